"""A text as the pieces a translation model can take: its sentences, and a sentence too long for the model cut to fit.

Sentences are split with sentencex (rule-based, about 300 languages, no model to download), and a sentence longer
than the model's positions is cut at punctuation or spaces into pieces that fit. Each piece keeps the whitespace that
followed it in the text, so that translations join back as the source was joined: a space between English sentences,
none between Japanese ones.

Why sentencex: it needs no downloaded model (spaCy, stanza and NLTK's punkt do), it covers far more languages than
pysbd's 22 (falling back from a language to its family, then to English rules), and its Rust core splits a megabyte in
milliseconds. Its segments keep their trailing whitespace, which is what putting a document back together needs.
"""

import re
from collections.abc import Callable

import sentencex

Piece = tuple[str, str]  # (text to translate, the whitespace that followed it)
CLAUSE_END = re.compile(r"(?<=[,;:)\]}\u3001\u3002\uff0c\uff1b\uff1a])\s*")  # after , ; : ) and their CJK forms
SPACE = re.compile(r"\s+")


def with_trailing_space(text: str) -> Piece:
    stripped = text.rstrip()
    return stripped, text[len(stripped) :]


def split_sentences(text: str, language: str) -> list[Piece]:
    """The sentences of `text` (one line or paragraph), each with the whitespace after it; leading whitespace is kept
    as a first piece with nothing to translate."""
    pieces = []
    leading = text[: len(text) - len(text.lstrip())]
    if leading:
        pieces.append(("", leading))
    pieces += [with_trailing_space(sentence) for sentence in sentencex.segment(language, text.lstrip())]
    return [piece for piece in pieces if piece != ("", "")]


def cut_to_fit(text: str, count: Callable[[str], int], limit: int) -> list[Piece]:
    """`text` as pieces of at most `limit` tokens by `count`: cut after clause punctuation first, then at spaces,
    then between characters (a script without spaces, or a run of one symbol). Pieces are packed greedily, so each
    is as long as fits. A text that fits is one piece."""
    if count(text) <= limit:
        return [(text, "")]
    for boundary in (CLAUSE_END, SPACE):
        parts = _split_keeping_space(text, boundary)
        if len(parts) > 1:
            return _pack(parts, count, limit)
    return _pack_characters(text, count, limit)


def _split_keeping_space(text: str, boundary: re.Pattern) -> list[Piece]:
    parts, start = [], 0
    for match in boundary.finditer(text):
        if match.end() == len(text) or match.end() == 0 or (match.start() == match.end() and match.end() == start):
            continue
        parts.append((text[start : match.start()], match.group()))
        start = match.end()
    parts.append((text[start:], ""))
    return [part for part in parts if part[0]]


def _pack(parts: list[Piece], count: Callable[[str], int], limit: int) -> list[Piece]:
    """Consecutive parts joined while they fit. Parts are counted one by one (the tokens a text has besides its
    words, count(""), once per piece), and each joined piece is counted again whole: one that still does not fit
    takes half as many parts, and a part that alone does not fit is cut further."""
    overhead = count("")
    costs = [max(count(part) - overhead, 1) for part, _ in parts]
    pieces: list[Piece] = []
    start = 0
    while start < len(parts):
        end, total = start + 1, overhead + costs[start]
        while end < len(parts) and total + costs[end] <= limit:
            total, end = total + costs[end], end + 1
        while True:
            text = "".join(part + space for part, space in parts[start : end - 1]) + parts[end - 1][0]
            if end - start == 1 or count(text) <= limit:
                break
            end = start + (end - start) // 2
        if end - start == 1 and count(text) > limit:
            cut = cut_to_fit(text, count, limit)
            pieces += cut[:-1] + [(cut[-1][0], parts[start][1])]
        else:
            pieces.append((text, parts[end - 1][1]))
        start = end
    return pieces


def _pack_characters(text: str, count: Callable[[str], int], limit: int) -> list[Piece]:
    """Cut a text without spaces into the longest prefixes that fit (binary search on the character count)."""
    pieces = []
    while text:
        low, high = 1, len(text)
        while low < high:
            middle = (low + high + 1) // 2
            if count(text[:middle]) <= limit:
                low = middle
            else:
                high = middle - 1
        pieces.append((text[:low], ""))
        text = text[low:]
    return pieces
