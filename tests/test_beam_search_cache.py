"""Beam search moves only the decoder's own cache between steps; the encoder-decoder keys and values, the same for
every beam of a sentence, are kept once per sentence and read once for all its beams (the fast paths). transformers'
beam search never moves a beam to another sentence, and a sentence's beams share its source and mask."""

import pytest
import torch

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

from .helpers import random_ids


def filled_cache(model, input_ids, attention_mask, num_beams: int):
    """The cache after two decoding steps of `num_beams` copies of each source, as beam search holds it."""
    input_ids = input_ids.repeat_interleave(num_beams, dim=0)
    attention_mask = attention_mask.repeat_interleave(num_beams, dim=0)
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
    cache = None
    for seed in range(2):
        step = random_ids(model.config, (input_ids.shape[0], 1), seed=seed)
        cache = model(
            attention_mask=attention_mask,
            encoder_outputs=encoder_outputs,
            decoder_input_ids=step,
            past_key_values=cache,
            use_cache=True,
        ).past_key_values
    return cache


@torch.no_grad()
def test_reordering_within_sentences_keeps_the_encoder_keys_and_values_once_per_sentence(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    cache = filled_cache(tiny_model, input_ids, attention_mask, num_beams=3)
    self_keys = cache.self_attention_cache.layers[0].keys.clone()
    cross_layers = [(layer.keys.clone(), layer.values.clone()) for layer in cache.cross_attention_cache.layers]
    beam_idx = torch.tensor([2, 2, 0, 4, 3, 3])  # every beam continues a beam of its own sentence
    tiny_model._reorder_cache(cache, beam_idx)
    assert torch.equal(cache.self_attention_cache.layers[0].keys, self_keys[beam_idx])
    for layer, (keys, values) in zip(cache.cross_attention_cache.layers, cross_layers, strict=True):
        assert torch.equal(layer.keys, keys[::3]) and torch.equal(layer.values, values[::3])  # one row per sentence

    tiny_model._reorder_cache(cache, torch.tensor([1, 1, 1, 5, 5, 4]))  # once grouped, they stay as they are
    assert cache.cross_attention_cache.layers[0].keys.shape[0] == 2


@torch.no_grad()
def test_the_switch_off_keeps_one_row_per_beam_as_generate_does(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    tiny_model.config.grouped_beam_cross_attention = False
    cache = filled_cache(tiny_model, input_ids, attention_mask, num_beams=2)
    cross_keys = cache.cross_attention_cache.layers[1].keys.clone()
    beam_idx = torch.tensor([1, 1, 2, 3])
    tiny_model._reorder_cache(cache, beam_idx)
    assert torch.equal(cache.cross_attention_cache.layers[1].keys, cross_keys[beam_idx])


@torch.no_grad()
def test_different_sources_are_never_grouped(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    cache = filled_cache(tiny_model, input_ids, attention_mask, num_beams=1)
    tiny_model._reorder_cache(cache, torch.tensor([0, 1]))
    assert cache.cross_attention_cache.layers[0].keys.shape[0] == 2


@torch.no_grad()
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("masks", ["per beam", "none"])
@pytest.mark.parametrize("new_tokens", [1, 2])
def test_grouped_attention_equals_attention_per_beam(tiny_model, source_batch, implementation, masks, new_tokens):
    """A decoding step after grouping: the same logits and cross-attention weights as with one row per beam."""
    tiny_model.set_attn_implementation(implementation)
    input_ids, attention_mask = source_batch
    beam_masks = attention_mask.repeat_interleave(3, dim=0)
    encoder_outputs = tiny_model.get_encoder()(
        input_ids=input_ids.repeat_interleave(3, dim=0), attention_mask=beam_masks
    )
    grouped = filled_cache(tiny_model, input_ids, attention_mask, num_beams=3)
    per_beam = filled_cache(tiny_model, input_ids, attention_mask, num_beams=3)
    tiny_model._reorder_cache(grouped, torch.arange(6))
    assert grouped.cross_attention_cache.layers[0].keys.shape[0] == 2

    step = dict(encoder_outputs=encoder_outputs, attention_mask=None if masks == "none" else beam_masks)
    step.update(decoder_input_ids=random_ids(tiny_model.config, (6, new_tokens), seed=5), use_cache=True)
    step.update(output_attentions=implementation == "eager")  # sdpa returns no weights
    expected = tiny_model(past_key_values=per_beam, **step)
    actual = tiny_model(past_key_values=grouped, **step)
    torch.testing.assert_close(actual.logits, expected.logits)
    assert (actual.cross_attentions is not None) == (implementation == "eager")
    heads = tiny_model.config.decoder_attention_heads
    for weights, expected_weights in zip(actual.cross_attentions or (), expected.cross_attentions or (), strict=True):
        assert weights.shape == expected_weights.shape == (6, heads, new_tokens, 9)
        torch.testing.assert_close(weights, expected_weights)


@torch.no_grad()
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("sources, groups", [("different", 3), ("identical", 1)])
def test_beam_search_returns_what_the_default_full_reorder_returns(
    tiny_model, tiny_config, monkeypatch, implementation, sources, groups
):
    tiny_model.set_attn_implementation(implementation)
    input_ids = random_ids(tiny_config, (3, 7), seed=11)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 4:] = 0
    if sources == "identical":  # all 12 beams share one row of encoder keys and values
        input_ids, attention_mask = input_ids[[2, 2, 2]], attention_mask[[2, 2, 2]]
    kwargs = dict(attention_mask=attention_mask, num_beams=4, max_new_tokens=10, num_return_sequences=2)
    kwargs.update(return_dict_in_generate=True, output_scores=True, output_attentions=implementation == "eager")
    grouped_rows = []
    reorder = tiny_model._reorder_cache

    def recording_reorder(cache, beam_idx):
        cache = reorder(cache, beam_idx)
        grouped_rows.append(cache.cross_attention_cache.layers[0].keys.shape[0])
        return cache

    monkeypatch.setattr(tiny_model, "_reorder_cache", recording_reorder)
    ours = tiny_model.generate(input_ids, **kwargs)
    assert set(grouped_rows) == {groups}  # one row of encoder keys and values per source, from the first step on
    monkeypatch.delattr(VanillaTransformerForConditionalGeneration, "_reorder_cache")  # generate's own reorder
    monkeypatch.delattr(tiny_model, "_reorder_cache")
    default = tiny_model.generate(input_ids, **kwargs)
    assert torch.equal(ours.sequences, default.sequences)
    assert (ours.cross_attentions is not None) == (implementation == "eager")
    torch.testing.assert_close(ours.sequences_scores, default.sequences_scores)
    for step, default_step in zip(ours.cross_attentions or (), default.cross_attentions or (), strict=True):
        for weights, default_weights in zip(step, default_step, strict=True):
            torch.testing.assert_close(weights, default_weights)
