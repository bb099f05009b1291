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

from vanilla_transformer.converters.core import FSMT_TOKENIZER_FILES, Problems, Source
from vanilla_transformer.converters.transformers_folder import (
    check_config,
    hf_fields,
    load_reference,
    reference_weights,
    source_decoding,
)
from vanilla_transformer.converters.untrusted import read_bytes


def read_fsmt(folder: Path, config: dict) -> Source:
    """An FSMT folder: its config and tokenizer files checked (one ConversionError naming every problem found), its
    model loaded by transformers, its tokenizer."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration, FSMTTokenizer

    where = str(folder / "config.json")
    with Problems() as problems:
        sizes = check_config(config, FSMTConfig, where, problems, "src_vocab_size")
        target_size = config.get("tgt_vocab_size", FSMTConfig.tgt_vocab_size)
        if target_size != sizes["vocab_size"]:
            problems.add(
                f"{where}: src_vocab_size is {sizes['vocab_size']!r} and tgt_vocab_size {target_size!r}: separate "
                "source and target vocabularies (dictionaries); the paper's model has one"
            )
        check_fsmt_vocabularies(folder, problems)
    tokenizer = FSMTTokenizer.from_pretrained(folder)
    reference, dtype = load_reference(folder, FSMTForConditionalGeneration)
    pad = reference.config.pad_token_id
    why = "FSMT's `tie_word_embeddings: false`, with embeddings or an output projection of their own"
    layers, embedding = reference_weights(reference, "sin_cos", "fairseq", pad + 1, why)
    fields = hf_fields(
        reference.config, vocab_size=sizes["vocab_size"], position_layout="sin_cos", position_frequencies="fairseq",
        position_offset=pad + 1, lm_head_bias=False,
    )  # fmt: skip
    return Source(
        "FSMT", str(folder), fields, layers, embedding, tokenizer, reference,
        decoding=source_decoding(reference), languages=(tokenizer.src_lang, tokenizer.tgt_lang), dtype=dtype,
    )  # fmt: skip


def check_fsmt_vocabularies(folder: Path, problems: Problems) -> None:
    """The folder's FSMTTokenizer files size-checked; a problem when its source and target vocabularies differ."""
    vocabularies = [json.loads(read_bytes(folder / name)) for name in FSMT_TOKENIZER_FILES[:2]]
    read_bytes(folder / "merges.txt")
    if vocabularies[0] != vocabularies[1]:
        differing = sorted(set(vocabularies[0].items()) ^ set(vocabularies[1].items()))[:1]
        problems.add(
            f"{folder}: vocab-src.json and vocab-tgt.json differ (e.g. {differing[0][0]!r}): separate source and "
            "target dictionaries; the paper's model has one vocabulary"
        )
