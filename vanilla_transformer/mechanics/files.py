"""Files of a folder we write or upload: only regular files inside it, never read or written through a symbolic link.

- `link_on_the_way(folder, name)`: the symbolic link, if any, between `folder` and its file `name` (the file itself
  or a subfolder on its path): such a file is never uploaded, written or deleted through the link.
- `file_problem(folder, name)`: why `name` is not a regular file inside `folder` (missing, a link, leading out).
- `content_problem(path)`: whether a file is what its name says before it is uploaded: `.json` parses as JSON,
  `.safetensors` opens as safetensors (its header), `.py` parses as Python, `.md`/`.txt` are UTF-8 text.
- `replace_file(path, data)`: write by replacing: a new file renamed over `path` (a link there is replaced, its
  target is never written).
- `move_into_place(staging, target)`: the one staged rename: a file or folder written complete beside `target`
  (`staging_path`), then renamed into place, so that a crash or a full disk never leaves half of it at `target`.
  `staged_folder(target)` writes a folder that way, replacing only what its caller checked (`TargetChanged`).
- `on_full_disk(error)`: the one disk-full guard: a write that runs out of space becomes the caller's error.
- `is_disk_full(error)`: whether a failed write ran out of space, however a library wrapped the error.
- `give_umask_modes(paths)`: files written with the user's umask, as `open()` writes them (safetensors writes 0600).
"""

import ast
import contextlib
import errno
import glob
import json
import os
import shutil
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.lock import pid_exists


def link_on_the_way(folder: Path, name: str) -> Path | None:
    """The first path from `folder` down to `folder / name` that is a symbolic link; None when there is none."""
    path = Path(folder)
    for part in Path(name).parts:
        path = path / part
        if path.is_symlink():
            return path
    return None


def describe_link(link: Path) -> str:
    try:
        return f"{link} is a symbolic link (to {os.readlink(link)})"
    except OSError:
        return f"{link} is a symbolic link"


def file_problem(folder: str | Path, name: str) -> str | None:
    """Why `folder / name` is not a regular file inside `folder`: "missing", a symbolic link on its path, or a path
    that leads out of the folder; None when it is one."""
    folder = Path(folder)
    if (link := link_on_the_way(folder, name)) is not None:
        return f"{describe_link(link)}: only regular files inside the folder are used, never a link's target"
    path = folder / name
    if not path.exists():
        return f"missing {name}"
    if not path.is_file():
        return f"{name} is not a regular file"
    if not path.resolve().is_relative_to(folder.resolve()):
        return f"{name} leads out of {folder}"
    return None


def content_problem(path: str | Path) -> str | None:
    """Why the file is not what its suffix says (JSON, safetensors, Python, UTF-8 text), named with its cause; None
    when it is, or for other suffixes."""
    path = Path(path)
    suffix = path.suffix
    try:
        if suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        elif suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(path, "pt") as weights:  # reads the header only
                weights.keys()
        elif suffix == ".py":
            ast.parse(path.read_bytes(), filename=path.name)
        elif suffix in (".md", ".txt"):
            path.read_text(encoding="utf-8")
    except Exception as error:  # noqa: BLE001 - whatever a damaged or foreign file raises while being parsed
        kind = {".json": "JSON", ".safetensors": "safetensors", ".py": "Python"}.get(suffix, "UTF-8 text")
        return f"{path.name} is not valid {kind} ({type(error).__name__}: {str(error)[:200]})"
    return None


def staging_path(target: str | Path) -> Path:
    """A new hidden name beside `target` to write it complete before `move_into_place`: ours alone, named after this
    machine and process so that what a killed writer left is known as such (`remove_stale_staging`)."""
    target = Path(target)
    return target.with_name(f"{staging_prefix(target)}{os.getpid()}-{uuid.uuid4().hex[:12]}")


def staging_prefix(target: Path) -> str:
    return f".{target.name}.incomplete-{socket.gethostname()}-"


def remove_stale_staging(target: str | Path) -> list[Path]:
    """Delete the staging files and folders of `target` (and what they renamed aside) that writers on this machine
    left when they were killed (`kill -9`, a power cut). Returns what was deleted."""
    return remove_stale(Path(target).parent, staging_prefix(Path(target)))


def remove_stale(parent: Path, prefix: str) -> list[Path]:
    """Delete the entries of `parent` named `{prefix}{pid}-...` whose process `pid` no longer runs: what writers on
    this machine (`prefix` names it) left when they were killed. Another live process's are left alone, as are another
    machine's. Returns what was deleted."""
    removed = []
    for path in parent.glob(f"{glob.escape(prefix)}*"):
        pid = path.name.removeprefix(prefix).split("-")[0]
        if pid.isdigit() and not pid_exists(int(pid)):
            _remove(path)
            removed.append(path)
    return removed


def move_into_place(staging: str | Path, target: str | Path, replace: bool = True) -> Path:
    """Rename the complete `staging` (a file or a folder, beside `target`) to `target`.

    A file replaces `target` in one rename. A folder replacing a folder (the caller has checked that the old one may
    go) renames the old one aside first (`<staging>.replaced`), then deletes it: `target` is always the old or the new
    one whole, but for the instant between two renames. `replace=False` never replaces: an existing `target` that is
    not an empty folder is an OSError (the caller decides what another writer's result means)."""
    staging, target = Path(staging), Path(target)
    if not replace or staging.is_file() or not target.exists():
        os.replace(staging, target)
        return target
    aside = staging.with_name(f"{staging.name}.replaced")
    _remove(aside)  # left by a writer killed between the two renames: named after our staging, so ours as well
    os.replace(target, aside)
    os.replace(staging, target)
    _remove(aside)
    return target


def _remove(path: Path) -> None:
    """Delete a file or a folder of ours; a link is removed itself, never followed."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


class TargetChanged(VanillaTransformerError, OSError):
    """The folder a staged write goes to changed while it was written (another writer's result, a file put there):
    nothing was replaced."""


@contextlib.contextmanager
def staged_folder(target: str | Path, replacing: Callable[[Path], str | None] | None = None) -> Iterator[Path]:
    """A new hidden folder to write `target` into; moved into place when the block ends, deleted when it fails:
    `target` is never left half-written. Only what the caller checked beforehand is replaced: without `replacing`,
    `target` must still be missing or empty at the rename; with it, `target` is replaced if `replacing(target)` still
    says nothing against it (None) at the rename. Otherwise TargetChanged, and `target` is left as it is."""
    target = Path(target)
    remove_stale_staging(target)
    staging = staging_path(target)
    try:
        yield staging
        why = replacing(target) if replacing is not None and target.is_dir() else None
        if why is not None:
            raise TargetChanged(errno.EEXIST, f"{target} changed while it was written ({why}): it was left as it is")
        try:
            move_into_place(staging, target, replace=replacing is not None)
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
            raise TargetChanged(
                error.errno, f"{target} was written by someone else meanwhile: it was left as it is"
            ) from error
    finally:
        if staging.is_dir() and not staging.is_symlink():
            shutil.rmtree(staging, ignore_errors=True)


def replace_file(path: str | Path, data: bytes | str, staging: str | Path | None = None) -> Path:
    """Write `data` to `path` by renaming a new file over it: a symbolic link at `path` is replaced by the file, its
    target is never opened. Text is written as UTF-8. `staging`: the new file's name when the caller must know it
    beforehand (a run records what it writes); a new hidden name otherwise."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    flags |= os.O_EXCL if staging is None else os.O_TRUNC  # a known name may be left by a killed writer
    staging = staging_path(path) if staging is None else Path(staging)
    descriptor = os.open(staging, flags, 0o666)
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        move_into_place(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return path


def current_umask() -> int:
    """The process's umask, read without changing it where Linux says it (/proc/self/status): setting it to read it
    would give files that another thread creates meanwhile the wrong mode."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def give_umask_modes(paths) -> None:
    """Give each regular file of `paths` (never through a link) the mode `open()` gives a new file, 0o666 less the
    umask (0644 with the usual 022): safetensors (0.7 on) writes its files 0600 through a temporary file, so a folder
    copied into a container or served by another user could not be read. Other modes (a chmod of the user's) stay."""
    mode = 0o666 & ~current_umask()
    for path in map(Path, paths):
        if not path.is_symlink() and path.is_file() and path.stat().st_mode & 0o777 == 0o600 != mode:
            os.chmod(path, mode)


# how a write that ran out of space reads once torch or safetensors wrapped it: torch's zip writer hides the errno
# behind a short write ("unexpected pos 14848 vs 14740", "file write failed"); safetensors names it ("os error 28")
DISK_FULL_SIGNS = (
    "no space left on device",
    "os error 28",
    "disk quota exceeded",
    "unexpected pos",
    "file write failed",
)


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, is a write that ran out of space: errno ENOSPC (or EDQUOT, a
    quota), or torch's and safetensors' wrappings of it (DISK_FULL_SIGNS)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(sign in str(error).lower() for sign in DISK_FULL_SIGNS):
            return True
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def on_full_disk(error: Callable[[BaseException], Exception]) -> Iterator[None]:
    """A write inside the block that runs out of space (`is_disk_full`) raises `error(cause)` instead, from the cause:
    one message that says what was being written and what to do. Every other error goes through as it is."""
    try:
        yield
    except Exception as cause:
        if not is_disk_full(cause):
            raise
        raise error(cause) from cause
