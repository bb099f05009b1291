"""Beam search moves only the decoder's own cache between steps; the encoder-decoder keys and values stay put."""

import torch

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

from .test_modeling import random_ids


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
def test_reordering_within_sentences_moves_only_the_decoder_keys_and_values(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    cache = filled_cache(tiny_model, input_ids, attention_mask, num_beams=3)
    self_keys = cache.self_attention_cache.layers[0].keys.clone()
    cross_keys = cache.cross_attention_cache.layers[0].keys
    beam_idx = torch.tensor([2, 2, 0, 4, 3, 3])  # every beam continues a beam of its own sentence
    tiny_model._reorder_cache(cache, beam_idx)
    assert torch.equal(cache.self_attention_cache.layers[0].keys, self_keys[beam_idx])
    assert cache.cross_attention_cache.layers[0].keys is cross_keys  # not copied


@torch.no_grad()
def test_reordering_across_sentences_still_moves_the_encoder_keys_and_values(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    cache = filled_cache(tiny_model, input_ids, attention_mask, num_beams=2)
    cross_keys = cache.cross_attention_cache.layers[1].keys.clone()
    beam_idx = torch.tensor([2, 3, 0, 1])  # the two sentences swap places
    tiny_model._reorder_cache(cache, beam_idx)
    assert torch.equal(cache.cross_attention_cache.layers[1].keys, cross_keys[beam_idx])


@torch.no_grad()
def test_beam_search_returns_what_the_default_full_reorder_returns(tiny_model, tiny_config, monkeypatch):
    input_ids = random_ids(tiny_config, (3, 7), seed=11)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[2, 4:] = 0
    kwargs = dict(attention_mask=attention_mask, num_beams=4, max_new_tokens=10, num_return_sequences=2)
    ours = tiny_model.generate(input_ids, **kwargs)
    monkeypatch.delattr(VanillaTransformerForConditionalGeneration, "_reorder_cache")  # generate's own reorder
    assert torch.equal(tiny_model.generate(input_ids, **kwargs), ours)
