"""The model card (README.md from model_card.md): Hub metadata with the measured BLEU, and usage code that runs."""

import json
import re
from dataclasses import replace

import pytest
import yaml
from huggingface_hub import ModelCard

import train_accelerate
from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS
from vanilla_transformer.commands.arguments import parse_training_arguments
from vanilla_transformer.data.toy_task import SYNTHETIC_EXAMPLE, synthetic_translation_pairs
from vanilla_transformer.hub.model_card import MODEL_ID_PLACEHOLDER

from .helpers import CARD_VALUES, run_without_the_project, save_tiny_model_folder


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.DOTALL | re.MULTILINE)


def test_card_metadata_follows_the_hub_spec_with_the_measured_bleu(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "model", {**CARD_VALUES, "validation_bleu": 25.04})
    card = ModelCard.load(folder / "README.md")  # the Hub's own parser of the YAML front matter

    assert card.data.language == ["en", "de"]
    assert card.data.license == "apache-2.0"
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "translation"
    assert {"translation", "transformer", "vanilla-transformer", "custom_code"} <= set(card.data.tags)
    assert card.data.datasets == ["wmt14"] and card.data.metrics == ["bleu", "chrf"]
    results = {(result.dataset_split, result.metric_type): result for result in card.data.eval_results}
    assert set(results) == {("validation", "bleu"), ("test", "bleu"), ("test", "chrf")}
    assert results["test", "bleu"].metric_value == 27.3 and results["validation", "bleu"].metric_value == 25.04
    assert results["test", "bleu"].task_type == "translation" and results["test", "bleu"].dataset_type == "wmt14"
    assert "| test | 27.3 | 55.1 |" in card.text
    assert "| validation | 25.04 | not measured |" in card.text
    assert "| d_model | 32 |" in card.text and "@inproceedings{vaswani2017attention" in card.text


def test_card_without_measurements_says_so_and_has_no_model_index(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "model")
    card = ModelCard.load(folder / "README.md")
    assert card.data.eval_results is None and card.data.language == [] and card.data.datasets == []
    assert "| test | not measured | not measured |" in card.text
    assert "| training steps | not recorded |" in card.text


@pytest.mark.slow
def test_card_python_code_runs_against_a_saved_model_without_the_project(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    blocks = python_blocks((folder / "README.md").read_text())
    assert len(blocks) >= 2 and all(MODEL_ID_PLACEHOLDER in block for block in blocks)
    code = "\n".join(block.replace(MODEL_ID_PLACEHOLDER, str(folder)) for block in blocks)
    stdout = run_without_the_project("import torch\ntorch.set_num_threads(1)\n" + code, cwd=tmp_path)
    assert stdout.count("translation_text") == 3  # one sentence, then a list of two


HUB_DATA = {
    "source_lang": "en",
    "target_lang": "de",
    "dataset": "wmt/wmt14",
    "dataset_config": "de-en",
    "validation_split": "validation",
    "test_split": "test",
    "validation_bleu": 25.04,
    "test_bleu": 27.3,
    "test_chrf": 55.1,
    "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0",
}


def front_matter(card_text: str) -> dict:
    return yaml.safe_load(card_text.split("---\n")[1])


def test_every_card_field_round_trips_through_the_hubs_model_card_data(tmp_path):
    text = (save_tiny_model_folder(tmp_path / "model", HUB_DATA) / "README.md").read_text()
    card = ModelCard(text)
    assert card.data.to_dict() == front_matter(text)  # the Hub's parser keeps every field, and writes them back
    assert card.data.datasets == ["wmt/wmt14"] and card.data.base_model is None
    assert card.data.model_name == "vanilla-transformer-en-de"
    scores = {(result.dataset_split, result.metric_type): result for result in card.data.eval_results}
    assert {key: result.metric_value for key, result in scores.items()} == {
        ("validation", "bleu"): 25.04,
        ("test", "bleu"): 27.3,
        ("test", "chrf"): 55.1,
    }
    for result in scores.values():
        assert (result.dataset_type, result.dataset_config, result.dataset_name) == (
            "wmt/wmt14",
            "de-en",
            "wmt/wmt14 de-en",
        )
        assert result.task_type == "translation"
    assert scores["test", "bleu"].metric_args == {"signature": HUB_DATA["bleu_signature"]}
    assert scores["test", "chrf"].metric_args is None  # chrF's own signature was not recorded: none is claimed
    assert "on wmt/wmt14 (de-en)." in card.text


def test_local_data_is_named_in_the_text_and_never_as_a_hub_dataset(tmp_path):
    values = {**HUB_DATA, "data": "local files (multi30k)"}
    del values["dataset"], values["dataset_config"]
    card = ModelCard.load(save_tiny_model_folder(tmp_path / "model", values) / "README.md")
    assert card.data.datasets == [] and card.data.eval_results is None and "model-index" not in card.content
    assert "on local files (multi30k)." in card.text and "| data | local files (multi30k) |" in card.text
    assert "| test | 27.3 | 55.1 |" in card.text  # the scores stay in the text


def training_card(tmp_path, tiny_model, *flags: str, prepared_sources: dict | None = None) -> ModelCard:
    """The card train_accelerate writes once a run with `flags` is scored (both splits)."""
    settings = parse_training_arguments(["--output_dir", str(tmp_path), *flags])
    if prepared_sources is not None:
        (tmp_path / "prepared").mkdir()
        (tmp_path / "prepared" / "manifest.json").write_text(json.dumps({"key": {"sources": prepared_sources}}))
        settings = replace(settings, data=replace(settings.data, prepared_data=str(tmp_path / "prepared")))
    score = {"bleu": 20.123, "chrf": 50.0, "signature": "nrefs:1|tok:13a"}
    summary = {"steps": 10, "training_minutes": 1.0, "checkpoints_averaged": 1, "mixed_precision": "no"}
    summary["results"] = {"validation": score, "test": score}
    train_accelerate.write_card_and_results(tiny_model, settings, summary)
    return ModelCard.load(tmp_path / "README.md")


def test_training_names_a_hub_dataset_with_its_config_and_evaluated_splits(tmp_path, tiny_model):
    flags = (
        "--dataset_name",
        "wmt/wmt14",
        "--dataset_config",
        "de-en",
        "--validation_split",
        "dev",
        "--test_split",
        "newstest",
    )
    card = training_card(tmp_path, tiny_model, *flags)
    assert card.data.datasets == ["wmt/wmt14"]
    assert {(r.dataset_type, r.dataset_config, r.dataset_split) for r in card.data.eval_results} == {
        ("wmt/wmt14", "de-en", "dev"),
        ("wmt/wmt14", "de-en", "newstest"),
    }
    assert {r.metric_value for r in card.data.eval_results} == {20.12, 50.0}


def test_a_prepared_corpus_from_the_hub_is_named_by_its_manifest(tmp_path, tiny_model):
    sources = {
        split: {"kind": "hub", "name": "wmt/wmt16", "config": "ro-en", "split": split}
        for split in ("train", "validation", "test")
    }
    card = training_card(tmp_path, tiny_model, prepared_sources=sources)
    assert card.data.datasets == ["wmt/wmt16"]
    assert {(r.dataset_config, r.dataset_split) for r in card.data.eval_results} == {
        ("ro-en", "validation"),
        ("ro-en", "test"),
    }


@pytest.mark.parametrize(
    ("flags", "prepared", "words"),
    [
        ((), None, "the embedded synthetic task"),
        (("--data_dir", "/data/multi30k"), None, "local files (multi30k)"),
        ((), {"train": {"kind": "parallel", "files": []}}, "local files (prepared)"),
    ],
)
def test_local_and_embedded_training_data_gets_no_hub_dataset(tmp_path, tiny_model, flags, prepared, words):
    card = training_card(tmp_path, tiny_model, *flags, prepared_sources=prepared)
    assert card.data.datasets == [] and card.data.eval_results is None
    assert f"| data | {words} |" in card.text and "synthetic\n" not in card.content


def test_card_shows_the_pipeline_the_model_with_generate_and_the_demo(tmp_path):
    text = (save_tiny_model_folder(tmp_path / "model", CARD_VALUES) / "README.md").read_text()
    pipeline_block, generate_block = python_blocks(text)
    assert 'pipeline("translation", model="your-username/vanilla-transformer"' in pipeline_block
    assert "AutoModelForSeq2SeqLM.from_pretrained" in generate_block and "model.generate(" in generate_block
    assert f"vanilla-transformer demo {MODEL_ID_PLACEHOLDER}\n" in text and '"vanilla-transformer[demo]"' in text
    assert f"supports transformers\n{SUPPORTED_TRANSFORMERS}." in text


@pytest.mark.parametrize("prepared", [None, {"train": {"kind": "synthetic", "pairs": 400, "seed": 0}}])
def test_the_embedded_tasks_card_claims_no_natural_language_and_its_example_is_of_the_tasks_vocabulary(
    tmp_path, tiny_model, prepared
):
    card = training_card(tmp_path, tiny_model, prepared_sources=prepared)
    assert not card.data.language and "en → de" not in card.text and "from en to de" not in card.text
    assert "the task's English-like source language → its invented German-like target language" in card.text
    vocabulary = {word for source, _ in synthetic_translation_pairs(2000) for word in source.split()}
    example = re.search(r'print\(translator\("(.*)"\)\)', card.text).group(1)
    assert example == SYNTHETIC_EXAMPLE[0] and set(example.split()) <= vocabulary
