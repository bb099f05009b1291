"""Export a saved model to CTranslate2, a C++ inference engine for fast CPU (and GPU) decoding.

The model maps one to one onto CTranslate2's `TransformerSpec`:

- post-norm layers (`pre_norm=False`): LayerNorm(x + Sublayer(x)) after every sub-layer, no final LayerNorm;
- self-attention as one fused Q,K,V projection (our `q_proj`, `k_proj` and `v_proj` stacked by rows), encoder-decoder
  attention as a query projection plus one fused K,V projection (our `q_proj`; `k_proj` and `v_proj` stacked), then
  the output projection;
- one embedding matrix shared by the encoder, the decoder and the (bias-free) pre-softmax projection,
  scaled by sqrt(d_model) on the input side; with separate vocabularies (`share_encoder_decoder_embeddings: false`)
  the encoder's matrix and source vocabulary, and the decoder's matrix (also the projection) and target vocabulary;
- the position table written out explicitly: ours interleaves sine and cosine (section 3.5 of the paper), and
  CTranslate2's built-in sinusoidal table is a different one (it changes the outputs).

The written table has `max_position_embeddings` rows, which bounds source and output lengths in CTranslate2
(the PyTorch model grows its table on demand).

The output folder may not be the model folder, nor inside it, nor hold it. If it exists, --overwrite replaces it only
when it is a previous CTranslate2 export (what the converter writes and nothing else): anything else is refused. The
export is written into a new hidden folder beside it and moved into place only once complete, so a failed export (a
full disk, an interruption) leaves the output folder as it was, never half written.

Usage:
    vanilla-transformer export-ctranslate2 MODEL_DIR OUTPUT_DIR [--quantization int8] [--overwrite]

    translator = ctranslate2.Translator(OUTPUT_DIR, compute_type="int8")
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("A sentence.").input_ids)  # ends with </s>
    best = translator.translate_batch([tokens], beam_size=4)[0].hypotheses[0]
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import torch
from torch import nn

try:  # the export needs CTranslate2; the checks of the folders do not
    from ctranslate2.converters import Converter
    from ctranslate2.specs import common_spec, transformer_spec
except ImportError:
    Converter, common_spec, transformer_spec = object, None, None

from modeling_vanilla_transformer import (
    VanillaTransformerAttention,
    VanillaTransformerDecoderLayer,
    VanillaTransformerEncoderLayer,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerLearnedPositionalEmbedding,
)
from vanilla_transformer.data.tokenization import UNK_TOKEN, UNK_TOKEN_ID, load_tokenizer
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import TargetChanged, on_full_disk, staged_folder
from vanilla_transformer.mechanics.outputs import check_output_folder
from vanilla_transformer.model.loading import ModelFolderError, load_model_folder

# config.activation_function -> the name of CTranslate2's common_spec.Activation
ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "gelu_new": "GELUTanh",
    "silu": "SWISH",
    "swish": "SWISH",
    "tanh": "Tanh",
}
SAVED_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# what the converter writes into its folder; a folder of these and nothing else is a previous export
CONVERTER_FILES = {"model.bin", "config.json", "vmap.txt"} | {
    f"{side}vocabulary.{extension}" for side in ("", "shared_", "source_", "target_") for extension in ("json", "txt")
}
CONVERTER_CONFIG_KEYS = {"bos_token", "eos_token", "unk_token"}  # in every config.json it writes


class ExportError(VanillaTransformerError, RuntimeError):
    """The model or output folder cannot be used; the message says which and why."""


def _weight(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().float().contiguous()


def _set_linear(spec: common_spec.LinearSpec, *linears: nn.Linear) -> None:
    """One linear layer, or several of the same input stacked by rows (CTranslate2's fused projections)."""
    spec.weight = _weight(torch.cat([linear.weight for linear in linears]))  # (out, in), CTranslate2's layout
    if linears[0].bias is not None:
        spec.bias = _weight(torch.cat([linear.bias for linear in linears]))


def _set_layer_norm(spec: common_spec.LayerNormSpec, norm: nn.LayerNorm) -> None:
    spec.gamma = _weight(norm.weight)
    spec.beta = _weight(norm.bias)


def _set_attention(spec, attention: VanillaTransformerAttention, norm: nn.LayerNorm) -> None:
    if attention.is_cross_attention:  # linear = [query, fused key+value, output]
        _set_linear(spec.linear[0], attention.q_proj)
        _set_linear(spec.linear[1], attention.k_proj, attention.v_proj)
    else:  # linear = [fused query+key+value, output]
        _set_linear(spec.linear[0], attention.q_proj, attention.k_proj, attention.v_proj)
    _set_linear(spec.linear[-1], attention.out_proj)
    _set_layer_norm(spec.layer_norm, norm)  # with pre_norm=False it runs after the residual sum


def _set_feed_forward(spec, layer: VanillaTransformerEncoderLayer | VanillaTransformerDecoderLayer) -> None:
    _set_linear(spec.linear_0, layer.feed_forward.fc1)
    _set_linear(spec.linear_1, layer.feed_forward.fc2)
    _set_layer_norm(spec.layer_norm, layer.final_layer_norm)


def _set_embeddings_and_positions(spec, stack, embed_scale: float) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _weight(stack.embed_tokens.weight)
    spec.scale_embeddings = embed_scale
    positions = stack.embed_positions
    if isinstance(positions, VanillaTransformerLearnedPositionalEmbedding):
        table = positions.weight
    else:  # the interleaved sinusoid table, at least max_position_embeddings rows
        table = positions(0, stack.config.max_position_embeddings)
    spec.position_encodings.encodings = _weight(table)


def model_spec(model: VanillaTransformerForConditionalGeneration) -> transformer_spec.TransformerSpec:
    """The CTranslate2 specification of `model`, weights filled in (float32), vocabulary not yet registered."""
    config = model.config
    activation = getattr(common_spec.Activation, ACTIVATIONS[config.activation_function])
    encoder_spec = transformer_spec.TransformerEncoderSpec(
        config.encoder_layers, config.encoder_attention_heads, pre_norm=False, activation=activation
    )
    decoder_spec = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers, config.decoder_attention_heads, pre_norm=False, activation=activation
    )
    encoder, decoder = model.model.encoder, model.model.decoder
    embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0

    _set_embeddings_and_positions(encoder_spec, encoder, embed_scale)
    for layer_spec, layer in zip(encoder_spec.layer, encoder.layers, strict=True):
        _set_attention(layer_spec.self_attention, layer.self_attn, layer.self_attn_layer_norm)
        _set_feed_forward(layer_spec.ffn, layer)

    _set_embeddings_and_positions(decoder_spec, decoder, embed_scale)
    for layer_spec, layer in zip(decoder_spec.layer, decoder.layers, strict=True):
        _set_attention(layer_spec.self_attention, layer.self_attn, layer.self_attn_layer_norm)
        _set_attention(layer_spec.attention, layer.encoder_attn, layer.encoder_attn_layer_norm)
        _set_feed_forward(layer_spec.ffn, layer)
    _set_linear(decoder_spec.projection, model.lm_head)  # tied: the same matrix as the embeddings, no bias

    spec = transformer_spec.TransformerSpec(encoder_spec, decoder_spec)
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    return spec


def vocabulary(model_dir: str | Path, vocab_size: int, side: str = "shared") -> list[str]:
    """Token strings by id from the tokenizer saved in `model_dir`; placeholders `id_<n>` where there are none.
    `side`: "shared" (one vocabulary), or with separate vocabularies "source" (the tokenizer's `get_vocab()`, the
    source side's for Marian and FSMT) or "target" (its id-to-token map, the target side's)."""
    tokens = [f"id_{index}" for index in range(vocab_size)]
    if not any((Path(model_dir) / name).is_file() for name in SAVED_TOKENIZER_FILES):
        warnings.warn(
            f"{model_dir} has no tokenizer ({', '.join(SAVED_TOKENIZER_FILES)}): the export's vocabulary is the "
            f"placeholders id_0 ... id_{vocab_size - 1}, so its users must pass token ids as such; save the tokenizer into the "
            "model folder first to export real tokens",
            stacklevel=2,
        )
    else:
        tokenizer = load_tokenizer(model_dir)
        if side == "source":
            by_id = {index: token for token, index in tokenizer.get_vocab().items() if 0 <= index < vocab_size}
        else:
            ids = list(range(min(len(tokenizer), vocab_size)))
            by_id = dict(zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True))
        for index, token in by_id.items():
            if token is not None:
                tokens[index] = token
    if len(set(tokens)) != len(tokens):
        raise ValueError("The vocabulary has duplicate token strings; CTranslate2 maps tokens by their string.")
    return tokens


class VanillaTransformerConverter(Converter):
    """CTranslate2 converter for a folder written by `VanillaTransformerForConditionalGeneration.save_pretrained`."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = str(model_dir)

    def _load(self) -> transformer_spec.TransformerSpec:
        try:
            model = load_model_folder(self.model_dir, VanillaTransformerForConditionalGeneration, dtype=torch.float32)
        except ModelFolderError as error:
            raise ExportError(str(error)) from error
        config = model.config
        spec = model_spec(model.eval())
        if config.share_encoder_decoder_embeddings:
            source_tokens = tokens = vocabulary(self.model_dir, config.vocab_size)
        else:
            source_tokens = vocabulary(self.model_dir, config.vocab_size, "source")
            tokens = vocabulary(self.model_dir, config.decoder_vocab_size, "target")
        spec.register_source_vocabulary(source_tokens)
        spec.register_target_vocabulary(tokens)
        # a converted Marian model has no bos_token_id and its `<unk>` elsewhere (vanilla_transformer.converters.convert)
        bos_token_id = config.bos_token_id if config.bos_token_id is not None else config.decoder_start_token_id
        spec.config.bos_token = tokens[bos_token_id]
        spec.config.eos_token = tokens[config.eos_token_id]
        spec.config.decoder_start_token = tokens[config.decoder_start_token_id]
        spec.config.unk_token = UNK_TOKEN if UNK_TOKEN in tokens else tokens[UNK_TOKEN_ID]
        return spec


def why_not_an_export(folder: Path) -> str | None:
    """None if `folder` holds a CTranslate2 export and nothing else; else the reason, e.g. "it holds notes.txt"."""
    if not folder.is_dir():
        return "it is not a folder"
    others = sorted(path.name for path in folder.iterdir() if path.name not in CONVERTER_FILES or not path.is_file())
    if others:
        return f"it holds {', '.join(others[:5])}" + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    if not (folder / "model.bin").is_file():
        return "it has no model.bin"
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict) or "model_type" in config or not CONVERTER_CONFIG_KEYS <= config.keys():
        return "its config.json is not CTranslate2's"
    return None


def check_ctranslate2_folders(model_dir: str | Path, output_dir: str | Path, overwrite: bool) -> bool:
    """Raise ExportError unless `model_dir` is a model folder and `output_dir` may be written under the one
    output-folder rule (mechanics/outputs.py): never the model's folder, and with `overwrite` a previous export only.
    True where a previous export will be replaced."""
    if not (Path(model_dir) / "config.json").is_file():
        raise ExportError(f"{model_dir} is not a model folder: it has no config.json")
    return check_output_folder(
        output_dir,
        overwrite=overwrite,
        why_not_previous=why_not_an_export,
        previous="a previous CTranslate2 export",
        inputs=[("the model folder", model_dir)],
        error=ExportError,
    )


def check_exportable(model_dir: str | Path) -> None:
    """Raise ExportError for a model CTranslate2's Transformer cannot hold: it has d_k = d_v = d_model / heads."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    d_v = config["d_model"] // config["encoder_attention_heads"]
    if config.get("qk_head_dim") not in (None, d_v):
        raise ExportError(
            f"{model_dir} has qk_head_dim={config['qk_head_dim']} (d_k) while d_v = d_model / heads = {d_v} "
            "(Table 3, row B): CTranslate2's Transformer has d_k = d_v, so this model cannot be exported"
        )


def convert_to_ctranslate2(
    model_dir: str | Path, output_dir: str | Path, quantization: str | None = None, overwrite: bool = False
) -> str:
    """Convert the model saved in `model_dir` to a CTranslate2 model in `output_dir`; returns `output_dir`.

    quantization: weight type of the written model (e.g. "int8", "int8_float32", "float16"); None keeps float32.
        CTranslate2 can also quantize when it loads: `Translator(output_dir, compute_type="int8")`.
    overwrite: replace `output_dir` if it is a previous CTranslate2 export. ExportError (before anything is written) if
        it is something else, if it exists without `overwrite`, or if it is, holds or is inside `model_dir`, or if the
        model has d_k != d_v.
    """
    replacing = check_ctranslate2_folders(model_dir, output_dir, overwrite)
    check_exportable(model_dir)
    if transformer_spec is None:
        raise ImportError("The export needs CTranslate2: pip install 'vanilla-transformer[export]'.")

    def full_disk(cause: BaseException) -> ExportError:
        return ExportError(
            f"no space left on device while exporting into {output_dir} ({type(cause).__name__}: {str(cause)[:200]}): "
            f"the incomplete export was removed, and {output_dir} is as it was. Free space and export again."
        )

    changed = why_not_an_export if replacing else None  # only what the check found is replaced (staged_folder)
    try:
        with on_full_disk(full_disk), staged_folder(Path(output_dir).resolve(), changed) as staging:
            VanillaTransformerConverter(model_dir).convert(str(staging), quantization=quantization)
    except TargetChanged as error:
        raise ExportError(f"{error.strerror}; the export was not written: export again") from error
    return str(output_dir)
