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

import json
from pathlib import Path

from vanilla_transformer.converters.core import ConversionError, Problems, Source
from vanilla_transformer.converters.transformers_folder import (
    check_config,
    hf_fields,
    load_reference,
    reference_weights,
    transformers_source,
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
        check_marian_vocabulary(folder, config, separate, problems)
    tokenizer = MarianTokenizer.from_pretrained(folder)
    reference, dtype = load_reference(folder, MarianMTModel)
    why = "Marian's `tie_word_embeddings: false`: input embeddings and an lm_head of their own"
    weights = reference_weights(reference, "sin_cos", "paper", 0, why, separate)
    bias = reference.final_logits_bias.detach()[0]
    fields = hf_fields(
        reference.config,
        vocab_size=reference.config.vocab_size,
        position_layout="sin_cos",
        position_frequencies="paper",
        position_offset=0,
        lm_head_bias=bool(bias.any()),
        share_encoder_decoder_embeddings=not separate,
        decoder_vocab_size=reference.config.decoder_vocab_size if separate else None,
    )
    languages = (tokenizer.init_kwargs.get("source_lang"), tokenizer.init_kwargs.get("target_lang"))
    logits_bias = bias if bias.any() else None
    return transformers_source(
        "Marian (OPUS-MT)", folder, fields, weights, tokenizer, reference, dtype, languages, logits_bias
    )


def check_marian_vocabulary(folder: Path, config: dict, separate: bool, problems: Problems) -> None:
    """The folder's MarianTokenizer files size-checked; a problem where the tokenizer's vocabularies (one, or
    `separate_vocabs` with a target_vocab.json) are not the model's (`separate`: share_encoder_decoder_embeddings
    false)."""
    for name in ("source.spm", "target.spm"):
        check_sentencepiece(folder / name, problems)
    settings = read_json_file(folder / "tokenizer_config.json", ConversionError)
    tokenizer_separate = bool(settings.get("separate_vocabs"))
    sizes = {"vocab.json": whole(config.get("vocab_size"))}
    if tokenizer_separate:
        sizes["target_vocab.json"] = whole(config.get("decoder_vocab_size")) or sizes["vocab.json"]
    for name, size in sizes.items():
        check_vocabulary(folder / name, size, problems)
    if tokenizer_separate != separate:
        problems.add(
            f"{folder}: tokenizer_config.json has separate_vocabs {settings.get('separate_vocabs')!r} while "
            f"config.json has share_encoder_decoder_embeddings {not separate!r}: the tokenizer's vocabularies are "
            "not the model's"
        )


def whole(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_sentencepiece(path: Path, problems: Problems) -> None:
    """A problem unless `path` is a SentencePiece model (read with a size limit, parsed by sentencepiece)."""
    import sentencepiece

    content = read_bytes(path)
    try:
        sentencepiece.SentencePieceProcessor(model_proto=content)
    except Exception as error:  # noqa: BLE001 - sentencepiece raises RuntimeError or OSError: said in one line
        problems.add(f"{path} is not a SentencePiece model ({type(error).__name__}: {str(error)[:120]})")


def check_vocabulary(path: Path, size: int | None, problems: Problems) -> None:
    """A problem unless `path` is a JSON object of pieces to ids from 0 to `size` - 1 (the model's vocabulary)."""
    try:
        vocabulary = json.loads(read_bytes(path))
    except ValueError as error:
        problems.add(f"{path} is not valid JSON: {error}")
        return
    if not isinstance(vocabulary, dict) or not all(
        isinstance(piece, str) and isinstance(index, int) and not isinstance(index, bool)
        for piece, index in vocabulary.items()
    ):
        problems.add(f"{path} is not a vocabulary: a JSON object of pieces to whole numbers")
        return
    if size is not None and (outside := sorted(i for i in vocabulary.values() if not 0 <= i < size)):
        problems.add(f"{path} has ids outside the model's vocabulary of {size:,}: {outside[:5]}")
