"""The one rule for the folder a command writes its result into, so that no command loses a user's work.

It holds for `convert`, `export-ctranslate2`, `space`, `refresh-code`, `paper-figures`, `attention-maps`, `prepare`,
`sweep`, and `train`'s --output_dir (tests/test_output_rule.py finds the commands that write from their parsers):

1. the folder is none of the command's inputs, is inside none and holds none: replacing it can never take an input;
2. it is written directly: a symbolic link or a file where the folder goes is refused;
3. a new or empty folder is written; one that holds anything is refused, unless the user gave `--overwrite` and the
   folder holds a previous output of the same command, and nothing that command would write over but what it wrote
   (the command's own `why_not_previous` says what else is there). A command that always replaces its folder in
   place (`refresh-code`) has no flag: the folder must be one it may replace.

Every refusal comes before anything is written and names the folder, what is wrong and what to do.

A command knows its previous output by one record of what it wrote (`write_record`: the command and each file's size
and sha256), read by `why_not_recorded`; earlier releases' records are upgraded in `upgraded_output_record` alone.
Those that write a whole folder (`convert`, `export-onnx`, `paper-figures`, `attention-maps`, `translate`'s dataset
folder) write it beside the folder, the record last, then move it into place (`write_recorded_folder` does all three):
a full disk or a folder that may not be written is one error naming it and what to do, and leaves it as it was.
`space` writes in place (a Space's folder may be a git clone), listing each file before writing it. A folder that
grows over many runs, whose files change, is known otherwise: `train`'s by the entries its runs created
(training/output_folder.py), `sweep`'s by a mark and the names it writes. `export-ctranslate2` knows its output by
CTranslate2's own layout, and `prepare` writes only into a new or empty folder.
"""

import errno
import json
import os
from collections.abc import Callable, Collection, Sequence
from fnmatch import fnmatch
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import TargetChanged, on_full_disk, replace_file, staged_folder
from vanilla_transformer.mechanics.integrity import files_problem, is_name_inside, record_files

OVERWRITE = "--overwrite"  # the one flag of every command that may replace its previous output
NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)  # a read-only folder or disk, another user's folder


class OutputFolderError(VanillaTransformerError, ValueError):
    """An output folder that may not be written; the message names it and what to do."""


def check_output_folder(
    folder: str | Path,
    *,
    overwrite: bool,
    why_not_previous: Callable[[Path], str | None],
    previous: str,
    inputs: Sequence[tuple[str, str | Path]] = (),
    error: type[Exception] = OutputFolderError,
    flag: str | None = OVERWRITE,
    ignore: Collection[str] = (),
) -> bool:
    """Apply the rule (the module docstring) to `folder`; raise `error` if it may not be written. `previous` names a
    previous output in words ("a previous conversion"); `inputs` are (what, path) pairs ("the source's folder",
    path); `flag` None: the command always replaces the folder (`overwrite` True); `ignore`: names of the command's
    own bookkeeping (fnmatch patterns), which do not make a folder non-empty. True if the folder holds a previous
    output that will be replaced, False if it is new or empty. Whether the folder is a previous output is asked first,
    so that a refusal without `overwrite` says whether the flag would help."""
    if not str(folder).strip():  # Path("") is the current folder
        raise error("the output folder's name is empty: give the folder to write")
    path = Path(folder)
    resolved = path.resolve()
    for name, input_path in inputs:
        if not Path(input_path).exists():
            continue
        own = Path(input_path).resolve()
        relation = "is" if resolved == own else "is inside" if own in resolved.parents else None
        relation = relation or ("holds" if resolved in own.parents else None)
        if relation:
            raise error(
                f"the output folder {folder} {relation} {name} {input_path}: write to a folder of its own, outside "
                f"it, so that replacing it ({OVERWRITE}) can never touch it"
            )
    if path.is_symlink():
        raise error(f"{folder} is a symbolic link: give the folder itself (a command never writes through a link)")
    if not path.exists():
        return False
    if not path.is_dir():
        raise error(f"{folder} exists and is not a folder: choose another output folder")
    if all(any(fnmatch(name, pattern) for pattern in ignore) for name in os.listdir(path)):
        return False
    why = why_not_previous(path)
    if why and flag is None:
        raise error(f"{folder} is not {previous}: {why}")
    if why:
        raise error(
            f"{folder} is not empty, and not {previous} ({why}): move or delete what it holds yourself, or choose "
            "another output folder"
        )
    if not overwrite:
        raise error(f"{folder} holds {previous}: add {flag} to replace it, or choose another output folder")
    return True


def write_record(folder: Path, record: str, written_by: str, files: dict | None = None) -> None:
    """`folder / record`, the one record of what a command wrote: {"written_by": the command, "files": {relative path:
    {"size", "sha256"}}}, by default every other file under `folder`. A command that writes in place lists a file as
    None before writing it (`files`). Replaced, never written through a link; written last by a command that writes
    its folder whole, so that a folder holds a record only once every file it lists is complete."""
    files = record_files(folder, excluded=(record,)) if files is None else files
    replace_file(folder / record, json.dumps({"written_by": written_by, "files": files}, indent=1) + "\n")


class NotRecorded(VanillaTransformerError):
    """Why a folder holds no record of a command's output; the message says it in words."""


def recorded_files(folder: Path, record: str, written_by: str) -> dict:
    """The files `folder / record` lists as written by `written_by` (`write_record`), earlier releases' records
    upgraded; NotRecorded naming why there are none (no record, a link, damaged, another command's)."""
    path = folder / record
    if path.is_symlink():
        raise NotRecorded(f"its {record} is a symbolic link, not a record that `{written_by}` writes")
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise NotRecorded(f"it has no readable record ({record}) of a `{written_by}` output") from None
    content = upgraded_output_record(content, folder)
    if not isinstance(content, dict) or content.get("written_by") != written_by:
        raise NotRecorded(f"its {record} is not a record of `{written_by}`")
    return content.get("files")


# what earlier releases wrote as "written_by", for today's name
EARLIER_WRITERS = {"vanilla-transformer translate, chunks 1": "vanilla-transformer translate"}


def upgraded_output_record(content, folder: Path):
    """An earlier release's record in today's format, the one place that knows them: a translated dataset's record
    named its writer by the corpus format; a Space export's listed each file by its sha256 alone (its size is taken
    from the folder, the sha256 still decides)."""
    if not isinstance(content, dict) or not isinstance(content.get("files"), dict):
        return content
    writer = EARLIER_WRITERS.get(content.get("written_by"), content.get("written_by"))
    files = {
        name: {"size": (folder / name).stat().st_size if (folder / name).is_file() else -1, "sha256": entry}
        if isinstance(entry, str) and isinstance(name, str) and is_name_inside(folder, name)
        else entry
        for name, entry in content["files"].items()
    }
    return {**content, "written_by": writer, "files": files}


def why_not_recorded(folder: Path, record: str, written_by: str) -> str | None:
    """None if `folder` holds a previous output of the command `written_by`: its `record` (`write_record`), every
    file it lists unchanged since, and nothing else; else why not (for `check_output_folder`'s `why_not_previous`)."""
    try:
        files = recorded_files(folder, record, written_by)
    except NotRecorded as why:
        return str(why)
    if problem := files_problem(folder, files):
        return problem
    present = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if not path.is_dir()} - {record}
    if unlisted := sorted(present - set(files)):
        return f"it holds {', '.join(unlisted[:5])}, which `{written_by}` did not write"
    return None


def write_recorded_folder(
    folder: Path,
    write: Callable[[Path], list[str]],
    *,
    replacing: bool,
    record: str,
    written_by: str,
    error: type[Exception],
    what: str,
) -> list[str]:
    """`write(staging)` (it returns the names it wrote) into a new folder beside `folder`, then its `record`
    (`write_record`), then moved into place: `folder` is replaced only if it is still what `check_output_folder` found
    (new or empty; with `replacing`, the previous output). A full disk, a folder or disk that may not be written, or a
    folder changed meanwhile is one `error` that names `folder` and what to do; `folder` is left as it was. `what`
    names the output in words ("the figures")."""

    def full_disk(cause: BaseException) -> Exception:
        return error(
            f"no space left on device while writing {folder}: it was left as it was, nothing of this run in it; free "
            "space, or give a folder on another disk, and run the command again"
        )

    changed = (lambda path: why_not_recorded(path, record, written_by)) if replacing else None
    try:
        with on_full_disk(full_disk):
            folder.parent.mkdir(parents=True, exist_ok=True)
            with staged_folder(folder.resolve(), changed) as staging:
                staging.mkdir()
                names = write(staging)
                write_record(staging, record, written_by)
    except TargetChanged as changed_meanwhile:
        raise error(
            f"{changed_meanwhile.strerror}; {what} were not written: run the command again"
        ) from changed_meanwhile
    except OSError as refused:
        if refused.errno not in NOT_WRITABLE:
            raise
        raise error(
            f"{folder} cannot be written ({refused.strerror}: {refused.filename}): give a folder you may write to, or "
            "make it writable, and run the command again"
        ) from refused
    return names
