"""Saving and loading: round trips, the tie on disk, the Auto classes, and trust_remote_code loading."""

import json

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, VanillaTransformerModel

from .helpers import run_without_the_project


def test_save_load_round_trip_keeps_logits_and_the_tie(tmp_path, tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :5])
    tiny_model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
    assert [name for name in names if "shared" in name or "embed_tokens" in name or "lm_head" in name] == [
        "model.shared.weight"
    ]  # one matrix, one entry on disk
    assert not any("embed_positions" in name for name in names)  # the sinusoidal table is computed, not stored
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert torch.equal(reloaded(**inputs).logits, tiny_model(**inputs).logits)
    assert reloaded.lm_head.weight is reloaded.model.shared.weight
    assert reloaded.model.encoder.embed_tokens.weight is reloaded.model.shared.weight


def test_auto_classes_know_the_model(tmp_path, tiny_model):
    tiny_model.save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), VanillaTransformerConfig)
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(tmp_path), VanillaTransformerForConditionalGeneration)
    assert isinstance(AutoModel.from_pretrained(tmp_path), VanillaTransformerModel)


def test_saved_folder_carries_auto_map_and_the_code(tmp_path, tiny_model):
    tiny_model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "vanilla_transformer"
    assert config["auto_map"]["AutoConfig"] == "configuration_vanilla_transformer.VanillaTransformerConfig"
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == (
        "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration"
    )
    assert (tmp_path / "modeling_vanilla_transformer.py").is_file()
    assert (tmp_path / "configuration_vanilla_transformer.py").is_file()


@pytest.mark.slow
def test_trust_remote_code_load_in_a_process_without_the_project(tmp_path, tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    model_dir = tmp_path / "model"
    tiny_model.save_pretrained(model_dir)
    expected = tiny_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, num_beams=2)
    stdout = run_without_the_project(
        f"""
        import json, torch
        try:
            import modeling_vanilla_transformer
            raise SystemExit("the project is importable: the test proves nothing")
        except ImportError:
            pass
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained("{model_dir}", trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
        assert model.lm_head.weight is model.model.shared.weight
        input_ids = torch.tensor({input_ids.tolist()})
        attention_mask = torch.tensor({attention_mask.tolist()})
        out = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, num_beams=2)
        print(json.dumps(out.tolist()))
        """,
        cwd=tmp_path,
    )
    assert json.loads(stdout.strip().splitlines()[-1]) == expected.tolist()
