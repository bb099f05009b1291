"""What `vanilla-transformer translate` reads: the units of a corpus, each translated into one unit of the output.

- A text file (or stdin): UTF-8, one unit per line; with `paragraphs`, one unit per paragraph (its lines joined by a
  space) and one per blank line, which stays blank. Lines are split at "\n" only; a byte-order mark on line 1 is
  dropped; bad UTF-8 is an error naming the line and byte. A line over `max_line_bytes` is an error naming it,
  raised before the line is held whole or tokenized (memory stays bounded on any file, /dev/zero included).
- A dataset (`datasets`): a Hub dataset in the local cache, or local Parquet, JSON Lines or CSV files, one unit per
  row, the text in `column` (held to `max_line_bytes` too); `streaming` reads it row by row, for datasets larger than
  memory. A broken JSON Lines row is an error naming its file and line.

A source is opened again by each process and for the final output, and yields the same units each time; an input that
can be read only once (stdin, a pipe, a FIFO, `<(...)`) is first copied into the run's folder (`spool`).
"""

import codecs
import hashlib
import io
import json
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError

MAX_LINE_BYTES = 1 << 20  # 1 MiB: about 250,000 tokens, 500 pieces at the paper's 512 positions
# the most --max_line_bytes may allow: a line takes about 200 times its size in memory while it is tokenized and cut
# into pieces (1 MiB about 200 MB, 4 MiB about 1 GB; a 30 MB line takes 6.4 GB)
LINE_BYTES_LIMIT = 4 << 20
OUTPUT_COLUMN = "translation"  # the column a dataset's output adds
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
    """A UTF-8 text file (`path`; None: stdin, read once), read a line or a paragraph a unit. `name`: what messages
    call it (the input as given, where `path` is its spooled copy)."""

    path: str | None
    paragraphs: bool = False
    max_line_bytes: int = MAX_LINE_BYTES
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or self.path or "(stdin)"

    @property
    def reads_once(self) -> bool:
        """Whether the input can be read only once (stdin, a pipe, a FIFO, a device): not a regular file."""
        if self.path is None:
            return True
        try:
            return not stat.S_ISREG(os.stat(self.path).st_mode)
        except OSError:  # missing: its reading names it
            return False

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


def spool(source: TextSource, path: Path) -> TextSource:
    """Copy an input that can be read only once (`source.reads_once`) into `path`, line by line (each line checked as
    `stream_lines` checks it), and return the source reading the copy: a resumable run reads its input more than once.
    Everything is read before anything is written to --output."""
    if source.path is None and sys.stdin is None:
        raise InputError(NO_STDIN)
    with open(path, "wb") as file:
        if source.path is None and getattr(sys.stdin, "buffer", None) is None:  # a text stdin (tests, embedding)
            file.write(sys.stdin.read().encode("utf-8"))
        else:
            for line in TextSource(source.path, max_line_bytes=source.max_line_bytes).units():
                file.write(line.encode("utf-8", "surrogatepass") + b"\n")
    return TextSource(str(path), source.paragraphs, source.max_line_bytes, source.label)


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
    max_line_bytes: int = MAX_LINE_BYTES

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
            names = data.column_names if data.column_names is not None else list(next(iter(data), {}))
        except Exception as error:  # noqa: BLE001 - datasets raises many kinds; the user gets one line
            raise self.unreadable(error) from error
        if self.column not in names:
            raise InputError(f"--column {self.column}: the dataset {self.label} has the columns {', '.join(names)}")
        if OUTPUT_COLUMN in names:
            raise InputError(
                f"the dataset {self.label} has a column named {OUTPUT_COLUMN!r}, which the output adds: rename that "
                "column first (the output keeps every column and adds the translations as that one)"
            )
        return data

    def unreadable(self, error: Exception) -> InputError:
        """The error of a dataset that cannot be read: a broken JSON Lines row named by its file and line."""
        for path in self.data_files:
            if Path(path).suffix == ".jsonl" and (broken := broken_json_line(path)):
                return InputError(f"cannot read the dataset {broken}: fix or remove that line")
        return InputError(f"cannot load the dataset {self.label}: {type(error).__name__}: {error}")

    def rows(self) -> Iterator[dict]:
        """The dataset's rows; an error while reading them (a streamed file) is InputError, as at loading."""
        rows = iter(self.load())
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            except Exception as error:  # noqa: BLE001 - as in `load`
                raise self.unreadable(error) from error
            yield row

    def units(self) -> Iterator[str]:
        for number, row in enumerate(self.rows()):
            text = row[self.column]
            if text is None:
                text = ""
            if not isinstance(text, str):
                raise InputError(
                    f"row {number} of {self.label}: --column {self.column} holds {type(text).__name__}, not text"
                )
            if utf8_size(text, self.max_line_bytes) > self.max_line_bytes:
                raise InputError(
                    f"row {number} of {self.label}: --column {self.column} holds over {self.max_line_bytes:,} bytes: "
                    "a unit is a sentence or a paragraph (split it, or raise --max_line_bytes)"
                )
            yield text


def utf8_size(text: str, limit: int) -> int:
    """The UTF-8 size of `text`, counted only where it may be over `limit` (a character is at most 4 bytes)."""
    return len(text.encode("utf-8", "surrogatepass")) if len(text) > limit // 4 else len(text)


def broken_json_line(path: str) -> str | None:
    """`path:line: why` for the first line of a JSON Lines file that is not a JSON object; None if every line is."""
    with open(path, "rb") as file:
        for number, raw in enumerate(file, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError as error:
                return f"{path}:{number}: not JSON ({error})"
            if not isinstance(row, dict):
                return f"{path}:{number}: a {type(row).__name__}, not a JSON object"
    return None


def fingerprint(units: Iterator[str], chunk_size: int) -> tuple[str, int, list[str]]:
    """sha256 of the units (each UTF-8, then a NUL), their number, and each chunk's `chunk_digest`: what a resumed
    run must find again, and what each chunk must be when it is read to be translated."""
    digest, count, chunks, chunk = hashlib.sha256(), 0, [], hashlib.sha256()
    for unit in units:
        encoded = unit.encode("utf-8", "surrogatepass") + b"\0"
        digest.update(encoded)
        chunk.update(encoded)
        count += 1
        if count % chunk_size == 0:
            chunks.append(chunk.hexdigest()[:CHUNK_DIGEST])
            chunk = hashlib.sha256()
    if count % chunk_size:
        chunks.append(chunk.hexdigest()[:CHUNK_DIGEST])
    return digest.hexdigest(), count, chunks


CHUNK_DIGEST = 16  # hex digits of a chunk's sha256 kept: enough to tell an edited chunk


def chunk_digest(units: list[str]) -> str:
    """A chunk's units' sha256, as `fingerprint` gives it."""
    digest = hashlib.sha256()
    for unit in units:
        digest.update(unit.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()[:CHUNK_DIGEST]


def read_lines(path: str | None) -> list[str]:
    """Every line of a UTF-8 file, or of stdin when `path` is None, without line endings (see `stream_lines`)."""
    return list(TextSource(path).units())
