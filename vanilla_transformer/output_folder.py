"""A training run's output folder: a new run never mixes with, or silently replaces, an earlier one.

`claim_output_dir` runs at start, before any data is prepared, and decides what a run may do with its folder:

- a missing or empty folder is used;
- `--resume_from_checkpoint` continues the run in the folder (the checkpoint is then checked against this run's
  model and tokenizer before anything is loaded, pruned or averaged); `latest` in a folder that holds files but no
  checkpoint is refused, as that would start a new run over an old one, and so is a checkpoint from another folder
  or of another run when the folder holds a run (it would replace that run); into an empty folder, any checkpoint
  continues;
- `--overwrite_output_dir` deletes what an earlier run wrote there (`RUN_FILES`: checkpoints, logs, hypotheses,
  results, the model folder) and leaves every other file alone; with a checkpoint from another folder, the run
  then continues from it;
- anything else is refused, with what the folder holds and the three ways on.

Each checkpoint records its run's id (`trainer_state.json`), and the script prunes and averages only the
checkpoints of its own run.
"""

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from . import checkpoints
from .names import (
    CHECKPOINTS_DIR,
    EVALUATION_FILES,
    REQUIRED_FILES,
    RESULTS,
    TRACKER_LOGS,
    TRAIN_LOG,
    WEIGHTS_NAME,
)

RUN_FILES = (CHECKPOINTS_DIR, TRAIN_LOG, RESULTS, TRACKER_LOGS, *EVALUATION_FILES, WEIGHTS_NAME, *REQUIRED_FILES)


@dataclass(frozen=True)
class OutputSettings:
    """A run's folder, and what the run may do with an earlier run's files there."""

    output_dir: str
    overwrite: bool = False  # delete the earlier run's files first (--overwrite_output_dir)
    resume_from: str | None = None  # a checkpoint folder, or "latest" (--resume_from_checkpoint)


class OutputDirError(Exception):
    """The output folder holds work that this run would replace or mix with; the message says what to do."""


def describe(folder: Path) -> str:
    """What an earlier run left in `folder`, in a few words."""
    results = folder / RESULTS
    if results.is_file():
        try:
            return f"a finished run ({json.loads(results.read_text())['steps']} steps, results.json)"
        except (ValueError, KeyError):
            return "a finished run (results.json)"
    latest = checkpoints.latest_checkpoint(folder / CHECKPOINTS_DIR)
    if latest is not None:
        return f"an unfinished run (checkpoints up to {latest.name})"
    names = sorted(path.name for path in folder.iterdir())
    return f"{len(names)} entries ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"


def claim_output_dir(settings: OutputSettings) -> None:
    """Check (and with --overwrite_output_dir, clear) --output_dir before a training run, saying what was deleted.
    Raises OutputDirError when the folder holds work this run must not touch."""
    folder, overwrite, resume_from_checkpoint = Path(settings.output_dir), settings.overwrite, settings.resume_from
    if folder.exists() and not folder.is_dir():
        raise OutputDirError(f"--output_dir {folder} is a file, not a folder")
    if not folder.exists() or not any(folder.iterdir()):
        return
    if overwrite:
        if resume_from_checkpoint and is_inside(Path(resume_from_checkpoint), folder):
            raise OutputDirError(
                f"--overwrite_output_dir would delete --resume_from_checkpoint {resume_from_checkpoint} (inside "
                f"--output_dir {folder}): continue that run without --overwrite_output_dir"
            )
        if deleted := clear_run_files(folder):
            print(f"[output] --overwrite_output_dir: deleted {', '.join(deleted)} from {folder}")
        return
    has_checkpoint = checkpoints.latest_checkpoint(folder / CHECKPOINTS_DIR) is not None
    if resume_from_checkpoint == "latest" and has_checkpoint:
        return
    if resume_from_checkpoint and resume_from_checkpoint != "latest":
        check_resumes_the_folders_run(folder, Path(resume_from_checkpoint))
        return
    raise OutputDirError(
        f"--output_dir {folder} already holds {describe(folder)}. Continue that run with --resume_from_checkpoint "
        "latest" + ("" if has_checkpoint else " (it has no checkpoint left)") + ", replace it with "
        "--overwrite_output_dir (deletes its checkpoints, logs and model), or choose another --output_dir."
    )


def is_inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def check_resumes_the_folders_run(folder: Path, checkpoint: Path) -> None:
    """A checkpoint resumed into a folder that holds a run must be one of that run's: from another folder, or of
    another run, resuming would replace the folder's checkpoints, model and results with the other run's."""
    if not any((folder / name).exists() for name in RUN_FILES):
        return  # no run here to replace (other files are never touched)
    newest = checkpoints.latest_checkpoint(folder / CHECKPOINTS_DIR)
    if is_inside(checkpoint, folder / CHECKPOINTS_DIR):
        if newest is None or checkpoints.run_id_of(checkpoint) == checkpoints.run_id_of(newest):
            return
        whose = f"of another run than {newest.name}, the newest checkpoint in {folder / 'checkpoints'}"
    else:
        whose = "from outside it"
    raise OutputDirError(
        f"--resume_from_checkpoint {checkpoint} is {whose}, and --output_dir {folder} already holds "
        f"{describe(folder)}: resuming would replace that run's checkpoints, model and results. Resume into an "
        "empty --output_dir, replace the folder's run with --overwrite_output_dir (deletes its checkpoints, logs "
        "and model), or continue the folder's own run with --resume_from_checkpoint latest."
    )


def clear_run_files(folder: Path) -> list[str]:
    """Delete what a training run writes into `folder` (RUN_FILES) and return their names; other files stay."""
    deleted = []
    for name in RUN_FILES:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        deleted.append(name)
    return deleted


def claim_evaluation_dir(output_dir: str | Path, overwrite: bool) -> None:
    """--evaluate_only writes hypotheses and scores into `output_dir`: never over an earlier run's."""
    folder = Path(output_dir)
    existing = [name for name in EVALUATION_FILES if (folder / name).exists()]
    if existing and not overwrite:
        raise OutputDirError(
            f"--output_dir {folder} already holds {', '.join(existing)}; choose another --output_dir for this "
            "evaluation, or replace them with --overwrite_output_dir"
        )
