"""`translate_texts`: the one translation function under the command, the demo and the benchmarks. It batches texts
by tokens (`token_batches`), cuts a text longer than the model's positions into pieces that fit, and gives the
translations back in input order. A backend (`translate.ModelBackend`, `ctranslate2_backend.CTranslate2Backend`) does
the encoding and the decoding; this module imports neither torch nor transformers.
"""

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
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
        batch_size = BATCH_SIZE
    waiting = deque()  # the groups read and not yet given back, in order

    def batches() -> Iterator[list[list[int]]]:
        for texts in groups:
            group = _Group(backend, texts, max_source_tokens or backend.max_source_tokens, max_tokens, batch_size)
            waiting.append(group)
            for batch in group.batches:
                yield [group.encoded[index] for index in batch]

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
        self.translated = Translated([""] * len(texts))
        kept = [index for index, text in enumerate(texts) if text.strip()]
        self.encoded, self.owners, self.spaces = [], [], []  # the ids translated, their text, the space after them
        for index, ids in zip(kept, backend.encode([texts[index] for index in kept]) if kept else [], strict=True):
            if len(ids) <= limit:  # encoded once: only the pieces of a cut text are encoded again
                self.encoded.append(ids)
                self.owners.append(index)
                self.spaces.append("")
                continue
            cut = cut_to_fit(texts[index], backend.count, limit)
            self.translated.cut += len(cut) > 1
            self.encoded += backend.encode([piece for piece, _ in cut])
            self.owners += [index] * len(cut)
            self.spaces += [space for _, space in cut]
        self.batches = token_batches([len(ids) for ids in self.encoded], max_tokens, batch_size, backend.beams)
        self.translations, self.finished = [""] * len(self.encoded), 0

    def add(self, texts: list[str], target_tokens: int) -> None:
        """The translations of the next of its batches."""
        for index, text in zip(self.batches[self.finished], texts, strict=True):
            self.translations[index] = text
        self.translated.target_tokens += target_tokens
        self.finished += 1

    def finish(self) -> Translated:
        """Each text's translation, its pieces' joined."""
        for owner, translation, space in zip(self.owners, self.translations, self.spaces, strict=True):
            self.translated.texts[owner] += translation + space
        return self.translated
