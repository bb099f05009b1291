"""What the converters of Marian (marian.py) and FSMT (fsmt.py) folders share, both formats being transformers models.

The config fields that name an architecture other than the paper's, the sizes and fields of a config, the weights
under fairseq's names, the model loaded as the reference, and the decoding settings a converted folder keeps.
"""

import pickle
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn

from configuration_vanilla_transformer import ACTIVATION_FUNCTIONS
from vanilla_transformer.converters.core import (
    ConversionError,
    Problems,
    Source,
    check_position_tables,
    one_embedding,
    refuse,
)
from vanilla_transformer.converters.untrusted import SIZE_LIMITS, check_sizes
from vanilla_transformer.model.loading import ModelFolderError, load_model_folder

# Fields of a transformers config whose other value names an architecture our model does not have:
# field -> (the value it must have, what another value means)
CONFIG_REFUSALS = {
    "normalize_before": (False, "pre-LN layers (LayerNorm before each sub-layer)"),
    "encoder_normalize_before": (False, "pre-LN encoder layers"),
    "decoder_normalize_before": (False, "pre-LN decoder layers"),
    "add_final_layer_norm": (False, "a LayerNorm after each stack"),
    "normalize_embedding": (False, "a LayerNorm on the embeddings"),
    "layernorm_embedding": (False, "a LayerNorm on the embeddings"),
    "static_position_embeddings": (True, "learned positions"),
}
# the decoding settings of a source's generation config that the converted folder keeps
DECODING_FIELDS = (
    "num_beams",
    "length_penalty",
    "early_stopping",
    "max_length",
    "min_length",
    "no_repeat_ngram_size",
    "repetition_penalty",
    "bad_words_ids",
    "forced_eos_token_id",
    "renormalize_logits",
)


def hf_sizes(
    config: dict, config_class, vocab_field: str = "vocab_size", target_field: str | None = None
) -> dict[str, Any]:
    """The sizes of a transformers config.json (the class's defaults where a field is left out); with separate
    vocabularies, `decoder_vocab_size` from `target_field`."""
    value = lambda name: config.get(name, getattr(config_class, name, None))  # noqa: E731
    sizes = {name: value(name) for name in SIZE_LIMITS if name != "vocab_size"}
    sizes["vocab_size"] = value(vocab_field)
    if target_field is not None:
        sizes["decoder_vocab_size"] = value(target_field) or sizes["vocab_size"]
    return sizes


def check_config(
    config: dict,
    config_class,
    where: str,
    problems: Problems,
    vocab_field: str = "vocab_size",
    separate: bool = False,
    target_field: str = "decoder_vocab_size",
) -> dict[str, Any]:
    """A transformers config.json's sizes (`hf_sizes`, the target vocabulary's from `target_field` where `separate`);
    a problem for each size out of bounds (`check_sizes`), each field of CONFIG_REFUSALS of another value, and an
    activation the model does not have."""
    sizes = hf_sizes(config, config_class, vocab_field, target_field if separate else None)
    check_sizes(sizes, where, problems)
    refuse(config, CONFIG_REFUSALS, where, problems)
    activation = config.get("activation_function", config_class.activation_function)
    if activation not in ACTIVATION_FUNCTIONS:
        problems.add(
            f"{where}: activation_function is {activation!r}; the model has {', '.join(ACTIVATION_FUNCTIONS)}"
        )
    return sizes


def hf_fields(config, **choices) -> dict[str, Any]:
    """Our config's fields from a loaded transformers Marian or FSMT config, plus the implementation's `choices`."""
    names = [name for name in SIZE_LIMITS if name != "vocab_size"]
    names += ["activation_function", "dropout", "attention_dropout", "activation_dropout", "scale_embedding"]
    names += ["pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_eos_token_id"]
    fields = {name: getattr(config, name) for name in names}
    return {
        **fields,
        "position_embedding_type": "sinusoidal",
        "tie_word_embeddings": True,
        "layer_norm_eps": 1e-5,
        **choices,
    }


def hf_weights(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A transformers model's tensors under fairseq's names ("model." dropped): layers, embeddings, position tables."""
    layers, embeddings, positions = {}, {}, {}
    for key, tensor in model.state_dict().items():
        name = key.removeprefix("model.")
        if (
            name.endswith(("embed_tokens.weight", "shared.weight", "output_projection.weight"))
            or name == "lm_head.weight"
        ):
            embeddings[name] = tensor
        elif name.endswith("embed_positions.weight"):
            positions[name] = tensor
        elif name != "final_logits_bias":
            layers[name] = tensor
    return layers, embeddings, positions


def reference_weights(
    reference: nn.Module, layout: str, frequencies: str, offset: int, why: str, separate: bool = False
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor | None]:
    """The source model's layers under fairseq's names, its one embedding matrix, and None; with `separate`
    vocabularies its encoder's matrix and its decoder's (the decoder's input and the output projection). One
    ConversionError naming the position tables that are not the sinusoids of `layout`, `frequencies` and `offset`,
    and embeddings that differ where the model has one matrix (`why`: the source's field that allows it)."""
    layers, embeddings, positions = hf_weights(reference)
    with Problems() as problems:
        check_position_tables(positions, reference.config.d_model, layout, frequencies, offset, problems)
        if not separate:
            return layers, one_embedding(embeddings, why, problems), None
        encoder = {name: tensor for name, tensor in embeddings.items() if name.startswith("encoder.")}
        decoder = {name: tensor for name, tensor in embeddings.items() if not name.startswith("encoder.")}
        embedding = one_embedding(encoder, why, problems, "the encoder input")
        decoder_embedding = one_embedding(decoder, why, problems, "the decoder input and the output projection")
    return layers, embedding, decoder_embedding


def load_reference(folder: Path, model_class) -> tuple[nn.Module, torch.dtype]:
    """The source model as transformers runs it (safetensors, or torch.load with weights_only=True), in float32 (which
    holds float16 and bfloat16 values exactly), and the dtype of its weights; refused when its weights lack tensors
    its config.json describes (transformers would make them up) or hold ones it has no place for (transformers would
    drop them)."""
    try:
        model = load_model_folder(folder, model_class, dtype="auto", weights_only=True)
    except ModelFolderError as error:
        raise ConversionError(str(error)) from None
    except OSError as error:  # no weights file, or one transformers cannot read
        raise ConversionError(f"cannot load the weights of {folder}: {error}") from None
    except SafetensorError as error:  # a header that lies about the data, or is no header
        raise ConversionError(f"{folder / 'model.safetensors'} is not readable safetensors: {error}") from None
    except ValueError as error:  # a config.json transformers cannot build its model from
        raise ConversionError(
            f"{folder / 'config.json'}: transformers cannot build the source model: {error}"
        ) from None
    except pickle.UnpicklingError as error:  # torch.load(weights_only=True) met an object that is not a tensor
        reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else "a pickle that is not weights"
        raise ConversionError(
            f"{folder}: its pytorch_model.bin holds more than tensors ({reason}); it was not unpickled. Give a "
            "folder with model.safetensors, or weights saved with torch.save(state_dict)"
        ) from None
    dtype = model.dtype
    return model.float().eval(), dtype


def source_decoding(reference: nn.Module) -> dict[str, Any]:
    """The decoding settings of the source model's generation config that a converted folder keeps (DECODING_FIELDS):
    it then decodes as the source does. num_beams, length_penalty and early_stopping always (transformers' defaults
    where the source sets none, rather than the paper's beam 4 and length penalty 0.6)."""
    generation = reference.generation_config
    decoding = {name: getattr(generation, name, None) for name in DECODING_FIELDS}
    decoding = {name: value for name, value in decoding.items() if value is not None}
    decoding.setdefault("num_beams", 1)
    decoding.setdefault("length_penalty", 1.0)
    decoding.setdefault("early_stopping", False)
    return decoding


def transformers_source(
    kind: str,
    folder: Path,
    fields: dict[str, Any],
    weights: tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor | None],
    tokenizer: Any,
    reference: nn.Module,
    dtype: torch.dtype,
    languages: tuple[str | None, str | None],
    logits_bias: torch.Tensor | None = None,
) -> Source:
    """A transformers folder read for conversion: our config's `fields`, the `weights` of `reference_weights`, its
    tokenizer and reference model, and the decoding settings of its generation config (`source_decoding`)."""
    layers, embedding, decoder_embedding = weights
    return Source(
        kind,
        str(folder),
        fields,
        layers,
        embedding,
        tokenizer,
        reference,
        logits_bias=logits_bias,
        decoder_embedding=decoder_embedding,
        decoding=source_decoding(reference),
        languages=languages,
        dtype=dtype,
    )
