"""BLEU during and after training (vanilla_transformer/evaluation.py): the evaluation batches."""

from vanilla_transformer.batching import TranslationCollator
from vanilla_transformer.evaluation import evaluation_loader


def test_an_over_long_evaluation_line_is_truncated_and_counted():
    examples = [{"input_ids": [5, 6, 2], "labels": [7, 2]}, {"input_ids": list(range(3, 10_003)), "labels": [7, 2]}]
    loader, truncated = evaluation_loader(examples, TranslationCollator(pad_token_id=0), batch_size=2, max_tokens=8)
    batch = next(iter(loader))
    assert truncated == 1 and batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][1, -1].item() == 10_002  # the last token (</s>) is kept
