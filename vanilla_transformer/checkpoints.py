"""Checkpoint folders written by `accelerator.save_state`: listing, resuming, pruning and averaging.

Layout: `<checkpoint_root>/step_000123/` holds everything `save_state` wrote, including the model
weights in `model.safetensors` (accelerate's name for the first prepared model; a second one
would be `model_1.safetensors`).

A checkpoint only counts once it is complete. Saves go to a staging folder first and are renamed
into place when done, so an interrupted save never looks like a checkpoint:

    staging = staging_dir(checkpoint_root, step)
    accelerator.save_state(staging)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        finalize_checkpoint(staging, checkpoint_dir(checkpoint_root, step))
        prune_checkpoints(checkpoint_root, keep_last)
    accelerator.wait_for_everyone()

The weights are only ever read with safetensors (no pickle).
"""

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

WEIGHTS_NAME = "model.safetensors"
CHECKPOINT_PREFIX = "step_"
STAGING_PREFIX = ".incomplete_"
_CHECKPOINT_NAME = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


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
    if not (tmp_dir / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(f"{tmp_dir} has no {WEIGHTS_NAME}; refusing to finalize an incomplete save.")
    if final_dir.exists():
        replaced_dir = final_dir.with_name(f"{STAGING_PREFIX}replaced_{final_dir.name}")
        shutil.rmtree(replaced_dir, ignore_errors=True)
        os.replace(final_dir, replaced_dir)
        os.replace(tmp_dir, final_dir)
        shutil.rmtree(replaced_dir)
    else:
        os.replace(tmp_dir, final_dir)
    return final_dir


def checkpoint_step(path: str | Path) -> int | None:
    """Step number of a `step_<N>` folder, or None for any other name."""
    match = _CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def is_complete_checkpoint(path: str | Path) -> bool:
    path = Path(path)
    return checkpoint_step(path) is not None and path.is_dir() and (path / WEIGHTS_NAME).is_file()


def list_checkpoints(checkpoint_root: str | Path) -> list[Path]:
    """Complete checkpoints under `checkpoint_root`, oldest first (by step number)."""
    root = Path(checkpoint_root)
    if not root.is_dir():
        return []
    checkpoints = [path for path in root.iterdir() if is_complete_checkpoint(path)]
    return sorted(checkpoints, key=checkpoint_step)


def latest_checkpoint(checkpoint_root: str | Path) -> Path | None:
    checkpoints = list_checkpoints(checkpoint_root)
    return checkpoints[-1] if checkpoints else None


def prune_checkpoints(checkpoint_root: str | Path, keep_last: int | None) -> list[Path]:
    """Delete all but the newest `keep_last` complete checkpoints and return the deleted folders.

    `keep_last` of None or <= 0 keeps everything. Incomplete folders are left alone.
    """
    if keep_last is None or keep_last <= 0:
        return []
    to_delete = list_checkpoints(checkpoint_root)[:-keep_last]
    for path in to_delete:
        shutil.rmtree(path)
    return to_delete


def find_weights_file(path: str | Path) -> Path:
    """The model weights of a checkpoint: `path` itself if it is a file, else `path/model.safetensors`."""
    path = Path(path)
    if path.is_file():
        return path
    weights_file = path / WEIGHTS_NAME
    if not weights_file.is_file():
        raise FileNotFoundError(f"No {WEIGHTS_NAME} in {path}")
    return weights_file


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """Average the model weights of several checkpoints (Vaswani et al. 2017, section 6.1).

    Each entry of `paths` is a checkpoint folder or a `.safetensors` file. Floating-point tensors
    are averaged in float64 and cast back to their dtype; other tensors must be identical in every
    checkpoint and are copied.
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint.")
    weights_files = [find_weights_file(path) for path in paths]

    first = load_file(weights_files[0])
    dtypes = {key: tensor.dtype for key, tensor in first.items()}
    sums = {
        key: tensor.to(torch.float64, copy=True) if tensor.is_floating_point() else tensor
        for key, tensor in first.items()
    }
    del first

    for weights_file in weights_files[1:]:
        state = load_file(weights_file)
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
