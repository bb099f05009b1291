"""FSMT folders (transformers' port of fairseq's WMT models), local or from the Hub.

FSMT's choices, as fairseq's: sines first in the position table (`sin_cos`), fairseq's frequencies, positions from
padding id + 1, no logits bias. Separate source and target dictionaries (`src_vocab_size` != `tgt_vocab_size`, or
vocab-src.json != vocab-tgt.json: the WMT19 models) become our config's `share_encoder_decoder_embeddings: false`
with a `decoder_vocab_size`; the decoder's input and output projection stay one matrix. Refused: embeddings or an
output projection of their own beyond that, and every field of `CONFIG_REFUSALS` of another value.

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
    transformers_source,
)
from vanilla_transformer.converters.untrusted import read_bytes


def read_fsmt(folder: Path, config: dict) -> Source:
    """An FSMT folder: its config and tokenizer files checked (one ConversionError naming every problem found), its
    model loaded by transformers, its tokenizer."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration, FSMTTokenizer

    where = str(folder / "config.json")
    with Problems() as problems:
        different_files = fsmt_vocabularies_differ(folder)
        source_size = config.get("src_vocab_size", FSMTConfig.src_vocab_size)
        separate = different_files or config.get("tgt_vocab_size", FSMTConfig.tgt_vocab_size) != source_size
        sizes = check_config(config, FSMTConfig, where, problems, "src_vocab_size", separate, "tgt_vocab_size")
    tokenizer = FSMTTokenizer.from_pretrained(folder)
    reference, dtype = load_reference(folder, FSMTForConditionalGeneration)
    pad = reference.config.pad_token_id
    why = "FSMT's `tie_word_embeddings: false`, with embeddings or an output projection of their own"
    weights = reference_weights(reference, "sin_cos", "fairseq", pad + 1, why, separate)
    fields = hf_fields(
        reference.config,
        vocab_size=sizes["vocab_size"],
        position_layout="sin_cos",
        position_frequencies="fairseq",
        position_offset=pad + 1,
        lm_head_bias=False,
        share_encoder_decoder_embeddings=not separate,
        decoder_vocab_size=sizes.get("decoder_vocab_size"),
    )
    languages = (tokenizer.src_lang, tokenizer.tgt_lang)
    return transformers_source("FSMT", folder, fields, weights, tokenizer, reference, dtype, languages)


def fsmt_vocabularies_differ(folder: Path) -> bool:
    """The folder's FSMTTokenizer files size-checked; whether its source and target vocabularies differ."""
    vocabularies = [json.loads(read_bytes(folder / name)) for name in FSMT_TOKENIZER_FILES[:2]]
    read_bytes(folder / "merges.txt")
    return vocabularies[0] != vocabularies[1]
