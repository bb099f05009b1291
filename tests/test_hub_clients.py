"""Our model behaves like every transformers model for its clients: a loaded model saved again keeps its pipeline
and speed paths, and the stock Seq2SeqTrainer fine-tunes a saved model whose checkpoints translate on a machine
without this project."""

import json
import math
import subprocess
import sys

import datasets
import pytest
import torch
from accelerate.state import AcceleratorState
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from vanilla_transformer.hub.model_folder import save_model_folder

from .helpers import (
    BLOCK_PROJECT_IMPORTS,
    CARD_VALUES,
    ENGLISH,
    GERMAN,
    OFFLINE,
    run_without_the_project,
    save_tiny_model_folder,
)

TRANSLATE_IN_A_CLEAN_PROCESS = """
import json
from transformers import pipeline
translator = pipeline("translation", model=FOLDER, trust_remote_code=True)
print(json.dumps({"class": type(translator).__name__, "output": translator(SENTENCE, max_new_tokens=5)}))
"""


def translate_without_the_project(folder) -> dict:
    code = f"FOLDER, SENTENCE = {str(folder)!r}, {ENGLISH[0]!r}\n" + TRANSLATE_IN_A_CLEAN_PROCESS
    return json.loads(run_without_the_project(code, cwd=folder.parent).strip().splitlines()[-1])


def tokenized_pairs(tokenizer, sources: list[str], targets: list[str]) -> datasets.Dataset:
    pairs = datasets.Dataset.from_dict({"source": sources, "target": targets})
    return pairs.map(
        lambda pair: tokenizer(pair["source"], text_target=pair["target"]), remove_columns=["source", "target"]
    )


def stock_trainer(model, tokenizer, arguments, **datasets_and_metrics) -> Seq2SeqTrainer:
    """transformers' own Seq2SeqTrainer with its own collator, as a user sets it up for a Hub model."""
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    return Seq2SeqTrainer(
        model=model, args=arguments, data_collator=collator, processing_class=tokenizer, **datasets_and_metrics
    )


@pytest.mark.slow
def test_a_loaded_model_saved_again_carries_its_pipeline(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    code = f"""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True).save_pretrained("resaved")
    AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True).save_pretrained("resaved")
    """
    run_without_the_project(code, cwd=tmp_path)
    resaved = tmp_path / "resaved"
    for name in ("modeling_vanilla_transformer.py", "pipeline_vanilla_transformer.py"):
        assert (resaved / name).read_text() == (folder / name).read_text(), name
    assert "custom_pipelines" in json.loads((resaved / "config.json").read_text())
    result = translate_without_the_project(resaved)
    assert result["class"] == "VanillaTransformerTranslationPipeline" and "translation_text" in result["output"][0]


@pytest.mark.slow
def test_the_stock_seq2seq_trainer_fine_tunes_a_saved_model_whose_checkpoint_translates(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
    tokenized = tokenized_pairs(tokenizer, ENGLISH, GERMAN)
    arguments = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "fine-tuned"),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        label_smoothing_factor=0.1,
        predict_with_generate=True,
        generation_max_length=8,
        save_steps=3,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        disable_tqdm=True,
    )
    try:
        trainer = stock_trainer(model, tokenizer, arguments, train_dataset=tokenized)
        before = model.model.shared.weight.detach().clone()
        history = trainer.train()
        predictions = trainer.predict(tokenized.select(range(4)))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert history.global_step == 3 and torch.isfinite(torch.tensor(history.training_loss))
    assert not torch.equal(before, model.model.shared.weight)  # it trained
    assert predictions.predictions.shape[0] == 4  # generated token ids (predict_with_generate)

    checkpoint = tmp_path / "fine-tuned" / "checkpoint-3"
    result = translate_without_the_project(checkpoint)
    assert result["class"] == "VanillaTransformerTranslationPipeline" and "translation_text" in result["output"][0]


@pytest.mark.parametrize("predict_with_generate", [False, True], ids=["loss only", "with generate"])
def test_the_stock_seq2seq_trainer_evaluates_a_loss_and_runs_compute_metrics(tmp_path, predict_with_generate):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
    tokenized = tokenized_pairs(tokenizer, ENGLISH[:8], GERMAN[:8])
    metric_calls = []

    def compute_metrics(prediction):
        metric_calls.append(prediction.label_ids.shape)
        return {"called": 1.0}

    arguments = Seq2SeqTrainingArguments(  # the defaults, but for what keeps the test small and offline
        output_dir=str(tmp_path / "evaluated"),
        per_device_eval_batch_size=4,
        predict_with_generate=predict_with_generate,
        generation_max_length=8,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    try:
        trainer = stock_trainer(model, tokenizer, arguments, eval_dataset=tokenized, compute_metrics=compute_metrics)
        metrics = trainer.evaluate()
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    assert trainer.label_names == ["labels"] and trainer.can_return_loss is False
    assert math.isfinite(metrics["eval_loss"]) and metrics["eval_loss"] > 0
    assert metrics["eval_called"] == 1.0 and len(metric_calls) == 1


def test_the_loss_divided_by_the_trainers_item_count_sums_to_the_whole_batch_mean(tmp_path):
    model = AutoModelForSeq2SeqLM.from_pretrained(save_tiny_model_folder(tmp_path / "m"), trust_remote_code=True)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, 300, (4, 6), generator=generator)
    labels = torch.randint(4, 300, (4, 5), generator=generator)
    labels[0, 3:] = -100
    whole = model(input_ids=input_ids, labels=labels).loss
    count = (labels != -100).sum()
    halves = [
        model(input_ids=input_ids[rows], labels=labels[rows], num_items_in_batch=count).loss
        for rows in (slice(0, 2), slice(2, 4))
    ]
    assert torch.allclose(halves[0] + halves[1], whole, atol=1e-5)


@pytest.mark.slow
def test_the_documented_tokenizer_loading_asks_nothing_and_saves_no_machine_settings(tmp_path):
    first = save_tiny_model_folder(tmp_path / "first", CARD_VALUES)
    model = AutoModelForSeq2SeqLM.from_pretrained(first, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(first, trust_remote_code=True)  # as --tokenizer_name_or_path loads it
    folder = save_model_folder(model, tokenizer, tmp_path / "model", CARD_VALUES)
    assert not {"is_local", "local_files_only"} & set(json.loads((folder / "tokenizer_config.json").read_text()))
    code = f"from transformers import AutoTokenizer\nAutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)"
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_PROJECT_IMPORTS + code],
        cwd=tmp_path,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=300,
        env={**OFFLINE, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Do you wish to run the custom code" not in output and "model of type" not in output, output
