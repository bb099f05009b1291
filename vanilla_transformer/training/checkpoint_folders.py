"""Checkpoint folders on disk: their layout, listing, integrity, pruning and averaging.

Layout: `<output_dir>/checkpoints/step_000123/` holds everything `save_state` wrote, including the model weights in
`model.safetensors` (accelerate's name for the first prepared model), plus our `trainer_state.json` (step, data
position, schedule, run id, model config, tokenizer fingerprint: JSON, nothing of ours is pickled) and
`checksums.json`. A checkpoint only counts once it is complete: saves go to a staging folder that is renamed into
place when done, so an interrupted save never looks like a checkpoint. The weights are only ever read with
safetensors, or FSDP's full-state file with `weights_only=True` (no code runs).

A run's side (saving, resuming, averaging with Accelerate) is in checkpointing.py.

Integrity: `checkpoint_problem` compares a folder against its `checksums.json`, so a truncated or damaged file is
named before anything is loaded. Ownership: listing, pruning and averaging take `run_id` and only ever touch that
run's checkpoints.
"""

import json
import math
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import give_umask_modes, move_into_place
from vanilla_transformer.mechanics.integrity import files_problem, record_files
from vanilla_transformer.mechanics.names import WEIGHTS_NAME

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
