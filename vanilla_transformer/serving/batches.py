"""`translate_texts`: the one translation function under the command, the demo, the server and the benchmarks. It
batches texts by tokens (`token_batches`), cuts a text longer than the model's positions into pieces that fit
(`Pieces`), and gives the translations back in input order. A backend (`TranslationBackend`: the model's
`decoding.ModelBackend`, `ctranslate2_backend.CTranslate2Backend`) does the encoding and the decoding; this module
imports neither torch nor transformers.
"""

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from vanilla_transformer.serving.sentences import cut_to_fit


class TranslationBackend(Protocol):
    """What decodes: the model (`decoding.ModelBackend`) or its CTranslate2 export (`CTranslate2Backend`). Decoding
    settings (beam, output length: the folder's generation_config.json unless given) are the backend's own."""

    beams: int  # the beam width (a batch's cost is its tokens times this)
    max_source_tokens: int  # the longest source it takes (the model's positions); longer texts are cut

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's source token ids."""

    def count(self, text: str) -> int:
        """The source tokens of `text`."""

    def translate(self, batch: list[list[int]]) -> tuple[list[str], int]:
        """One batch's translations, in order, and the target tokens generated (special tokens excluded)."""

    def translate_batches(self, batches: Iterable[list[list[int]]]) -> Iterator[tuple[list[str], int]]:
        """`translate` of each batch, in order (a backend may decode several at once)."""

    def with_decoding(self, num_beams: int | None = None, max_new_tokens: int | None = None) -> "TranslationBackend":
        """The same model decoding with this beam or output length (None: this backend's): a request's options."""


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
    `batch_size`, at least one given (ValueError otherwise): each caller states its own default."""
    [translated] = translate_groups(backend, [texts], batch_size, max_tokens, max_source_tokens)  # run to its end
    return translated


def translate_groups(
    backend,
    groups: Iterable[Sequence[str]],
    batch_size: int | None = None,
    max_tokens: int | None = None,
    max_source_tokens: int | None = None,
) -> Iterator[Translated]:
    """`translate_texts` of each group of texts (a corpus's chunks), in order, each batched on its own (the batches it
    would have alone), with the groups' batches given to the backend as one stream: a backend decoding several
    batches at once starts the next group's first while the last of a group are decoded. A group is read, encoded and
    batched only when the backend asks for its first batch."""
    if batch_size is None and max_tokens is None:
        raise ValueError("give batch_size (sentences) or max_tokens (source tokens x beams) for the batches")
    waiting = deque()  # the groups read and not yet given back, in order

    def batches() -> Iterator[list[list[int]]]:
        for texts in groups:
            group = _Group(backend, texts, max_source_tokens or backend.max_source_tokens, max_tokens, batch_size)
            waiting.append(group)
            for batch in group.batches:
                yield [group.pieces.encoded[index] for index in batch]

    def finished() -> Iterator[Translated]:  # the first groups, once all their batches are back (or they had none)
        while waiting and waiting[0].finished == len(waiting[0].batches):
            yield waiting.popleft().finish()

    for texts, target_tokens in backend.translate_batches(batches()):
        yield from finished()  # groups read since the last batch, without a batch of their own
        waiting[0].add(texts, target_tokens)
        yield from finished()
    yield from finished()


class _Group:
    """One group of texts as `translate_groups` translates it: the ids to translate (a text over `limit` tokens cut
    into pieces), their batches, and the translations as the batches come back."""

    def __init__(self, backend, texts: Sequence[str], limit: int, max_tokens: int | None, batch_size: int | None):
        self.pieces = Pieces(backend, texts, limit)
        self.batches = token_batches([len(ids) for ids in self.pieces.encoded], max_tokens, batch_size, backend.beams)
        self.translations, self.target_tokens, self.finished = [""] * len(self.pieces.encoded), 0, 0

    def add(self, texts: list[str], target_tokens: int) -> None:
        """The translations of the next of its batches."""
        for index, text in zip(self.batches[self.finished], texts, strict=True):
            self.translations[index] = text
        self.target_tokens += target_tokens
        self.finished += 1

    def finish(self) -> Translated:
        return Translated(self.pieces.join(self.translations), self.target_tokens, self.pieces.cut)


class Pieces:
    """Texts as the token ids a backend translates: a blank text none (its translation is ""), a text within `limit`
    tokens its own ids, a longer one cut at punctuation or spaces into pieces that fit (`sentences.cut_to_fit`), whose
    translations `join` puts back together."""

    def __init__(self, backend, texts: Sequence[str], limit: int):
        self.count, self.cut = len(texts), 0
        kept = [index for index, text in enumerate(texts) if text.strip()]
        self.encoded, self.owners, self.spaces = [], [], []  # the ids translated, their text, the space after them
        for index, ids in zip(kept, backend.encode([texts[index] for index in kept]) if kept else [], strict=True):
            if len(ids) <= limit:  # encoded once: only the pieces of a cut text are encoded again
                self.encoded.append(ids)
                self.owners.append(index)
                self.spaces.append("")
                continue
            cut = cut_to_fit(texts[index], backend.count, limit)
            self.cut += len(cut) > 1
            self.encoded += backend.encode([piece for piece, _ in cut])
            self.owners += [index] * len(cut)
            self.spaces += [space for _, space in cut]

    def join(self, translations: Sequence[str]) -> list[str]:
        """Each text's translation from its pieces' (one for each of `encoded`, in order)."""
        texts = [""] * self.count
        for owner, translation, space in zip(self.owners, translations, self.spaces, strict=True):
            texts[owner] += translation + space
        return texts
