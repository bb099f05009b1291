"""`translate_texts`: the one translation function under the command, the demo and the benchmarks. It batches texts
by tokens (`token_batches`), cuts a text longer than the model's positions into pieces that fit, and gives the
translations back in input order. A backend (`translate.ModelBackend`, `ctranslate2_backend.CTranslate2Backend`) does
the encoding and the decoding; this module imports neither torch nor transformers.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from vanilla_transformer.serving.sentences import cut_to_fit
from vanilla_transformer.serving.settings import BATCH_SIZE


@dataclass
class Translated:
    """Translations in input order, with what a summary reports: target tokens generated (special tokens excluded)
    and the sentences cut to fit the model."""

    texts: list[str]
    target_tokens: int = 0
    cut: int = 0


def token_batches(
    lengths: Sequence[int], max_tokens: int | None = None, max_sentences: int | None = None, beams: int = 1
) -> list[list[int]]:
    """The indices of `lengths` in batches, longest first (little padding). A batch of n sentences whose longest has
    L tokens holds n * L * beams <= `max_tokens` (fairseq's --max-tokens, padding counted, times the beams that
    generation multiplies it by) and n <= `max_sentences`; a sentence over the budget alone is a batch of its own."""
    if max_tokens is None and max_sentences is None:
        raise ValueError("give max_tokens, max_sentences or both.")
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    batches, batch = [], []
    for index in order:
        longest = lengths[batch[0]] if batch else lengths[index]
        too_many = max_sentences is not None and len(batch) == max_sentences
        too_big = max_tokens is not None and (len(batch) + 1) * longest * beams > max_tokens
        if batch and (too_many or too_big):
            batches.append(batch)
            batch = []
        batch.append(index)
    if batch:
        batches.append(batch)
    return batches


def translate_texts(
    backend,
    texts: Sequence[str],
    batch_size: int | None = None,
    max_tokens: int | None = None,
    max_source_tokens: int | None = None,
) -> Translated:
    """Translate `texts` with `backend` (ModelBackend, CTranslate2Backend), one translation each, in input order.

    Empty or whitespace-only texts give "" without running the model. A text over `max_source_tokens` (default: the
    backend's, the model's positions) is cut at punctuation or spaces into pieces that fit (`sentences.cut_to_fit`),
    whose translations are joined; `Translated.cut` counts them. Batches: `token_batches` by `max_tokens` and
    `batch_size` (at least one given; the default is BATCH_SIZE sentences)."""
    if batch_size is None and max_tokens is None:
        batch_size = BATCH_SIZE
    limit = max_source_tokens or backend.max_source_tokens
    result = Translated([""] * len(texts))
    kept = [index for index, text in enumerate(texts) if text.strip()]
    encoded, owners, spaces = [], [], []  # the ids translated, the text each belongs to, the space after it
    for index, ids in zip(kept, backend.encode([texts[index] for index in kept]) if kept else [], strict=True):
        if len(ids) <= limit:  # encoded once: only the pieces of a cut text are encoded again
            encoded.append(ids)
            owners.append(index)
            spaces.append("")
            continue
        cut = cut_to_fit(texts[index], backend.count, limit)
        result.cut += len(cut) > 1
        encoded += backend.encode([piece for piece, _ in cut])
        owners += [index] * len(cut)
        spaces += [space for _, space in cut]
    translations = [""] * len(encoded)
    batches = token_batches([len(ids) for ids in encoded], max_tokens, batch_size, backend.beams)
    translated = backend.translate_batches([encoded[index] for index in batch] for batch in batches)
    for batch, (texts_out, tokens) in zip(batches, translated, strict=True):
        result.target_tokens += tokens
        for index, text in zip(batch, texts_out, strict=True):
            translations[index] = text
    for owner, translation, space in zip(owners, translations, spaces, strict=True):
        result.texts[owner] += translation + space
    return result
