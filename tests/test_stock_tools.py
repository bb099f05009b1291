"""The calls Hugging Face users make, with no argument of ours, give the paper's answer.

generate() of a loaded model folder without a length decodes up to section 6.1's input length + 50, ending early at
</s>, as the pipeline and the commands do (the folder's custom_generate/generate.py, transformers' hook for a
repository's own decoding); a length the user sets, in the call or in the generation config, is used as given. The translation
pipeline takes the arguments of transformers 4's TranslationPipeline with their meaning there. The linear layers are
plain nn.Linear, so quantizers that match layers by type find every one.
"""

import copy
import subprocess
import sys

import pytest
import torch
from torch import nn
from transformers import GenerationConfig, pipeline

from .helpers import (
    BLOCK_PROJECT_IMPORTS,
    CARD_VALUES,
    ENGLISH,
    OFFLINE,
    random_ids,
    random_tiny_model,
    run_without_the_project,
    save_tiny_model_folder,
)

SOURCE_TOKENS = 25  # longer than transformers' own fallback of 20 new tokens


@pytest.fixture(scope="module")
def loaded_model(tmp_path_factory):
    """A saved folder loaded as a Hub user loads it: its code, its custom_generate/generate.py."""
    from transformers import AutoModelForSeq2SeqLM

    folder = save_tiny_model_folder(tmp_path_factory.mktemp("stock") / "model")
    return AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()


def test_a_plain_generate_call_may_decode_input_length_plus_50_tokens(loaded_model):
    model = loaded_model
    sources = random_ids(model.config, (2, SOURCE_TOKENS))
    never_ending = [[model.config.eos_token_id]]  # the random model then decodes to the limit
    output = model.generate(input_ids=sources, attention_mask=torch.ones_like(sources), bad_words_ids=never_ending)
    assert output.shape == (2, 1 + SOURCE_TOKENS + 50)  # the decoder start token, then the new tokens
    assert model.generate(sources, bad_words_ids=never_ending).shape == output.shape  # the ids as `inputs`


def test_the_limit_counts_the_longest_source_without_its_padding(loaded_model):
    model = loaded_model
    sources = random_ids(model.config, (2, SOURCE_TOKENS))
    mask = torch.ones_like(sources)
    mask[:, 20:] = 0  # both right-padded from position 20
    output = model.generate(input_ids=sources, attention_mask=mask, bad_words_ids=[[model.config.eos_token_id]])
    assert output.shape == (2, 1 + 20 + 50)


@pytest.mark.parametrize("setting", [{"num_beams": 0}, {"num_beams": -2}, {"num_return_sequences": 0}], ids=str)
def test_a_count_under_one_is_refused_by_name(loaded_model, setting):
    """Where transformers' generate() would divide by zero (or build a negative shape): a ValueError naming it."""
    sources = random_ids(loaded_model.config, (1, 5))
    ((name, value),) = setting.items()
    with pytest.raises(ValueError, match=f"`{name}` must be a positive integer, got {value}"):
        loaded_model.generate(sources, max_new_tokens=4, **setting)


def test_a_plain_generate_call_ends_at_the_end_of_sentence(memorising_model):
    model, sources, targets = memorising_model
    assert torch.equal(model.generate(input_ids=sources, num_beams=1)[:, 1:], targets)


def test_a_length_the_user_sets_is_used_as_given(loaded_model):
    model = copy.deepcopy(loaded_model)
    sources = random_ids(model.config, (1, SOURCE_TOKENS))
    never_ending = [[model.config.eos_token_id]]
    assert model.generate(sources, max_new_tokens=7, bad_words_ids=never_ending).shape == (1, 8)
    assert model.generate(sources, max_length=12, bad_words_ids=never_ending).shape == (1, 12)
    given = GenerationConfig(max_new_tokens=5, bad_words_ids=never_ending, **model.generation_config.to_diff_dict())
    assert model.generate(sources, generation_config=given).shape == (1, 6)
    model.generation_config.max_length = 10  # as a folder's generation_config.json may say
    assert model.generate(sources, bad_words_ids=never_ending).shape == (1, 10)


@pytest.mark.slow
def test_a_saved_folder_loaded_by_transformers_alone_decodes_the_papers_length(tmp_path):
    save_tiny_model_folder(tmp_path / "model")
    printed = run_without_the_project(
        f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained("model", trust_remote_code=True)
        sources = torch.randint(4, model.config.vocab_size, (1, {SOURCE_TOKENS}))
        print(model.generate(sources, bad_words_ids=[[model.config.eos_token_id]]).shape[1])
        """,
        tmp_path,
    )
    assert int(printed) == 1 + SOURCE_TOKENS + 50


# --- the translation pipeline takes transformers 4's TranslationPipeline arguments ---------------------------------


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    """The pipeline of a saved English-to-German folder, loaded as a Hub user loads it."""
    folder = save_tiny_model_folder(tmp_path_factory.mktemp("v4") / "model", CARD_VALUES)
    return pipeline("translation", model=str(folder), trust_remote_code=True)


def test_the_pipeline_takes_return_tensors_and_return_text_with_their_v4_meaning(translator):
    (ids_only,) = translator(ENGLISH[0], return_tensors=True, max_new_tokens=4)
    assert set(ids_only) == {"translation_token_ids"} and ids_only["translation_token_ids"].dim() == 1
    (both,) = translator(ENGLISH[0], return_tensors=True, return_text=True, max_new_tokens=4)
    assert both["translation_text"] == translator.tokenizer.decode(
        ids_only["translation_token_ids"], skip_special_tokens=True
    )
    assert torch.equal(both["translation_token_ids"], ids_only["translation_token_ids"])
    with pytest.raises(ValueError, match="nothing to return"):
        translator(ENGLISH[0], return_text=False)


def test_the_pipeline_takes_truncation_and_clean_up_tokenization_spaces(translator):
    too_long = " ".join(ENGLISH) * 20  # more tokens than the tokenizer's model_max_length
    assert len(translator.tokenizer(too_long)["input_ids"]) > translator.tokenizer.model_max_length
    (cut,) = translator(too_long, truncation=True, max_new_tokens=2, clean_up_tokenization_spaces=True)
    assert isinstance(cut["translation_text"], str)


def test_the_pipeline_checks_src_lang_and_tgt_lang_against_the_models_languages(translator):
    assert translator(ENGLISH[0], src_lang="en", tgt_lang="de", max_new_tokens=2)
    with pytest.raises(ValueError, match="tgt_lang='fr', but this model translates en to de only"):
        translator(ENGLISH[0], src_lang="en", tgt_lang="fr")


@pytest.mark.slow
def test_building_the_pipeline_in_a_users_process_logs_nothing(translator):
    """The folder's code registers the "translation" task twice in a fresh process (as the model's sibling and as
    the pipeline transformers loads): transformers' "already registered. Overwriting" warning must not show."""
    code = BLOCK_PROJECT_IMPORTS + "from transformers import pipeline\n"
    code += f"pipeline('translation', model={translator.model.name_or_path!r}, trust_remote_code=True)\n"
    environment = {**OFFLINE, "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    built = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=environment)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "already registered" not in built.stderr


# --- quantizers find the linear layers --------------------------------------------------------------------------


def test_the_linear_layers_are_plain_nn_linear_for_the_tools_that_match_by_type(tiny_model):
    linears = [name for name, module in tiny_model.named_modules() if isinstance(module, nn.Linear)]
    assert linears and all(type(tiny_model.get_submodule(name)) is nn.Linear for name in linears)


def test_quantize_dynamic_converts_every_linear_layer_and_the_model_still_translates(memorising_model):
    model, sources, targets = memorising_model
    linears = sum(isinstance(module, nn.Linear) for module in model.modules())
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    converted = sum(isinstance(module, torch.ao.nn.quantized.dynamic.Linear) for module in quantized.modules())
    assert converted == linears == 6 * model.config.encoder_layers + 10 * model.config.decoder_layers + 1
    assert torch.equal(quantized.generate(input_ids=sources, num_beams=1)[:, 1:], targets)


# --- static cache and torch.compile, as the model declares (_can_compile_fullgraph) ---------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("num_beams", [1, 4])
def test_compiled_static_cache_decoding_gives_the_tokens_of_eager_dynamic_cache_decoding(num_beams):
    """fullgraph=True fails at any graph break; the "eager" backend runs the traced graph without code generation
    (the speed of inductor's code is measured in benchmarks/, not here)."""
    model = random_tiny_model(61, max_position_embeddings=8)  # the sinusoidal table grows before decoding
    assert model._can_compile_fullgraph
    sources = random_ids(model.config, (2, 9))
    settings = dict(attention_mask=torch.ones_like(sources), num_beams=num_beams, max_new_tokens=10)
    eager = model.generate(sources, **settings)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, fullgraph=True, dynamic=False, backend="eager")
    compiled = model.generate(sources, cache_implementation="static", **settings)
    assert torch.equal(compiled, eager)


# --- LoRA with the recipe users copy from BART and Marian -------------------------------------------------------


@pytest.fixture
def peft():
    """peft (the dev extra), or the test skipped: releases before 0.21.2 call generation code transformers 5 removed."""
    pytest.importorskip("peft", minversion="0.21.2", reason="the LoRA tests need peft 0.21.2 or later")
    import peft as module

    return module


def lora_model(peft, base):
    config = peft.LoraConfig(target_modules=["q_proj", "v_proj"], task_type="SEQ_2_SEQ_LM", r=4, lora_dropout=0.0)
    return peft.get_peft_model(base, config)


def test_lora_on_q_proj_and_v_proj_adapts_the_queries_and_values_of_every_attention_layer(peft):
    model = lora_model(peft, random_tiny_model(61))
    wrapped = sorted(name for name, module in model.named_modules() if isinstance(module, peft.tuners.lora.LoraLayer))
    config = model.config
    assert len(wrapped) == 2 * config.encoder_layers + 4 * config.decoder_layers
    expected = [
        f"base_model.model.model.{stack}.layers.{index}.{attention}.{projection}"
        for stack, layers, attentions in (
            ("encoder", config.encoder_layers, ["self_attn"]),
            ("decoder", config.decoder_layers, ["self_attn", "encoder_attn"]),
        )
        for index in range(layers)
        for attention in attentions
        for projection in ("q_proj", "v_proj")
    ]
    assert wrapped == sorted(expected)


def test_lora_trains_only_its_own_weights_saves_reloads_and_merges_into_plain_linear_layers(peft, tmp_path):
    base = random_tiny_model(61, dropout=0.0)
    base.save_pretrained(tmp_path / "base")
    model = lora_model(peft, base).train()
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" not in name}
    lora = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" in name}
    assert all(p.requires_grad == ("lora_" in name) for name, p in model.named_parameters())
    sources = random_ids(model.config, (4, 7), seed=3)
    batch = dict(input_ids=sources, labels=torch.cat([sources.flip(1)[:, :5], torch.full((4, 1), 2)], dim=1))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(5):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    parameters = dict(model.named_parameters())
    assert all(torch.equal(parameters[name], tensor) for name, tensor in frozen.items())
    assert any(not torch.equal(parameters[name], tensor) for name, tensor in lora.items())

    model.eval()
    model.save_pretrained(tmp_path / "adapter")
    fresh = type(base).from_pretrained(tmp_path / "base")
    reloaded = peft.PeftModel.from_pretrained(fresh, tmp_path / "adapter").eval()
    with torch.no_grad():
        logits = model(**batch).logits
        assert torch.equal(reloaded(**batch).logits, logits)
        merged = reloaded.merge_and_unload()
        linears = [module for module in merged.modules() if isinstance(module, nn.Linear)]
        assert all(type(module) is nn.Linear for module in linears)
        assert len(linears) == 6 * model.config.encoder_layers + 10 * model.config.decoder_layers + 1
        torch.testing.assert_close(merged(**batch).logits, logits, rtol=1e-5, atol=1e-5)
        settings = dict(max_new_tokens=6, num_beams=1, do_sample=False)
        assert torch.equal(merged.generate(sources, **settings), model.generate(input_ids=sources, **settings))


# --- ONNX: torch.onnx.export, run by onnxruntime (the `onnx` extra; CI installs it in its demo run) ----------------


@pytest.mark.slow
def test_the_onnx_export_run_by_onnxruntime_gives_the_models_logits(tmp_path):
    onnxruntime = pytest.importorskip(
        "onnxruntime", reason="the ONNX check needs the onnx extra: pip install -e '.[onnx]'"
    )
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript: pip install -e '.[onnx]'")

    class Logits(nn.Module):  # one teacher-forced step: the inputs and output ONNX sees
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, decoder_input_ids):
            inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
            return self.model(**inputs, use_cache=False).logits

    model = Logits(random_tiny_model(61))
    inputs = (random_ids(model.model.config, (2, 9)), torch.ones(2, 9, dtype=torch.long))
    inputs += (random_ids(model.model.config, (2, 5), seed=1),)
    names = ["input_ids", "attention_mask", "decoder_input_ids"]
    torch.onnx.export(model, inputs, tmp_path / "model.onnx", input_names=names, output_names=["logits"], dynamo=True)
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"))
    (logits,) = session.run(None, {name: tensor.numpy() for name, tensor in zip(names, inputs, strict=True)})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(logits), model(*inputs), rtol=1e-5, atol=1e-5)
