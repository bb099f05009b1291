"""The one rule for the folder a command writes its result into (`convert`, `export-ctranslate2`, `space`,
`refresh-code`, and `train`'s --output_dir), so that no command loses a user's work:

1. the folder is none of the command's inputs, is inside none and holds none: replacing it can never take an input;
2. it is written directly: a symbolic link or a file where the folder goes is refused;
3. a new or empty folder is written; one that holds anything is refused, unless the user gave `--overwrite` and the
   folder holds a previous output of the same command, and nothing that command would write over but what it wrote
   (the command's own `why_not_previous` says what else is there). A command that always replaces its folder in place (`refresh-code`) has no flag: the folder must be
   one it may replace.

Every refusal comes before anything is written and names the folder, what is wrong and what to do. A command that
knows its previous output by a record of the files it wrote (`paper-figures`, `attention-maps`) writes it with
`write_record`, last, and asks `why_not_recorded`.
"""

import json
import os
from collections.abc import Callable, Collection, Sequence
from fnmatch import fnmatch
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.integrity import files_problem, record_files

OVERWRITE = "--overwrite"  # the one flag of every command that may replace its previous output


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
    own bookkeeping (fnmatch patterns), which do not make a folder non-empty. True if the folder holds a previous output that will be
    replaced, False if it is new or empty. Whether the folder is a previous output is asked first, so that a refusal
    without `overwrite` says whether the flag would help."""
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


def write_record(folder: Path, record: str, written_by: str) -> None:
    """`folder / record`: the command `written_by` and every other file under `folder` with its size and sha256.
    Written last, so that a folder holds a record only once every file it lists is complete."""
    files = record_files(folder, excluded=(record,))
    (folder / record).write_text(json.dumps({"written_by": written_by, "files": files}, indent=1) + "\n", "utf-8")


def why_not_recorded(folder: Path, record: str, written_by: str) -> str | None:
    """None if `folder` holds a previous output of the command `written_by`: its `record` (`write_record`), every
    file it lists unchanged since, and nothing else; else why not (for `check_output_folder`'s `why_not_previous`)."""
    try:
        recorded = json.loads((folder / record).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"it has no readable record ({record}) of a `{written_by}` output"
    files = recorded.get("files") if isinstance(recorded, dict) else None
    if not isinstance(recorded, dict) or recorded.get("written_by") != written_by:
        return f"its {record} is not a record of `{written_by}`"
    if problem := files_problem(folder, files):
        return problem
    present = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if not path.is_dir()} - {record}
    if unlisted := sorted(present - set(files)):
        return f"it holds {', '.join(unlisted[:5])}, which `{written_by}` did not write"
    return None
