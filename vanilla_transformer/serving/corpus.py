"""Translating a corpus: chunks of units translated by every process, recorded as they finish, put together in input
order. The library under `vanilla-transformer translate`.

The input's units (`sources`: lines, paragraphs, dataset rows) are numbered and cut into chunks of `buffer_size`.
Each chunk is translated on its own: its sentences sorted by length and batched by tokens (`batches.translate_groups`,
which streams the chunks' batches to the backend, so that its workers start a chunk while the last batches of the one
before are decoded), so its translation depends on its units and the settings only, never on the process that made it
or on the chunks before it. That is what makes a run resumable and shardable, and its output byte-identical either
way.

With an output path, the run keeps a folder beside it, `<output>.partial/`:

- `manifest.json`: the input's sha256 and unit count, each chunk's sha256, and the settings that change the output
  (the model's digest, the export's, the backend, the decoding as it is in effect, the batching, the chunking). A
  resumed run must find them again: a changed input or setting is refused by name (`--overwrite` starts again). Each
  chunk is checked against its sha256 when it is read to be translated: an input edited, truncated or replaced
  while the run reads it is an error naming it, never a translation of the other text or a wait. The manifest names
  no path; the chunks are known by their names alone (`chunk-` and eight digits), regular files, never links.
- `chunk-00000012.jsonl`: a finished chunk, one JSON line of counts then one JSON string per unit; written whole or not
  at all (a staged file renamed into place), so a run stopped any way (Ctrl-C, SIGTERM, kill -9, a lost machine) loses
  at most the chunks it was translating. The chunks done are the chunk files present.
- `plan.json`: the chunks still to translate when the run began; process r of n takes every n-th of them, from r.
- `input.txt`: an input that can be read only once (stdin, a pipe, a FIFO, `<(...)`), read whole before anything
  else (a resumed run reads it again and compares).
- `lock`: taken (flock) before anything in the folder is decided or removed; `--overwrite` starts again only under
  it, so it never takes over a live run's folder.

When every chunk is there, the first process writes the output (a staged file or folder renamed into place: the
previous output, if `--overwrite` allowed one, stays whole until then; a stopped run resumed without `--overwrite`
replaces only the file it recorded as there when it began, never one put there since) and removes the partial
folder's files, which it knows by name. The processes meet once, after the first has checked the input and the manifest; then each works on
its own, and the first waits for the others' chunk files: a shared filesystem is all that several machines need.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from tqdm import tqdm

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import move_into_place, on_full_disk, replace_file, staging_path
from vanilla_transformer.mechanics.outputs import check_output_folder, why_not_recorded, write_record
from vanilla_transformer.serving.batches import translate_groups
from vanilla_transformer.serving.sentences import split_sentences
from vanilla_transformer.serving.settings import CorpusSettings, upgraded_record
from vanilla_transformer.serving.sources import (
    OUTPUT_COLUMN,
    DatasetSource,
    InputError,
    TextSource,
    chunk_digest,
    fingerprint,
    spool,
)

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

FORMAT = "vanilla-transformer translate, chunks 1"
MANIFEST, PLAN, LOCK, SPOOL = "manifest.json", "plan.json", "lock", "input.txt"
CHUNK_PREFIX, CHUNK_SUFFIX = "chunk-", ".jsonl"
CHUNK_NAME = re.compile(r"chunk-([0-9]{8})\.jsonl")
SPOOLING = ".input.new"
BEFORE_MANIFEST = {LOCK, SPOOL, SPOOLING}  # what a run writes before its manifest: a folder of these is ours
DATASET_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")  # a dataset's output files; no suffix: a folder
WRITTEN_BY = "vanilla-transformer translate"
DATASET_RECORD = ".vanilla_transformer_translation.json"  # in a dataset folder we wrote: its files, for --overwrite
POLL_SECONDS = 2.0


def say(message: str) -> None:
    """A message on stderr; none where stderr is closed (2>&-), never onto stdout (print's fallback)."""
    if sys.stderr is not None:
        print(message, file=sys.stderr, flush=True)


class CorpusError(VanillaTransformerError):
    """The corpus cannot be translated as asked (its output, its partial folder, a resumed run's input or settings);
    the message names the path, flag or setting."""


@dataclass
class Summary:
    units: int = 0
    pieces: int = 0
    target_tokens: int = 0
    cut: int = 0
    chunks: int = 0
    resumed: int = 0
    resumed_tokens: int = 0
    seconds: float = 0.0

    def add(self, counts: dict) -> None:
        self.units += counts["units"]
        self.pieces += counts["pieces"]
        self.target_tokens += counts["target_tokens"]
        self.cut += counts["cut"]

    def line(self, unit_name: str = "lines") -> str:
        tokens = self.target_tokens - self.resumed_tokens
        rate = tokens / self.seconds if self.seconds > 0 else 0.0
        cut = f"; {self.cut} sentence(s) over the model's length cut into pieces" if self.cut else ""
        return (
            f"translated {self.units} {unit_name} ({self.pieces} sentences, {self.target_tokens} target tokens) in "
            f"{self.seconds:.1f} s: {rate:.0f} target tokens/s; {self.resumed} of {self.chunks} chunks resumed{cut}"
        )


@dataclass
class Process:
    """This process among those of the launch (accelerate's PartialState, or one alone)."""

    index: int = 0
    count: int = 1
    broadcast: Callable[[object], object] = field(default=lambda value: value)  # the first process's value, to all

    @property
    def is_first(self) -> bool:
        return self.index == 0


def pieces_of(units: list[str], settings: CorpusSettings) -> list[list[tuple[str, str]]]:
    """A chunk's units as the texts to translate: each unit's sentences (with `split_sentences`; else the unit
    whole), each with the whitespace after it; none for a blank unit."""
    if settings.split_sentences:
        return [split_sentences(unit, settings.language) if unit.strip() else [] for unit in units]
    return [[(unit, "")] if unit.strip() else [] for unit in units]


def translate_chunks(
    backend, chunks: Iterable[tuple[int, list[str]]], settings: CorpusSettings
) -> Iterator[tuple[int, list[str], dict]]:
    """Each chunk (number, units) as (number, each unit's translation, its counts), in order: a unit's sentences
    translated and joined as they were. Each chunk is batched on its own; the next chunk is read when the backend is
    ready for its first batch (`batches.translate_groups`)."""
    taken = deque()

    def texts_of_each() -> Iterator[list[str]]:
        for number, units in chunks:
            pieces = pieces_of(units, settings)
            taken.append((number, units, pieces))
            yield [text for unit in pieces for text, _ in unit]

    for translated in translate_groups(
        backend, texts_of_each(), settings.batch_size, settings.max_batch_tokens, settings.max_piece_tokens
    ):
        number, units, pieces = taken.popleft()
        translations, position = [], 0
        for unit in pieces:
            parts = translated.texts[position : position + len(unit)]
            translations.append("".join(text + space for text, (_, space) in zip(parts, unit, strict=True)).rstrip())
            position += len(unit)
        pieces_translated = sum(1 for unit in pieces for text, _ in unit if text.strip())
        counts = {"units": len(units), "pieces": pieces_translated, "cut": translated.cut}
        counts["target_tokens"] = translated.target_tokens
        yield number, translations, counts


def chunks_of(units: Iterator[str], size: int, wanted: set[int] | None = None) -> Iterator[tuple[int, list[str]]]:
    """(chunk number, its units) for the chunks in `wanted` (all when None); the others are read past, and reading
    stops after the last one wanted."""
    chunk, number, count = [], 0, 0
    last = max(wanted) if wanted else math.inf
    for unit in units:
        if number > last:
            return
        count += 1
        if wanted is None or number in wanted:
            chunk.append(unit)
        if count == size:
            if chunk:
                yield number, chunk
            chunk, count, number = [], 0, number + 1
    if chunk:
        yield number, chunk


def one_line(translation: str) -> str:
    """A translation as one output line, whatever line breaks the model produced."""
    return " ".join(translation.splitlines())


class Progress:
    """Lines done, lines/s, target tokens/s and the time left: a bar on a terminal, else a line every `log_every`
    seconds (a batch job's log). Counts the whole run's units (the other processes' chunks too, on the first)."""

    def __init__(self, total: int | None, done: int, terminal: bool, log_every: float, enabled: bool = True):
        self.total, self.done, self.tokens, self.start_done = total, done, 0, done
        self.log_every, self.enabled = log_every, enabled
        self.started = self.logged = time.monotonic()
        self.bar = None
        if enabled and terminal and sys.stderr is not None:
            self.bar = tqdm(
                total=total, initial=done, desc="translating", unit=" lines", file=sys.stderr, dynamic_ncols=True
            )

    def advance(self, units: int, tokens: int) -> None:
        self.done += units
        self.tokens += tokens
        if not self.enabled:
            return
        now = time.monotonic()
        rate = self.tokens / max(now - self.started, 1e-9)
        if self.bar is not None:
            self.bar.set_postfix_str(f"{rate:.0f} target tok/s", refresh=False)
            self.bar.update(units)
        elif now - self.logged >= self.log_every:
            self.logged = now
            say(self.log_line(now, rate))

    def log_line(self, now: float, rate: float) -> str:
        lines_rate = (self.done - self.start_done) / max(now - self.started, 1e-9)
        of = f"/{self.total} ({100 * self.done / self.total:.0f}%)" if self.total else ""
        left = ""
        if self.total and lines_rate > 0:
            seconds = int((self.total - self.done) / lines_rate)
            left = f", about {seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d} left"
        return f"translated {self.done}{of} lines, {lines_rate:.1f} lines/s, {rate:.0f} target tokens/s{left}"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class PartialFolder:
    """`<output>.partial/`, the record of a resumable run (see the module's docstring). Only the names this module
    writes are ever deleted from it."""

    def __init__(self, output: str | Path):
        self.output = Path(output)
        self.folder = self.output.with_name(self.output.name + ".partial")
        self.lock_descriptor: int | None = None

    def chunk(self, number: int) -> Path:
        return self.folder / f"{CHUNK_PREFIX}{number:08d}{CHUNK_SUFFIX}"

    def done(self) -> set[int]:
        """The finished chunks: files named as this module names them, regular files (a link is not a chunk)."""
        if not self.folder.is_dir() or self.folder.is_symlink():
            return set()
        return {
            int(match[1])
            for entry in os.scandir(self.folder)
            if (match := CHUNK_NAME.fullmatch(entry.name)) and entry.is_file(follow_symlinks=False)
        }

    def open_chunk(self, number: int):
        """A finished chunk's file, opened for reading without following a link."""
        descriptor = os.open(self.chunk(number), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        return open(descriptor, encoding="utf-8")

    def chunk_counts(self, number: int) -> dict:
        """A finished chunk's counts (its first line)."""
        with self.open_chunk(number) as file:
            return json.loads(file.readline())

    def chunk_translations(self, number: int) -> Iterator[str]:
        """A finished chunk's translations, one a unit."""
        with self.open_chunk(number) as file:
            file.readline()
            for line in file:
                yield json.loads(line)

    def read(self, name: str) -> dict:
        """A record of the folder, a JSON object; CorpusError if it is not one."""
        try:
            content = json.loads((self.folder / name).read_text(encoding="utf-8"))
            if not isinstance(content, dict):
                raise ValueError(f"a {type(content).__name__}, not a JSON object")
        except (OSError, ValueError) as error:
            raise CorpusError(
                f"{self.folder / name} cannot be read ({error}): the partial run's record is damaged; start again "
                "with --overwrite"
            ) from None
        return content

    def write(self, name: str, content) -> None:
        replace_file(self.folder / name, json.dumps(content, ensure_ascii=False, indent=1) + "\n")

    def manifest(self) -> dict | None:
        """The folder's manifest if it is one of ours (a regular file, of this format); else None."""
        manifest = self.folder / MANIFEST
        if self.folder.is_symlink() or not self.folder.is_dir() or manifest.is_symlink() or not manifest.is_file():
            return None
        with contextlib.suppress(OSError, ValueError):
            content = json.loads(manifest.read_text(encoding="utf-8"))
            return content if isinstance(content, dict) and content.get("format") == FORMAT else None
        return None

    def is_ours(self) -> bool:
        """Whether the folder is a run's of this module: its manifest, or only what a run writes before it (a run
        stopped or refused before its first chunk)."""
        if self.manifest() is not None:
            return True
        if self.folder.is_symlink() or not self.folder.is_dir() or (self.folder / MANIFEST).exists():
            return False
        return all(entry.name in BEFORE_MANIFEST for entry in os.scandir(self.folder))

    def lock(self) -> None:
        """Claim the folder for this run (flock, released by the kernel if the process dies): a second command with
        the same --output is refused. The lock file locked is the one in the folder (not one a finishing run just
        removed)."""
        for _ in range(3):
            self.folder.mkdir(exist_ok=True)
            self.lock_descriptor = os.open(self.folder / LOCK, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0))
            if fcntl is None or not self.flock():
                return
            with contextlib.suppress(OSError):
                if os.path.samestat(os.fstat(self.lock_descriptor), os.lstat(self.folder / LOCK)):
                    return
            self.unlock()
        raise CorpusError(f"{self.folder / LOCK} keeps being replaced: another command is writing --output")

    def flock(self) -> bool:
        """flock the lock file; False on a filesystem without flock."""
        try:
            fcntl.flock(self.lock_descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.unlock()
            raise CorpusError(
                f"--output {self.output} is being written by another command (its {self.folder.name} is locked): wait "
                "for it to finish, or choose another --output"
            ) from None
        except OSError:
            return False  # a filesystem without flock
        return True

    def replaces(self, output: Path) -> bool:
        """Whether a stopped run recorded `output` as there when it began (a file --overwrite let it replace): its
        resumption may replace that one, never a file put there since."""
        recorded = (self.manifest() or {}).get("replaces")
        return recorded is not None and recorded == identity(output)

    def unlock(self) -> None:
        if self.lock_descriptor is not None:
            os.close(self.lock_descriptor)
            self.lock_descriptor = None

    def remove(self, keep_lock: bool = False) -> None:
        """Delete what this module writes there (and leftovers of writes that were stopped), then the folder if that
        emptied it; `keep_lock`: all but the lock, which this run holds."""
        if not self.folder.is_dir() or self.folder.is_symlink():
            return
        for entry in os.scandir(self.folder):
            ours = entry.name in (MANIFEST, PLAN, LOCK, SPOOL) or entry.name.startswith((CHUNK_PREFIX, ".", "cache"))
            if not ours or (keep_lock and entry.name == LOCK):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        with contextlib.suppress(OSError):
            self.folder.rmdir()


def check_output(output: str, overwrite: bool, dataset: bool, inputs: list[tuple[str, str]] = ()) -> None:
    """Refuse, before anything is loaded, an --output that could not be written or would replace what is not ours:
    one of `inputs` ((what, path) pairs: the model folder, the input files), or inside one; a dataset's folder under
    the one output rule (mechanics/outputs.py)."""
    path = Path(output)
    if dataset and is_dataset_folder(path):
        check_output_folder(
            output,
            overwrite=overwrite,
            why_not_previous=why_not_a_translation,
            previous="a dataset translated by this command",
            inputs=inputs,
            error=CorpusError,
        )
    elif dataset and path.suffix not in DATASET_SUFFIXES:
        raise CorpusError(
            f"--output {output}: a dataset is written as {', '.join(DATASET_SUFFIXES)} (by the suffix), or as a "
            "save_to_disk folder (a name without a suffix)"
        )
    if not dataset and path.is_dir():
        raise CorpusError(f"--output {output} is a folder: name the file to write")
    if not path.parent.is_dir():
        raise CorpusError(f"--output {output}: the folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise CorpusError(f"--output {output} cannot be written (permission denied)")
    check_not_an_input(output, inputs)
    partial = PartialFolder(output)
    if partial.folder.exists() and not partial.is_ours():
        raise CorpusError(
            f"{partial.folder} exists and is not a partial translation of ours: move or delete it yourself"
        )
    if os.path.lexists(path) and not overwrite and not partial.replaces(path):
        raise CorpusError(f"--output {output} exists: add --overwrite to replace it, or choose another --output")


def is_dataset_folder(path: Path) -> bool:
    """Whether a dataset's --output is a save_to_disk folder: no suffix, or a folder already."""
    return path.suffix == "" or (path.is_dir() and not path.is_symlink())


def check_not_an_input(output: str, inputs: list[tuple[str, str]]) -> None:
    """Refuse an --output that is one of `inputs` or inside one (the model folder's weights, an export)."""
    resolved = Path(output).resolve()
    for what, path in inputs:
        own = Path(path).resolve()
        if resolved == own or own in resolved.parents:
            relation = "is" if resolved == own else "is inside"
            raise CorpusError(
                f"--output {output} {relation} {what} {path}: write the translation outside it, so that it can "
                "never replace what the run reads"
            )


def identity(path: Path) -> list[int] | None:
    """What tells a file or folder at `path` from another put there since: device, inode, size, change time."""
    try:
        status = os.lstat(path)
    except OSError:
        return None
    return [status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns]


def why_not_a_translation(folder: Path) -> str | None:
    """None if `folder` is a dataset folder this command wrote, every file as it wrote it and nothing else."""
    return why_not_recorded(folder, DATASET_RECORD, WRITTEN_BY)


def same_file(input_path: str | None, output: str) -> bool:
    """Whether --output is the --input file (or stdin's file), by device and inode: a hard link or another spelling of
    the path is the same file."""
    try:
        output_stat = os.stat(output)
    except OSError:
        return False
    try:
        input_stat = os.stat(input_path) if input_path is not None else os.fstat(sys.stdin.fileno())
    except (OSError, AttributeError, ValueError):
        return False
    return (input_stat.st_dev, input_stat.st_ino) == (output_stat.st_dev, output_stat.st_ino)


def prepare(partial: PartialFolder, source, record: dict, settings: CorpusSettings, overwrite: bool) -> tuple:
    """The first process, before the others start: claim the partial folder (the lock first, then `--overwrite`'s
    removal), read the input once (one read only once into `input.txt`), check a resumed run's input and settings
    against the manifest, and write the plan. Returns the manifest, with the plan in it, and the source to read.
    A refusal before the manifest is written leaves no partial folder."""
    partial.lock()
    if overwrite:
        partial.remove(keep_lock=True)
    try:
        manifest, source = read_input(partial, source, record, settings)
    except BaseException:
        if partial.manifest() is None:
            partial.remove()
        raise
    for entry in os.scandir(partial.folder):  # staged chunk files of a stopped run: never renamed into place
        if entry.name.startswith(".") and entry.name != SPOOLING:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
    done = partial.done()
    manifest["plan"] = [number for number in range(manifest["chunks"]) if number not in done]
    manifest["resumed"] = manifest["chunks"] - len(manifest["plan"])
    partial.write(PLAN, manifest["plan"])
    return manifest, source


def read_input(partial: PartialFolder, source, record: dict, settings: CorpusSettings) -> tuple[dict, object]:
    """Fingerprint the input (spooled first if it can be read only once) and check it and the settings against a
    resumed run's manifest, or write the manifest of a new run."""
    if isinstance(source, TextSource) and source.reads_once:
        spooled = spool(source, partial.folder / SPOOLING)
        move_into_place(partial.folder / SPOOLING, partial.folder / SPOOL)
        source = replace(spooled, path=str(partial.folder / SPOOL))
    sha256, units, chunks = fingerprint(source.units(), settings.buffer_size)
    if units == 0:
        raise InputError(f"the input {source.label} is empty: there is nothing to translate")
    manifest = {"format": FORMAT, "input": {"sha256": sha256, "units": units}, "settings": record}
    manifest["chunks"], manifest["chunk_sha256"] = len(chunks), chunks
    if (partial.folder / MANIFEST).is_file():
        check_resumable(partial.read(MANIFEST), manifest, source.label)
    else:
        partial.write(MANIFEST, {**manifest, "replaces": identity(partial.output)})
    return manifest, source


def check_resumable(recorded: dict, now: dict, label: str) -> None:
    """Refuse to resume when the input or a setting that changes the output differs, naming what changed."""
    if recorded.get("input") != now["input"]:
        was, now_input = recorded.get("input", {}), now["input"]
        raise CorpusError(
            f"the input {label} is not the one this run began with (then {was.get('units')} units, sha256 "
            f"{str(was.get('sha256'))[:12]}; now {now_input['units']}, {now_input['sha256'][:12]}): give that input "
            "to continue, or start again with --overwrite"
        )
    before, after = upgraded_record(recorded.get("settings", {})), now["settings"]
    changed = [name for name in sorted(before.keys() | after.keys()) if before.get(name) != after.get(name)]
    if changed:
        described = "; ".join(f"{name} was {before.get(name)!r}, now {after.get(name)!r}" for name in changed)
        raise CorpusError(
            f"this run's settings differ from those it began with ({described}): its finished chunks were translated "
            "with those; give the same settings to continue, or start again with --overwrite"
        )


class CorpusTranslation:
    """One process's part of translating `source` into `output` (see the module's docstring): `begin` (every
    process: the first prepares, the others receive its manifest), `translate` (this process's chunks), `finish`
    (the first: waits for every chunk, writes the output, returns the summary)."""

    def __init__(self, source, output: str, settings: CorpusSettings, process: Process, overwrite: bool = False):
        self.source, self.output, self.settings, self.process, self.overwrite = (
            source,
            output,
            settings,
            process,
            overwrite,
        )
        self.partial = PartialFolder(output)
        self.manifest: dict | None = None
        self.progress: Progress | None = None
        self.seen: set[int] = set()
        self.summary = Summary()
        self.said_cut = False

    def begin(self, record: Callable[[], tuple[dict, dict]]) -> dict:
        """Prepare on the first process and share its manifest with the others; returns what was shared.
        `record()`, called on the first process only, gives the settings that change the output and what else the
        others need (an export's path). A failure on the first process stops the others too (CorpusError there)."""
        shared = None
        if self.process.is_first:
            try:
                settings, extra = record()
                manifest, self.source = prepare(self.partial, self.source, settings, self.settings, self.overwrite)
                shared = {"manifest": manifest, "source": self.source, **extra}
            finally:
                self.process.broadcast(shared)
        else:
            shared = self.process.broadcast(None)
            if shared is None:
                raise CorpusError("the first process stopped before translating (its error is above)")
            self.source = shared["source"]
        self.manifest = shared["manifest"]
        return shared

    def translate(self, backend, terminal: bool = False) -> None:
        """Translate this process's share of the chunks still to do, each recorded as it is finished."""
        manifest, size = self.manifest, self.settings.buffer_size
        self.started = time.monotonic()
        mine = set(manifest["plan"][self.process.index :: self.process.count])
        self.seen = set(range(manifest["chunks"])) - set(manifest["plan"])
        done_units = sum(min(size, manifest["input"]["units"] - number * size) for number in self.seen)
        self.progress = Progress(
            manifest["input"]["units"], done_units, terminal, self.settings.log_every, enabled=self.process.is_first
        )
        chunks = self.checked(chunks_of(self.source.units(), size, mine), mine) if mine else ()
        for number, translations, counts in translate_chunks(backend, chunks, self.settings):
            self.say_cut_once(counts, number)
            lines = [json.dumps(counts)] + [json.dumps(text, ensure_ascii=False) for text in translations]
            with on_full_disk(
                lambda cause, number=number: self.disk_full(f"chunk {number + 1} of {manifest['chunks']}")
            ):
                replace_file(self.partial.chunk(number), "\n".join(lines) + "\n")
            self.seen.add(number)
            self.progress.advance(counts["units"], counts["target_tokens"])
            if self.process.is_first:
                self.poll_others()

    def checked(self, chunks: Iterator[tuple[int, list[str]]], wanted: set[int]) -> Iterator[tuple[int, list[str]]]:
        """The chunks as read, each checked against the sha256 the run began with, and every one wanted read."""
        digests, left = self.manifest["chunk_sha256"], set(wanted)
        for number, units in chunks:
            if chunk_digest(units) != digests[number]:
                first = number * self.settings.buffer_size + 1
                raise self.changed(f"its units {first}-{first + len(units) - 1} are not those it had")
            left.discard(number)
            yield number, units
        if left:
            raise self.changed(f"it ended before unit {min(left) * self.settings.buffer_size + 1}")

    def changed(self, what: str) -> CorpusError:
        return CorpusError(
            f"the input {self.source.label} changed while this run read it ({what}; it had "
            f"{self.manifest['input']['units']} units when the run began): give it back as it was, or start again "
            "with --overwrite; the finished chunks are kept"
        )

    def disk_full(self, what: str) -> CorpusError:
        return CorpusError(
            f"no space left on device while writing {what} into {self.partial.folder}: the finished chunks are kept; "
            "free space, and the same command continues"
        )

    def say_cut_once(self, counts: dict, number: int) -> None:
        if counts["cut"] and not self.said_cut:
            self.said_cut = True
            first = number * self.settings.buffer_size + 1
            say(
                f"note: units {first}-{first + counts['units'] - 1} hold a sentence longer than the model takes: it "
                "is cut at punctuation or spaces into pieces that fit (the summary counts them)"
            )

    def poll_others(self) -> None:
        """Count the chunks the other processes finished since the last look into the progress."""
        if self.process.count == 1:
            return
        for number in sorted(self.partial.done() - self.seen):
            counts = self.partial.chunk_counts(number)
            self.seen.add(number)
            self.progress.advance(counts["units"], counts["target_tokens"])

    def finish(self) -> Summary | None:
        """On the first process: wait for every chunk, write the output, remove the partial folder; the summary.
        Other processes return None at once."""
        if not self.process.is_first:
            return None
        chunks = self.manifest["chunks"]
        while missing := set(range(chunks)) - self.partial.done():
            if self.process.count == 1:  # ours were all written: another hand removed one
                raise CorpusError(
                    f"chunk {min(missing) + 1} of {chunks} went missing from {self.partial.folder} while this run "
                    "wrote it: the same command translates it again"
                )
            self.poll_others()
            time.sleep(POLL_SECONDS)
        self.poll_others()
        self.progress.close()
        with on_full_disk(lambda cause: self.disk_full(f"the output {self.output}")):
            if isinstance(self.source, DatasetSource):
                write_dataset(self.source, self, self.output)
            else:
                self.write_text()
        summary = Summary(chunks=chunks, resumed=self.manifest["resumed"])
        planned = set(self.manifest["plan"])
        for number in range(chunks):
            counts = self.partial.chunk_counts(number)
            summary.add(counts)
            if number not in planned:
                summary.resumed_tokens += counts["target_tokens"]
        summary.seconds = time.monotonic() - self.started
        self.partial.remove()
        return summary

    def close(self) -> None:
        """Release the partial folder and the progress bar, however the run ended."""
        if self.progress is not None:
            self.progress.close()
        self.partial.unlock()

    def write_text(self) -> None:
        staging = staging_path(self.output)
        try:
            with open(staging, "x", encoding="utf-8", newline="\n") as file:
                for number in range(self.manifest["chunks"]):
                    file.writelines(one_line(text) + "\n" for text in self.partial.chunk_translations(number))
                file.flush()
                os.fsync(file.fileno())
            move_into_place(staging, self.output)
        finally:
            staging.unlink(missing_ok=True)


def translate_to_stream(
    backend, source, settings: CorpusSettings, write: Callable[[str], None], terminal: bool = False
) -> Summary:
    """Translate `source` chunk by chunk into `write` (stdout), in input order; nothing is recorded (no resume)."""
    summary, started = Summary(), time.monotonic()
    progress = Progress(None, 0, terminal, settings.log_every)
    for _, translations, counts in translate_chunks(
        backend, chunks_of(source.units(), settings.buffer_size), settings
    ):
        write("".join(one_line(text) + "\n" for text in translations))
        summary.add(counts)
        summary.chunks += 1
        progress.advance(counts["units"], counts["target_tokens"])
    progress.close()
    if summary.units == 0:
        raise InputError(f"the input {source.label} is empty: there is nothing to translate")
    summary.seconds = time.monotonic() - started
    return summary


def write_dataset(source: DatasetSource, run: CorpusTranslation, output: str) -> None:
    """The input dataset with a `translation` column, as Parquet, JSON Lines, CSV or a `save_to_disk` folder (by the
    output's suffix; the folder with its record, DATASET_RECORD), built row by row through an Arrow cache in the
    partial folder (bounded memory)."""
    import datasets

    features = source.load().features
    if features is not None:
        features = datasets.Features({**features, OUTPUT_COLUMN: datasets.Value("string")})
    generated = datasets.Dataset.from_generator(
        _rows_with_translations,
        gen_kwargs={"source": source, "partial": str(run.partial.output), "chunks": run.manifest["chunks"]},
        features=features,
        cache_dir=str(run.partial.folder / "cache"),
    )
    suffix = Path(output).suffix
    staging = staging_path(output)
    try:
        if is_dataset_folder(Path(output)):
            generated.save_to_disk(str(staging))
            write_record(staging, DATASET_RECORD, WRITTEN_BY)
            if Path(output).is_dir() and (why := why_not_a_translation(Path(output))) and os.listdir(output):
                raise CorpusError(f"--output {output} changed while the run wrote it ({why}): it was left as it is")
        elif suffix == ".parquet":
            generated.to_parquet(str(staging))
        elif suffix == ".csv":
            generated.to_csv(str(staging))
        else:
            generated.to_json(str(staging), lines=True, force_ascii=False)
        move_into_place(staging, output)
    finally:
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.unlink(missing_ok=True)


def _rows_with_translations(source: DatasetSource, partial: str, chunks: int) -> Iterator[dict]:
    folder = PartialFolder(partial)
    translations = (text for number in range(chunks) for text in folder.chunk_translations(number))
    for row, translation in itertools.zip_longest(source.rows(), translations):
        if row is None or translation is None:
            raise CorpusError(
                f"the dataset {source.label} changed while this run read it: start again with --overwrite"
            )
        yield {**row, OUTPUT_COLUMN: translation}
