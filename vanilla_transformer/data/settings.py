"""What a training corpus is and how it is read, tokenized, filtered and streamed: the data's settings, each default
stated once (the training flags read them). This module imports neither torch nor transformers, so that
`vanilla-transformer train --help` and `prepare --help` answer at once."""

from dataclasses import dataclass, field

import numpy as np

from vanilla_transformer.data.readers import DataError, DataReport


@dataclass(frozen=True)
class Corpus:
    """Where the translation pairs come from, the first of these given: a Hub dataset (`dataset_name`), a folder of
    line-aligned files `{split}.{lang}[.gz]` (`data_dir`), TSV or JSONL files per split, or else the embedded
    synthetic task; and which side is which."""

    source_lang: str = "en"
    target_lang: str = "de"
    dataset_name: str | None = None
    dataset_config: str | None = None
    data_dir: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    train_split: str = "train"  # the splits' names in the dataset or the folder
    validation_split: str = "validation"
    test_split: str = "test"
    synthetic_pairs: int = 30000
    synthetic_seed: int = 42

    @property
    def is_embedded_task(self) -> bool:
        return not (self.dataset_name or self.data_dir or self.train_file or self.validation_file or self.test_file)

    def split_name(self, split: str) -> str:
        return {"train": self.train_split, "validation": self.validation_split, "test": self.test_split}[split]

    def split_file(self, split: str) -> str | None:
        return {"train": self.train_file, "validation": self.validation_file, "test": self.test_file}[split]


@dataclass(frozen=True)
class TokenizerSettings:
    """A given tokenizer (`name_or_path`), or the shared BPE (5.1) to train: its size, and the seeded sample of
    training pairs it learns from."""

    name_or_path: str | None = None
    vocab_size: int = 8000
    sample_pairs: int = 1_000_000
    seed: int = 42

    def load_given(self):
        """The given tokenizer, or None when one is to be trained: every path loads a given one here."""
        from vanilla_transformer.data.tokenization import load_tokenizer

        return load_tokenizer(self.name_or_path) if self.name_or_path else None


@dataclass(frozen=True)
class LengthFilter:
    """Which training pairs are kept, in tokens (`</s>` included): no side longer than `max_sentence_tokens`, no
    longer side more than `max_length_ratio` times the shorter one (None: no limit)."""

    max_sentence_tokens: int | None = 256
    max_length_ratio: float | None = None

    def keep(self, source_lengths: np.ndarray, target_lengths: np.ndarray, report: DataReport) -> np.ndarray:
        """Mask of the pairs to keep; counts the dropped pairs in `report`."""
        longer, shorter = np.maximum(source_lengths, target_lengths), np.minimum(source_lengths, target_lengths)
        too_long = longer > self.max_sentence_tokens if self.max_sentence_tokens else np.zeros(len(longer), dtype=bool)
        bad_ratio = ~too_long & (
            longer > self.max_length_ratio * np.maximum(shorter, 1) if self.max_length_ratio else False
        )
        report.too_long_dropped, report.ratio_dropped = int(too_long.sum()), int(np.sum(bad_ratio))
        keep = ~(too_long | bad_ratio)
        report.kept = int(keep.sum())
        return keep

    def refuse_if_none_kept(self, pairs: int, report: DataReport) -> None:
        """DataError when the filter dropped every one of `pairs` training pairs (`report`: what `keep` counted),
        naming its flags and the counts: nothing would be left to train on."""
        if pairs == 0 or report.kept > 0:
            return
        limits = {
            "--max_sentence_tokens": (self.max_sentence_tokens, report.too_long_dropped, "longer than"),
            "--max_length_ratio": (self.max_length_ratio, report.ratio_dropped, "over"),
        }
        limits = {flag: limit for flag, limit in limits.items() if limit[0]}
        dropped = ", ".join(
            f"{count} {relation} {flag} {value:g}" for flag, (value, count, relation) in limits.items()
        )
        raise DataError(
            f"{', '.join(report.sources) or 'the training pairs'}: the length filter dropped all {pairs} training "
            f"pairs ({dropped}; lengths in tokens, </s> included): raise {' or '.join(limits)}, or check the data"
        )


@dataclass(frozen=True)
class DataSettings:
    """Everything a prepared corpus depends on, and where it is cached; or a folder prepared beforehand
    (`prepared_data`), which replaces the rest."""

    corpus: Corpus = field(default_factory=Corpus)
    tokenizer: TokenizerSettings = field(default_factory=TokenizerSettings)
    filters: LengthFilter = field(default_factory=LengthFilter)
    prepared_data: str | None = None
    cache_dir: str | None = None
    num_workers: int | None = None  # processes that tokenize


@dataclass(frozen=True)
class StreamSettings:
    """How the stream is shuffled and cut into batches (per process)."""

    shuffle_buffer_size: int = 100_000  # pairs
    pool_batches: int = 100  # batches' worth of tokens sorted and cut together
