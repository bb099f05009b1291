"""A converted OPUS-MT folder's tokenizer as the one `tokenizer.json` that transformers.js and `tokenizers` read.

The folder's tokenizer is transformers' MarianTokenizer (source.spm, target.spm, vocab.json). The `tokenizer.json` is
a Unigram model over vocab.json's ids, scored by the source language's SentencePiece model and normalised as it
normalises (transformers' SpmConverter builds that part), `</s>` appended. Pieces of vocab.json that the source model
lacks (the target language's) get a score below any segmentation of the source model's own, so encoding never picks
them. The result is checked to give the folder's ids on the check sentences, or refused.
"""

from __future__ import annotations

import json

SPECIAL = ("</s>", "<unk>", "<pad>")


def marian_tokenizer_json(tokenizer, sentences: list[str], error: type[Exception]):
    """The `tokenizers.Tokenizer` of a MarianTokenizer (the module docstring); `error` if it encodes `sentences`
    otherwise than the MarianTokenizer does."""
    from tokenizers import Tokenizer, processors
    from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf

    proto = import_protobuf().ModelProto()
    with open(tokenizer.spm_files[0], "rb") as file:
        proto.ParseFromString(file.read())
    scores = {piece.piece: piece.score for piece in proto.pieces}
    floor = min(scores.values()) * 100 - 1000  # below any segmentation of a source sentence into its own pieces
    by_id = {index: token for token, index in tokenizer.encoder.items()}
    vocab = [(by_id[index], scores.get(by_id[index], floor)) for index in range(len(by_id))]
    built = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    content = json.loads(built.to_str())
    content["model"]["unk_id"] = tokenizer.encoder[tokenizer.unk_token]
    built = Tokenizer.from_str(json.dumps(content))
    built.add_special_tokens([token for token in SPECIAL if token in tokenizer.encoder])
    eos = tokenizer.eos_token
    built.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}", pair=f"$A $B {eos}", special_tokens=[(eos, tokenizer.encoder[eos])]
    )
    expected = tokenizer(sentences, verbose=False)["input_ids"]
    got = [encoding.ids for encoding in built.encode_batch(sentences)]
    differ = sum(a != b for a, b in zip(got, expected, strict=True))
    if differ:
        raise error(
            f"the tokenizer.json made from the folder's MarianTokenizer gives other ids on {differ} of "
            f"{len(sentences)} check sentences: the export would translate other tokens; it was not written"
        )
    return built


def converted_tokenizer_config(tokenizer) -> dict:
    """tokenizer_config.json for the converted tokenizer: its special tokens, length and languages."""
    return {
        "eos_token": tokenizer.eos_token,
        "unk_token": tokenizer.unk_token,
        "pad_token": tokenizer.pad_token,
        "model_max_length": tokenizer.model_max_length,
        "source_lang": tokenizer.init_kwargs.get("source_lang"),
        "target_lang": tokenizer.init_kwargs.get("target_lang"),
    }
