"""The attention that reads a sentence's source once for all its beams (vanilla_transformer/model/beam_cache.py): sdpa's
output on the keys and values repeated for the beams, whatever the mask."""

import pytest
import torch
from torch.nn import functional as F

from vanilla_transformer.model.beam_cache import sentence_beams_attention


class CrossAttention(torch.nn.Module):
    is_causal = False


def padding_mask(rows: int, query_length: int, source_length: int) -> torch.Tensor:
    mask = torch.ones(rows, 1, query_length, source_length, dtype=torch.bool)
    mask[1::3, ..., source_length // 2 :] = False  # some rows' sources are shorter
    return mask


@pytest.mark.parametrize(
    "query_length, mask",
    [(1, None), (1, "padding"), (1, "one for all"), (3, "padding"), (3, None)],
)
def test_the_sentence_beams_attention_gives_sdpa_on_the_keys_and_values_repeated_for_the_beams(query_length, mask):
    torch.manual_seed(0)
    sentences, beams, heads, source_length = 5, 4, 2, 7
    query = torch.randn(sentences * beams, heads, query_length, 8)
    key, value = torch.randn(sentences, heads, source_length, 8), torch.randn(sentences, heads, source_length, 8)
    rows = {"padding": sentences, "one for all": 1}.get(mask)
    attention_mask = padding_mask(rows, 1, source_length) if rows else None
    if attention_mask is not None and rows > 1:  # a sentence's mask on each of its beams' rows, as generate() has it
        attention_mask = attention_mask.repeat_interleave(beams, 0)
        if query_length > 1:  # a mask per query position: the path that repeats the keys and values
            attention_mask = attention_mask.expand(-1, -1, query_length, -1)
    output, _ = sentence_beams_attention(CrossAttention(), query, key, value, attention_mask, scaling=8**-0.5)
    expected = F.scaled_dot_product_attention(
        query, key.repeat_interleave(beams, 0), value.repeat_interleave(beams, 0), attn_mask=attention_mask
    ).transpose(1, 2)
    assert output.shape == (sentences * beams, query_length, heads, 8)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-6)


def test_the_model_reads_the_sources_once_a_sentence_until_the_last_of_overlapping_calls_ends(model_and_tokenizer):
    """Calls on one model in several threads (ModelBackend's workers) overlap: the first to end leaves the others'
    attention as it was, and the last puts sdpa back."""
    from vanilla_transformer.model.beam_cache import SENTENCE_BEAMS_ATTENTION, sentence_beam_cache

    model, _ = model_and_tokenizer
    config, attention = model.config, model.config._attn_implementation
    config._attn_implementation = "sdpa"
    try:
        first, second = sentence_beam_cache(model), sentence_beam_cache(model)
        assert first.__enter__().source_once_a_sentence and second.__enter__().source_once_a_sentence
        first.__exit__(None, None, None)
        assert config._attn_implementation == SENTENCE_BEAMS_ATTENTION
        second.__exit__(None, None, None)
        assert config._attn_implementation == "sdpa"
    finally:
        config._attn_implementation = attention
