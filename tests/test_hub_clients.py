"""Our model behaves like every transformers model for its clients: a loaded model saved again keeps its pipeline
and speed paths, and the stock Seq2SeqTrainer fine-tunes a saved model whose checkpoints translate on a machine
without this project."""

import json

import datasets
import torch
from accelerate.state import AcceleratorState
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from .test_hub import run_without_the_project
from .test_hub_folder import CARD_VALUES, ENGLISH, GERMAN, save_tiny_model_folder

TRANSLATE_IN_A_CLEAN_PROCESS = """
import json
from transformers import pipeline
translator = pipeline("translation", model=FOLDER, trust_remote_code=True)
print(json.dumps({"class": type(translator).__name__, "output": translator(SENTENCE, max_new_tokens=5)}))
"""


def translate_without_the_project(folder) -> dict:
    code = f"FOLDER, SENTENCE = {str(folder)!r}, {ENGLISH[0]!r}\n" + TRANSLATE_IN_A_CLEAN_PROCESS
    return json.loads(run_without_the_project(code, cwd=folder.parent).strip().splitlines()[-1])


def test_a_loaded_model_saved_again_carries_its_pipeline_and_fast_paths(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    code = f"""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True).save_pretrained("resaved")
    AutoTokenizer.from_pretrained({str(folder)!r}).save_pretrained("resaved")
    """
    run_without_the_project(code, cwd=tmp_path)
    resaved = tmp_path / "resaved"
    for name in ("pipeline_vanilla_transformer.py", "fast_paths_vanilla_transformer.py"):
        assert (resaved / name).read_text() == (folder / name).read_text(), name
    assert "custom_pipelines" in json.loads((resaved / "config.json").read_text())
    result = translate_without_the_project(resaved)
    assert result["class"] == "VanillaTransformerTranslationPipeline" and "translation_text" in result["output"][0]


def test_the_stock_seq2seq_trainer_fine_tunes_a_saved_model_whose_checkpoint_translates(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
    pairs = datasets.Dataset.from_dict({"en": ENGLISH, "de": GERMAN})
    tokenized = pairs.map(lambda pair: tokenizer(pair["en"], text_target=pair["de"]), remove_columns=["en", "de"])
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
        trainer = Seq2SeqTrainer(
            model=model,
            args=arguments,
            train_dataset=tokenized,
            data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
            processing_class=tokenizer,
        )
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
