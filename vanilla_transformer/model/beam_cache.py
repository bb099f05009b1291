"""A decoder cache for beam search that leaves the encoder-decoder attention's keys and values where they are.

Beam search keeps num_beams rows per sentence and, after each step, reorders the cache so that each row continues
the hypothesis it was chosen from (`reorder_cache(beam_idx)`). Those choices never leave a sentence: a row takes the
place of another row of the same sentence. The self-attention cache differs from row to row and must move; the
encoder-decoder attention's keys and values are the source sentence's, the same on every row of a sentence, so moving
them copies each sentence's rows onto themselves. transformers' EncoderDecoderCache moves both: at the OPUS-MT size
and beam 4, half of the reorder's time (8% of a translation's, docs/BENCHMARKS.md).

`beam_search_cache(config)` is a cache for one generate() call that moves only the self-attention cache; the
translate command's model backend passes it (`generate(..., cache=...)`). It gives generate()'s tokens (tested on
padded batches of sentences of different lengths, tests/test_translate_corpus.py).
"""

from transformers.cache_utils import DynamicCache, EncoderDecoderCache


class SentenceBeamCache(EncoderDecoderCache):
    """An EncoderDecoderCache whose beam reorder moves the self-attention cache only (the module docstring)."""

    def reorder_cache(self, beam_idx):
        self.self_attention_cache.reorder_cache(beam_idx)


def beam_search_cache(config) -> SentenceBeamCache:
    """A new, empty cache for one generate() call of a model of `config`."""
    return SentenceBeamCache(DynamicCache(config=config), DynamicCache(config=config))
