"""FSMT folders (transformers' port of fairseq's WMT models), local or from the Hub.

FSMT's choices, as fairseq's: sines first in the position table (`sin_cos`), fairseq's frequencies, positions from
padding id + 1, no logits bias. Refused: separate source and target vocabularies (`src_vocab_size` !=
`tgt_vocab_size`, vocab-src.json != vocab-tgt.json), embeddings or an output projection of their own, and every field
of `CONFIG_REFUSALS` of another value.

The tokenizer stays transformers' `FSMTTokenizer` (vocab-src.json, vocab-tgt.json, merges.txt): Moses punctuation
normalization and tokenization (sacremoses), then subword-nmt BPE, whose rules have no `tokenizers` equivalent.
"""

import json
from pathlib import Path

from vanilla_transformer.converters.core import (
    FSMT_TOKENIZER_FILES,
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
from vanilla_transformer.converters.untrusted import check_sizes, read_bytes


def read_fsmt(folder: Path, config: dict) -> Source:
    """An FSMT folder: its config checked, its model loaded by transformers, its tokenizer."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    where = str(folder / "config.json")
    sizes = hf_sizes(config, FSMTConfig, "src_vocab_size")
    check_sizes(sizes, where)
    refuse(config, CONFIG_REFUSALS, where)
    target_size = config.get("tgt_vocab_size", FSMTConfig.tgt_vocab_size)
    if target_size != sizes["vocab_size"]:
        raise ConversionError(
            f"{where}: src_vocab_size is {sizes['vocab_size']!r} and tgt_vocab_size {target_size!r}: separate source "
            "and target vocabularies (dictionaries); the paper's model has one"
        )
    check_activation(config.get("activation_function", FSMTConfig.activation_function), where)
    tokenizer = fsmt_tokenizer(folder)
    reference = load_reference(folder, FSMTForConditionalGeneration)
    pad = reference.config.pad_token_id
    layers, embeddings, positions = hf_weights(reference)
    check_position_tables(positions, reference.config.d_model, "sin_cos", "fairseq", pad + 1)
    fields = hf_fields(
        reference.config, vocab_size=sizes["vocab_size"], position_layout="sin_cos", position_frequencies="fairseq",
        position_offset=pad + 1, lm_head_bias=False,
    )  # fmt: skip
    why = "FSMT's `tie_word_embeddings: false`, with embeddings or an output projection of their own"
    return Source(
        "FSMT", str(folder), fields, layers, one_embedding(embeddings, why), tokenizer, reference,
        decoding=source_decoding(reference), languages=(tokenizer.src_lang, tokenizer.tgt_lang),
    )  # fmt: skip


def fsmt_tokenizer(folder: Path):
    """The folder's FSMTTokenizer (its files size-checked); refused when its source and target vocabularies differ."""
    from transformers import FSMTTokenizer

    vocabularies = [json.loads(read_bytes(folder / name)) for name in FSMT_TOKENIZER_FILES[:2]]
    read_bytes(folder / "merges.txt")
    if vocabularies[0] != vocabularies[1]:
        differing = sorted(set(vocabularies[0].items()) ^ set(vocabularies[1].items()))[:1]
        raise ConversionError(
            f"{folder}: vocab-src.json and vocab-tgt.json differ (e.g. {differing[0][0]!r}): separate source and "
            "target dictionaries; the paper's model has one vocabulary"
        )
    return FSMTTokenizer.from_pretrained(folder)
