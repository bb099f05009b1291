"""The model card (README.md from model_card.md): Hub metadata with the measured BLEU, and usage code that runs."""

import re

from huggingface_hub import ModelCard

from tests.test_hub import run_without_the_project
from tests.test_hub_folder import CARD_VALUES, save_tiny_model_folder
from vanilla_transformer import hub


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


def test_card_python_code_runs_against_a_saved_model_without_the_project(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    blocks = python_blocks((folder / "README.md").read_text())
    assert len(blocks) >= 2 and all(hub.MODEL_ID_PLACEHOLDER in block for block in blocks)
    code = "\n".join(block.replace(hub.MODEL_ID_PLACEHOLDER, str(folder)) for block in blocks)
    stdout = run_without_the_project("import torch\ntorch.set_num_threads(1)\n" + code, cwd=tmp_path)
    assert stdout.count("translation_text") == 3  # one sentence, then a list of two
