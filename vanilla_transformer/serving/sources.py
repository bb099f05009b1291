"""What `vanilla-transformer translate` reads: the units of a corpus, each translated into one unit of the output.

- A text file (or stdin): UTF-8, one unit per line; with `paragraphs`, one unit per paragraph (its lines joined by a
  space) and one per blank line, which stays blank. Lines are split at "\n" only; a byte-order mark on line 1 is
  dropped; bad UTF-8 is an error naming the line and byte. A line over `max_line_bytes` is an error naming it,
  raised before the line is held whole or tokenized (memory stays bounded on any file, /dev/zero included).
- A dataset (`datasets`): a Hub dataset in the local cache, or local Parquet, JSON Lines or CSV files, one unit per
  row, the text in `column`; `streaming` reads it row by row, for datasets larger than memory.

A source is opened again by each process and for the final output, and yields the same units each time.
"""

import codecs
import hashlib
import io
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError

MAX_LINE_BYTES = 1 << 20  # 1 MiB: about 250,000 tokens, 500 pieces at the paper's 512 positions
NO_STDIN = "there is no input: stdin is closed. Pipe the sentences in (< source.txt) or give --input FILE."
DATA_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


class InputError(VanillaTransformerError):
    """The input cannot be read as a corpus; the message names the file, line or field."""


def decode_line(raw: bytes, number: int, name: str) -> str:
    """Line `number` without its line ending (and, on line 1, a byte-order mark); InputError names the line and byte of
    bad UTF-8. Only "\n" ends a line: other characters that `str.splitlines` breaks at stay inside it."""
    raw = raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw
    try:
        return raw.decode("utf-8").removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError as error:
        raise InputError(
            f"cannot read the input {name}: invalid UTF-8 on line {number} ({error.reason} at byte {error.start + 1} "
            "of the line): the input must be UTF-8 text"
        ) from None


def stream_lines(stream, name: str, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The lines of a binary stream, decoded (`decode_line`), none held over `max_line_bytes`."""
    number = 0
    try:
        while raw := stream.readline(max_line_bytes + 1):
            number += 1
            if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                raise InputError(
                    f"line {number} of {name} is over {max_line_bytes:,} bytes: a line is a sentence or a paragraph, "
                    "so this is not text to translate line by line (split it, or raise --max_line_bytes)"
                )
            yield decode_line(raw, number, name)
    except OSError as error:
        raise InputError(f"cannot read the input {name}: {error}") from error


def paragraphs(lines: Iterator[str], max_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Paragraphs (runs of non-blank lines, joined by a space) and, as "", each blank line between them."""
    paragraph: list[str] = []
    size = 0
    for line in lines:
        if line.strip():
            paragraph.append(line.strip())
            size += len(line)
            if size > max_bytes:
                raise InputError(f"a paragraph is over {max_bytes:,} characters: separate paragraphs by blank lines")
            continue
        if paragraph:
            yield " ".join(paragraph)
            paragraph, size = [], 0
        yield ""
    if paragraph:
        yield " ".join(paragraph)


@dataclass(frozen=True)
class TextSource:
    """A UTF-8 text file (`path`; None: stdin, read once), read a line or a paragraph a unit."""

    path: str | None
    paragraphs: bool = False
    max_line_bytes: int = MAX_LINE_BYTES

    @property
    def label(self) -> str:
        return self.path or "(stdin)"

    def units(self) -> Iterator[str]:
        if self.path is None:
            yield from stdin_units(self.paragraphs, self.max_line_bytes)
            return
        try:
            stream = open(self.path, "rb")
        except OSError as error:
            raise InputError(f"cannot read the input {self.path}: {error}") from error
        with stream:
            lines = stream_lines(stream, self.path, self.max_line_bytes)
            yield from paragraphs(lines, self.max_line_bytes) if self.paragraphs else lines


def stdin_units(paragraph_mode: bool, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The units of stdin, read once (translating to stdout)."""
    if sys.stdin is None:
        raise InputError(NO_STDIN)
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stdin (tests, embedding): encode it back
        stream = io.BytesIO(sys.stdin.read().encode("utf-8"))
    lines = stream_lines(stream, "(stdin)", max_line_bytes)
    return paragraphs(lines, max_line_bytes) if paragraph_mode else lines


def spool_stdin(path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> None:
    """Copy stdin into `path`, line by line (each line checked as `stream_lines` checks it): a resumable run reads its
    input again, and stdin cannot be read twice. Everything is read before anything is written to --output."""
    if sys.stdin is None:
        raise InputError(NO_STDIN)
    stream = getattr(sys.stdin, "buffer", None)
    with open(path, "wb") as file:
        if stream is None:
            file.write(sys.stdin.read().encode("utf-8"))
            return
        for line in stream_lines(stream, "(stdin)", max_line_bytes):
            file.write(line.encode("utf-8") + b"\n")


@dataclass(frozen=True)
class DatasetSource:
    """Rows of a dataset, the unit being `column`: a Hub dataset (`name`, `config`, `split`) from the local cache, or
    local `data_files` (Parquet, JSON Lines, CSV, by their suffix); `streaming` for one larger than memory."""

    column: str
    name: str | None = None
    config: str | None = None
    split: str = "train"
    data_files: tuple[str, ...] = ()
    streaming: bool = False

    def __post_init__(self):
        for path in self.data_files:
            if Path(path).suffix not in DATA_FILE_BUILDERS:
                raise InputError(
                    f"--data_files {path}: a data file is {', '.join(DATA_FILE_BUILDERS)} (by its suffix)"
                )
            if not Path(path).is_file():
                raise InputError(f"--data_files {path} is not a file")
        builders = {DATA_FILE_BUILDERS[Path(path).suffix] for path in self.data_files}
        if len(builders) > 1:
            raise InputError(f"--data_files mixes formats ({', '.join(sorted(builders))}): give files of one format")

    @property
    def label(self) -> str:
        return self.name or ", ".join(self.data_files)

    def load(self):
        """The dataset (a `Dataset`, or an `IterableDataset` when streaming); InputError if it cannot be loaded or
        has no `column`."""
        import datasets

        try:
            if self.data_files:
                builder = DATA_FILE_BUILDERS[Path(self.data_files[0]).suffix]
                data = datasets.load_dataset(
                    builder, data_files=list(self.data_files), split="train", streaming=self.streaming
                )
            else:
                data = datasets.load_dataset(self.name, self.config, split=self.split, streaming=self.streaming)
        except Exception as error:  # noqa: BLE001 - datasets raises many kinds; the user gets one line
            raise InputError(f"cannot load the dataset {self.label}: {type(error).__name__}: {error}") from error
        names = data.column_names if data.column_names is not None else list(next(iter(data), {}))
        if self.column not in names:
            raise InputError(f"--column {self.column}: the dataset {self.label} has the columns {', '.join(names)}")
        return data

    def units(self) -> Iterator[str]:
        for number, row in enumerate(self.load()):
            text = row[self.column]
            if text is None:
                text = ""
            if not isinstance(text, str):
                raise InputError(
                    f"row {number} of {self.label}: --column {self.column} holds {type(text).__name__}, not text"
                )
            yield text


def fingerprint(units: Iterator[str]) -> tuple[str, int]:
    """sha256 of the units (each UTF-8, then a NUL) and their number: what a resumed run must find again."""
    digest, count = hashlib.sha256(), 0
    for unit in units:
        digest.update(unit.encode("utf-8", "surrogatepass") + b"\0")
        count += 1
    return digest.hexdigest(), count


def read_lines(path: str | None) -> list[str]:
    """Every line of a UTF-8 file, or of stdin when `path` is None, without line endings (see `stream_lines`)."""
    return list(TextSource(path).units())
