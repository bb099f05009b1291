"""Translation through an ONNX export (`vanilla-transformer translate --backend onnx --onnx_dir OUT`), run by ONNX
Runtime.

The export is the folder `export-onnx` wrote, decoded with the model folder's own generation settings, giving the
model backend's tokens (converters/onnx_decoding.py: generate()'s greedy and beam search over the export's
sessions). Batches, cutting and the rest come from `batches.translate_texts`, as for the model itself.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from pipeline_vanilla_transformer import EXTRA_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS
from vanilla_transformer.converters.export_onnx import VARIANT_SUFFIXES, OnnxExportError
from vanilla_transformer.converters.onnx_check import padded, rows
from vanilla_transformer.converters.onnx_decoding import Decoding, OnnxModel, search
from vanilla_transformer.converters.onnx_graphs import EXTRA_ROWS
from vanilla_transformer.model.loading import read_json_file
from vanilla_transformer.serving.settings import folder_max_new_tokens


class OnnxBackend:
    """`translate_texts`' backend on ONNX Runtime sessions of an export of `model_dir` (`onnx_dir`; `variant` None,
    "q8" or "fp16"). Decoding follows the model folder's generation_config.json (beam, length penalty, forced end,
    bad words; its length, else section 6.1's input + 50) unless `num_beams` or `max_new_tokens` are given."""

    def __init__(self, model_dir, onnx_dir, num_beams=None, max_new_tokens=None, threads=0, variant=None):
        from vanilla_transformer.data.tokenization import load_tokenizer

        if not (Path(onnx_dir) / "onnx").is_dir():
            raise OnnxExportError(f"--onnx_dir {onnx_dir} is not an export of `vanilla-transformer export-onnx`")
        suffix = VARIANT_SUFFIXES[variant] if variant else ""
        if variant and not (Path(onnx_dir) / "onnx" / f"encoder_model{suffix}.onnx").is_file():
            raise OnnxExportError(
                f"--onnx_dir {onnx_dir} has no {variant} variant (onnx/encoder_model{suffix}.onnx): export it with "
                f"`vanilla-transformer export-onnx MODEL_DIR {onnx_dir} --overwrite --quantize {variant}`"
            )
        config = read_json_file(Path(model_dir) / "config.json")
        generation = read_json_file(Path(model_dir) / "generation_config.json") or {}
        self.decoding = Decoding.from_generation(generation, config)
        if num_beams is not None:
            self.decoding = dataclasses.replace(self.decoding, num_beams=num_beams)
        self.beams = self.decoding.num_beams
        self.max_new_tokens = max_new_tokens if max_new_tokens is not None else folder_max_new_tokens(generation)
        self.learned = config.get("position_embedding_type") == "learned"
        self.max_source_tokens = config["max_position_embeddings"]
        # the target positions the graphs' position table holds after the start token (onnx_graphs.EXTRA_ROWS)
        self.max_output = self.max_source_tokens - 1 + (0 if self.learned else EXTRA_ROWS)
        self.check_length(self.max_new_tokens)
        self.tokenizer = load_tokenizer(onnx_dir)
        self.model = OnnxModel(onnx_dir, suffix, threads)
        self.special_ids = set(self.tokenizer.all_special_ids)

    def with_decoding(self, num_beams: int | None = None, max_new_tokens: int | None = None) -> OnnxBackend:
        """A backend on the same sessions that decodes with this beam or output length (None: this one's)."""
        other = copy.copy(self)
        if num_beams is not None:
            other.decoding, other.beams = dataclasses.replace(self.decoding, num_beams=num_beams), num_beams
        if max_new_tokens is not None:
            other.check_length(max_new_tokens)
            other.max_new_tokens = max_new_tokens
        return other

    def check_length(self, max_new_tokens: int | None) -> None:
        """Refuse an output length past the export's positions (the PyTorch model grows its sinusoids; a graph holds
        its table as exported: enough for section 6.1's source + 50 at the model's longest source)."""
        if max_new_tokens is not None and max_new_tokens > self.max_output:
            raise OnnxExportError(
                f"an output of {max_new_tokens} tokens is past the {self.max_output} target positions the export's "
                f"graphs hold: ask for {self.max_output} new tokens or fewer, or use --backend model"
            )

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer(list(texts), verbose=False)["input_ids"]

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, verbose=False)["input_ids"])

    def new_tokens(self, batch: list[list[int]]) -> int:
        """The model backend's output length (pipeline_vanilla_transformer.length_arguments) for this batch."""
        length = self.max_new_tokens
        if length is None:
            length = min(max(map(len, batch)) + EXTRA_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS)
        return min(length, self.max_source_tokens - 1) if self.learned else length

    def translate(self, batch: list[list[int]]) -> tuple[list[str], int]:
        ids, mask = padded(batch, self.decoding.pad if self.decoding.pad is not None else 0)
        output = rows(search(self.model, ids, mask, self.decoding, self.new_tokens(batch) + 1), self.decoding.pad)
        tokens = sum(token not in self.special_ids for row in output for token in row)
        return self.tokenizer.batch_decode(output, skip_special_tokens=True), tokens

    def translate_batches(self, batches: Iterable[list[list[int]]]) -> Iterator[tuple[list[str], int]]:
        return map(self.translate, batches)
