"""Sources with separate source and target vocabularies (OPUS-MT's `separate_vocabs`, FSMT's two dictionaries)
converted to two embedding matrices that compute, tokenize, export, translate and are described as the source's."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import FSMTConfig, FSMTForConditionalGeneration, FSMTTokenizer, MarianMTModel, MarianTokenizer

from vanilla_transformer.converters.convert import convert
from vanilla_transformer.converters.core import ConversionError
from vanilla_transformer.data.tokenization import load_tokenizer
from vanilla_transformer.data.toy_task import synthetic_translation_pairs

from .sources import (
    HEADS,
    MULTI30K_LIKE,
    NEW_TOKENS,
    SENTENCES,
    SIZES,
    TOLERANCE,
    check_same_generation,
    converted_model,
    fairseq_symbols,
    logits_difference,
    padded_batch,
    scramble,
    train_sentencepiece,
    write_fsmt_tokenizer,
    write_marian,
)


@pytest.fixture(scope="module")
def marian_separate_vocabularies(tmp_path_factory) -> Path:
    """The tokenizer files of an OPUS-MT model with separate vocabularies (MarianTokenizer's `separate_vocabs`): a
    SentencePiece model per language, vocab.json over the source's pieces and target_vocab.json over the target's,
    of another size (</s> 0, <unk> 1, <pad> 2 in both)."""
    folder = tmp_path_factory.mktemp("marian_separate_vocabularies")
    pairs = synthetic_translation_pairs(300, seed=2)
    sides = (
        ("source", [s for s, _ in pairs], 160, "vocab.json"),
        ("target", [t for _, t in pairs], 110, "target_vocab.json"),
    )
    for side, texts, size, vocabulary_file in sides:
        pieces = train_sentencepiece(texts + MULTI30K_LIKE, folder / f"{side}.spm", size)
        vocabulary = {"</s>": 0, "<unk>": 1, "<pad>": 2}
        for piece in pieces:
            vocabulary.setdefault(piece, len(vocabulary)) if piece != "<s>" else None
        (folder / vocabulary_file).write_text(json.dumps(vocabulary, ensure_ascii=False))
    settings = {"source_lang": "en", "target_lang": "de", "separate_vocabs": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    (folder / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n# opus-mt-tc-tiny\n")
    return folder


@pytest.fixture(scope="module")
def fsmt_separate_folder(fairseq_files, tmp_path_factory) -> Path:
    """An FSMT folder with two dictionaries of different sizes, random weights, as the WMT19 models are: their config
    says `tie_word_embeddings: false` (transformers 5 would tie the encoder's embedding to the decoder's otherwise),
    and their weights hold the decoder's input embedding again as its output projection."""
    size = len(fairseq_symbols(fairseq_files[0]))
    target_size = size - 37
    config = FSMTConfig(
        langs=["en", "de"],
        src_vocab_size=size,
        tgt_vocab_size=target_size,
        **SIZES,
        **HEADS,
        max_position_embeddings=128,
        activation_function="relu",
        scale_embedding=True,
        tie_word_embeddings=False,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
    )
    folder = tmp_path_factory.mktemp("fsmt_separate") / "source"
    model = scramble(FSMTForConditionalGeneration(config), seed=2)
    with torch.no_grad():
        model.model.decoder.output_projection.weight.copy_(model.model.decoder.embed_tokens.weight)
    model.save_pretrained(folder)
    write_fsmt_tokenizer(folder, *fairseq_files, target_size=target_size)
    return folder


@pytest.fixture(scope="module")
def marian_separate(marian_separate_vocabularies, tmp_path_factory):
    """The `marian` tuple for an OPUS-MT model with separate vocabularies."""
    base = tmp_path_factory.mktemp("marian_separate")
    target_size = len(json.loads((marian_separate_vocabularies / "target_vocab.json").read_text()))
    source = write_marian(
        base / "source",
        marian_separate_vocabularies,
        share_encoder_decoder_embeddings=False,
        decoder_vocab_size=target_size,
        pad_token_id=2,
        decoder_start_token_id=2,
    )
    output = convert(source, base / "converted")
    return (
        MarianMTModel.from_pretrained(source).eval(),
        MarianTokenizer.from_pretrained(source),
        converted_model(output),
        load_tokenizer(output),
        output,
    )


@pytest.fixture(scope="module")
def fsmt_separate(fsmt_separate_folder, tmp_path_factory):
    output = convert(fsmt_separate_folder, tmp_path_factory.mktemp("fsmt_separate_converted") / "converted")
    return (
        FSMTForConditionalGeneration.from_pretrained(fsmt_separate_folder).eval(),
        FSMTTokenizer.from_pretrained(fsmt_separate_folder),
        converted_model(output),
        load_tokenizer(output),
        output,
    )


@pytest.fixture(scope="module", params=["marian", "fsmt"])
def separate(request, marian_separate, fsmt_separate):
    return {"marian": marian_separate, "fsmt": fsmt_separate}[request.param]


def test_separate_vocabularies_convert_to_separate_matrices_of_the_sources_sizes(separate):
    source, _, ours, _, _ = separate
    source_size, target_size = (
        (source.config.vocab_size, source.config.decoder_vocab_size)
        if isinstance(source, MarianMTModel)
        else (source.config.src_vocab_size, source.config.tgt_vocab_size)
    )
    assert source_size != target_size
    config = ours.config
    assert not config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    assert (config.vocab_size, config.decoder_vocab_size) == (source_size, target_size)
    assert ours.model.encoder.embed_tokens.weight.shape[0] == source_size
    assert ours.lm_head.weight.data_ptr() == ours.model.decoder.embed_tokens.weight.data_ptr()


def test_separate_vocabularies_give_the_sources_logits_within_1e_5_on_a_padded_batch(separate):
    assert logits_difference(separate, padded_batch(separate[1], separate[2])) < TOLERANCE


@pytest.mark.parametrize("num_beams", [1, 4])
def test_separate_vocabularies_generate_the_sources_tokens(separate, num_beams):
    check_same_generation(separate, separate[1], num_beams)


def test_separate_vocabularies_keep_the_sources_ids_for_text_and_text_target(separate):
    _, theirs, _, ours, _ = separate
    assert type(ours) is type(theirs)
    assert ours(SENTENCES)["input_ids"] == theirs(SENTENCES)["input_ids"]
    targets = ours(text_target=SENTENCES)["input_ids"]
    assert targets == theirs(text_target=SENTENCES)["input_ids"]
    if isinstance(
        theirs, MarianTokenizer
    ):  # its target side reads the other vocabulary (FSMT's encodes as the source)
        assert targets != ours(SENTENCES)["input_ids"]
    assert ours.batch_decode(targets, skip_special_tokens=True) == theirs.batch_decode(
        targets, skip_special_tokens=True
    )


@pytest.mark.parametrize("num_beams", [1, 4])
def test_separate_vocabularies_translate_through_ctranslate2_as_the_converted_model(separate, tmp_path, num_beams):
    """The export writes the tokenizer's source and target vocabularies; the CTranslate2 backend reads the sources
    through the one and its translations through the other, and gives generate()'s ids (the same lengths)."""
    pytest.importorskip("ctranslate2")
    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2
    from vanilla_transformer.serving.ctranslate2_backend import CTranslate2Backend

    _, _, ours, tokenizer, folder = separate
    export = convert_to_ctranslate2(folder, tmp_path / "ct2")
    backend = CTranslate2Backend(folder, tokenizer, export, num_beams=num_beams, max_new_tokens=NEW_TOKENS)
    backend.options["min_decoding_length"] = NEW_TOKENS  # both decode NEW_TOKENS tokens: no early end to compare
    backend.forced_end = False  # nor a forced </s> in the last place
    texts, _ = backend.translate(backend.encode(MULTI30K_LIKE[4:10]))
    batch = tokenizer(MULTI30K_LIKE[4:10], return_tensors="pt", padding=True)
    with torch.inference_mode():
        expected = ours.generate(
            **batch,
            num_beams=num_beams,
            min_new_tokens=NEW_TOKENS,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            length_penalty=1.0,
            forced_eos_token_id=None,
            bad_words_ids=None,
            renormalize_logits=True,
        )
    assert texts == tokenizer.batch_decode(expected, skip_special_tokens=True)
    assert len(set(texts)) > 1


def test_separate_vocabularies_translate_the_same_through_the_pipeline_translate_and_the_demo(separate):
    """Downstream of the conversion: the pipeline, `translate`'s library function and the demo give generate()'s
    text for a folder with two vocabularies."""
    from pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline
    from vanilla_transformer.serving.demo import load_translator, translate_text
    from vanilla_transformer.serving.translate import load_model_and_tokenizer, translate_sentences

    _, _, _, _, folder = separate
    model, tokenizer = load_model_and_tokenizer(folder)
    sentences = MULTI30K_LIKE[4:7]
    with torch.inference_mode():
        ids = model.generate(**tokenizer(sentences, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=8)
    expected = tokenizer.batch_decode(ids, skip_special_tokens=True)
    assert translate_sentences(model, tokenizer, sentences, num_beams=1, max_new_tokens=8) == expected
    pipeline = VanillaTransformerTranslationPipeline(model=model, tokenizer=tokenizer, device=-1)
    assert [pipeline(text, num_beams=1, max_new_tokens=8)[0]["translation_text"] for text in sentences] == expected
    translator = load_translator(str(folder))
    translator.model.generation_config.max_new_tokens = 8
    assert translate_text(translator, "\n".join(sentences), 1, 1.0)[0].splitlines() == expected


def test_the_card_of_separate_vocabularies_gives_both_sizes(separate):
    _, _, ours, _, folder = separate
    card = (folder / "README.md").read_text()
    config = ours.config
    assert f"| vocabularies (source / target) | {config.vocab_size} / {config.decoder_vocab_size} tokens |" in card
    assert "shared vocabulary" not in card and "separate source and target vocabularies" in card


def test_a_tokenizer_whose_vocabularies_are_not_the_models_is_refused_naming_the_fields(marian_copy, tmp_path):
    settings = json.loads((marian_copy / "tokenizer_config.json").read_text())
    (marian_copy / "tokenizer_config.json").write_text(json.dumps({**settings, "separate_vocabs": True}))
    shutil.copy(marian_copy / "vocab.json", marian_copy / "target_vocab.json")
    with pytest.raises(ConversionError, match="separate_vocabs True while config.json has share_encoder_decoder"):
        convert(marian_copy, tmp_path / "out")
