"""OPUS-MT folders (transformers' `MarianMTModel`), local or from the Hub.

Marian's choices, recorded in the converted config.json: sines first in the position table (`sin_cos`), the paper's
frequencies from position 0, usually the swish activation, and a `final_logits_bias`. Refused: separate source and
target vocabularies (`share_encoder_decoder_embeddings: false`, a `decoder_vocab_size` of its own, a
target_vocab.json), an lm_head of its own, and every field of `CONFIG_REFUSALS` of another value.

The tokenizer stays transformers' `MarianTokenizer` (source.spm, target.spm, vocab.json): a `tokenizers` fast
tokenizer cannot be exact, as Marian encodes with the source language's SentencePiece model, decodes with the target
language's, and maps pieces to ids through its own vocab.json (transformers has no fast Marian tokenizer for this
reason).
"""

from pathlib import Path

from vanilla_transformer.converters.core import (
    ConversionError,
    Source,
    check_activation,
    check_position_tables,
    one_embedding,
    refuse,
)
from vanilla_transformer.converters.transformers_folder import (
    CONFIG_REFUSALS,
    hf_fields,
    hf_sizes,
    hf_weights,
    load_reference,
    source_decoding,
)
from vanilla_transformer.converters.untrusted import check_sizes, read_bytes, read_json


def read_marian(folder: Path, config: dict) -> Source:
    """An OPUS-MT (MarianMTModel) folder: its config checked, its model loaded by transformers, its tokenizer."""
    from transformers import MarianConfig, MarianMTModel

    where = str(folder / "config.json")
    check_sizes(hf_sizes(config, MarianConfig), where)
    refuse(config, CONFIG_REFUSALS, where)
    if config.get("decoder_vocab_size") not in (None, config.get("vocab_size", MarianConfig.vocab_size)):
        raise ConversionError(
            f"{where}: decoder_vocab_size is {config['decoder_vocab_size']!r} and vocab_size "
            f"{config.get('vocab_size')!r}: separate source and target vocabularies; the paper's model has one"
        )
    check_activation(config.get("activation_function", MarianConfig.activation_function), where)
    tokenizer = marian_tokenizer(folder)
    reference = load_reference(folder, MarianMTModel)
    layers, embeddings, positions = hf_weights(reference)
    check_position_tables(positions, reference.config.d_model, "sin_cos", "paper", 0)
    bias = reference.final_logits_bias.detach()[0]
    fields = hf_fields(
        reference.config, vocab_size=reference.config.vocab_size, position_layout="sin_cos",
        position_frequencies="paper", position_offset=0,
        lm_head_bias=bool(bias.any()),
    )  # fmt: skip
    why = "Marian's `tie_word_embeddings: false`: input embeddings and an lm_head of their own"
    languages = (tokenizer.init_kwargs.get("source_lang"), tokenizer.init_kwargs.get("target_lang"))
    return Source(
        "Marian (OPUS-MT)", str(folder), fields, layers, one_embedding(embeddings, why), tokenizer, reference,
        logits_bias=bias if bias.any() else None, decoding=source_decoding(reference), languages=languages,
    )  # fmt: skip


def marian_tokenizer(folder: Path):
    """The folder's MarianTokenizer (its files size-checked); refused with separate source and target vocabularies."""
    from transformers import MarianTokenizer

    for name in ("source.spm", "target.spm", "vocab.json"):
        read_bytes(folder / name)
    settings = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    if settings.get("separate_vocabs") or (folder / "target_vocab.json").is_file():
        raise ConversionError(
            f"{folder}: tokenizer_config.json has separate_vocabs {settings.get('separate_vocabs')!r} (or the folder "
            "has a target_vocab.json): separate source and target vocabularies; the paper's model has one"
        )
    return MarianTokenizer.from_pretrained(folder)
