"""Translation pairs read from local files or the Hub, and split. The embedded synthetic task is `toy_task.py`.

The `iter_*` readers stream (source, target) pairs, so a corpus of any size passes through them in constant memory
(`vanilla_transformer.data.prepare` writes them into Arrow files); the `read_*` readers return a plain list and a
`DataReport` that counts what was kept and dropped, for small files. Problems with the data raise `DataError`, whose
message names the file and line.

Local files are UTF-8 text, one record per line, and only "\n" ends a line (see `_read_lines`). Two repairs are made
and counted in the report: a CR before "\n" (CRLF line endings) is removed, and so is a UTF-8 byte-order mark at the
start of a file. A missing final newline loses nothing. Everything else that could shift a line or a column is a
`DataError` naming the file and line: invalid UTF-8; UTF-16 (a UTF-16 byte-order mark, or NUL bytes); a carriage return
inside a line (old Mac line endings would make the whole file one line); a TSV line with another column count than
the file's first line (a tab inside a field); a JSON line that is not an object with a string for each language; a
`.gz` file that does not decompress. Source and target files with different line counts are an error naming both
counts (a blank last line counts as a line).
"""

import codecs
import gzip
import json
import random
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import IO

from vanilla_transformer.mechanics.errors import VanillaTransformerError

Pair = tuple[str, str]


class DataError(VanillaTransformerError, ValueError):
    """A data file or dataset cannot be used; the message says which and where."""


@dataclass
class DataReport:
    """What reading and filtering did to the data.

    `too_long_dropped` and `ratio_dropped` are set by the token-length filter (`prepare.token_filter`, training pairs
    only); they stay None where no length filter ran (the readers, the evaluation splits), and the summary then says
    nothing about lengths.
    """

    sources: list[str] = field(default_factory=list)
    kept: int = 0
    empty_dropped: int = 0
    too_long_dropped: int | None = None
    ratio_dropped: int | None = None
    crlf_line_endings: int = 0  # repaired: the CR of a CRLF line ending removed
    byte_order_marks: int = 0  # repaired: a UTF-8 byte-order mark at the start of a file removed

    def summary(self) -> str:
        names = ", ".join(self.sources) or "pairs"
        dropped = f"dropped {self.empty_dropped} with an empty side"
        if self.too_long_dropped is not None:
            dropped += f", {self.too_long_dropped} too long"
        if self.ratio_dropped:
            dropped += f", {self.ratio_dropped} with a bad length ratio"
        repairs = [(self.crlf_line_endings, "CRLF line ending"), (self.byte_order_marks, "byte-order mark")]
        stripped = ", ".join(f"{count} {name}{'s' * (count > 1)}" for count, name in repairs if count)
        return f"{names}: kept {self.kept} pairs; {dropped}" + (f"; stripped {stripped}" if stripped else "")


# Reading local files


def _open_binary(path: Path) -> IO[bytes]:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except OSError as error:
        raise DataError(f"{path}: cannot open the file ({error.strerror or error})") from None


def _decode_line(raw_line: bytes, path: Path, line_number: int, report: DataReport) -> str:
    """The text of line `line_number` of `path` without its line ending ("\\n" or "\\r\\n")."""
    try:
        line = raw_line.decode("utf-8").removesuffix("\n")
    except UnicodeDecodeError as error:
        raise DataError(f"{path}:{line_number}: invalid UTF-8 ({error.reason} at byte {error.start})") from None
    if line.endswith("\r"):
        line = line.rstrip("\r")
        report.crlf_line_endings += 1
    if "\r" in line:
        raise DataError(
            f"{path}:{line_number}: a carriage return (\\r) inside the line, which other tools may take for a line "
            "end (old Mac files end their lines with \\r): end lines with \\n, or replace it, e.g. with tr '\\r' ' '"
        )
    if "\0" in line:
        raise DataError(f"{path}:{line_number}: a NUL byte: is the file UTF-16? Convert it to UTF-8 (iconv -f UTF-16)")
    return line


def _read_lines(path: Path, report: DataReport | None = None) -> Iterator[str]:
    """Yield the lines of a UTF-8 (optionally gzipped) file without their line ending.

    Lines are split on "\\n" only: characters such as U+2028 or form feed inside a sentence do not start a new line
    (as they would with `str.splitlines`), so line-aligned files stay aligned. The repairs (CRLF endings, a UTF-8
    byte-order mark) are counted in `report`; the problems listed in the module docstring raise `DataError`.
    """
    report = report if report is not None else DataReport()
    line_number = 0
    try:
        with _open_binary(path) as file:
            for line_number, raw_line in enumerate(file, start=1):
                if line_number == 1 and raw_line.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
                    raise DataError(
                        f"{path}:1: a UTF-16 byte-order mark: the file is UTF-16, not UTF-8. Convert it, e.g. with "
                        "iconv -f UTF-16 -t UTF-8"
                    )
                if line_number == 1 and raw_line.startswith(codecs.BOM_UTF8):
                    raw_line = raw_line.removeprefix(codecs.BOM_UTF8)
                    report.byte_order_marks += 1
                yield _decode_line(raw_line, path, line_number, report)
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise DataError(f"{path}:{line_number + 1}: cannot decompress the gzip file ({error})") from None


def non_empty_pairs(pairs: Iterable[Pair], report: DataReport) -> Iterator[Pair]:
    """Yield the pairs whose two sides are non-empty; count them (and the dropped ones) in `report`."""
    for source, target in pairs:
        if source and target:
            report.kept += 1
            yield source, target
        else:
            report.empty_dropped += 1


def _keep_non_empty(pairs: Iterable[Pair], report: DataReport) -> list[Pair]:
    kept = list(non_empty_pairs(pairs, report))
    if not kept:
        raise DataError(f"{', '.join(report.sources)}: no translation pairs found")
    return kept


def iter_parallel_text(
    source_path: str | Path, target_path: str | Path, report: DataReport | None = None
) -> Iterator[Pair]:
    """Stream the (stripped) pairs of two line-aligned UTF-8 text files (`.gz` files are decompressed), empty
    sides included; a difference in line counts raises `DataError` naming both files and counts. The repairs of the
    module docstring are counted in `report`."""
    source_path, target_path = Path(source_path), Path(target_path)
    source_lines, target_lines = _read_lines(source_path, report), _read_lines(target_path, report)
    for line_count, (source, target) in enumerate(zip_longest(source_lines, target_lines), start=1):
        if source is None or target is None:
            source_count = line_count - 1 + sum(1 for _ in source_lines) + (source is not None)
            target_count = line_count - 1 + sum(1 for _ in target_lines) + (target is not None)
            raise DataError(
                f"{source_path} has {source_count} lines but {target_path} has {target_count}: "
                "the files must be line-aligned"
            )
        yield source.strip(), target.strip()


def iter_tsv(path: str | Path, report: DataReport | None = None) -> Iterator[Pair]:
    """Stream the (stripped) pairs of a tab-separated UTF-8 file (optionally `.gz`): the source sentence in the first
    column, the target in the second; a blank line gives an empty pair. Each other line must have as many columns as
    the first (a tab inside a field would shift the fields after it): else `DataError` names the line. Repairs are
    counted in `report`."""
    path = Path(path)
    first = None  # (line number, column count) of the first non-blank line
    for line_number, line in enumerate(_read_lines(path, report), start=1):
        if not line.strip():
            yield "", ""
            continue
        columns = line.split("\t")
        if len(columns) < 2:
            raise DataError(f"{path}:{line_number}: found {len(columns)} tab-separated columns, need at least 2")
        first = first or (line_number, len(columns))
        if len(columns) != first[1]:
            raise DataError(
                f"{path}:{line_number}: found {len(columns)} tab-separated columns but line {first[0]} has "
                f"{first[1]}: a tab inside a field, or a missing field?"
            )
        yield columns[0].strip(), columns[1].strip()


def iter_jsonl(
    path: str | Path, source_lang: str, target_lang: str, report: DataReport | None = None
) -> Iterator[Pair]:
    """Stream the (stripped) pairs of a JSON-lines file (optionally `.gz`); each line is
    `{"translation": {"en": ..., "de": ...}}` or `{"en": ..., "de": ...}`; a blank line gives an empty pair.
    Repairs are counted in `report`."""
    path = Path(path)
    for line_number, line in enumerate(_read_lines(path, report), start=1):
        if not line.strip():
            yield "", ""
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{line_number}: invalid JSON ({error.msg})") from None
        if isinstance(record, dict) and isinstance(record.get("translation"), dict):
            record = record["translation"]
        if not isinstance(record, dict):
            raise DataError(f"{path}:{line_number}: expected a JSON object, got {type(record).__name__}")
        sentences = []
        for lang in (source_lang, target_lang):
            if lang not in record:
                raise DataError(f"{path}:{line_number}: no {lang!r} key (found {sorted(record)})")
            if not isinstance(record[lang], str):
                raise DataError(f"{path}:{line_number}: {lang!r} is not a string")
            sentences.append(record[lang].strip())
        yield sentences[0], sentences[1]


def read_parallel_text(source_path: str | Path, target_path: str | Path) -> tuple[list[Pair], DataReport]:
    """Read two line-aligned UTF-8 text files (`.gz` files are decompressed); line i of each file is one pair.

    Pairs where either side is empty are dropped and counted.
    """
    report = DataReport(sources=[str(source_path), str(target_path)])
    return _keep_non_empty(iter_parallel_text(source_path, target_path, report), report), report


def read_tsv(path: str | Path) -> tuple[list[Pair], DataReport]:
    """Read a tab-separated UTF-8 file (optionally `.gz`): source sentences in the first column, targets in the second.

    Blank lines and pairs where either side is empty are dropped and counted.
    """
    report = DataReport(sources=[str(path)])
    return _keep_non_empty(iter_tsv(path, report), report), report


def read_jsonl(path: str | Path, source_lang: str, target_lang: str) -> tuple[list[Pair], DataReport]:
    """Read a JSON-lines file (optionally `.gz`); each line is `{"translation": {"en": ..., "de": ...}}` or
    `{"en": ..., "de": ...}` (with `source_lang`/`target_lang` as keys).

    Blank lines and pairs where either side is empty are dropped and counted.
    """
    report = DataReport(sources=[str(path)])
    return _keep_non_empty(iter_jsonl(path, source_lang, target_lang, report), report), report


def hub_dataset_label(name: str, config: str | None, split: str) -> str:
    return f"{name}" + (f"/{config}" if config else "") + f" [{split}]"


def open_hub_dataset(name: str, config: str | None, split: str, streaming: bool = False):
    """A split of a Hugging Face Hub translation dataset with a `translation` column, such as `wmt14` `de-en`
    (a `datasets.Dataset`, or an `IterableDataset` with `streaming=True`). Needs network access (or a filled
    `datasets` cache)."""
    import datasets

    label = hub_dataset_label(name, config, split)
    try:
        dataset = datasets.load_dataset(name, config, split=split, streaming=streaming)
    except Exception as error:
        raise DataError(
            f"could not load the dataset {label} ({type(error).__name__}: {error}). "
            "Without network access, use local files instead (parallel text, TSV or JSON lines)."
        ) from error
    if dataset.column_names is not None and "translation" not in dataset.column_names:
        raise DataError(f"{label}: no 'translation' column (columns: {dataset.column_names})")
    return dataset


def translation_pairs(translations: Iterable[dict], label: str, source_lang: str, target_lang: str) -> Iterator[Pair]:
    """The (stripped) pairs of a `translation` column's dictionaries; empty sides included."""
    for translation in translations:
        if source_lang not in translation or target_lang not in translation:
            raise DataError(f"{label}: translation has no {source_lang!r}/{target_lang!r} (has {sorted(translation)})")
        yield (translation[source_lang] or "").strip(), (translation[target_lang] or "").strip()


def iter_hub_dataset(name: str, config: str | None, split: str, source_lang: str, target_lang: str) -> Iterator[Pair]:
    """Stream the (stripped) pairs of a Hub translation dataset's split, empty sides included."""
    dataset = open_hub_dataset(name, config, split)
    label = hub_dataset_label(name, config, split)
    for batch in dataset.iter(batch_size=10_000):
        yield from translation_pairs(batch["translation"], label, source_lang, target_lang)


def load_hub_dataset(
    name: str, config: str | None, split: str, source_lang: str, target_lang: str
) -> tuple[list[Pair], DataReport]:
    """Load a split of a Hugging Face Hub translation dataset with a `translation` column, such as `wmt14` `de-en`.

    Needs network access (or a filled `datasets` cache).
    """
    report = DataReport(sources=[hub_dataset_label(name, config, split)])
    return _keep_non_empty(iter_hub_dataset(name, config, split, source_lang, target_lang), report), report


# Splitting


def split_pairs(
    pairs: list[Pair], valid_size: int, test_size: int = 0, seed: int = 0
) -> tuple[list[Pair], list[Pair], list[Pair]]:
    """Shuffle (deterministically given `seed`) and split into train, validation and test pairs."""
    if valid_size < 0 or test_size < 0 or valid_size + test_size >= len(pairs):
        raise ValueError(
            f"Cannot take {valid_size} validation and {test_size} test pairs from {len(pairs)} pairs "
            "and keep training pairs."
        )
    shuffled = list(pairs)
    random.Random(seed).shuffle(shuffled)
    valid = shuffled[:valid_size]
    test = shuffled[valid_size : valid_size + test_size]
    train = shuffled[valid_size + test_size :]
    return train, valid, test
