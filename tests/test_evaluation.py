"""BLEU during and after training (vanilla_transformer/training/evaluation.py): the evaluation batches."""

import pytest

from vanilla_transformer.data.batching import TranslationCollator
from vanilla_transformer.training.evaluation import evaluation_loader

from .helpers import train


def test_an_over_long_evaluation_line_is_truncated_and_counted():
    examples = [{"input_ids": [5, 6, 2], "labels": [7, 2]}, {"input_ids": list(range(3, 10_003)), "labels": [7, 2]}]
    loader, truncated = evaluation_loader(examples, TranslationCollator(pad_token_id=0), batch_size=2, max_tokens=8)
    batch = next(iter(loader))
    assert truncated == 1 and batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][1, -1].item() == 10_002  # the last token (</s>) is kept


@pytest.mark.slow
def test_evaluate_only_refuses_a_config_with_more_layers_than_the_weights_naming_the_missing_keys(
    folder_with_a_layer_too_many, tmp_path
):
    result = train(
        tmp_path / "scores", "--evaluate_only", "--model_name_or_path", folder_with_a_layer_too_many, check=False
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "16 tensor(s) that its model.safetensors lacks (model.encoder.layers.2." in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "scores" / "evaluation_results.json").exists()
