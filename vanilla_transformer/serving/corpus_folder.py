"""A corpus run's partial folder, `<output>.partial/`: its manifest, plan, chunks and lock, which make a run resumable.

serving/corpus.py runs the translation.

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
"""

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import move_into_place, replace_file
from vanilla_transformer.serving.settings import CorpusSettings, upgraded_record
from vanilla_transformer.serving.sources import InputError, TextSource, fingerprint, spool

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


class CorpusError(VanillaTransformerError):
    """The corpus cannot be translated as asked (its output, its partial folder, a resumed run's input or settings);
    the message names the path, flag or setting."""


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


def identity(path: Path) -> list[int] | None:
    """What tells a file or folder at `path` from another put there since: device, inode, size, change time."""
    try:
        status = os.lstat(path)
    except OSError:
        return None
    return [status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns]


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
