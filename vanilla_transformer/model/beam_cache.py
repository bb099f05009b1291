"""A decoder cache for beam search that leaves the encoder-decoder attention's keys and values where they are.

Beam search keeps num_beams rows per sentence and, after each step, reorders the cache so that each row continues
the hypothesis it was chosen from (`reorder_cache(beam_idx)`). Those choices never leave a sentence: a row takes the
place of another row of the same sentence. The self-attention cache differs from row to row and must move; the
encoder-decoder attention's keys and values are the source sentence's, the same on every row of a sentence, so moving
them copies each sentence's rows onto themselves. transformers' EncoderDecoderCache moves both: at the OPUS-MT size
and beam 4, half of the reorder's time (8% of a translation's, docs/BENCHMARKS.md).

generate() also computes the encoder-decoder attention's keys and values on num_beams copies of each sentence's
encoder output (it repeats the encoder output for the beams before decoding): num_beams times the projections a
sentence needs, at the OPUS-MT size 11% of a beam-4 translation's multiply-adds on 16 sentences of Multi30k.
`beam_search_cache(model, encoder_output, attention_mask, num_beams)` is a cache for one generate() call that moves only
the self-attention cache and holds the source's keys and values already, computed once a sentence by the model's own
decoder and repeated for the beams. The translate command's model backend passes it with the encoder output
(`generate(encoder_outputs=..., cache=...)`). It gives generate()'s tokens (tested on padded batches of sentences of
different lengths, tests/test_translate_corpus.py).
"""

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache


class SentenceBeamCache(EncoderDecoderCache):
    """An EncoderDecoderCache whose beam reorder moves the self-attention cache only (the module docstring)."""

    def reorder_cache(self, beam_idx):
        self.self_attention_cache.reorder_cache(beam_idx)


def beam_search_cache(
    model, encoder_output: torch.Tensor, attention_mask: torch.Tensor, num_beams: int
) -> SentenceBeamCache:
    """A cache for one generate() call on a batch whose encoder output (one row a sentence) is `encoder_output`: an
    empty self-attention cache, and the encoder-decoder attention's keys and values of each sentence, computed once
    and repeated for its `num_beams` beams (the module docstring)."""
    config = model.config
    cache = SentenceBeamCache(DynamicCache(config=config), DynamicCache(config=config))
    any_token = torch.zeros((len(encoder_output), 1), dtype=torch.long, device=encoder_output.device)
    # one decoder step fills the source's keys and values (they do not depend on the token); its own are dropped
    model.get_decoder()(
        input_ids=any_token,
        encoder_hidden_states=encoder_output,
        encoder_attention_mask=attention_mask,
        cache=cache,
        use_cache=True,
    )
    cache.self_attention_cache = DynamicCache(config=config)
    cache.cross_attention_cache.batch_repeat_interleave(num_beams)
    return cache
