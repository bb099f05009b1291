"""generate(): greedy, beam, sampling, padding, and the KV cache giving exactly the uncached tokens."""

import warnings

import pytest
import torch
import transformers
from transformers import EncoderDecoderCache
from transformers.testing_utils import CaptureLogger

from .helpers import random_ids

DECODING = {
    "greedy": dict(do_sample=False, num_beams=1),
    "beam": dict(do_sample=False, num_beams=4, length_penalty=0.6),
    "sampling": dict(do_sample=True, top_k=0, temperature=1.0),
}


@pytest.mark.parametrize("strategy", sorted(DECODING))
@torch.no_grad()
def test_cached_and_uncached_generation_return_the_same_tokens(tiny_model, source_batch, strategy):
    input_ids, attention_mask = source_batch
    outputs = []
    for use_cache in (True, False):
        torch.manual_seed(0)
        outputs.append(
            tiny_model.generate(
                input_ids, attention_mask=attention_mask, max_new_tokens=12, use_cache=use_cache, **DECODING[strategy]
            )
        )
    assert outputs[0].shape[1] > 2
    assert torch.equal(outputs[0], outputs[1])


@torch.no_grad()
def test_generation_starts_from_the_decoder_start_token_and_honours_max_new_tokens(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    generated = tiny_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=7, do_sample=False)
    assert (generated[:, 0] == tiny_model.config.decoder_start_token_id).all()
    assert generated.shape[1] <= 1 + 7


@pytest.mark.parametrize("num_beams", [1, 3])
@torch.no_grad()
def test_batched_padded_generation_equals_one_by_one(tiny_model, source_batch, num_beams):
    input_ids, attention_mask = source_batch
    batched = tiny_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=8, num_beams=num_beams)
    for row in range(2):
        length = int(attention_mask[row].sum())
        alone = tiny_model.generate(input_ids[row : row + 1, :length], max_new_tokens=8, num_beams=num_beams)
        assert torch.equal(batched[row, : alone.shape[1]], alone[0])


@torch.no_grad()
def test_encoder_decoder_keys_and_values_are_computed_once_per_generation(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    calls = []
    handle = tiny_model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(
        lambda *args: calls.append(1)
    )
    tiny_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, min_new_tokens=6)
    handle.remove()
    assert len(calls) == 1


@torch.no_grad()
def test_incremental_decoding_matches_the_full_forward(tiny_model, tiny_config, source_batch):
    input_ids, attention_mask = source_batch
    target = random_ids(tiny_config, (2, 6), seed=7)
    full = tiny_model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=target).logits
    encoder_outputs = tiny_model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    cache, steps = None, []
    for position in range(target.shape[1]):
        out = tiny_model(
            attention_mask=attention_mask,
            encoder_outputs=encoder_outputs,
            decoder_input_ids=target[:, position : position + 1],
            cache=cache,
            use_cache=True,
        )
        cache = out.cache
        steps.append(out.logits)
    assert isinstance(cache, EncoderDecoderCache)
    assert cache.self_attention_cache.get_seq_length() == target.shape[1]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


# --- the cache with a model whose tokens depend on the past --------------------------------------------------------

MEMORISED_DECODING = {
    "greedy": dict(num_beams=1),
    "beam": dict(num_beams=4),
}


@pytest.mark.parametrize("strategy", sorted(MEMORISED_DECODING))
@pytest.mark.parametrize("use_cache", [True, False], ids=["cached", "uncached"])
@torch.no_grad()
def test_a_model_that_depends_on_its_past_decodes_its_memorised_targets(memorising_model, strategy, use_cache):
    model, sources, targets = memorising_model
    generated = model.generate(sources, max_new_tokens=12, use_cache=use_cache, **MEMORISED_DECODING[strategy])
    assert generated[:, 1:].tolist() == targets.tolist()


@torch.no_grad()
def test_the_step_logits_of_generate_equal_a_full_forward_over_the_same_prefix(memorising_model):
    model, sources, targets = memorising_model
    generated = model.generate(
        sources, max_new_tokens=12, num_beams=1, output_logits=True, return_dict_in_generate=True
    )
    step_logits = torch.stack(generated.logits, dim=1)  # (B, steps, V)
    full = model(input_ids=sources, decoder_input_ids=generated.sequences[:, :-1]).logits
    assert step_logits.shape == full.shape
    assert torch.allclose(step_logits, full, atol=1e-4)


@torch.no_grad()
def test_forward_reads_the_cache_under_either_name_and_returns_it_as_cache(memorising_model):
    model, sources, targets = memorising_model
    decoder_inputs = torch.cat([torch.ones_like(targets[:, :1]), targets[:, :-1]], dim=1)
    full = model(input_ids=sources, decoder_input_ids=decoder_inputs).logits
    for name in ("cache", "past_key_values"):  # the old name with the library's FutureWarning
        cache, steps = None, []
        for position in range(decoder_inputs.shape[1]):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                output = model(
                    input_ids=sources,
                    decoder_input_ids=decoder_inputs[:, position : position + 1],
                    use_cache=True,
                    **{name: cache},
                )
            cache = output.cache
            steps.append(output.logits)
        assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5), name


@torch.no_grad()
def test_loading_and_decoding_give_no_deprecation_warning(memorising_model, tmp_path):
    model, sources, _ = memorising_model
    model.save_pretrained(tmp_path)
    transformers.utils.logging.warning_once.cache_clear()  # a warning given earlier in the session is given again
    logger = transformers.utils.logging.get_logger("transformers")
    with warnings.catch_warnings(record=True) as caught, CaptureLogger(logger) as logged:
        warnings.simplefilter("always")
        loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path, trust_remote_code=True)
        for num_beams in (1, 4):
            loaded.generate(sources, max_new_tokens=10, num_beams=num_beams)
    messages = [str(warning.message) for warning in caught] + logged.out.splitlines()
    assert not [message for message in messages if "deprecat" in message.lower()], messages
