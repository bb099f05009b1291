"""Sizes and sha256 of a folder's files: recorded when the folder is written, compared before it is trusted.

Checkpoints keep theirs in `checksums.json`, prepared corpora in `manifest.json`. A truncated, replaced or edited
file is then named before anything reads it, whatever it would have raised deep inside pyarrow or torch.
"""

import hashlib
from collections.abc import Iterable
from pathlib import Path

CHUNK_BYTES = 1 << 24


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def record_files(folder: Path, excluded: Iterable[str] = ()) -> dict[str, dict]:
    """{relative path: {"size", "sha256"}} for every file under `folder` but the `excluded` names."""
    excluded = set(excluded)
    files = sorted(path for path in folder.rglob("*") if path.is_file() and path.name not in excluded)
    return {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": sha256_of(path)} for path in files
    }


def files_problem(folder: Path, entries, only: Iterable[str] | None = None) -> str | None:
    """The first recorded file (of `only`, if given) that is missing, of another size or another sha256, named
    with its path; None when all match. `entries` as `record_files` returns them, as read back from JSON."""
    if not isinstance(entries, dict) or not all(_is_entry(entry) for entry in entries.values()):
        return f"the file list recorded for {folder} is damaged (not the sizes and sha256 we write)"
    if outside := next((name for name in entries if not is_name_inside(folder, name)), None):
        return f"the file list recorded for {folder} names {outside!r}, which is not a file inside it"
    only = None if only is None else set(only)
    for name, entry in entries.items():
        if only is not None and Path(name).name not in only:
            continue
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != entry["size"]:
            return f"{path} has {path.stat().st_size} bytes, {entry['size']} were written (truncated or replaced)"
        if sha256_of(path) != entry["sha256"]:
            return f"{path} does not match the sha256 recorded when it was written (damaged or edited)"
    return None


def is_name_inside(folder: Path, name) -> bool:
    """Whether a name read from a record is a relative path to a file inside `folder`: no absolute path, no `..`,
    no symbolic link on the way. A record is input: what it names may be read, replaced or deleted."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name:
        return False
    parts = Path(name).parts
    if Path(name).is_absolute() or any(part in ("", ".", "..") for part in parts):
        return False
    return not any((folder.joinpath(*parts[: depth + 1])).is_symlink() for depth in range(len(parts)))


def _is_entry(entry) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("size"), int)
        and not isinstance(entry.get("size"), bool)
        and isinstance(entry.get("sha256"), str)
    )
