"""Export a model folder (trained here, or converted) to ONNX in the layout transformers.js loads for an
encoder-decoder.

The layout is the one optimum writes for OPUS-MT (Xenova/opus-mt-en-de): a folder a web page, Node or ONNX Runtime in
Python translates with.

    OUT/onnx/encoder_model.onnx, OUT/onnx/decoder_model_merged.onnx   float32 (onnx_graphs.py: the layout)
    OUT/onnx/*_quantized.onnx (--quantize q8), OUT/onnx/*_fp16.onnx (--quantize fp16)
    OUT/config.json, generation_config.json, tokenizer.json, tokenizer_config.json

Exact, or refused: before OUT is written, the float32 export runs through ONNX Runtime on check sentences and must give
the PyTorch model's logits (relative 1e-4) and its greedy and beam-4 tokens, with and without the cache branch
(onnx_check.py); a difference refuses with the numbers. The quantized variants are measured against float32 (the
share of sentences with the same tokens), not required to equal it.

config.json says `model_type: "marian"`: the model is computed inside the graphs, so transformers.js reads the config
only for what it feeds the graphs and how it generates: the cache's names and shapes (decoder_layers,
decoder_attention_heads, d_model: the empty past of the first step) and the generation ids. Those are written as the
graphs use them: the encoder's keys and values in the cache are the cross-attention's, with the decoder's layers and
heads, so `encoder_layers` and `encoder_attention_heads` are written as the decoder's (transformers.js sizes the
encoder's past from them). Nothing of the architecture (post-LN, interleaved positions, sqrt(d_model) scaling) is read
from it, which is why calling it Marian is exact.

The output folder follows the one rule (mechanics/outputs.py): never the model's folder, new or empty, or with
--overwrite a previous export known by its record; it is written beside, checked, and moved into place only then.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from pipeline_vanilla_transformer import EXTRA_OUTPUT_TOKENS, MAX_OUTPUT_TOKENS
from vanilla_transformer.converters.onnx_check import OnnxCheckError, agreement, check_onnx_export
from vanilla_transformer.converters.onnx_decoding import Decoding
from vanilla_transformer.converters.onnx_graphs import DECODER, ENCODER, export_graphs, merge_decoders
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.outputs import check_output_folder, why_not_recorded, write_recorded_folder

WRITTEN_BY = "vanilla-transformer export-onnx"
ONNX_EXPORT_RECORD = ".vanilla_transformer_export_onnx.json"
VARIANT_SUFFIXES = {"q8": "_quantized", "fp16": "_fp16"}
CHECK_SENTENCE_COUNT = 8


class OnnxExportError(VanillaTransformerError, ValueError):
    """A model or output folder the ONNX export cannot use; the message names it and what to do."""


def check_onnx_folders(model_dir: str | Path, output_dir: str | Path, overwrite: bool) -> bool:
    """The model folder has a config.json, and the output folder may be written by the rule; True if replacing."""
    if not (Path(model_dir) / "config.json").is_file():
        raise OnnxExportError(f"{model_dir} is not a model folder: it has no config.json")
    return check_output_folder(
        output_dir,
        overwrite=overwrite,
        why_not_previous=lambda folder: why_not_recorded(folder, ONNX_EXPORT_RECORD, WRITTEN_BY),
        previous=f"a previous `{WRITTEN_BY}` output",
        inputs=[("the model folder", model_dir)],
        error=OnnxExportError,
    )


def web_config(config) -> dict:
    """config.json for transformers.js (the module docstring says why these fields are exact)."""
    vocab = config.vocab_size if config.share_encoder_decoder_embeddings else config.decoder_vocab_size
    return {
        "model_type": "marian",
        "architectures": ["MarianMTModel"],
        "is_encoder_decoder": True,
        "d_model": config.d_model,
        "decoder_layers": config.decoder_layers,
        "decoder_attention_heads": config.decoder_attention_heads,
        "encoder_layers": config.decoder_layers,  # the cross-attention's cache: the decoder's layers and heads
        "encoder_attention_heads": config.decoder_attention_heads,
        "vocab_size": vocab,
        "decoder_vocab_size": vocab,
        "max_position_embeddings": config.max_position_embeddings,
        "pad_token_id": config.pad_token_id,
        "eos_token_id": config.eos_token_id,
        "bos_token_id": config.bos_token_id,
        "decoder_start_token_id": config.decoder_start_token_id,
        "forced_eos_token_id": config.forced_eos_token_id,
        "exported_from": config.model_type,
    }


def web_generation_config(generation: dict, config) -> dict:
    """generation_config.json: the folder's. Where it sets no length, the model decodes section 6.1's input + 50
    tokens: that is said as `extra_output_tokens` (the page's decoding.mjs reads it), and `max_length` is the most the
    model decodes, for a caller of transformers.js that gives no length (its own default stops at 20 tokens)."""
    written = {key: value for key, value in generation.items() if key != "transformers_version"}
    if written.get("max_new_tokens") is None and written.get("max_length") is None:
        limit = MAX_OUTPUT_TOKENS + 1
        if config.position_embedding_type == "learned":
            limit = min(limit, config.max_position_embeddings)
        written["max_length"] = limit
        written["extra_output_tokens"] = EXTRA_OUTPUT_TOKENS
    return written


def sentences_to_check(tokenizer, count: int) -> list[list[int]]:
    """Source ids of `count` sentences of the toy task and of Multi30k's kind, as the folder's tokenizer reads them."""
    from vanilla_transformer.data.toy_task import synthetic_translation_pairs

    others = ["A man in an orange hat starring at something.", "Zwei Hunde spielen im Schnee, während es schneit."]
    texts = [text for pair in synthetic_translation_pairs(count, seed=7) for text in pair]
    texts = [others[index % 2] if index % 4 == 3 else text for index, text in enumerate(texts)]
    return tokenizer(texts[:count], verbose=False)["input_ids"]  # cut to the positions by the caller


def write_tokenizer(model_dir: Path, out: Path, tokenizer, sentences: list[str], positions: int) -> list[str]:
    """tokenizer.json and tokenizer_config.json: the folder's own, or a Marian folder's sentencepiece tokenizer
    converted (tokenizer_json.py), checked to give its ids on `sentences`. The settings are stated for transformers.js
    rather than left to its defaults: the plain tokenizer class (its MarianTokenizer trims a text and looks for
    language codes), the folder's `clean_up_tokenization_spaces` (transformers.js takes true when it is absent), and
    at most the model's `positions` source tokens (transformers.js's pipeline cuts a longer text there; the graphs'
    position table ends there)."""
    from vanilla_transformer.converters.tokenizer_json import converted_tokenizer_config, marian_tokenizer_json

    if (model_dir / "tokenizer.json").is_file():
        shutil.copyfile(model_dir / "tokenizer.json", out / "tokenizer.json")
        settings = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    elif type(tokenizer).__name__ == "MarianTokenizer":
        marian_tokenizer_json(tokenizer, sentences, OnnxExportError).save(str(out / "tokenizer.json"))
        settings = converted_tokenizer_config(tokenizer)
    else:
        raise OnnxExportError(
            f"{model_dir}: its tokenizer ({type(tokenizer).__name__}) has no tokenizer.json to export"
        )
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    settings["clean_up_tokenization_spaces"] = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
    settings["model_max_length"] = min(positions, settings.get("model_max_length") or positions)
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n", "utf-8")
    return ["tokenizer.json", "tokenizer_config.json"]


def quantize_variant(graphs: tuple[Path, Path, Path], onnx_dir: Path, kind: str, config) -> list[str]:
    """The `kind` variant of the exported graphs (encoder, first step, next step) into `onnx_dir`, the decoders
    quantized apart and then merged: q8, ONNX Runtime's dynamic int8 (weights int8, activations quantized as they
    come); fp16, every float16 (ONNX Runtime's converter, inputs and outputs included)."""
    import onnx

    suffix, variants = VARIANT_SUFFIXES[kind], []
    for path in graphs:
        target = path.with_name(f"{path.stem}{suffix}.onnx")
        if kind == "q8":
            from onnxruntime.quantization import QuantType, quantize_dynamic

            quantize_dynamic(path, target, weight_type=QuantType.QInt8, per_channel=False)
        else:
            from onnxruntime.transformers.float16 import convert_float_to_float16

            onnx.save(convert_float_to_float16(onnx.load(str(path)), keep_io_types=False), str(target))
        variants.append(target)
    encoder, decoder = (onnx_dir / name.replace(".onnx", f"{suffix}.onnx") for name in (ENCODER, DECODER))
    shutil.copyfile(variants[0], encoder)
    onnx.save(merge_decoders(variants[1], variants[2], config), str(decoder))
    return [f"onnx/{encoder.name}", f"onnx/{decoder.name}"]


def _load(model_dir: Path):
    """The model (float32, eval), its tokenizer and its decoding settings; OnnxExportError naming what is wrong."""
    import torch

    from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
    from vanilla_transformer.data.tokenization import load_tokenizer
    from vanilla_transformer.model.loading import ModelFolderError, load_model_folder, read_json_file

    try:
        model = load_model_folder(model_dir, VanillaTransformerForConditionalGeneration, dtype=torch.float32).eval()
    except ModelFolderError as error:
        raise OnnxExportError(str(error)) from error
    config = model.config
    if config.qk_head_dim not in (None, config.d_model // config.decoder_attention_heads):
        raise OnnxExportError(
            f"{model_dir} has qk_head_dim={config.qk_head_dim} (d_k != d_v): transformers.js sizes the cache as "
            "d_model / heads, so this model cannot be exported in its layout"
        )
    generation = read_json_file(model_dir / "generation_config.json") or {}
    try:
        decoding = Decoding.from_generation(generation, config.to_dict())
    except ValueError as error:
        raise OnnxExportError(f"{model_dir}: {error}") from error
    return model, load_tokenizer(model_dir), generation, decoding


def write_graphs(model, staging: Path, batch: list[list[int]], decoding, quantize, folder: Path) -> tuple[list, dict]:
    """The float32 graphs written into `staging/onnx/` and checked against `model` on `batch` (refused naming
    `folder`, the user's), then each quantized variant with its agreement: the names written and the check's
    numbers."""
    import onnx

    onnx_dir, summary = staging / "onnx", {}
    onnx_dir.mkdir()
    with tempfile.TemporaryDirectory() as temporary:
        graphs = export_graphs(model, Path(temporary))
        shutil.copyfile(graphs[0], onnx_dir / ENCODER)
        onnx.save(merge_decoders(graphs[1], graphs[2], model.config), str(onnx_dir / DECODER))
        try:
            summary.update(check_onnx_export(model, staging, batch, decoding, name=folder))
        except OnnxCheckError as refused:
            raise OnnxCheckError(f"{refused}; {folder} was left as it was") from None
        names = [f"onnx/{ENCODER}", f"onnx/{DECODER}"]
        for kind in dict.fromkeys(quantize):
            names += quantize_variant(graphs, onnx_dir, kind, model.config)
            summary[f"{kind}: same tokens as float32"] = agreement(staging, VARIANT_SUFFIXES[kind], batch, decoding)
    return names, summary


def write_settings(staging: Path, model_dir: Path, model, generation: dict, tokenizer, batch) -> list[str]:
    """config.json, generation_config.json and the tokenizer's files, for transformers.js: the names written."""
    names = []
    for name, content in (
        ("config.json", web_config(model.config)),
        ("generation_config.json", web_generation_config(generation, model.config)),
    ):
        (staging / name).write_text(json.dumps(content, indent=2) + "\n", "utf-8")
        names.append(name)
    sentences = tokenizer.batch_decode(batch, skip_special_tokens=True)
    return names + write_tokenizer(model_dir, staging, tokenizer, sentences, model.config.max_position_embeddings)


def export_onnx(
    model_dir: str | Path,
    output_dir: str | Path,
    quantize: tuple[str, ...] = (),
    overwrite: bool = False,
    extra: Callable[[Path], list[str]] | None = None,
    check_count: int = CHECK_SENTENCE_COUNT,
) -> dict:
    """Export `model_dir` into `output_dir` (the module docstring), checked first; `extra(staging)` writes more files
    into the folder before it is moved into place (the web page) and gives their names. Returns the check's numbers
    (relative logits differences; shares of sentences with the model's tokens; each variant's agreement)."""
    model_dir, folder = Path(model_dir), Path(output_dir)
    unknown = sorted(set(quantize) - set(VARIANT_SUFFIXES))
    if unknown:
        raise OnnxExportError(f"--quantize {', '.join(unknown)}: choose among {', '.join(VARIANT_SUFFIXES)}")
    replacing = check_onnx_folders(model_dir, folder, overwrite)
    model, tokenizer, generation, decoding = _load(model_dir)
    positions = model.config.max_position_embeddings  # translate_texts cuts longer sources to these
    batch = [
        ids[: positions - 1] + ids[-1:] if len(ids) > positions else ids
        for ids in sentences_to_check(tokenizer, check_count)
    ]
    summary = {}

    def write(staging: Path) -> list[str]:
        names, checked = write_graphs(model, staging, batch, decoding, quantize, folder)
        summary.update(checked)
        names += write_settings(staging, model_dir, model, generation, tokenizer, batch)
        return names + (extra(staging) if extra is not None else [])

    write_recorded_folder(
        folder,
        write,
        replacing=replacing,
        record=ONNX_EXPORT_RECORD,
        written_by=WRITTEN_BY,
        error=OnnxExportError,
        what="the ONNX export",
    )
    return summary
