"""Translating a corpus: chunks of units translated by every process, recorded as they finish, put together in input
order. The library under `vanilla-transformer translate`.

The input's units (`sources`: lines, paragraphs, dataset rows) are numbered and cut into chunks of `buffer_size`.
Each chunk is translated on its own: its sentences sorted by length and batched by tokens (`batches.translate_groups`,
which streams the chunks' batches to the backend, so that its workers start a chunk while the last batches of the one
before are decoded), so its translation depends on its units and the settings only, never on the process that made it
or on the chunks before it. That is what makes a run resumable and shardable, and its output byte-identical either
way.

With an output path, the run keeps a folder beside it, `<output>.partial/` (serving/corpus_folder.py): the
manifest, the plan, the finished chunks and the lock.

When every chunk is there, the first process writes the output (a staged file or folder renamed into place: the
previous output, if `--overwrite` allowed one, stays whole until then; a stopped run resumed without `--overwrite`
replaces only the file it recorded as there when it began, never one put there since) and removes the partial
folder's files, which it knows by name (serving/corpus_output.py writes a dataset). The processes meet once, after
the first has checked the input and the manifest; then each works on its own, and the first waits for the others'
chunk files: a shared filesystem is all that several machines need.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from tqdm import tqdm

from vanilla_transformer.mechanics.files import move_into_place, on_full_disk, replace_file, staging_path
from vanilla_transformer.serving.batches import translate_groups
from vanilla_transformer.serving.corpus_folder import CorpusError, PartialFolder, prepare
from vanilla_transformer.serving.corpus_output import write_dataset
from vanilla_transformer.serving.sentences import split_sentences
from vanilla_transformer.serving.settings import CorpusSettings
from vanilla_transformer.serving.sources import (
    DatasetSource,
    InputError,
    chunk_digest,
)

POLL_SECONDS = 2.0


def say(message: str) -> None:
    """A message on stderr; none where stderr is closed (2>&-), never onto stdout (print's fallback)."""
    if sys.stderr is not None:
        print(message, file=sys.stderr, flush=True)


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
                write_dataset(self.source, self.partial, self.manifest["chunks"], self.output)
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
