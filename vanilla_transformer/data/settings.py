"""What a training corpus is and how it is read, tokenized, filtered and streamed: the data's settings, each default
stated once (the training flags read them).

A field that is a flag of `vanilla-transformer train` and `prepare` declares it in its metadata (its help, the check
of its value, `flag` where the flag is spelled otherwise: commands/flags.py's `add_settings_flags`). This module
imports neither torch nor transformers, so that `vanilla-transformer train --help` and `prepare --help` answer at
once."""

from dataclasses import dataclass, field

import numpy as np

from vanilla_transformer.data.readers import DataError, DataReport


def setting(default, help: str | None, *, check=None, flag: str | None = None, choices=None):
    """A settings field that declares its flag: its default, its `help` (None: none), and where given the `check` of
    its value, the `flag` spelled otherwise than the field, and its `choices` (commands/flags.py reads them)."""
    given = {"flag": flag, "check": check, "choices": choices}
    return field(
        default=default, metadata={"help": help} | {key: value for key, value in given.items() if value is not None}
    )


@dataclass(frozen=True)
class Corpus:
    """Where the translation pairs come from, the first of these given: a Hub dataset (`dataset_name`), a folder of
    line-aligned files `{split}.{lang}[.gz]` (`data_dir`), TSV or JSONL files per split, or else the embedded
    synthetic task; and which side is which."""

    source_lang: str = setting("en", "the source language")
    target_lang: str = setting("de", "the target language")
    dataset_name: str | None = setting(None, "a Hub dataset with a `translation` column, e.g. wmt14 (online)")
    dataset_config: str | None = setting(None, "e.g. de-en")
    data_dir: str | None = setting(None, "folder of line-aligned files {split}.{lang}[.gz], e.g. Multi30k")
    train_file: str | None = setting(None, "a .tsv or .jsonl file of pairs (with --validation_file/--test_file)")
    validation_file: str | None = setting(None, None)
    test_file: str | None = setting(None, None)
    # the splits' names in the dataset or the folder
    train_split: str = setting("train", None)
    validation_split: str = setting("validation", None)
    test_split: str = setting("test", None)
    synthetic_pairs: int = setting(30000, "size of the embedded task", check=("at_least", 10))
    synthetic_seed: int = 42  # --data_seed, TokenizerSettings.seed's flag (a test holds the two defaults equal)

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

    name_or_path: str | None = setting(
        None, "an existing tokenizer; default: train one", flag="tokenizer_name_or_path"
    )
    vocab_size: int = setting(8000, "shared BPE vocabulary (paper: 37000)", check=("at_least", 260))
    sample_pairs: int = setting(
        1_000_000,
        "train the BPE on a seeded random sample of this many training pairs (all of them if fewer)",
        check="positive_int",
        flag="tokenizer_train_pairs",
    )
    seed: int = setting(
        42,  # and Corpus.synthetic_seed
        "the tokenizer's sample and the embedded task (not training's seed)",
        check="non_negative_int",
        flag="data_seed",
    )

    def load_given(self):
        """The given tokenizer, or None when one is to be trained: every path loads a given one here."""
        from vanilla_transformer.data.tokenization import load_tokenizer

        return load_tokenizer(self.name_or_path) if self.name_or_path else None


@dataclass(frozen=True)
class LengthFilter:
    """Which training pairs are kept, in tokens (`</s>` included): no side longer than `max_sentence_tokens`, no
    longer side more than `max_length_ratio` times the shorter one (None: no limit)."""

    max_sentence_tokens: int | None = setting(
        256, "drop training pairs with a sentence (source or target) longer than this", check=("at_least", 2)
    )
    max_length_ratio: float | None = setting(
        None,
        "drop training pairs whose longer side has more than this many times the tokens of the shorter "
        "one (corpus cleaning; e.g. 3 for WMT; default: off)",
        check=("number_in", 1),
    )

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
    prepared_data: str | None = setting(
        None, "a folder made by `vanilla-transformer prepare` (replaces the data flags)"
    )
    cache_dir: str | None = setting(
        None,
        "where prepared corpora are cached (default: $HF_HOME/vanilla_transformer/prepared)",
        flag="data_cache_dir",
    )
    num_workers: int | None = setting(
        None, "processes that tokenize (default: 1)", check="positive_int", flag="preprocessing_num_workers"
    )


@dataclass(frozen=True)
class StreamSettings:
    """How the stream is shuffled and cut into batches (per process)."""

    shuffle_buffer_size: int = setting(100_000, "pairs in the shuffle buffer", check="positive_int")
    pool_batches: int = setting(  # batches' worth of tokens
        100, "batches sorted and cut together", check="positive_int", flag="stream_pool_batches"
    )
