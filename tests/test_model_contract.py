"""transformers' model contract, as its own common tests (ModelTesterMixin, GenerationTesterMixin) hold every
model inside the library to it, written here in the project's words against our model: ties, the cache, outputs,
attention implementations, gradient checkpointing, generate's dict outputs, left padding, remote code."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, VanillaTransformerModel

from .helpers import CARD_VALUES, OFFLINE, TINY, model_with_attention, random_ids, save_tiny_model_folder

GREEDY = dict(do_sample=False, num_beams=1, max_new_tokens=6)


def tiny(attn_implementation: str = "sdpa", **overrides) -> VanillaTransformerForConditionalGeneration:
    return model_with_attention(attn_implementation, **{"dropout": 0.0, **overrides})


# --- weights: one matrix, tied as the library ties, reported like any other --------------------------------------


def test_the_one_embedding_matrix_is_one_parameter_tied_the_librarys_way(tiny_model):
    shared = tiny_model.model.shared.weight
    assert tiny_model.lm_head.weight is shared
    assert tiny_model.model.encoder.embed_tokens.weight is shared
    assert tiny_model.model.decoder.embed_tokens.weight is shared
    assert sum(p.numel() for p in tiny_model.parameters()) == sum(
        p.numel() for p in {id(p): p for p in tiny_model.parameters()}.values()
    )


def test_a_folder_without_the_shared_matrix_reports_it_missing_and_initialises_it(tmp_path, tiny_model):
    tiny_model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.shared.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})

    loaded, loading = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)

    assert "model.shared.weight" in loading["missing_keys"]
    assert not any(tensor.is_meta for tensor in loaded.state_dict().values())
    assert loaded.model.shared.weight.abs().sum() > 0  # initialised, not left empty
    assert loaded.lm_head.weight is loaded.model.shared.weight


def test_a_saved_folder_round_trips_with_no_conversion_registered_for_the_model(tmp_path, tiny_model):
    """The current format only: nothing to convert on load (upgrades are refresh-code's), and what is saved loads back
    exactly, with no missing, unexpected or mismatched key."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    assert not get_checkpoint_conversion_mapping(VanillaTransformerConfig.model_type)
    tiny_model.save_pretrained(tmp_path)
    loaded, loading = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(loading[kind] for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    for name, tensor in tiny_model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    loaded.save_pretrained(tmp_path / "again")
    assert (
        load_file(tmp_path / "again" / "model.safetensors").keys() == load_file(tmp_path / "model.safetensors").keys()
    )


@pytest.mark.parametrize("model_class", [VanillaTransformerModel, VanillaTransformerForConditionalGeneration])
def test_a_model_without_tied_weights_saves_and_loads_with_nothing_missing(tmp_path, model_class):
    """transformers' common test `test_load_save_without_tied_weights`, as Marian passes it: `tie_word_embeddings`
    False in a config otherwise the default, the model built, saved and loaded back exactly, nothing missing."""
    config = VanillaTransformerConfig(**{**TINY, "tie_word_embeddings": False})
    model = model_class(config)
    model.save_pretrained(tmp_path)
    serialized = load_file(tmp_path / "model.safetensors").keys()
    reloaded, loading = model_class.from_pretrained(tmp_path, output_loading_info=True)
    reloaded_state = reloaded.state_dict()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(
            tensor, reloaded_state[name], msg=lambda m, name=name: f"{name} ({name in serialized}): {m}"
        )
    assert loading["missing_keys"] == set()


def test_no_linear_layer_has_a_forward_of_its_own(tiny_model):
    for name, module in tiny_model.named_modules():
        if isinstance(module, nn.Linear):
            assert "forward" not in module.__dict__, name


# --- the cache -------------------------------------------------------------------------------------------------


def test_beam_search_returns_one_cache_row_per_beam(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    output = tiny_model.generate(
        input_ids, attention_mask=attention_mask, num_beams=4, max_new_tokens=5, return_dict_in_generate=True
    )
    for layer in output.cache.cross_attention_cache.layers:
        assert layer.keys.shape[0] == layer.values.shape[0] == 2 * 4
    for layer in output.cache.self_attention_cache.layers:
        assert layer.keys.shape[0] == 2 * 4


def test_the_old_cache_name_gives_the_librarys_deprecation_warning_and_the_same_logits(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    decoder_input_ids = random_ids(tiny_model.config, (2, 4), seed=3)
    first = tiny_model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, :3])
    step = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, 3:])
    new = tiny_model(**step, cache=first.cache).logits
    again = tiny_model(input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, :3])
    with pytest.warns(FutureWarning, match="`past_key_values` is deprecated.*`cache`"):
        old = tiny_model(**step, past_key_values=again.cache).logits
    torch.testing.assert_close(old, new)


def test_generate_passes_the_cache_under_its_new_name_without_a_warning(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # generate() itself passes `cache`: no warning
        tokens = tiny_model.generate(input_ids, attention_mask=attention_mask, **GREEDY)
    assert torch.equal(
        tokens, tiny_model.generate(input_ids, attention_mask=attention_mask, use_cache=False, **GREEDY)
    )


# --- outputs ---------------------------------------------------------------------------------------------------


def test_attentions_and_hidden_states_have_the_librarys_shapes(source_batch):
    tiny_model = tiny("eager")  # the attention weights of eager attention (sdpa returns none, in every model)
    input_ids, attention_mask = source_batch
    decoder_input_ids = random_ids(tiny_model.config, (2, 5), seed=3)
    output = tiny_model(
        input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_attentions=True,
        output_hidden_states=True,
    )
    config, heads = tiny_model.config, tiny_model.config.encoder_attention_heads
    assert len(output.encoder_hidden_states) == config.encoder_layers + 1
    assert len(output.decoder_hidden_states) == config.decoder_layers + 1
    assert output.encoder_attentions[0].shape == (2, heads, 9, 9)
    assert output.decoder_attentions[0].shape == (2, heads, 5, 5)
    assert output.cross_attentions[0].shape == (2, heads, 5, 9)
    torch.testing.assert_close(
        output.decoder_hidden_states[-1],
        tiny_model.model(
            input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        ).last_hidden_state,
    )


def test_return_dict_false_gives_the_librarys_tuple(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    decoder_input_ids = random_ids(tiny_model.config, (2, 5), seed=3)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    as_tuple = tiny_model(**inputs, return_dict=False)
    torch.testing.assert_close(as_tuple[0], tiny_model(**inputs).logits)


@pytest.mark.parametrize(
    "implementation", ["sdpa", pytest.param("flex_attention", marks=pytest.mark.slow)]
)  # compiled
def test_eager_and_other_attention_implementations_give_the_same_logits(source_batch, implementation):
    eager, other = tiny("eager"), tiny(implementation)
    input_ids, attention_mask = source_batch
    inputs = dict(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=random_ids(eager.config, (2, 5))
    )
    if implementation == "flex_attention":
        pytest.importorskip("torch.nn.attention.flex_attention")
    with torch.no_grad():
        torch.testing.assert_close(other(**inputs).logits, eager(**inputs).logits, atol=1e-5, rtol=1e-4)


def test_the_library_sees_that_the_model_takes_its_keyword_arguments():
    """`**kwargs: Unpack[TransformersKwargs]`: what transformers reads to know that output_attentions reaches every
    attention (its eager-vs-SDPA checks run on such models)."""
    import inspect

    from transformers.utils import TransformersKwargs

    for forward in (VanillaTransformerForConditionalGeneration.forward,):
        annotation = inspect.signature(forward).parameters["kwargs"].annotation
        assert TransformersKwargs in getattr(annotation, "__args__", ()), annotation


def test_generate_reads_the_forward_signature_without_deriving_it_at_every_step(tiny_model, source_batch, monkeypatch):
    """generate() asks for the signature of a remote-code model's forward at each step (transformers 5.24): the model
    gives the one inspect derives, derived once, so longer outputs derive it no more often."""
    import inspect

    derived = []
    from_function = inspect._signature_from_function

    def deriving(cls, function, *args, **kwargs):
        derived.extend([function.__qualname__] if function.__qualname__.startswith("VanillaTransformer") else [])
        return from_function(cls, function, *args, **kwargs)

    monkeypatch.setattr(inspect, "_signature_from_function", deriving)
    counts = []
    for new_tokens in (2, 12):
        derived.clear()
        input_ids, attention_mask = source_batch
        tiny_model.generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens
        )
        counts.append(len(derived))
    assert counts[0] == counts[1]
    forward = type(tiny_model).forward
    assert inspect.signature(forward) == inspect.signature(inspect.unwrap(forward))  # the function's own


def test_gradient_checkpointing_gives_the_same_gradients(source_batch):
    input_ids, attention_mask = source_batch
    labels = random_ids(tiny().config, (2, 5), seed=4)
    gradients = []
    for checkpointing in (False, True):
        model = tiny().train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        gradients.append({name: p.grad.clone() for name, p in model.named_parameters()})
    for name in gradients[0]:
        torch.testing.assert_close(gradients[0][name], gradients[1][name], msg=name)


# --- generate ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        dict(GREEDY),
        dict(do_sample=True, num_beams=1, max_new_tokens=6),
        dict(do_sample=False, num_beams=3, max_new_tokens=6),
    ],
    ids=["greedy", "sampling", "beam"],
)
@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_returns_the_librarys_dict_outputs(source_batch, settings, use_cache):
    tiny_model = tiny("eager")
    input_ids, attention_mask = source_batch
    torch.manual_seed(0)
    output = tiny_model.generate(
        input_ids,
        attention_mask=attention_mask,
        use_cache=use_cache,
        return_dict_in_generate=True,
        output_scores=True,
        output_attentions=True,
        output_hidden_states=True,
        **settings,
    )
    rows = 2 * settings["num_beams"] if settings["num_beams"] > 1 else 2
    steps = output.sequences.shape[1] - 1
    assert len(output.scores) == steps and output.scores[0].shape == (rows, tiny_model.config.vocab_size)
    assert len(output.encoder_attentions) == tiny_model.config.encoder_layers
    assert len(output.decoder_attentions) == len(output.cross_attentions) == steps
    assert len(output.decoder_hidden_states) == steps
    assert (output.cache is not None) == use_cache
    torch.manual_seed(0)
    cached = tiny_model.generate(input_ids, attention_mask=attention_mask, use_cache=not use_cache, **settings)
    assert torch.equal(cached, output.sequences)


def test_a_padded_source_translates_as_it_does_alone(tiny_model):
    """Padding is masked everywhere: a source padded in a batch (on the right, as the tokenizers pad) decodes the
    tokens it decodes alone. (Left padding shifts absolute positions, in Marian as here: the tokenizers never do it.)"""
    source = random_ids(tiny_model.config, (1, 6), seed=7)
    other = random_ids(tiny_model.config, (1, 9), seed=8)
    padded = torch.cat([torch.cat([source, torch.full((1, 3), tiny_model.config.pad_token_id)], dim=1), other])
    mask = (torch.arange(9) < torch.tensor([[6], [9]])).long()
    for num_beams in (1, 3):
        settings = {**GREEDY, "num_beams": num_beams}
        alone = tiny_model.generate(source, **settings)
        together = tiny_model.generate(padded, attention_mask=mask, **settings)
        assert torch.equal(together[0, : alone.shape[1]], alone[0])


# --- remote code: what a Hub user's fresh process sees -----------------------------------------------------------


def run_fresh(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **OFFLINE},
        timeout=300,
    )


@pytest.mark.slow
def test_importing_the_hub_facing_modules_registers_nothing(tmp_path):
    result = run_fresh(
        """
        from transformers import AutoConfig
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
        from transformers.pipelines import PIPELINE_REGISTRY
        before = (set(CONFIG_MAPPING.keys()), sorted(PIPELINE_REGISTRY.get_supported_tasks()))
        import configuration_vanilla_transformer, generate_vanilla_transformer, modeling_vanilla_transformer
        import pipeline_vanilla_transformer
        after = (set(CONFIG_MAPPING.keys()), sorted(PIPELINE_REGISTRY.get_supported_tasks()))
        assert before == after, (before, after)
        assert not get_checkpoint_conversion_mapping("vanilla_transformer")
        print("nothing registered")
        """,
        tmp_path,
    )
    assert "nothing registered" in result.stdout, result.stderr


@pytest.mark.slow
def test_every_auto_class_loads_a_saved_folder_in_a_fresh_process(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModel"]
    result = run_fresh(
        f"""
        from transformers import AutoModel, AutoModelForSeq2SeqLM
        base = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
        full = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
        print(type(base).__name__, type(full).__name__, type(base).__module__.startswith("transformers_modules"))
        """,
        tmp_path,
    )
    assert "VanillaTransformerModel VanillaTransformerForConditionalGeneration True" in result.stdout, result.stderr
