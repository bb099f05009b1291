"""A training run's output folder: a new run never mixes with, or silently replaces, an earlier one.

`claim_run_folder` runs at start, before any data is prepared, on the process that writes the folder. It takes the
folder's lock (`folder_lock`: one run per folder; a lock left by a killed run is told apart and taken over), then
decides what the run may do with the folder (`claim_output_dir`):

- a missing or empty folder is used;
- `--resume_from_checkpoint` continues the run in the folder (the checkpoint is then checked against this run's
  model and tokenizer before anything is loaded, pruned or averaged); `latest` in a folder that holds files but no
  checkpoint is refused, as that would start a new run over an old one, and so is a checkpoint from another folder
  or of another run when the folder holds a run (it would replace that run); into an empty folder, any checkpoint
  continues;
- `--overwrite` deletes what an earlier run of ours wrote there, as its record says (below), and leaves
  every other entry alone, naming it; a folder holding anything the new run would write over that no run of ours
  wrote (a downloaded model, a project's files) is refused. With a checkpoint from another folder, the run then
  continues from it;
- anything else is refused, with what the folder holds and the three ways on.

The record: `RUN_RECORD` in the folder lists the ids of the runs that trained there and every top-level entry they
write, each added before it is written (`ClaimedOutputDir.record`), so a run killed at any moment leaves nothing of its own
unlisted; at the end, entries that were never written are dropped. `--overwrite` deletes only what it lists,
and inside `checkpoints/` only the checkpoints of the listed runs (each records its run id in trainer_state.json).
It never follows a symbolic link (a link is deleted as a link), and never deletes a `.py` file or a folder holding one.
Nothing is ever written through a link: a link where the run writes is refused.

Each checkpoint records its run's id (`trainer_state.json`), and the script prunes and averages only the
checkpoints of its own run.
"""

import fnmatch
import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vanilla_transformer.mechanics.barrier import run_while_others_wait
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import describe_link, is_disk_full, on_full_disk, replace_file
from vanilla_transformer.mechanics.lock import LOCK_NAME, FolderLock, FolderLockError
from vanilla_transformer.mechanics.names import (
    CHECKPOINTS_DIR,
    CODE_FILES,
    CUSTOM_GENERATE,
    EVALUATION_FILES,
    HYPOTHESES_FILES,
    REQUIRED_FILES,
    RESULTS,
    TRACKER_LOGS,
    TRAIN_LOG,
    UPLOADED_FILES,
    UPLOADED_PATTERNS,
    WEIGHTS_NAME,
)
from vanilla_transformer.mechanics.outputs import check_output_folder
from vanilla_transformer.training import checkpoint_folders, checkpointing
from vanilla_transformer.training.settings import OutputSettings

RUN_RECORD = ".vanilla_transformer_run.json"  # what the runs in a folder wrote (never uploaded: not on the allow-list)
BOOKKEEPING = (RUN_RECORD, LOCK_NAME)  # ours, and never counted as what a folder holds
# what a run writes into its folder, in the order it writes them (and accelerate's TRACKER_LOGS with --report_to)
TRAINING_ENTRIES = (CHECKPOINTS_DIR, TRAIN_LOG, f"{TRAIN_LOG}.tmp")
# the model folder (and its shards; custom_generate/generate.py as its folder), the hypotheses
FINAL_ENTRIES = (RESULTS, *dict.fromkeys(name.split("/")[0] for name in UPLOADED_FILES), *HYPOTHESES_FILES)
# the model code a run writes: never deleted (.py files), and written again by the next run's save
REWRITTEN_CODE = (*CODE_FILES, CUSTOM_GENERATE.split("/")[0])
RUN_FILES = (*TRAINING_ENTRIES, TRACKER_LOGS, *FINAL_ENTRIES)


def is_run_file(name: str) -> bool:
    """Whether a run writes an entry of this name into its folder (model shards included)."""
    return name in RUN_FILES or any(fnmatch.fnmatchcase(name, pattern) for pattern in UPLOADED_PATTERNS)


class OutputDirError(VanillaTransformerError):
    """The output folder holds work that this run would replace or mix with; the message says what to do."""


def contents(folder: Path) -> list[str]:
    """The names of what `folder` holds, but for our bookkeeping (the lock, the record and its staging copies)."""
    if not folder.is_dir():
        return []
    return sorted(
        name for name in os.listdir(folder) if name not in BOOKKEEPING and not name.startswith(f".{RUN_RECORD}.")
    )


def describe(folder: Path) -> str:
    """What an earlier run left in `folder`, in a few words. A finished run has its whole model folder and
    results.json, written last (`write_final_records`); a run stopped during its final save or evaluation (killed, or
    out of space) has its checkpoints and some or all of the model folder, but no results.json."""
    results = folder / RESULTS
    latest = checkpoint_folders.latest_checkpoint(folder / CHECKPOINTS_DIR)
    saved = f"checkpoints up to {latest.name}" if latest is not None else "no checkpoint"
    if results.is_file() and not results.is_symlink():
        try:
            return f"a finished run ({json.loads(results.read_text())['steps']} steps, results.json)"
        except (ValueError, KeyError, TypeError):
            return "a finished run (results.json)"
    if (folder / "config.json").is_file():  # the final save writes it before the weights
        problem = final_model_problem(folder) or "no results.json"
        return f"an interrupted run (its final save or evaluation did not finish: {problem}; {saved})"
    if latest is not None:
        return f"an unfinished run ({saved})"
    return f"{len(contents(folder))} entries ({listed(contents(folder))})"


def write_final_records(output_dir: str | Path, card: str, summary: dict) -> None:
    """The finished run's model card (README.md) and results.json, each written once, after the model folder and the
    final evaluation; results.json last, as it says that the run finished (`describe`, the sweep's rows)."""
    folder = Path(output_dir)
    (folder / "README.md").write_text(card, encoding="utf-8")
    (folder / RESULTS).write_text(json.dumps(summary, indent=2))


def final_model_problem(folder: Path) -> str | None:
    """Why `folder` does not hold the whole model folder a run's final save writes (every REQUIRED_FILES file and its
    tokenizer.json, the weights complete), or None when it does."""
    if missing := [name for name in (*REQUIRED_FILES, "tokenizer.json") if not (folder / name).is_file()]:
        return f"missing {listed(missing, at_most=3)}"
    index = folder / f"{WEIGHTS_NAME}.index.json"
    if (folder / WEIGHTS_NAME).is_file() or not index.is_file():
        return safetensors_problem(folder / WEIGHTS_NAME)
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        if not all(isinstance(shard, str) and shard == Path(shard).name for shard in shards):
            raise ValueError("a shard outside the folder")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"{index.name} is damaged"
    return next((problem for shard in shards if (problem := safetensors_problem(folder / shard))), None)


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a whole safetensors file ("missing", cut short by a kill or a full disk), from its header and
    size alone; None when it is whole."""
    if path.is_symlink() or not path.is_file():
        return f"missing {path.name}"
    try:
        with path.open("rb") as file:
            header_size = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(min(header_size, 100 * 2**20)))
        tensors = [entry for name, entry in header.items() if name != "__metadata__"]
        data_size = max((int(entry["data_offsets"][1]) for entry in tensors), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return f"{path.name} is not a whole safetensors file"
    if (size := path.stat().st_size) < 8 + header_size + data_size:
        return f"{path.name} is cut short ({size:,} of {8 + header_size + data_size:,} bytes)"
    return None


def listed(names: list[str], at_most: int = 8) -> str:
    return ", ".join(names[:at_most]) + (f", ... ({len(names)} in all)" if len(names) > at_most else "")


def claim_output_dir(settings: OutputSettings) -> None:
    """Check (and with --overwrite, clear) --output_dir before a training run, saying what was deleted. Raises
    OutputDirError when the folder holds work this run must not touch. With --overwrite, the one output-folder rule
    (mechanics/outputs.py) decides, a previous output being what earlier runs of ours wrote; without, a folder that
    holds a run is continued (--resume_from_checkpoint) or refused."""
    folder, overwrite, resume_from_checkpoint = Path(settings.output_dir), settings.overwrite, settings.resume_from
    if folder.exists() and not folder.is_dir():
        raise OutputDirError(f"--output_dir {folder} is a file, not a folder")
    if not contents(folder):
        return
    if overwrite:
        if resume_from_checkpoint and is_inside(Path(resume_from_checkpoint), folder):
            raise OutputDirError(
                f"--overwrite would delete --resume_from_checkpoint {resume_from_checkpoint} (inside "
                f"--output_dir {folder}): continue that run without --overwrite"
            )
        check_output_folder(
            folder,
            overwrite=True,
            why_not_previous=why_not_a_run_of_ours,
            previous="what earlier runs of this project wrote",
            error=OutputDirError,
            ignore=(*BOOKKEEPING, f".{RUN_RECORD}.*"),
        )
        clear_run_files(folder)
        return
    refuse_links_where_the_run_writes(folder)
    has_checkpoint = checkpoint_folders.latest_checkpoint(folder / CHECKPOINTS_DIR) is not None
    if resume_from_checkpoint == "latest" and has_checkpoint:
        return
    if resume_from_checkpoint and resume_from_checkpoint != "latest":
        check_resumes_the_folders_run(folder, Path(resume_from_checkpoint))
        return
    raise OutputDirError(
        f"--output_dir {folder} already holds {describe(folder)}. Continue that run with --resume_from_checkpoint "
        "latest" + ("" if has_checkpoint else " (it has no checkpoint left)") + ", replace it with "
        "--overwrite (deletes what an earlier run wrote there: its checkpoints, logs and model), or choose "
        "another --output_dir."
    )


def refuse_links_where_the_run_writes(folder: Path) -> None:
    """A run writes its files by name: a symbolic link under one of those names would have it write through the link,
    out of the folder."""
    if links := [name for name in contents(folder) if is_run_file(name) and (folder / name).is_symlink()]:
        raise OutputDirError(
            f"--output_dir {folder}: {'; '.join(describe_link(folder / name) for name in links)}: the run would write "
            "through it. Replace the link with the file or folder itself, or choose another --output_dir."
        )


def is_inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def check_resumes_the_folders_run(folder: Path, checkpoint: Path) -> None:
    """A checkpoint resumed into a folder that holds a run must be one of that run's: from another folder, or of
    another run, resuming would replace the folder's checkpoints, model and results with the other run's."""
    if not any((folder / name).exists() for name in RUN_FILES):
        return  # no run here to replace (other files are never touched)
    newest = checkpoint_folders.latest_checkpoint(folder / CHECKPOINTS_DIR)
    if is_inside(checkpoint, folder / CHECKPOINTS_DIR):
        if newest is None or checkpoint_folders.run_id_of(checkpoint) == checkpoint_folders.run_id_of(newest):
            return
        whose = f"of another run than {newest.name}, the newest checkpoint in {folder / 'checkpoints'}"
    else:
        whose = "from outside it"
    raise OutputDirError(
        f"--resume_from_checkpoint {checkpoint} is {whose}, and --output_dir {folder} already holds "
        f"{describe(folder)}: resuming would replace that run's checkpoints, model and results. Resume into an "
        "empty --output_dir, replace the folder's run with --overwrite (deletes its checkpoints, logs "
        "and model), or continue the folder's own run with --resume_from_checkpoint latest."
    )


# --- what the runs in a folder wrote: its record ----------------------------------------------------------------


def read_run_record(folder: Path) -> dict | None:
    """The folder's RUN_RECORD ({"entries": [...], "run_ids": [...]}), None when it has none; an OutputDirError
    naming the file when it is a link or not the record we write (its entries must be plain names in the folder)."""
    path = Path(folder) / RUN_RECORD
    if path.is_symlink():
        raise OutputDirError(f"{describe_link(path)}, not the record a run of ours writes: remove the link")
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        entries, run_ids = record["entries"], record["run_ids"]
        names = [*entries, *run_ids]
        if not all(isinstance(name, str) for name in names) or not all(_plain_name(name) for name in entries):
            raise ValueError("entries and run ids must be names of the folder's own entries")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise OutputDirError(
            f"{path} is damaged ({type(error).__name__}: {str(error)[:200]}): it lists what runs of ours wrote in "
            f"{folder}, and without it nothing there is deleted. Delete the run's files yourself (then this file), "
            "or choose another --output_dir."
        ) from error
    return {"entries": list(entries), "run_ids": list(run_ids)}


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..", *BOOKKEEPING) and "/" not in name and os.sep not in name


def write_run_record(folder: Path, record: dict) -> None:
    """Replace the folder's record (never written through a link; a crash leaves the old one or the new one)."""
    text = json.dumps({"written_by": "vanilla-transformer train", **record}, indent=1)
    replace_file(Path(folder) / RUN_RECORD, text + "\n")


def record_run_files(folder: Path, names=(), run_id: str | None = None) -> None:
    """Add `names` (top-level entries a run is about to write) and `run_id` to the folder's record; creates it."""
    record = read_run_record(folder) or {"entries": [], "run_ids": []}
    record["entries"] += [name for name in names if name not in record["entries"]]
    if run_id is not None and run_id not in record["run_ids"]:
        record["run_ids"].append(run_id)
    write_run_record(folder, record)


def forget_unwritten(folder: Path) -> None:
    """Drop from the record the entries that were listed but never written (a run that ended first); a record
    left listing nothing is deleted."""
    if (record := read_run_record(folder)) is None:
        return
    entries = [name for name in record["entries"] if os.path.lexists(folder / name)]
    if not entries:
        (folder / RUN_RECORD).unlink()
    elif entries != record["entries"]:
        write_run_record(folder, {**record, "entries": entries})


# --- --overwrite --------------------------------------------------------------------------------------


@dataclass
class Overwrite:
    """What --overwrite does with a folder: what goes, what stays and why, and what is in the way (the new
    run would write over it: refused)."""

    delete: list[str] = field(default_factory=list)  # paths relative to the folder
    kept: dict[str, str] = field(default_factory=dict)  # path relative to the folder -> why it stays
    in_the_way: list[str] = field(default_factory=list)


def plan_overwrite(folder: Path, record: dict | None) -> Overwrite:
    """What a run of ours wrote in `folder` (`record`), and so may go. Without a record, the folder was written by
    an older version of this project (or by no run of ours): only what provably is an earlier run of ours goes,
    the checkpoints whose trainer_state.json records a run id and a train_log.jsonl of our log lines."""
    plan = Overwrite()
    ours = set(record["entries"]) if record else set()
    # A folder without a record was written by an older version of this project (or by no run of ours). Its
    # checkpoints whose trainer_state.json has a run id are an older run of ours, and so is a train_log.jsonl of our
    # log lines (a run killed before its first checkpoint, which the Table 3 sweep starts again with
    # --overwrite); nothing else in it is taken for ours.
    for name in sorted(contents(folder), key=lambda name: (name != CHECKPOINTS_DIR, name)):
        path = folder / name
        if name == CHECKPOINTS_DIR and (name in ours or record is None) and not path.is_symlink() and path.is_dir():
            _plan_checkpoints(folder, record, plan)
        elif name in ours or (record is None and name == TRAIN_LOG and _is_our_log(path)):
            if path.is_symlink():
                plan.delete.append(name)  # the link goes, never what it leads to
            elif name.endswith(".py"):
                plan.kept[name] = ".py files are never deleted; the new model folder writes this project's code"
            elif path.is_dir() and _holds_python(path):
                plan.kept[name] = "holds .py files, never deleted"
            else:
                plan.delete.append(name)
        else:
            plan.kept[name] = "not written by a run of ours"
    plan.in_the_way += [
        name
        for name, why in plan.kept.items()
        if ("/" not in name and is_run_file(name) and not (name in ours and name in REWRITTEN_CODE))
        or ("/" in name and checkpoint_folders.checkpoint_step(name) is not None)  # checkpoints/step_N of another run
    ]
    return plan


def _plan_checkpoints(folder: Path, record: dict | None, plan: Overwrite) -> None:
    """Inside `checkpoints/`: the checkpoints of the recorded runs go (of any run with an id, for a folder without a
    record: an older version of this project wrote it), and the unfinished saves of ours (`.incomplete_*`)."""
    root = folder / CHECKPOINTS_DIR
    gone = 0
    for path in sorted(root.iterdir()):
        name = f"{CHECKPOINTS_DIR}/{path.name}"
        if path.is_symlink():
            if record is not None:
                plan.delete.append(name)
                gone += 1
            else:
                plan.kept[name] = "a symbolic link, not a checkpoint of ours"
            continue
        run_id = checkpoint_folders.run_id_of(path) if path.is_dir() else None
        ours = run_id in record["run_ids"] if record is not None else isinstance(run_id, str)
        if record is not None and path.name.startswith(checkpoint_folders.STAGING_PREFIX) and path.is_dir():
            ours = True  # an unfinished save of a recorded run (only ours are named so)
        if not ours:
            plan.kept[name] = "not a checkpoint of a run of ours"
        elif _holds_python(path):
            plan.kept[name] = "holds .py files, never deleted"
        else:
            plan.delete.append(name)
            gone += 1
    if gone == len(os.listdir(root)):  # all of it: the folder itself goes
        plan.delete = [name for name in plan.delete if not name.startswith(f"{CHECKPOINTS_DIR}/")] + [CHECKPOINTS_DIR]


def _holds_python(folder: Path) -> bool:
    return any(name.endswith(".py") for _, _, files in os.walk(folder) for name in files)  # links not followed


def _is_our_log(path: Path) -> bool:
    """A train_log.jsonl of our lines ({"step": int, "loss": number, ...}), as older versions wrote it."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (ValueError, UnicodeDecodeError):
        return False
    return all(
        isinstance(record, dict) and isinstance(record.get("step"), int) and isinstance(record.get("loss"), float)
        for record in records
    )


def why_not_a_run_of_ours(folder: Path) -> str | None:
    """None if everything in `folder` that a new run would write over was written by a run of ours (its record,
    `plan_overwrite`); else what is in the way."""
    record = read_run_record(folder)
    if not (in_the_way := plan_overwrite(folder, record).in_the_way):
        return None
    whose = (
        f"and no record of a run of this project ({RUN_RECORD})"
        if record is None
        else f"that no run of ours wrote (its record, {RUN_RECORD}, does not list them)"
    )
    return f"it holds {listed(in_the_way)} {whose}, which the new run would write over"


def clear_run_files(folder: Path) -> list[str]:
    """--overwrite: delete what runs of ours wrote into `folder` (its record, `plan_overwrite`), print what went and
    what stayed, and return what went. The caller has checked that nothing a new run writes over is another's
    (`why_not_a_run_of_ours`)."""
    record = read_run_record(folder)
    plan = plan_overwrite(folder, record)
    for name in plan.delete:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)  # never follows a link inside it
        else:
            path.unlink()
    if record is not None:
        entries = [name for name in record["entries"] if os.path.lexists(folder / name)]
        write_run_record(folder, {"entries": entries, "run_ids": []})
    deleted = ", ".join(plan.delete) if plan.delete else "nothing"
    kept = "; ".join(f"{name} ({why})" for name, why in plan.kept.items())
    print(f"[output] --overwrite: deleted {deleted} from {folder}" + (f"; kept {kept}" if kept else ""))
    return plan.delete


# --- the folder of a run: its lock and its record -----------------------------------------------------------------


class ClaimedOutputDir:
    """A run's output folder while the run holds its lock (`lock`): `record` lists what the run is about to write,
    `close` drops what it never wrote and gives the lock back. Without a lock (a process that does not write the
    folder), both do nothing."""

    def __init__(self, folder: str | Path, lock: FolderLock | None = None, created: bool = False):
        self.folder, self.lock, self.created = Path(folder), lock, created

    def record(self, names=(), run_id: str | None = None) -> None:
        if self.lock is not None:
            record_run_files(self.folder, names, run_id)

    def record_model_shards(self) -> None:
        """A model too large for one file is saved in shards, named only once saved: listed right after."""
        if self.lock is not None:
            self.record(sorted({path.name for pattern in UPLOADED_PATTERNS for path in self.folder.glob(pattern)}))

    def close(self) -> None:
        """Also at the end of a run stopped by a full disk: the record, which could not be rewritten then, keeps
        listing the entries never written, and the next claim of the folder drops them (never raising over the
        error that stopped the run)."""
        if self.lock is None:
            return
        try:
            forget_unwritten(self.folder)
        except OSError as error:
            if not is_disk_full(error):
                raise
        finally:
            self.lock.release()
            self.lock = None
            if self.created and self.folder.is_dir() and not os.listdir(self.folder):
                self.folder.rmdir()  # a run that wrote nothing leaves no folder it made


def claim_run_folder(settings: OutputSettings) -> ClaimedOutputDir:
    """Take --output_dir's lock (one run per folder), then `claim_output_dir`, then start the folder's record, before
    the run writes anything else there; returns the folder to record into and close at the end. OutputDirError when
    another run holds the folder (naming its pid and host) or the claim is refused (the lock is then given back)."""
    folder = Path(settings.output_dir)
    if folder.exists() and not folder.is_dir():
        raise OutputDirError(f"--output_dir {folder} is a file, not a folder")
    created = not folder.exists()
    lock = FolderLock(folder, "training run")
    try:
        with on_full_disk(refused_for_full_disk(folder)):
            note = lock.take()
    except FolderLockError as error:
        raise OutputDirError(f"--output_dir: {error}") from error
    if note:
        print(f"[output] {note}")
    run_folder = ClaimedOutputDir(folder, lock, created)
    try:
        with on_full_disk(refused_for_full_disk(folder)):
            forget_unwritten(folder)
            claim_output_dir(settings)
            record_run_files(folder)
    except BaseException:
        run_folder.close()
        raise
    return run_folder


def refused_for_full_disk(folder: Path) -> Callable[[BaseException], OutputDirError]:
    """For `on_full_disk`: a full disk while claiming the folder (its lock, its record) is an OutputDirError that says
    so, not a traceback: nothing of the run has started."""
    return lambda cause: OutputDirError(
        f"--output_dir {folder}: no space left on device ({cause}); free space on that disk, then run the command again"
    )


def output_dir_is_shared(accelerator, output_dir: str | Path) -> bool:
    """Whether every process sees the main process's `output_dir`: the main process leaves a marker beside it and
    every process looks for it."""
    from accelerate.utils import broadcast_object_list, gather_object

    if accelerator.num_processes == 1:
        return True
    token = [uuid.uuid4().hex]
    broadcast_object_list(token)
    folder = Path(output_dir).absolute()
    marker = folder.parent / f".{folder.name}.shared-{token[0]}"

    def leave_marker():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()

    run_while_others_wait(accelerator, leave_marker, "checking --output_dir", accelerator.is_main_process)
    seen = gather_object([marker.exists()])
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        marker.unlink()
    return all(seen)


def claim_for_training(accelerator, settings: OutputSettings) -> ClaimedOutputDir:
    """The output folder is this run's (or refused), on every machine that writes one: with no filesystem shared
    by every process, each machine keeps its own copy of every checkpoint. Returns the folder, locked by the process
    that claimed it (one run per folder), to record what the run writes and to close at the end.

    The lock: on one filesystem shared by every process, only the main process writes the folder, and only it takes
    the lock. Without one, each machine's first process writes that machine's own copy of the folder and claims it,
    lock included: a second run can only write into a machine's copy through that machine's first process, which
    then meets the lock there (on other machines' folders nobody else writes)."""
    save_on_each_node = not output_dir_is_shared(accelerator, settings.output_dir)
    accelerator.project_configuration.save_on_each_node = save_on_each_node
    if save_on_each_node:
        accelerator.print("[output] --output_dir is not shared between the machines: each keeps its own checkpoints")
    claimed = [ClaimedOutputDir(settings.output_dir)]  # unlocked: a process that does not write the folder

    def claim():
        claimed[0] = claim_run_folder(settings)

    try:
        writes = checkpointing.writes_checkpoints(accelerator)
        run_while_others_wait(accelerator, claim, "checking --output_dir", writes)
    except BaseException:  # refused on another machine: this one's lock goes too
        claimed[0].close()
        raise
    return claimed[0]


def claim_evaluation_dir(output_dir: str | Path, overwrite: bool) -> FolderLock:
    """--evaluate_only writes hypotheses and scores into `output_dir`: never while another run (a training run, an
    evaluation) holds the folder's lock, never over an earlier run's files, and never through a symbolic link. Returns
    the folder's lock, taken: release it when the evaluation ends."""
    lock = FolderLock(output_dir, "run")
    try:
        with on_full_disk(refused_for_full_disk(Path(output_dir))):
            if note := lock.take():
                print(f"[output] {note}")
        _check_evaluation_files(Path(output_dir), overwrite)
    except FolderLockError as error:
        raise OutputDirError(f"--output_dir: {error}") from error
    except BaseException:
        lock.release()
        raise
    return lock


def _check_evaluation_files(folder: Path, overwrite: bool) -> None:
    if links := [name for name in EVALUATION_FILES if (folder / name).is_symlink()]:
        raise OutputDirError(
            f"--output_dir {folder}: {'; '.join(describe_link(folder / name) for name in links)}: the evaluation "
            "would write through it. Remove the link, or choose another --output_dir."
        )
    existing = [name for name in EVALUATION_FILES if (folder / name).exists()]
    if existing and not overwrite:
        raise OutputDirError(
            f"--output_dir {folder} already holds {', '.join(existing)}; choose another --output_dir for this "
            "evaluation, or replace them with --overwrite"
        )
