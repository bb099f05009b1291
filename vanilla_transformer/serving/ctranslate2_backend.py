"""Translation through CTranslate2 (`vanilla-transformer translate --backend ctranslate2`): the folder's export, made
once and cached beside the model folder, decoded with the model's own generation settings. Batches, cutting and the
rest come from `translate.translate_texts`, as for the model itself.

The cache is `<model folder>.ctranslate2-<digest>` beside the folder, the digest that of the model's config and
weights: a model trained or converted again gets a new export, never a stale one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from pipeline_vanilla_transformer import EXTRA_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS
from vanilla_transformer.converters.export_ctranslate2 import (
    ExportError,
    convert_to_ctranslate2,
    vocabulary,
    why_not_an_export,
)
from vanilla_transformer.model.loading import read_json_file


def model_digest(model_dir: str | Path) -> str:
    """sha256 of what makes a model translate as it does: its config, generation config, weights and tokenizer."""
    digest = hashlib.sha256()
    folder = Path(model_dir)
    for name in sorted(path.name for path in folder.iterdir() if path.is_file() and path.name != "README.md"):
        digest.update(name.encode() + b"\0")
        with open(folder / name, "rb") as file:
            while block := file.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()


def cached_export(model_dir: str | Path, digest: str | None = None) -> Path:
    """The folder's CTranslate2 export, made on first use beside it (`<folder>.ctranslate2-<digest[:12]>`, float32;
    CTranslate2 quantizes when it loads); ExportError when it cannot be made there (give --ctranslate2_dir)."""
    folder = Path(model_dir).resolve()
    export = folder.with_name(f"{folder.name}.ctranslate2-{(digest or model_digest(folder))[:12]}")
    if export.exists() and why_not_an_export(export) is None:
        return export
    try:
        convert_to_ctranslate2(folder, export, overwrite=export.exists())
    except OSError as error:
        raise ExportError(
            f"cannot write the CTranslate2 export beside the model, in {export} ({error}): make one with "
            "`vanilla-transformer export-ctranslate2 MODEL_DIR OUTPUT_DIR` and give it with --ctranslate2_dir"
        ) from error
    return export


class CTranslate2Backend:
    """`translate_texts`' backend on a CTranslate2 Translator: source tokens are the model tokenizer's, decoding
    follows the folder's generation_config.json (beam, length penalty, repetition settings, bad words) unless
    `num_beams` or `max_new_tokens` are given, with section 6.1's input + 50 as the output length.

    In int8 on a CPU, `threads` threads are `threads` workers of one thread each (CTranslate2's inter_threads), each
    decoding a share of every batch: small products keep one thread busier than two share them. On 2 cores, at the
    OPUS-MT size, beam 4: 1.2-1.4x the tokens/s of one worker of two threads (docs/BENCHMARKS.md). Other compute types
    keep one worker of `threads` threads: in float32 the workers gained nothing, and with MKL_NUM_THREADS set they ran
    at 0.7x (not in a process without torch: likely each worker's MKL products, MKL shared with torch, took that many
    threads; not verified).
    `threads` 0 leaves CTranslate2's own default (one worker)."""

    def __init__(
        self,
        model_dir,
        tokenizer,
        export_dir,
        device="cpu",
        compute_type="default",
        threads=0,
        num_beams=None,
        max_new_tokens=None,
    ):
        import ctranslate2
        import torch

        config = read_json_file(Path(model_dir) / "config.json")
        generation = read_json_file(Path(model_dir) / "generation_config.json") or {}
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        # CTranslate2 sets its thread count in the OpenMP runtime torch loaded for the whole process: torch's
        # computations after it (a caller's, a training run's in the same process) would run on other threads and
        # give other floats. Its own workers keep theirs.
        torch_threads = torch.get_num_threads()
        self.workers = threads if device == "cpu" and threads > 1 and compute_type.startswith("int8") else 1
        try:
            self.translator = ctranslate2.Translator(
                str(export_dir),
                device=device,
                compute_type=compute_type,
                intra_threads=threads if self.workers == 1 else 1,
                inter_threads=self.workers,
            )
        finally:
            torch.set_num_threads(torch_threads)
        self.source_tokens = self.target_ids = None  # one vocabulary: the tokenizer's own conversions
        if config.get("share_encoder_decoder_embeddings") is False:  # the two vocabularies, as the export wrote them
            self.source_tokens = vocabulary(model_dir, config["vocab_size"], "source")
            self.target_ids = {
                token: index
                for index, token in enumerate(vocabulary(model_dir, config["decoder_vocab_size"], "target"))
            }
        self.beams = num_beams or generation.get("num_beams") or 1
        self.max_source_tokens = config["max_position_embeddings"]
        self.options = {"beam_size": self.beams, "max_input_length": 0}
        for ours, theirs in (
            ("length_penalty", "length_penalty"),
            ("no_repeat_ngram_size", "no_repeat_ngram_size"),
            ("repetition_penalty", "repetition_penalty"),
        ):
            if generation.get(ours) is not None:
                self.options[theirs] = generation[ours]
        if "eos_token_id" in generation and generation["eos_token_id"] is None:  # generate() then never ends early
            self.options["end_token"] = []
        if generation.get("min_new_tokens"):
            self.options["min_decoding_length"] = generation["min_new_tokens"]
        # generate() ends a translation that reaches the length limit with this token, which takes the last place
        self.forced_end = generation.get("forced_eos_token_id") is not None
        if generation.get("bad_words_ids"):
            self.options["suppress_sequences"] = [
                tokenizer.convert_ids_to_tokens(ids) for ids in generation["bad_words_ids"]
            ]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer(list(texts), verbose=False)["input_ids"]

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, verbose=False)["input_ids"])

    def decoding_length(self, batch: list[list[int]]) -> int:
        """The output length of a batch: as `pipeline_vanilla_transformer.output_length` gives the model (longest
        source + 50 up to MAX_OUTPUT_TOKENS), within the exported position table (its first row is the start)."""
        length = self.max_new_tokens or min(max(map(len, batch)) + EXTRA_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS)
        return min(length, self.max_source_tokens - 1) - self.forced_end

    def translate_batches(self, batches: Iterable[list[list[int]]]) -> Iterator[tuple[list[str], int]]:
        return map(self.translate, batches)  # the workers share each batch

    def translate(self, batch: list[list[int]]) -> tuple[list[str], int]:
        if self.source_tokens is None:
            tokens = [self.tokenizer.convert_ids_to_tokens(ids) for ids in batch]
        else:
            tokens = [[self.source_tokens[index] for index in ids] for ids in batch]
        length = self.decoding_length(batch)
        # every workers-th sentence to each worker: the batch is sorted by length, so the shares are alike
        shares = [
            self.translator.translate_batch(
                tokens[first :: self.workers], max_decoding_length=length, asynchronous=True, **self.options
            )
            for first in range(min(self.workers, len(tokens)))
        ]
        hypotheses = [None] * len(tokens)
        for first, share in enumerate(shares):
            hypotheses[first :: self.workers] = [result.result().hypotheses[0] for result in share]
        if self.target_ids is None:
            ids = [self.tokenizer.convert_tokens_to_ids(hypothesis) for hypothesis in hypotheses]
        else:
            ids = [[self.target_ids[token] for token in hypothesis] for hypothesis in hypotheses]
        special = set(self.tokenizer.all_special_tokens)
        tokens = sum(token not in special for hypothesis in hypotheses for token in hypothesis)
        return self.tokenizer.batch_decode(ids, skip_special_tokens=True), tokens
