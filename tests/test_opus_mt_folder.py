"""A converted folder whose config.json, tokenizer_config.json and generation_config.json are set as OPUS-MT's are
(beam 4, a max_length, bad_words_ids [[pad]], the decoder starting at pad, clean_up_tokenization_spaces true): it
decodes as its source does in every command, its card says how, it keeps the source's dtype, and `--evaluate_only`
scores it as it decodes."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from safetensors import safe_open
from transformers import GenerationConfig, MarianMTModel

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline, length_arguments
from vanilla_transformer.commands.arguments import parse_training_arguments
from vanilla_transformer.commands.convert import main as convert_main
from vanilla_transformer.converters.convert import convert
from vanilla_transformer.data.batching import TranslationCollator
from vanilla_transformer.hub.model_folder import paper_generation_config
from vanilla_transformer.serving.demo import Translator, translate_text
from vanilla_transformer.serving.translate import load_model_and_tokenizer, translate_sentences
from vanilla_transformer.training.evaluation import decoding_used, evaluation_loader, translate_for_evaluation

from .sources import write_marian

MAX_LENGTH = 40  # the folder's length (OPUS-MT's is 512): under section 6.1's input + 50 for the sentences here
SENTENCE = "A dog runs through the snow."


def opus_mt_settings(folder: Path, **generation) -> Path:
    """Set `folder`'s generation_config.json and tokenizer_config.json as OPUS-MT's are."""
    config = json.loads((folder / "config.json").read_text())
    pad = config["pad_token_id"]
    generation_config = {
        "bad_words_ids": [[pad]],
        "bos_token_id": 0,
        "decoder_start_token_id": pad,
        "eos_token_id": 0,
        "forced_eos_token_id": 0,
        "max_length": MAX_LENGTH,
        "num_beams": 4,
        "pad_token_id": pad,
        "renormalize_logits": True,
        **generation,
    }
    (folder / "generation_config.json").write_text(json.dumps(generation_config))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["clean_up_tokenization_spaces"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder


@pytest.fixture(scope="module")
def opus_mt_source(marian_vocabulary, tmp_path_factory) -> Path:  # noqa: F811
    return opus_mt_settings(write_marian(tmp_path_factory.mktemp("opus_mt") / "source", marian_vocabulary))


@pytest.fixture(scope="module")
def opus_mt_folder(opus_mt_source, tmp_path_factory) -> Path:
    return convert(opus_mt_source, tmp_path_factory.mktemp("opus_mt_converted") / "converted")


@pytest.fixture(scope="module")
def endless(opus_mt_source, tmp_path_factory):
    """The model and tokenizer of a converted folder whose generation_config.json also bans </s>: every translation
    runs to the folder's length."""
    source = opus_mt_settings(shutil.copytree(opus_mt_source, tmp_path_factory.mktemp("endless") / "source"))
    generation = json.loads((source / "generation_config.json").read_text())
    generation["bad_words_ids"] += [[0]]
    del generation["forced_eos_token_id"]
    (source / "generation_config.json").write_text(json.dumps(generation))
    return load_model_and_tokenizer(convert(source, source.parent / "converted"))


def recording_lengths(model) -> list[int]:
    """The lengths of what `model.generate` returns from now on, one a call."""
    lengths, generate = [], model.generate

    def recorded(*args, **kwargs):
        output = generate(*args, **kwargs)
        lengths.append(output.shape[-1])
        return output

    model.generate = recorded
    return lengths


def answering(model, ids: list[int]) -> None:
    """`model.generate` returns `ids` for every source, whatever it reads."""
    model.generate = lambda *args, **kwargs: torch.tensor([ids] * kwargs["input_ids"].shape[0])


def evaluation_translations(model, tokenizer, sentences: list[str]) -> list[str]:
    encoded = [
        {"input_ids": torch.tensor(ids).numpy(), "labels": torch.tensor(ids).numpy()}
        for ids in tokenizer(sentences)["input_ids"]
    ]
    loader, _ = evaluation_loader(encoded, TranslationCollator(tokenizer.pad_token_id), 8, 1024)
    try:
        return translate_for_evaluation(Accelerator(cpu=True), model, loader, tokenizer, {})
    finally:  # Accelerate's state is one a process: leave none to the worker's later tests
        AcceleratorState._reset_state(reset_partial_state=True)


def every_commands_translation(model, tokenizer) -> dict[str, str]:
    """`SENTENCE` translated by the pipeline, `translate`, the demo and the evaluation."""
    pipeline = VanillaTransformerTranslationPipeline(model=model, tokenizer=tokenizer, device=model.device)
    demo = Translator(model, tokenizer, "opus-mt", "en", "de", num_beams=4, length_penalty=1.0)
    return {
        "pipeline": pipeline(SENTENCE)[0]["translation_text"],
        "translate": translate_sentences(model, tokenizer, [SENTENCE])[0],
        "demo": translate_text(demo, SENTENCE, 4, 1.0)[0],
        "evaluation": evaluation_translations(model, tokenizer, [SENTENCE])[0],
    }


def test_the_card_of_a_converted_opus_mt_folder_names_the_decoding_of_its_generation_config(opus_mt_folder):
    card = (opus_mt_folder / "README.md").read_text()
    assert f"beam search with beam size 4 and length penalty 1.0, at most {MAX_LENGTH} tokens" in card


def test_the_pipeline_translate_the_demo_and_the_evaluation_decode_the_same_ids_to_the_same_text(opus_mt_folder):
    model, tokenizer = load_model_and_tokenizer(opus_mt_folder)
    ids = tokenizer(text_target="Hello , world ! Is it ?")["input_ids"]
    expected = tokenizer.decode(ids, skip_special_tokens=True)  # the tokenizer's own clean-up: true, as OPUS-MT's
    assert expected != tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    answering(model, [model.config.decoder_start_token_id, *ids])
    assert every_commands_translation(model, tokenizer) == dict.fromkeys(
        ("pipeline", "translate", "demo", "evaluation"), expected
    )


def test_the_evaluation_decodes_through_the_commands_backend(opus_mt_folder, monkeypatch):
    """One decoding under the command, the demo and the evaluation: model/decoding.py's ModelBackend."""
    from vanilla_transformer.model.decoding import ModelBackend

    model, tokenizer = load_model_and_tokenizer(opus_mt_folder)
    decoded, translate = [], ModelBackend.translate
    monkeypatch.setattr(ModelBackend, "translate", lambda self, batch: decoded.append(batch) or translate(self, batch))
    hypotheses = evaluation_translations(model, tokenizer, [SENTENCE, "Hello"])
    assert sorted(map(len, decoded[0])) == sorted(len(ids) for ids in tokenizer([SENTENCE, "Hello"])["input_ids"])
    assert hypotheses == translate_sentences(model, tokenizer, [SENTENCE, "Hello"])


def test_every_command_decodes_a_folder_to_the_length_its_generation_config_gives(endless):
    model, tokenizer = endless
    lengths = recording_lengths(model)
    every_commands_translation(model, tokenizer)
    assert lengths == [MAX_LENGTH] * 4


def test_a_generation_config_without_a_length_decodes_to_section_6_1s_input_plus_50(opus_mt_folder):
    model, _ = load_model_and_tokenizer(opus_mt_folder)
    mask = torch.ones(2, 7, dtype=torch.long)
    assert length_arguments(mask, model.config, paper_generation_config(model.config)) == {"max_new_tokens": 57}


def test_a_float16_source_converts_to_a_float16_folder_with_the_same_weights(opus_mt_source, tmp_path):
    source = shutil.copytree(opus_mt_source, tmp_path / "source")
    MarianMTModel.from_pretrained(opus_mt_source).half().save_pretrained(source)
    folder = convert(source, tmp_path / "converted")
    with safe_open(folder / "model.safetensors", "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"F16"}
    ours = VanillaTransformerForConditionalGeneration.from_pretrained(folder, dtype="auto")
    theirs = MarianMTModel.from_pretrained(source, dtype="auto")
    assert torch.equal(ours.model.shared.weight, theirs.model.shared.weight)


def test_the_convert_commands_dtype_chooses_the_folders_dtype(opus_mt_source, tmp_path, capsys):
    assert convert_main([str(opus_mt_source), str(tmp_path / "converted"), "--dtype", "bfloat16"]) == 0
    with safe_open(tmp_path / "converted" / "model.safetensors", "pt") as weights:
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"BF16"}


def test_decoding_settings_kept_only_in_config_json_are_kept_by_the_converter(opus_mt_source, tmp_path):
    source = shutil.copytree(opus_mt_source, tmp_path / "source")
    (source / "generation_config.json").unlink()
    config = json.loads((source / "config.json").read_text())
    settings = {"num_beams": 6, "max_length": 30, "bad_words_ids": [[config["pad_token_id"]]]}
    (source / "config.json").write_text(json.dumps({**config, **settings}))
    generation = json.loads((convert(source, tmp_path / "converted") / "generation_config.json").read_text())
    assert {name: generation.get(name) for name in settings} == settings


def test_evaluate_only_leaves_the_beam_and_length_penalty_to_the_folder_unless_given(opus_mt_folder):
    folder = ["--evaluate_only", "--model_name_or_path", str(opus_mt_folder)]
    assert parse_training_arguments(folder).evaluation.final_decoding == {}
    given = parse_training_arguments([*folder, "--num_beams", "2"]).evaluation.final_decoding
    assert given == {"num_beams": 2}
    assert parse_training_arguments([]).evaluation.final_decoding == {"num_beams": 4, "length_penalty": 0.6}


def test_evaluate_only_says_which_decoding_it_used_and_where_each_setting_came_from(opus_mt_folder):
    generation = GenerationConfig.from_pretrained(opus_mt_folder)
    assert decoding_used({"num_beams": 2}, generation) == (
        "decoding: num_beams 2 (--num_beams), length_penalty 1.0 (generation_config.json), "
        f"max_length {MAX_LENGTH} (generation_config.json)"
    )
