"""OPUS-MT folders (transformers' `MarianMTModel`), local or from the Hub.

Marian's choices, recorded in the converted config.json: sines first in the position table (`sin_cos`), the paper's
frequencies from position 0, usually the swish activation, and a `final_logits_bias`. Separate source and target
vocabularies (`share_encoder_decoder_embeddings: false`, a `decoder_vocab_size` of its own, MarianTokenizer's
`separate_vocabs` with a target_vocab.json) are our config's same fields. Refused: an lm_head of its own, and every
field of `CONFIG_REFUSALS` of another value.

The tokenizer stays transformers' `MarianTokenizer` (source.spm, target.spm, vocab.json): a `tokenizers` fast
tokenizer cannot be exact, as Marian encodes with the source language's SentencePiece model, decodes with the target
language's, and maps pieces to ids through its own vocab.json (transformers has no fast Marian tokenizer for this
reason).
"""

from pathlib import Path

from vanilla_transformer.converters.core import ConversionError, Problems, Source
from vanilla_transformer.converters.transformers_folder import (
    check_config,
    hf_fields,
    load_reference,
    reference_weights,
    source_decoding,
)
from vanilla_transformer.converters.untrusted import read_bytes
from vanilla_transformer.model.loading import read_json_file


def read_marian(folder: Path, config: dict) -> Source:
    """An OPUS-MT (MarianMTModel) folder: its config and tokenizer files checked (one ConversionError naming every
    problem found), its model loaded by transformers, its tokenizer."""
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    where = str(folder / "config.json")
    with Problems() as problems:
        separate = config.get("share_encoder_decoder_embeddings") is False
        check_config(config, MarianConfig, where, problems, separate=separate)
        check_marian_vocabulary(folder, separate, problems)
    tokenizer = MarianTokenizer.from_pretrained(folder)
    reference, dtype = load_reference(folder, MarianMTModel)
    why = "Marian's `tie_word_embeddings: false`: input embeddings and an lm_head of their own"
    layers, embedding, decoder_embedding = reference_weights(reference, "sin_cos", "paper", 0, why, separate)
    bias = reference.final_logits_bias.detach()[0]
    fields = hf_fields(
        reference.config, vocab_size=reference.config.vocab_size, position_layout="sin_cos",
        position_frequencies="paper", position_offset=0,
        lm_head_bias=bool(bias.any()), share_encoder_decoder_embeddings=not separate,
        decoder_vocab_size=reference.config.decoder_vocab_size if separate else None,
    )  # fmt: skip
    languages = (tokenizer.init_kwargs.get("source_lang"), tokenizer.init_kwargs.get("target_lang"))
    return Source(
        "Marian (OPUS-MT)", str(folder), fields, layers, embedding, tokenizer, reference,
        logits_bias=bias if bias.any() else None, decoder_embedding=decoder_embedding,
        decoding=source_decoding(reference), languages=languages, dtype=dtype,
    )  # fmt: skip


def check_marian_vocabulary(folder: Path, separate: bool, problems: Problems) -> None:
    """The folder's MarianTokenizer files size-checked; a problem where the tokenizer's vocabularies (one, or
    `separate_vocabs` with a target_vocab.json) are not the model's (`separate`: share_encoder_decoder_embeddings
    false)."""
    for name in ("source.spm", "target.spm", "vocab.json"):
        read_bytes(folder / name)
    settings = read_json_file(folder / "tokenizer_config.json", ConversionError)
    tokenizer_separate = bool(settings.get("separate_vocabs"))
    if tokenizer_separate:
        read_bytes(folder / "target_vocab.json")
    if tokenizer_separate != separate:
        problems.add(
            f"{folder}: tokenizer_config.json has separate_vocabs {settings.get('separate_vocabs')!r} while "
            f"config.json has share_encoder_decoder_embeddings {not separate!r}: the tokenizer's vocabularies are "
            "not the model's"
        )
