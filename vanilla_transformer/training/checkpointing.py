"""A run's checkpointing: saving, resuming and averaging with Accelerate, on top of checkpoint_folders.py.

checkpoint_folders.py gives the folders' layout, listing, integrity, pruning and averaging.

In the order a run meets it (fairseq keeps these in `checkpoint_utils` the same way): `writes_checkpoints` (the
main process, or each machine's first one where no filesystem is shared by every process:
output_folder.output_dir_is_shared), `new_run_id` and `run_identity`, `save_checkpoint`, `resume`
(`find_resume_checkpoint`: the processes agree on one intact checkpoint before any loads it;
`check_checkpoint_matches`: it must be of this model and tokenizer), and `load_averaged_weights` (section 6.1). A full
disk (`disk_full`: errno ENOSPC, or torch's and safetensors' wrappings of it) stops the run with one DiskFull that
names the folder, deletes the checkpoint's staging folder and names the checkpoint to continue from with
--resume_from_checkpoint latest.
"""

import json
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from vanilla_transformer.data.batching import DataPosition
from vanilla_transformer.mechanics.files import on_full_disk
from vanilla_transformer.model.upgrade import (
    OBSOLETE_CONFIG_FIELDS,
    has_fused_projections,
    split_fused_optimizer_state,
    split_fused_projections,
    splitting_fused_weights,
    upgrade_config,
)
from vanilla_transformer.training.checkpoint_folders import (
    STAGING_PREFIX,
    TRAINER_STATE,
    WEIGHTS_NAMES,
    CheckpointError,
    DiskFull,
    average_checkpoints,
    checkpoint_dir,
    checkpoint_problem,
    checkpoint_step,
    finalize_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    regular_checkpoints,
    remove_superseded_stops,
    staging_dir,
    trainer_state,
    weight_shapes,
)
from vanilla_transformer.training.settings import CheckpointSettings

# --- a run's checkpoints, with Accelerate ------------------------------------------------------------------------
# Where each process writes: with one filesystem that every process sees, the main process writes checkpoints, logs
# and the model folder. Machines without a shared filesystem each get their own copy of every checkpoint (each
# machine's first process writes it: accelerate's save_on_each_node), so that every machine can resume and average;
# logs and the final model folder are written on the main process's machine only.

# config fields that are not what the model is (and those of earlier releases): a resumed run may change them
NOT_MODEL_IDENTITY = {"transformers_version", "use_cache", *OBSOLETE_CONFIG_FIELDS}


@dataclass
class TrainerState:
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
    the tokenizer and the training data (its fingerprint: prepare.training_data_fingerprint, or
    streaming.streamed_data_fingerprint)."""
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
    state: TrainerState,
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
    return TrainerState(saved.get("run_id"), saved["step"], position, saved["elapsed_seconds"], stopped)


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
