"""Checkpoints: the folders `accelerator.save_state` writes, and a run's saving, resuming and averaging with them.

Layout: `<output_dir>/checkpoints/step_000123/` holds everything `save_state` wrote, including the model weights in
`model.safetensors` (accelerate's name for the first prepared model), plus our `trainer_state.json` (step, data
position, schedule, run id, model config, tokenizer fingerprint: JSON, nothing of ours is pickled) and
`checksums.json`. A checkpoint only counts once it is complete: saves go to a staging folder that is renamed into
place when done, so an interrupted save never looks like a checkpoint. The weights are only ever read with
safetensors, or FSDP's full-state file with `weights_only=True` (no code runs).

The script's side, in the order a run meets it (fairseq keeps these in `checkpoint_utils` the same way):
`writes_checkpoints` (the main process, or each machine's first one where no filesystem is shared by every process:
output_folder.output_dir_is_shared), `new_run_id` and `run_identity`, `save_checkpoint`, `resume`
(`find_resume_checkpoint`: the processes agree on one intact checkpoint before any loads it;
`check_checkpoint_matches`: it must be of this model and tokenizer), and `load_averaged_weights` (section 6.1).

Integrity: `checkpoint_problem` compares a folder against its `checksums.json`, so a truncated or damaged file is
named before anything is loaded. Ownership: listing, pruning and averaging take `run_id` and only ever touch that
run's checkpoints. A full disk (`disk_full`: errno ENOSPC, or torch's and safetensors' wrappings of it) stops
the run with one DiskFull that names the folder, deletes the checkpoint's staging folder and names the checkpoint to
continue from with --resume_from_checkpoint latest.
"""

import json
import math
import re
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vanilla_transformer.data.batching import DataPosition
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import give_umask_modes, move_into_place, on_full_disk
from vanilla_transformer.mechanics.integrity import files_problem, record_files
from vanilla_transformer.mechanics.names import WEIGHTS_NAME
from vanilla_transformer.model.upgrade import (
    OBSOLETE_CONFIG_FIELDS,
    has_fused_projections,
    split_fused_optimizer_state,
    split_fused_projections,
    splitting_fused_weights,
    upgrade_config,
)
from vanilla_transformer.training.settings import CheckpointSettings

# FSDP with `fsdp_state_dict_type: FULL_STATE_DICT` saves the whole model as one torch file (read here with
# `weights_only=True`: tensors only, no code). Sharded FSDP checkpoints are refused at start by the script.
FSDP_WEIGHTS_NAME = "pytorch_model_fsdp.bin"
WEIGHTS_NAMES = (WEIGHTS_NAME, FSDP_WEIGHTS_NAME)
CHECKSUMS_NAME = "checksums.json"
TRAINER_STATE = "trainer_state.json"
ANY_RUN = object()  # `run_id` that matches every checkpoint
NO_RUN = object()  # the run of a checkpoint whose trainer_state.json is unusable: matches no run id


class CheckpointError(VanillaTransformerError):
    """A checkpoint is damaged, or belongs to another model or run; the message names the folder or file."""


class MissingWeights(CheckpointError, FileNotFoundError):
    """A checkpoint folder without its weights file."""


class DiskFull(CheckpointError):
    """A checkpoint or the final model could not be written for want of space; the message names the folder, what
    was removed, and how to continue."""


CHECKPOINT_PREFIX = "step_"
STAGING_PREFIX = ".incomplete_"
_CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


def save_tied_weights_once(models, weights: list[dict], output_dir) -> None:
    """`accelerator.save_state` pre-hook: each tensor stored once, under the first of its names (the shared embedding
    matrix has four, 3.4). Accelerate drops the other names the same way, but logs "Removed shared tensor" at every
    checkpoint; loading ties them again."""
    for state_dict in weights:
        seen = set()
        for name in list(state_dict):
            tensor = state_dict[name]
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = (tensor.device, tensor.untyped_storage().data_ptr())
            if storage in seen:
                del state_dict[name]
            seen.add(storage)


def checkpoint_dir(checkpoint_root: str | Path, step: int) -> Path:
    """Final folder of the checkpoint taken at `step`, e.g. `step_000123`."""
    return Path(checkpoint_root) / f"{CHECKPOINT_PREFIX}{step:06d}"


def staging_dir(checkpoint_root: str | Path, step: int) -> Path:
    """Folder to save into before `finalize_checkpoint`; never listed as a checkpoint."""
    return Path(checkpoint_root) / f"{STAGING_PREFIX}{CHECKPOINT_PREFIX}{step:06d}"


def finalize_checkpoint(tmp_dir: str | Path, final_dir: str | Path) -> Path:
    """Rename a finished save into its final place; an older folder of the same name is replaced.

    Call on the main process only, after every process has finished `save_state`.
    """
    tmp_dir, final_dir = Path(tmp_dir), Path(final_dir)
    if not any((tmp_dir / name).is_file() for name in WEIGHTS_NAMES):
        raise MissingWeights(f"{tmp_dir} has no {WEIGHTS_NAME}; refusing to finalize an incomplete save.")
    give_umask_modes(tmp_dir.rglob("*.safetensors"))  # safetensors writes 0600; the user's umask decides
    write_checksums(tmp_dir)
    return move_into_place(tmp_dir, final_dir)  # replacing an older save of this step


def checkpoint_step(path: str | Path) -> int | None:
    """Step number of a `step_<N>` folder, or None for any other name."""
    match = _CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def is_complete_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return checkpoint_step(path) is not None and any((path / name).is_file() for name in WEIGHTS_NAMES)


# trainer_state.json's fields and their types: required ones first, then those older checkpoints may lack
TRAINER_STATE_FIELDS = {"step": int, "epoch": int, "batches_done_in_epoch": int, "elapsed_seconds": (int, float)}
OPTIONAL_TRAINER_STATE_FIELDS = {
    "run_id": (str, type(None)),
    "schedule": dict,
    "model_config": dict,
    "continuation": dict,
    "training_data": dict,
    "stop": bool,
}


def trainer_state(path: str | Path) -> dict:
    """The training script's `trainer_state.json` of a checkpoint ({} if it has none); a CheckpointError naming
    the file and field when it is not the JSON we write (`trainer_state_problem`)."""
    state_file = Path(path) / TRAINER_STATE
    if not state_file.is_file():
        return {}
    if problem := trainer_state_problem(path):
        raise CheckpointError(problem)
    return json.loads(state_file.read_text())


def trainer_state_problem(path: str | Path) -> str | None:
    """Why a checkpoint's trainer_state.json cannot be used (not JSON, a field missing or of another type)."""
    state_file = Path(path) / TRAINER_STATE
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError) as error:
        return f"{state_file} cannot be read ({type(error).__name__}: {str(error)[:200]})"
    if not isinstance(state, dict):
        return f"{state_file} holds {type(state).__name__}, not a JSON object"
    for name, kind in {**TRAINER_STATE_FIELDS, **OPTIONAL_TRAINER_STATE_FIELDS}.items():
        if name not in state:
            if name in TRAINER_STATE_FIELDS:
                return f"{state_file}: field {name!r} is missing"
            continue
        value = state[name]
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            expected = " or ".join(_JSON_NAMES[k] for k in kinds)
            return f"{state_file}: field {name!r} holds {value!r}, not a {expected}"
        if name in TRAINER_STATE_FIELDS and not 0 <= value < math.inf:
            return f"{state_file}: field {name!r} holds {value!r}, not a finite number >= 0"
    return None


_JSON_NAMES = {
    bool: "true or false",
    int: "whole number",
    float: "number",
    str: "string",
    dict: "JSON object",
    type(None): "null",
}


def run_id_of(path: str | Path):
    """The run a checkpoint belongs to: its recorded id, None if saved before ids existed; a checkpoint whose
    trainer_state.json is unusable belongs to no run (never pruned or averaged as one of ours)."""
    try:
        state = json.loads((Path(path) / TRAINER_STATE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return NO_RUN
    run_id = state.get("run_id") if isinstance(state, dict) else NO_RUN
    return run_id if run_id is None or isinstance(run_id, str) else NO_RUN


def list_checkpoints(checkpoint_root: str | Path, run_id=ANY_RUN) -> list[Path]:
    """Complete checkpoints under `checkpoint_root` (of the run `run_id` only, if given), oldest first."""
    root = Path(checkpoint_root)
    if not root.is_dir():
        return []
    checkpoints = [path for path in root.iterdir() if is_complete_checkpoint(path)]
    if run_id is not ANY_RUN:
        checkpoints = [path for path in checkpoints if run_id_of(path) == run_id]
    return sorted(checkpoints, key=checkpoint_step)


def latest_checkpoint(checkpoint_root: str | Path, run_id=ANY_RUN) -> Path | None:
    """The newest complete checkpoint, a stop's included: where a run continues from."""
    checkpoints = list_checkpoints(checkpoint_root, run_id)
    return checkpoints[-1] if checkpoints else None


def is_stop_checkpoint(path: str | Path) -> bool:
    """Whether a checkpoint was saved because a signal stopped the run (`"stop": true` in its trainer_state.json),
    not at a --save_steps step or at the run's end: it is only there to resume from."""
    try:
        state = json.loads((Path(path) / TRAINER_STATE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and state.get("stop") is True


def regular_checkpoints(checkpoint_root: str | Path, run_id=ANY_RUN) -> list[Path]:
    """The checkpoints an uninterrupted run would have saved (stop checkpoints left out), oldest first: the ones
    that are pruned and averaged."""
    return [path for path in list_checkpoints(checkpoint_root, run_id) if not is_stop_checkpoint(path)]


def prune_checkpoints(checkpoint_root: str | Path, keep_last: int | None, run_id=ANY_RUN) -> list[Path]:
    """Delete all but the newest `keep_last` regular checkpoints (of the run `run_id` only, if given) and return
    the deleted folders.

    `keep_last` of None or <= 0 keeps everything. Incomplete folders and stop checkpoints are left alone (a stop
    checkpoint goes once a newer checkpoint supersedes it: `remove_superseded_stops`).
    """
    if keep_last is None or keep_last <= 0:
        return []
    to_delete = regular_checkpoints(checkpoint_root, run_id)[:-keep_last]
    for path in to_delete:
        shutil.rmtree(path)
    return to_delete


def remove_superseded_stops(checkpoint_root: str | Path, step: int, run_id=ANY_RUN) -> list[Path]:
    """Delete the stop checkpoints (of the run `run_id` only, if given) older than `step`, where the run has just
    saved a newer checkpoint to continue from; returns the deleted folders."""
    to_delete = [
        path
        for path in list_checkpoints(checkpoint_root, run_id)
        if checkpoint_step(path) < step and is_stop_checkpoint(path)
    ]
    for path in to_delete:
        shutil.rmtree(path)
    return to_delete


def find_weights_file(path: str | Path) -> Path:
    """The model weights of a checkpoint: `path` itself if it is a file, else its `model.safetensors` (or FSDP's
    full-state file)."""
    path = Path(path)
    if path.is_file():
        return path
    for name in WEIGHTS_NAMES:
        if (path / name).is_file():
            return path / name
    raise MissingWeights(f"No {WEIGHTS_NAME} in {path}")


def load_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint's model weights, from safetensors or (FSDP) a torch file read with `weights_only=True`."""
    weights_file = find_weights_file(path)
    if weights_file.suffix == ".safetensors":
        return load_file(weights_file)
    return torch.load(weights_file, map_location="cpu", weights_only=True, mmap=True)


def average_checkpoints(
    paths: Sequence[str | Path], convert: Callable[[dict], dict] | None = None
) -> dict[str, torch.Tensor]:
    """Average the model weights of several checkpoints (Vaswani et al. 2017, section 6.1).

    Each entry of `paths` is a checkpoint folder or a `.safetensors` file. Floating-point tensors
    are averaged in float64 and cast back to their dtype; other tensors must be identical in every
    checkpoint and are copied. `convert`, if given, is applied to each checkpoint's weights first (e.g. the model's
    current names for those of older code).
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint.")
    weights_files = [find_weights_file(path) for path in paths]
    convert = convert or (lambda weights: weights)

    first = convert(load_weights(weights_files[0]))
    dtypes = {key: tensor.dtype for key, tensor in first.items()}
    sums = {
        key: tensor.to(torch.float64, copy=True) if tensor.is_floating_point() else tensor
        for key, tensor in first.items()
    }
    del first

    for weights_file in weights_files[1:]:
        state = convert(load_weights(weights_file))
        missing, extra = sorted(sums.keys() - state.keys()), sorted(state.keys() - sums.keys())
        if missing or extra:
            raise ValueError(
                f"{weights_file} does not match {weights_files[0]}: missing keys {missing}, extra keys {extra}"
            )
        for key, tensor in state.items():
            total = sums[key]
            if tensor.shape != total.shape:
                raise ValueError(
                    f"Key {key!r} in {weights_file} has shape {tuple(tensor.shape)}, expected {tuple(total.shape)}"
                )
            if tensor.dtype != dtypes[key]:
                raise ValueError(f"Key {key!r} in {weights_file} has dtype {tensor.dtype}, expected {dtypes[key]}")
            if tensor.is_floating_point():
                total += tensor.to(torch.float64)
            elif not torch.equal(tensor, total):
                raise ValueError(f"Non-float tensor {key!r} in {weights_file} differs from {weights_files[0]}")

    count = len(weights_files)
    return {
        key: (total / count).to(dtypes[key]) if dtypes[key].is_floating_point else total for key, total in sums.items()
    }


# --- integrity ---------------------------------------------------------------------------------------------------


def _checkpoint_files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file() and path.name != CHECKSUMS_NAME)


def write_checksums(folder: str | Path) -> None:
    """Record the size and sha256 of every file of a checkpoint folder in `checksums.json`."""
    folder = Path(folder)
    (folder / CHECKSUMS_NAME).write_text(json.dumps(record_files(folder, excluded=[CHECKSUMS_NAME]), indent=1))


def checkpoint_problem(folder: str | Path, only: Sequence[str] | None = None) -> str | None:
    """Why the checkpoint folder cannot be trusted (naming the file), or None when it is intact.

    Against `checksums.json` when it has one: every recorded file must be there with its size and sha256. Folders
    saved before checksums were recorded are checked for structure: the weights must parse as safetensors and
    every pickle must load with `weights_only=True` (never executing code). `only`: check just these files.
    """
    folder = Path(folder)
    if not is_complete_checkpoint(folder):
        return f"{folder} is not a complete checkpoint (a step_* folder with {WEIGHTS_NAME})"
    checksums_file = folder / CHECKSUMS_NAME
    if not checksums_file.is_file():
        return _legacy_checkpoint_problem(folder, only)
    try:
        entries = json.loads(checksums_file.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        return f"{checksums_file} is damaged ({error})"
    return files_problem(folder, entries, only) or _trainer_state_problem_if_checked(folder, only)


def _trainer_state_problem_if_checked(folder: Path, only: Sequence[str] | None) -> str | None:
    if (folder / TRAINER_STATE).is_file() and (only is None or TRAINER_STATE in only):
        return trainer_state_problem(folder)
    return None


def _legacy_checkpoint_problem(folder: Path, only: Sequence[str] | None) -> str | None:
    from accelerate.utils import load  # torch.load with weights_only=True and only numpy's array types allowed

    for path in _checkpoint_files(folder):
        if only is not None and path.name not in only:
            continue
        try:
            if path.suffix == ".safetensors":
                with safe_open(path, "pt") as weights:
                    for key in weights.keys():
                        weights.get_slice(key)
            elif path.suffix in (".pkl", ".bin"):
                load(path, map_location="cpu")
            elif path.suffix == ".json":
                json.loads(path.read_text())
        except Exception as error:  # whatever a damaged or crafted file raises while being parsed
            return f"{path} cannot be read ({type(error).__name__}: {str(error)[:200]})"
    return _trainer_state_problem_if_checked(folder, only)


def weight_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a checkpoint's weights (from the safetensors header: no tensor is loaded)."""
    weights_file = find_weights_file(path)
    if weights_file.suffix != ".safetensors":
        return {key: tuple(tensor.shape) for key, tensor in load_weights(weights_file).items()}
    with safe_open(weights_file, "pt") as weights:
        return {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}


# --- a run's checkpoints, with Accelerate ------------------------------------------------------------------------
# Where each process writes: with one filesystem that every process sees, the main process writes checkpoints, logs
# and the model folder. Machines without a shared filesystem each get their own copy of every checkpoint (each
# machine's first process writes it: accelerate's save_on_each_node), so that every machine can resume and average;
# logs and the final model folder are written on the main process's machine only.

# config fields that are not what the model is (and those of earlier releases): a resumed run may change them
NOT_MODEL_IDENTITY = {"transformers_version", "use_cache", *OBSOLETE_CONFIG_FIELDS}


@dataclass
class RunState:
    """Where the run stands; saved in each checkpoint's trainer_state.json beside accelerate's state."""

    run_id: str | None  # the run that owns the checkpoints it prunes and averages (None: saved before ids existed)
    step: int = 0
    position: DataPosition = field(default_factory=DataPosition)
    elapsed_seconds: float = 0.0
    # the checkpoint of `step` is a stop checkpoint (resumed from one): the run's end saves a regular one in its place
    at_stop_checkpoint: bool = False


def writes_checkpoints(accelerator) -> bool:
    """Whether this process writes the checkpoints (and claims --output_dir) on its machine."""
    if accelerator.project_configuration.save_on_each_node:
        return accelerator.is_local_main_process
    return accelerator.is_main_process


def new_run_id() -> str:
    """A new id, the main process's on every process."""
    from accelerate.utils import broadcast_object_list

    run_id = [uuid.uuid4().hex]
    broadcast_object_list(run_id)
    return run_id[0]


def run_identity(config, tokenizer_fingerprint: str, training_data: dict | None = None) -> dict:
    """What a checkpoint must share with the run that resumes it: the model (its config without training settings),
    the tokenizer and the training data (its fingerprint: prepare.training_data_fingerprint, or streaming's)."""
    model_config = {k: v for k, v in config.to_diff_dict().items() if k not in NOT_MODEL_IDENTITY}
    identity = {"model_config": model_config, "tokenizer": tokenizer_fingerprint}
    return identity if training_data is None else {**identity, "training_data": training_data}


def continuation_settings(accelerator, batches_and_schedule: dict) -> dict:
    """What an exact continuation needs unchanged: the batches (tokens per batch, accumulation, seed, in
    `batches_and_schedule`; and the processes: the data position counts batches), the schedule (its scale and
    warm-up) and the loss (label smoothing)."""
    return {**batches_and_schedule, "num_processes": accelerator.num_processes}


def save_checkpoint(
    accelerator,
    settings: CheckpointSettings,
    state: RunState,
    schedule,
    identity: dict,
    continuation: dict,
    stop: bool = False,
) -> None:
    """accelerator.save_state into a staging folder, renamed into place once complete (with checksums); keeps the
    run's last K. The schedule and the data position go into JSON (nothing of ours is pickled).

    `stop`: saved because a signal stopped the run. Such a checkpoint changes nothing of what an uninterrupted run
    saves, prunes or averages: it is recorded as a stop (`"stop": true`), never pruned, counted or averaged, and
    removed once the run saves a newer checkpoint (a regular one of the same step replaces it)."""
    staging = staging_dir(settings.root, state.step)
    writes = writes_checkpoints(accelerator)
    what = f"the {'stop ' if stop else ''}checkpoint of step {state.step}"
    with on_full_disk(disk_full(settings, what, staging if writes else None)):
        accelerator.save_state(str(staging))
        if writes:
            trainer_state = {
                "run_id": state.run_id,
                "step": state.step,
                "epoch": state.position.epoch,
                "batches_done_in_epoch": state.position.batches_done_in_epoch,
                "elapsed_seconds": state.elapsed_seconds,
                "schedule": schedule.state_dict(),
                "continuation": continuation,
                "stop": stop,
                **identity,
            }
            (staging / TRAINER_STATE).write_text(json.dumps(trainer_state, indent=2))
    accelerator.wait_for_everyone()
    if writes:
        with on_full_disk(disk_full(settings, what, staging)):
            finalize_checkpoint(staging, checkpoint_dir(settings.root, state.step))  # writes checksums.json
        prune_checkpoints(settings.root, settings.keep_last, run_id=state.run_id)
        remove_superseded_stops(settings.root, state.step, run_id=state.run_id)
    state.at_stop_checkpoint = stop
    accelerator.wait_for_everyone()


def disk_full(settings: CheckpointSettings, what: str, incomplete: Path | None = None) -> Callable:
    """For `on_full_disk`: a write of `what` into the run's folder that ran out of space is one DiskFull. It names
    what was being written and where, deletes `incomplete` (the staging folder of a checkpoint being saved: ours, and
    never a checkpoint) so that it stops taking space, and says how to continue: --resume_from_checkpoint latest, from
    the last complete checkpoint."""

    def error(cause: BaseException) -> DiskFull:
        removed = ""
        if incomplete is not None and incomplete.name.startswith(STAGING_PREFIX) and _remove_staging(incomplete):
            removed = f"; the incomplete {incomplete} was removed"
        return DiskFull(
            f"no space left on device while writing {what} into {settings.output_dir}{removed}. "
            f"{how_to_continue(settings)} ({type(cause).__name__}: {str(cause)[:200]})"
        )

    return error


def _remove_staging(folder: Path) -> bool:
    """Delete a checkpoint's staging folder (never through a link); whether it is gone."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


def how_to_continue(settings: CheckpointSettings) -> str:
    """After a failed write: free space, then continue from the newest complete checkpoint, if there is one."""
    latest = latest_checkpoint(settings.root)
    if latest is None:
        return (
            f"There is no complete checkpoint in {settings.root} to continue from: free space on that disk, then "
            "start the run again with --overwrite."
        )
    return (
        f"Free space on that disk, then continue from the last complete checkpoint, {latest}, with "
        "--resume_from_checkpoint latest."
    )


def _problems_anywhere(path: Path) -> list[str]:
    """What is wrong with the checkpoint `path` on any process's machine (each checks its own copy)."""
    from accelerate.utils import gather_object

    return sorted({problem for problem in gather_object([checkpoint_problem(path)]) if problem})


def find_resume_checkpoint(accelerator, settings: CheckpointSettings) -> Path | None:
    """The checkpoint every process resumes from, agreed before any loads it: the given one, which must be intact
    on every machine; or with `latest`, the newest step that every machine holds intact (a newer one missing or
    damaged somewhere is named and skipped). None when no machine has a checkpoint at all."""
    from accelerate.utils import gather_object

    if settings.resume_from != "latest":
        path = Path(settings.resume_from)
        if problems := _problems_anywhere(path):
            raise CheckpointError(f"cannot resume from {path}: {'; '.join(problems)}")
        return path
    held = gather_object([[checkpoint_step(path) for path in list_checkpoints(settings.root)]])
    if not any(held):
        return None
    common = set(held[0]).intersection(*held[1:])
    for step in sorted(common, reverse=True):
        path = checkpoint_dir(settings.root, step)
        if not (problems := _problems_anywhere(path)):
            if {newer for steps in held for newer in steps if newer > step} - common:
                accelerator.print(f"[resume] newer checkpoints are not on every machine; resuming from {path.name}")
            return path
        accelerator.print(f"[resume] skipping {path.name}: {'; '.join(problems)}")
    holdings = "; ".join(f"process {rank}: steps {steps or 'none'}" for rank, steps in enumerate(held))
    raise CheckpointError(
        f"no intact checkpoint in {settings.root} that every process holds ({holdings}); on machines without a "
        "shared filesystem, copy the checkpoint folder to each machine's --output_dir"
    )


def check_checkpoint_matches(path: Path, identity: dict, model) -> None:
    """Refuse a checkpoint of another model or tokenizer, naming what differs, before anything is loaded (checkpoints
    saved before the model's config was recorded are compared by their weights' shapes)."""
    saved = trainer_state(path)
    if "model_config" in saved:
        there, here = upgrade_config(saved["model_config"]), upgrade_config(identity["model_config"])
        differing = [k for k in sorted(there.keys() | here.keys()) if there.get(k) != here.get(k)]
        differences = [f"{k}: {there.get(k)!r} there, {here.get(k)!r} here" for k in differing]
    else:  # the shapes under the model's current names (older code fused the attention's projections)
        there = {key: torch.empty(shape, device="meta") for key, shape in weight_shapes(path).items()}
        there = {key: tuple(tensor.shape) for key, tensor in split_fused_projections(there, model.config).items()}
        here = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        differing = [k for k in there if there[k] != here.get(k)][:3]
        differences = [f"{k}: shape {there[k]} there, {here.get(k)} here" for k in differing]
    if differences:
        raise CheckpointError(
            f"{path} is a checkpoint of another model ({'; '.join(differences)}): resume with the model flags it was "
            "trained with, or start a new run in another --output_dir"
        )
    if saved.get("tokenizer", identity["tokenizer"]) != identity["tokenizer"]:
        raise CheckpointError(
            f"{path} was trained with another tokenizer (other data, --vocab_size or --tokenizer_name_or_path): "
            "resume with the data flags it was trained with"
        )
    if changes := training_data_changes(saved.get("training_data"), identity.get("training_data")):
        raise CheckpointError(
            f"{path} was trained on other data ({'; '.join(changes)}): resuming would not continue its run. Resume "
            "with the data and data flags it was trained with, or start a new run in another --output_dir"
        )


def training_data_changes(there: dict | None, here: dict | None) -> list[str]:
    """How the training data differs from a checkpoint's (`run_identity`'s fingerprints), in words; [] when it is
    the same, or when either side has no fingerprint (saved before they were recorded)."""
    if there is None or here is None or there == here:
        return []
    flags = {"max_sentence_tokens": "--max_sentence_tokens", "max_length_ratio": "--max_length_ratio"}
    changes = [
        f"{flags.get(name, name)} {there.get(name)!r} there, {here.get(name)!r} here"
        for name in sorted(there.keys() | here.keys())
        if name != "sha256" and there.get(name) != here.get(name)
    ]
    return changes or [
        "the same number of training pairs and tokens, but other pairs or the same pairs in another order (shuffled "
        "or edited data)"
    ]


def warn_if_not_exact(accelerator, saved: dict, continuation: dict) -> None:
    """Resuming with other batches, another schedule or loss is allowed (a longer run at a new learning rate, more
    GPUs), but said: the data position then points at other batches, or the steps go otherwise, so the run is no
    longer the one it continues. (Other training data is refused: `check_checkpoint_matches`.)"""
    there = saved.get("continuation", {})
    if changed := [f"{k} {there[k]} -> {v}" for k, v in continuation.items() if k in there and there[k] != v]:
        accelerator.print(
            f"[resume] warning: {', '.join(changed)} since the checkpoint: training continues, but not exactly as "
            "the interrupted run would have (other batches, another learning-rate schedule or another loss)"
        )


def resume(accelerator, settings: CheckpointSettings, model, schedule, identity: dict, continuation: dict):
    """Restore model, optimizer, RNG states (accelerate), schedule and data position (ours, JSON) from the agreed
    checkpoint; returns the run's state there, or None when there is no checkpoint to resume."""
    path = find_resume_checkpoint(accelerator, settings)
    if path is None:
        accelerator.print(f"[resume] no checkpoint in {settings.root}; starting from scratch")
        return None
    check_checkpoint_matches(path, identity, accelerator.unwrap_model(model))
    hooks = []
    if has_fused_projections(weight_shapes(path)):  # fused projections: upgraded as it loads (upgrade.py)
        split = partial(split_fused_optimizer_state, accelerator.unwrap_model(model))
        optimizers = [getattr(optimizer, "optimizer", optimizer) for optimizer in accelerator._optimizers]
        hooks = [optimizer.register_load_state_dict_pre_hook(split) for optimizer in optimizers]
    try:
        with splitting_fused_weights(accelerator.unwrap_model(model)):
            accelerator.load_state(str(path))
    finally:
        for hook in hooks:
            hook.remove()
    saved = trainer_state(path)
    warn_if_not_exact(accelerator, saved, continuation)
    if "schedule" in saved:
        schedule.load_state_dict(saved["schedule"])
    else:  # saved before the schedule went into trainer_state.json: accelerate's pickle, read with weights_only
        from accelerate.utils import load as load_with_weights_only

        schedule.load_state_dict(load_with_weights_only(path / "custom_checkpoint_0.pkl"))
    accelerator.print(f"[resume] from {path} at step {saved['step']}")
    position = DataPosition(saved["epoch"], saved["batches_done_in_epoch"])
    stopped = saved.get("stop", False)
    return RunState(saved.get("run_id"), saved["step"], position, saved["elapsed_seconds"], stopped)


def load_averaged_weights(model, accelerator, settings: CheckpointSettings, run_id) -> int:
    """Section 6.1: average this run's last K regular checkpoints (no stop checkpoint) into the final model; returns
    how many were averaged."""
    paths = regular_checkpoints(settings.root, run_id)[-settings.average_last :]
    if not paths:
        raise CheckpointError(
            f"the run took no optimizer step, so {settings.root} holds no checkpoint of it to average into the final "
            "model: --max_minutes ran out before step 1. Give the run more --max_minutes."
        )
    for path in paths:
        if problem := checkpoint_problem(path, only=WEIGHTS_NAMES):
            raise CheckpointError(f"cannot average {path}: {problem}")
    averaged = average_checkpoints(paths, convert=partial(upgraded_weights, model.config))
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    tied = set(model.get_expanded_tied_weights_keys(all_submodels=True)) | {
        name for name, _ in model.named_buffers() if name.endswith("embed_positions.table")
    }
    if unexpected or not set(missing) <= tied:
        raise CheckpointError(
            f"the averaged checkpoints do not match the model: missing {missing}, unexpected {unexpected}"
        )
    accelerator.print(f"[average] the final model averages {len(paths)} checkpoint(s): {[p.name for p in paths]}")
    return len(paths)


def upgraded_weights(config, state_dict: dict) -> dict:
    """A checkpoint's weights in the current format (`average_checkpoints`' convert)."""
    return split_fused_projections(state_dict, config)
