"""The encoder-decoder attention's keys and values once a sentence during beam search, not once a beam.

generate()'s beam search runs num_beams rows per sentence. It repeats the encoder output for the beams, so every
decoder layer projects num_beams copies of each source into keys and values (at the OPUS-MT size, 11% of a beam-4
translation's multiply-adds on 16 sentences of Multi30k), holds num_beams copies in its cache, reads all of them at
every step (the query of one step is one vector a row: the attention reads the whole source for 8 products) and, after
each step, reorders them (`reorder_cache(beam_idx)`) although a row only ever takes the place of another row of the
same sentence: the source's keys and values are the same on every row of a sentence, so the reorder copies them onto
themselves.

`sentence_beam_cache(model)` gives a cache for one generate() call that

- takes the first step once a sentence (`beam_search.first_step_once_a_sentence`), where a sentence's beams are one
  row num_beams times: that step computes the source's keys and values once a sentence too;
- then holds them once a sentence, and moves only the self-attention cache when the beams are reordered
  (`SentenceBeamCache`);
- for as long as the call lasts, has the model's "sdpa" attention read them once a sentence: the queries of a
  sentence's beams become one query of num_beams positions against its source (`sentence_beams_attention`, registered
  with transformers' AttentionInterface, the library's public way to supply an attention function), the same
  products row by row, though not always rounded alike: torch's flash kernel on CPU takes another path for one query
  position than for several (on an AMD EPYC the outputs differed by up to 7e-7 in values up to 1.2), so the beams
  get generate()'s tokens, checked by the tests, not its bits. The model's config names it while a call lasts (with
  calls in several threads, until the last ends) and "sdpa" again after; wherever the rows are equal it is sdpa
  itself, so another call on the same model meanwhile computes as before.

With another attention implementation (eager, a flash kernel) the keys and values are repeated for the beams after
the first step, as generate() holds them, and only the first two points hold. The translate command's model backend
uses it (`model/decoding.py`); it gives generate()'s tokens (tests/test_translate_corpus.py).
"""

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from transformers import AttentionInterface, AttentionMaskInterface
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

SENTENCE_BEAMS_ATTENTION = "vanilla_transformer_sentence_beams_sdpa"
_CALLS, _CALLS_LOCK = Counter(), threading.Lock()  # the calls under way on each model config, in any thread


class SentenceBeamCache(EncoderDecoderCache):
    """An EncoderDecoderCache for beam search whose first step is taken once a sentence (then `repeat_for_beams`),
    and whose beam reorder moves the self-attention cache only (the module docstring). `source_once_a_sentence`: the
    source's keys and values stay one row a sentence (the attention reads them so)."""

    source_once_a_sentence = False

    def repeat_for_beams(self, num_beams: int) -> None:
        """After a first step taken once a sentence: each sentence's rows, num_beams times, where the beams need them."""
        self.self_attention_cache.batch_repeat_interleave(num_beams)
        if not self.source_once_a_sentence:
            self.cross_attention_cache.batch_repeat_interleave(num_beams)

    def reorder_cache(self, beam_idx):
        self.self_attention_cache.reorder_cache(beam_idx)


def sentence_beams_attention(module, query, key, value, attention_mask, **kwargs):
    """sdpa attention where the keys and values hold one row a sentence and the queries num_beams rows a sentence
    (sentence-major, as generate() lays the beams out): each sentence's beams are one query of num_beams x Tq
    positions against its source. Anything else (equal rows: self-attention, the encoder) is sdpa as it is."""
    beams, rest = divmod(query.shape[0], key.shape[0])
    if beams == 1 or rest:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.shape[2] != 1:  # a mask per query position: one row a beam
        key, value = key.repeat_interleave(beams, 0), value.repeat_interleave(beams, 0)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.shape[0] == query.shape[0]:
        attention_mask = attention_mask[::beams]  # a sentence's mask, the same for its beams' positions
    sentences, query_length = key.shape[0], query.shape[2]
    # (sentences * beams, H, Tq, d) -> (sentences, H, beams * Tq, d)
    folded = query.unflatten(0, (sentences, beams)).transpose(1, 2).flatten(2, 3)
    output, weights = sdpa_attention_forward(module, folded, key, value, attention_mask, **kwargs)
    # output (sentences, beams * Tq, H, d_v) -> (sentences * beams, Tq, H, d_v)
    return output.unflatten(1, (beams, query_length)).flatten(0, 1), weights


@contextmanager
def sentence_beam_cache(model) -> Iterator[SentenceBeamCache]:
    """An empty cache for one generate() call with `beam_search`, to use inside the `with` block (the module
    docstring)."""
    config = model.config
    cache = SentenceBeamCache(DynamicCache(config=config), DynamicCache(config=config))
    with _CALLS_LOCK:
        if config._attn_implementation in ("sdpa", SENTENCE_BEAMS_ATTENTION):
            cache.source_once_a_sentence = True
            AttentionInterface.register(SENTENCE_BEAMS_ATTENTION, sentence_beams_attention)
            AttentionMaskInterface.register(SENTENCE_BEAMS_ATTENTION, sdpa_mask)  # the masks sdpa gets
            config._attn_implementation = SENTENCE_BEAMS_ATTENTION
            _CALLS[id(config)] += 1
    if not cache.source_once_a_sentence:
        yield cache
        return
    try:
        yield cache
    finally:
        with _CALLS_LOCK:
            _CALLS[id(config)] -= 1
            if not _CALLS[id(config)]:  # the last of the calls on this model (ModelBackend's workers run several)
                del _CALLS[id(config)]
                config._attn_implementation = "sdpa"
