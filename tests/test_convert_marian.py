"""OPUS-MT (MarianMTModel) folders converted: Marian's logits, tokens, tokenizer, decoding and card kept, and a
config or tokenizer file the model cannot represent refused by name."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import MarianMTModel, MarianTokenizer

from vanilla_transformer.converters.convert import convert
from vanilla_transformer.converters.core import ConversionError
from vanilla_transformer.data.tokenization import load_tokenizer

from .sources import (
    MULTI30K_LIKE,
    NEW_TOKENS,
    SENTENCES,
    TOLERANCE,
    check_same_generation,
    converted_model,
    generated,
    logits_difference,
    padded_batch,
    write_marian,
)


@pytest.fixture(scope="module", params=["swish", "relu"])
def marian(request, marian_vocabulary, tmp_path_factory):
    """(source model, source tokenizer, converted model, converted tokenizer, converted folder) for OPUS-MT."""
    base = tmp_path_factory.mktemp(f"marian_{request.param}")
    source = write_marian(base / "source", marian_vocabulary, activation=request.param)
    output = convert(source, base / "converted")
    return (
        MarianMTModel.from_pretrained(source).eval(),
        MarianTokenizer.from_pretrained(source),
        converted_model(output),
        load_tokenizer(output),
        output,
    )


def edited_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def out_of_range(folder: Path) -> None:
    vocabulary = json.loads((folder / "vocab.json").read_text())
    vocabulary[next(iter(vocabulary))] = 99999
    (folder / "vocab.json").write_text(json.dumps(vocabulary))


def test_converted_opus_mt_gives_marians_logits_within_1e_5_on_a_padded_batch(marian):
    assert logits_difference(marian, padded_batch(marian[1], marian[2])) < TOLERANCE


@pytest.mark.parametrize("num_beams", [1, 4])
def test_converted_opus_mt_generates_marians_tokens(marian, num_beams):
    check_same_generation(marian, marian[1], num_beams)


def test_converted_opus_mt_keeps_marians_tokenizer_ids_and_text(marian):
    _, theirs, _, ours, _ = marian
    assert type(ours).__name__ == "MarianTokenizer"
    expected = theirs(SENTENCES)["input_ids"]
    assert ours(SENTENCES)["input_ids"] == expected
    assert ours(text_target=SENTENCES)["input_ids"] == theirs(text_target=SENTENCES)["input_ids"]
    decoded = theirs.batch_decode(expected, skip_special_tokens=True)
    assert ours.batch_decode(expected, skip_special_tokens=True) == decoded
    assert sum(text == sentence for text, sentence in zip(decoded, SENTENCES, strict=True)) > len(SENTENCES) // 2


def test_converted_opus_mt_tokenizer_loads_in_a_fresh_process_without_asking_to_run_code(marian):
    """load_tokenizer, as the CTranslate2 backend and a library user call it, before any registration of the model
    type: the folder's MarianTokenizer, without AutoTokenizer's question about the folder's custom code."""
    *_, output = marian
    code = "import sys; from vanilla_transformer.data.tokenization import load_tokenizer as f; print(type(f(sys.argv[1])).__name__)"
    result = subprocess.run(
        [sys.executable, "-c", code, str(output)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "MarianTokenizer"
    assert "custom code" not in result.stdout + result.stderr


def test_converted_opus_mt_records_marians_choices_and_decoding(marian):
    _, _, ours, _, folder = marian
    config = ours.config
    assert (config.position_layout, config.position_frequencies, config.position_offset) == ("sin_cos", "paper", 0)
    assert config.lm_head_bias and config.pad_token_id == config.decoder_start_token_id == config.vocab_size - 1
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["num_beams"] == 4 and generation["length_penalty"] == 1.0
    assert generation["forced_eos_token_id"] == 0


def test_the_card_names_the_source_its_license_and_the_conversion(marian):
    card = (marian[4] / "README.md").read_text()  # the source's README.md says cc-by-4.0
    front = card.split("---\n")[1]
    assert 'license: "cc-by-4.0"' in front and 'language: ["en", "de"]' in front
    body = card.split("---\n", 2)[2]
    assert "Marian (OPUS-MT)" in body and "vanilla-transformer convert" in body and "cc-by-4.0" in body
    assert "**source**" in body and str(marian[4].parent) not in body  # the source folder by its name, not its path


def test_the_ctranslate2_export_of_a_converted_opus_mt_decodes_marians_tokens(marian, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2

    source, tokenizer, _, _, folder = marian
    translator = ctranslate2.Translator(convert_to_ctranslate2(folder, tmp_path / "ct2"), intra_threads=1)
    special = json.loads((tmp_path / "ct2" / "config.json").read_text())
    assert special["unk_token"] == "<unk>" and special["decoder_start_token"] == "<pad>"  # Marian's, not ours
    batch = tokenizer(MULTI30K_LIKE[4:8], return_tensors="pt", padding=True)
    expected = generated(source, batch, 1)
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"]) for text in MULTI30K_LIKE[4:8]]
    results = translator.translate_batch(tokens, beam_size=1, max_decoding_length=NEW_TOKENS)
    for result, row in zip(results, expected.tolist(), strict=True):
        ids = tokenizer.convert_tokens_to_ids(result.hypotheses[0])
        until_eos = row[1 : row.index(0)] if 0 in row else row[1:]  # generate() forces </s> (0) at the last step
        assert ids[: len(until_eos)] == until_eos and len(ids) >= len(until_eos)


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"normalize_before": True}, "normalize_before is True"),
        ({"static_position_embeddings": False}, "static_position_embeddings is False"),
        ({"normalize_embedding": True}, "normalize_embedding is True"),
        ({"activation_function": "quick_gelu"}, "activation_function is 'quick_gelu'"),
        ({"vocab_size": 10**9}, "vocab_size is 1000000000"),
        ({"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 10**9}, "decoder_vocab_size is 1000000000"),
        ({"d_model": 0}, "d_model is 0"),
    ],
)
def test_a_marian_config_the_model_cannot_represent_is_refused_naming_the_field(marian_copy, tmp_path, changes, named):
    with pytest.raises(ConversionError, match=named):
        convert(edited_config(marian_copy, **changes), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_every_problem_of_a_marian_config_is_named_at_once_one_a_line(marian_copy, tmp_path):
    changes = {"normalize_before": True, "static_position_embeddings": False, "activation_function": "quick_gelu"}
    with pytest.raises(ConversionError) as refused:
        convert(edited_config(marian_copy, **changes), tmp_path / "out")
    lines = str(refused.value).splitlines()
    assert lines[0] == "the source cannot be converted exactly, for 3 reasons:"
    named = ["normalize_before is True", "static_position_embeddings is False", "activation_function is 'quick_gelu'"]
    assert [[name for name in named if name in line] for line in lines[1:]] == [[name] for name in named]
    assert refused.value.problems == lines[1:]
    assert not (tmp_path / "out").exists()


def test_a_file_that_stops_the_checks_is_named_with_the_problems_found_before_it(marian_copy, tmp_path):
    (marian_copy / "source.spm").unlink()
    with pytest.raises(ConversionError) as refused:
        convert(edited_config(marian_copy, d_model=0, normalize_before=True), tmp_path / "out")
    problems = refused.value.problems
    assert len(problems) == 3 and "d_model is 0" in problems[0] and "normalize_before is True" in problems[1]
    assert problems[2] == f"{marian_copy / 'source.spm'} is missing"


def test_an_output_projection_of_its_own_is_refused(marian_vocabulary, tmp_path):
    source = write_marian(tmp_path / "untied", marian_vocabulary, tie_word_embeddings=False)
    with pytest.raises(ConversionError, match=r"embed_tokens\.weight differ \(Marian.s `tie_word_embeddings: false`"):
        convert(source, tmp_path / "out")


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda folder: (folder / "vocab.json").write_text("[1, 2, 3]"), "vocab.json is not a vocabulary"),
        (lambda folder: (folder / "vocab.json").write_text('"abc"'), "vocab.json is not a vocabulary"),
        (lambda folder: (folder / "vocab.json").write_text("{not json"), "vocab.json is not valid JSON"),
        (lambda folder: (folder / "source.spm").write_bytes(b"no model"), "source.spm is not a SentencePiece model"),
        (out_of_range, "vocab.json has ids outside the model's vocabulary of"),
    ],
    ids=["vocab list", "vocab string", "vocab invalid", "spm garbage", "ids out of range"],
)
def test_broken_opus_mt_tokenizer_files_are_one_error_naming_the_file(marian_source, tmp_path, damage, message):
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    damage(source)
    with pytest.raises(ConversionError, match=message):
        convert(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()
