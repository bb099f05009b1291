"""Translation through CTranslate2 (`vanilla-transformer translate --backend ctranslate2`), with the model's own
generation settings.

The model folder's export is made once and cached beside the folder. Batches, cutting and the rest come from
`batches.translate_texts`, as for the model itself.

The cache is `<model folder>.ctranslate2-<digest>` beside the folder, the digest that of the model's config and
weights: a model trained or converted again gets a new export, never a stale one. An export given by its path
(`--ctranslate2_dir`) is checked to be the model's (`check_export`): its vocabulary is the model's tokenizer's, and
its target embeddings are the model's, within what the export's quantization changes (a model fine-tuned from
another by less than that cannot be told from it).
"""

from __future__ import annotations

import copy
import hashlib
import json
import struct
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
from vanilla_transformer.serving.settings import folder_max_new_tokens

EMBEDDINGS = "decoder/embeddings/weight"  # the export's target embeddings (the shared matrix, one vocabulary)
MODEL_EMBEDDINGS = ("model.decoder.embed_tokens.weight", "model.shared.weight")  # the folder's, by its safetensors
MODEL_BIN_TYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")  # CTranslate2's type ids in model.bin


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


def check_export(export_dir: str | Path, model_dir: str | Path) -> None:
    """Refuse (ExportError naming the folder and the fix) an export that is not a CTranslate2 export, or not
    `model_dir`'s: another vocabulary, or other target embeddings."""
    export, fix = Path(export_dir), "give the export of MODEL_DIR, or leave --ctranslate2_dir out to have it made"
    if (why := why_not_an_export(export)) is not None:
        raise ExportError(f"--ctranslate2_dir {export_dir} is not a CTranslate2 export ({why}): {fix}")
    config = read_json_file(Path(model_dir) / "config.json")
    if config.get("share_encoder_decoder_embeddings") is False:
        sides = [("source", config["vocab_size"]), ("target", config["decoder_vocab_size"])]
    else:
        sides = [("shared", config["vocab_size"])]
    for side, size in sides:
        written = [line for line in exported_vocabulary(export, side) if line is not None]
        if written != vocabulary(model_dir, size, side):
            raise ExportError(f"--ctranslate2_dir {export_dir} has another vocabulary than {model_dir}'s: {fix}")
    if not same_embeddings(export, Path(model_dir)):
        raise ExportError(f"--ctranslate2_dir {export_dir} has other weights than {model_dir}: {fix}")


def exported_vocabulary(export: Path, side: str) -> list[str]:
    """The tokens of an export's vocabulary file for `side` (vocabulary.json or .txt; shared_, source_, target_)."""
    prefixes = ("", "shared_") if side == "shared" else (f"{side}_",)
    for prefix in prefixes:
        if (export / f"{prefix}vocabulary.json").is_file():
            return json.loads((export / f"{prefix}vocabulary.json").read_text(encoding="utf-8"))
        if (export / f"{prefix}vocabulary.txt").is_file():
            return (export / f"{prefix}vocabulary.txt").read_text(encoding="utf-8").split("\n")[:-1]
    return []


def same_embeddings(export: Path, model_dir: Path) -> bool:
    """Whether the export's target embeddings are the folder's, each row within its quantization's step; True
    where either cannot be read (a folder without model.safetensors, or by other names)."""
    import numpy as np
    from safetensors import safe_open

    weights = model_dir / "model.safetensors"
    variables = read_variables(export / "model.bin", {EMBEDDINGS, EMBEDDINGS + "_scale"})
    if not weights.is_file() or EMBEDDINGS not in variables:
        return True
    with safe_open(str(weights), "np") as tensors:
        name = next((name for name in MODEL_EMBEDDINGS if name in tensors.keys()), None)  # noqa: SIM118
        if name is None:
            return True
        ours = tensors.get_tensor(name).astype(np.float32)
    theirs = variables[EMBEDDINGS]
    if EMBEDDINGS + "_scale" in variables:
        theirs = theirs / variables[EMBEDDINGS + "_scale"][:, None]
    if theirs.shape != ours.shape:
        return False
    step = np.abs(ours).max(axis=1, keepdims=True) / 100 + 1e-2 * np.abs(ours) + 1e-6  # int8's, float16's
    return bool((np.abs(theirs - ours) <= step).all())


def read_variables(path: Path, names: set[str]) -> dict:
    """The variables `names` of a CTranslate2 model.bin (CTranslate2's format: version, spec name, revision, then
    each variable's name, shape, type and bytes), as float32 numpy arrays; the others are skipped unread."""
    import numpy as np

    found = {}
    with open(path, "rb") as file:

        def number(code: str):
            return struct.unpack(code, file.read(struct.calcsize(code)))[0]

        def string() -> str:
            return file.read(number("H"))[:-1].decode("utf-8")

        _version, _spec, _revision = number("I"), string(), number("I")
        for _ in range(number("I")):
            name = string()
            shape = tuple(number("I") for _ in range(number("B")))
            dtype, size = MODEL_BIN_TYPES[number("B")], number("I")
            if name not in names:
                file.seek(size, 1)
                continue
            raw = file.read(size)
            if dtype == "bfloat16":
                values = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                values = np.frombuffer(raw, dtype).astype(np.float32)
            found[name] = values.reshape(shape)
    return found


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


def load_ctranslate2_translator(export_dir, device: str, compute_type: str, threads: int, workers: int):
    """The export's ctranslate2.Translator: `workers` workers (inter_threads) of `threads` threads, or of one each;
    ExportError naming the export and the fix when CTranslate2 cannot load it."""
    import ctranslate2
    import torch

    # CTranslate2 sets its thread count in the OpenMP runtime torch loaded for the whole process: torch's
    # computations after it (a caller's, a training run's in the same process) would run on other threads and
    # give other floats. Its own workers keep theirs.
    torch_threads = torch.get_num_threads()
    try:
        return ctranslate2.Translator(
            str(export_dir),
            device=device,
            compute_type=compute_type,
            intra_threads=threads if workers == 1 else 1,
            inter_threads=workers,
        )
    except (RuntimeError, ValueError) as error:
        raise ExportError(
            f"CTranslate2 cannot load the export {export_dir} on {device} as {compute_type} ({error}): export it "
            "again (`vanilla-transformer export-ctranslate2 MODEL_DIR OUTPUT_DIR`), or choose another "
            "--compute_type or --device"
        ) from error
    finally:
        torch.set_num_threads(torch_threads)


def decoding_options(generation: dict, beams: int, tokenizer) -> dict:
    """translate_batch's options for a folder's generation_config.json (as generate() reads it) and `beams`."""
    options = {"beam_size": beams, "max_input_length": 0}
    for name in ("length_penalty", "no_repeat_ngram_size", "repetition_penalty"):
        if generation.get(name) is not None:
            options[name] = generation[name]
    if "eos_token_id" in generation and generation["eos_token_id"] is None:  # generate() then never ends early
        options["end_token"] = []
    if generation.get("min_new_tokens"):
        options["min_decoding_length"] = generation["min_new_tokens"]
    if generation.get("bad_words_ids"):
        options["suppress_sequences"] = [tokenizer.convert_ids_to_tokens(ids) for ids in generation["bad_words_ids"]]
    return options


class CTranslate2Backend:
    """`translate_texts`' backend on a CTranslate2 Translator: source tokens are the model tokenizer's, decoding
    follows the folder's generation_config.json (beam, length penalty, repetition settings, bad words, its length:
    `max_new_tokens`, or `max_length` less the decoder's start) unless `num_beams` or `max_new_tokens` are given, with
    section 6.1's input + 50 as the output length where neither gives one.

    In int8 on a CPU, `threads` threads are `threads` workers of one thread each (CTranslate2's inter_threads), each
    decoding a share of every batch: small products keep one thread busier than two share them. On 2 cores, at the
    OPUS-MT size, beam 4, they give 1.22-1.33x the tokens/s of one worker of two threads (docs/BENCHMARKS.md,
    "Translating a corpus"). Other compute types keep one worker of `threads` threads: in float32 the workers gain
    nothing (the same row), and with MKL_NUM_THREADS set, in a process that has loaded torch, they run at 0.7x.
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
        config = read_json_file(Path(model_dir) / "config.json")
        generation = read_json_file(Path(model_dir) / "generation_config.json") or {}
        self.tokenizer = tokenizer
        configured = folder_max_new_tokens(generation)
        self.max_new_tokens = max_new_tokens if max_new_tokens is not None else configured
        self.workers = threads if device == "cpu" and threads > 1 and compute_type.startswith("int8") else 1
        self.translator = load_ctranslate2_translator(export_dir, device, compute_type, threads, self.workers)
        self.source_tokens = self.target_ids = None  # one vocabulary: the tokenizer's own conversions
        if config.get("share_encoder_decoder_embeddings") is False:  # the two vocabularies, as the export wrote them
            self.source_tokens = vocabulary(model_dir, config["vocab_size"], "source")
            self.target_ids = {
                token: index
                for index, token in enumerate(vocabulary(model_dir, config["decoder_vocab_size"], "target"))
            }
        self.beams = num_beams or generation.get("num_beams") or 1
        self.max_source_tokens = config["max_position_embeddings"]
        self.options = decoding_options(generation, self.beams, tokenizer)
        # generate() ends a translation that reaches the length limit with this token, which takes the last place
        self.forced_end = generation.get("forced_eos_token_id") is not None

    def with_decoding(self, num_beams: int | None = None, max_new_tokens: int | None = None) -> CTranslate2Backend:
        """A backend on the same translator that decodes with this beam or output length (None: this one's)."""
        other = copy.copy(self)
        if num_beams is not None:
            other.beams, other.options = num_beams, {**self.options, "beam_size": num_beams}
        if max_new_tokens is not None:
            other.max_new_tokens = max_new_tokens
        return other

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
