"""Checkpoints (training/checkpoint_folders.py, checkpointing.py): saved whole or not at all, found in step order,
pruned, averaged (section 6.1); in a run, resumed only into the same model, checked before anything is loaded, never
unpickled."""

import errno
import gzip
import json
import os
import pickle
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from vanilla_transformer.training import checkpoint_folders, checkpointing
from vanilla_transformer.training.checkpoint_folders import (
    WEIGHTS_NAME,
    average_checkpoints,
    checkpoint_dir,
    finalize_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    staging_dir,
)
from vanilla_transformer.training.settings import CheckpointSettings, OutputSettings

from .helpers import fake_checkpoint, logged_losses, snapshot, train, train_tiny_tokenizer


def write_checkpoint(root: Path, step: int, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Save like the training script: into a staging folder, then rename it into place."""
    staging = staging_dir(root, step)
    staging.mkdir(parents=True)
    save_file(tensors or {"weight": torch.full((2,), float(step))}, str(staging / WEIGHTS_NAME))
    (staging / "optimizer.bin").write_bytes(b"")
    return finalize_checkpoint(staging, checkpoint_dir(root, step))


def test_numeric_sorting(tmp_path: Path) -> None:
    for step in (10, 2, 100, 1):
        write_checkpoint(tmp_path, step)
    (tmp_path / "step_3").mkdir()  # no weights: interrupted save_state
    (tmp_path / "step_4.bak").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert [path.name for path in list_checkpoints(tmp_path)] == [
        "step_000001",
        "step_000002",
        "step_000010",
        "step_000100",
    ]
    # Numeric, not lexicographic, even without zero padding.
    for name in ("step_9", "step_1000000"):
        (tmp_path / name).mkdir()
        save_file({"weight": torch.zeros(2)}, str(tmp_path / name / WEIGHTS_NAME))
    assert [path.name for path in list_checkpoints(tmp_path)][-3:] == ["step_000010", "step_000100", "step_1000000"]


def test_incomplete_checkpoints_are_ignored(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    write_checkpoint(tmp_path, 5)
    staging_dir(tmp_path, 7).mkdir()  # save in progress
    save_file({"weight": torch.zeros(2)}, str(staging_dir(tmp_path, 7) / WEIGHTS_NAME))
    checkpoint_dir(tmp_path, 9).mkdir()  # weights never written
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 5)


def test_finalize_refuses_incomplete_and_replaces_existing(tmp_path: Path) -> None:
    staging_dir(tmp_path, 1).mkdir()
    with pytest.raises(FileNotFoundError, match="has no model.safetensors; refusing to finalize an incomplete save"):
        finalize_checkpoint(staging_dir(tmp_path, 1), checkpoint_dir(tmp_path, 1))
    save_file({"weight": torch.zeros(2)}, str(staging_dir(tmp_path, 1) / WEIGHTS_NAME))
    finalize_checkpoint(staging_dir(tmp_path, 1), checkpoint_dir(tmp_path, 1))

    final = write_checkpoint(tmp_path, 1, {"weight": torch.ones(2)})
    assert torch.equal(average_checkpoints([final])["weight"], torch.ones(2))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step_000001"]


def test_prune_keeps_newest(tmp_path: Path) -> None:
    for step in (1, 2, 10, 20):
        write_checkpoint(tmp_path, step)
    staging_dir(tmp_path, 30).mkdir()
    assert prune_checkpoints(tmp_path, None) == []
    assert prune_checkpoints(tmp_path, 0) == []
    assert len(list_checkpoints(tmp_path)) == 4

    deleted = prune_checkpoints(tmp_path, 2)
    assert [path.name for path in deleted] == ["step_000001", "step_000002"]
    assert list_checkpoints(tmp_path) == [checkpoint_dir(tmp_path, 10), checkpoint_dir(tmp_path, 20)]
    assert staging_dir(tmp_path, 30).is_dir()

    prune_checkpoints(tmp_path, 1)
    assert list_checkpoints(tmp_path) == [checkpoint_dir(tmp_path, 20)]


def test_average_of_three_is_the_mean(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    states = [
        {"linear.weight": torch.randn(3, 4, generator=generator), "steps": torch.tensor([7, 8])} for _ in range(3)
    ]
    paths = [write_checkpoint(tmp_path, step, state) for step, state in enumerate(states)]
    paths[2] = paths[2] / WEIGHTS_NAME  # files and folders both work

    averaged = average_checkpoints(paths)
    expected = torch.stack([state["linear.weight"] for state in states]).mean(dim=0)
    assert set(averaged) == {"linear.weight", "steps"}
    torch.testing.assert_close(averaged["linear.weight"], expected)
    assert averaged["linear.weight"].dtype == torch.float32
    assert torch.equal(averaged["steps"], torch.tensor([7, 8]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_average_keeps_low_precision_dtype(tmp_path: Path, dtype: torch.dtype) -> None:
    values = [torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])]
    paths = [write_checkpoint(tmp_path, step, {"weight": value.to(dtype)}) for step, value in enumerate(values)]
    averaged = average_checkpoints(paths)["weight"]
    assert averaged.dtype == dtype
    assert torch.equal(averaged, torch.tensor([1.5, 3.0], dtype=dtype))


def test_average_rejects_mismatches(tmp_path: Path) -> None:
    base = write_checkpoint(tmp_path, 1, {"a": torch.zeros(2), "b": torch.zeros(2)})
    other_keys = write_checkpoint(tmp_path, 2, {"a": torch.zeros(2), "c": torch.zeros(2)})
    other_shape = write_checkpoint(tmp_path, 3, {"a": torch.zeros(2), "b": torch.zeros(3)})
    other_ints = write_checkpoint(tmp_path, 4, {"i": torch.tensor([2])})

    with pytest.raises(ValueError, match=r"missing keys \['b'\], extra keys \['c'\]") as error:
        average_checkpoints([base, other_keys])
    assert "step_000002" in str(error.value)
    with pytest.raises(ValueError, match=r"'b'.*step_000003.*shape \(3,\)"):
        average_checkpoints([base, other_shape])
    with pytest.raises(ValueError, match=r"'i'.*differs"):
        average_checkpoints([write_checkpoint(tmp_path, 5, {"i": torch.tensor([1])}), other_ints])
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([])
    with pytest.raises(FileNotFoundError, match="No model.safetensors in .*step_000099"):
        average_checkpoints([tmp_path / "step_000099"])


# --- in a run: resuming only the same model, saying when the continuation is not exact, pruning only the run's
# own checkpoints, a damaged file named, no pickle executed (end to end through the script) -----------------------


@pytest.mark.slow
def test_resuming_with_another_model_or_tokenizer_is_refused_before_anything_is_touched(tmp_path):
    output_dir = tmp_path / "run"
    train(output_dir, "--max_steps", "4", "--save_steps", "2")
    before = snapshot(output_dir)
    for flags, named in (
        (["--d_model", "64"], "d_model: 32 there, 64 here"),
        (["--vocab_size", "320"], "vocab_size: 300 there, 320 here"),
    ):
        result = train(output_dir, "--max_steps", "6", "--resume_from_checkpoint", "latest", *flags, check=False)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"step_000004 is a checkpoint of another model ({named}" in result.stderr, result.stderr
    assert snapshot(output_dir) == before


@pytest.mark.slow
def test_resuming_on_other_training_data_is_refused_naming_what_changed_before_anything_is_touched(
    tmp_path, corpus_dir
):
    tokenizer = tmp_path / "tokenizer"
    train_tiny_tokenizer().save_pretrained(tokenizer)  # one tokenizer whatever the data: only the data differs
    data = ["--data_dir", str(corpus_dir), "--validation_split", "val", "--tokenizer_name_or_path", str(tokenizer)]
    run = tmp_path / "run"
    train(run, *data, "--max_steps", "2", "--save_steps", "2")
    before = snapshot(run)
    resume = [*data, "--max_steps", "4", "--resume_from_checkpoint", "latest"]
    refused = train(run, *resume, "--max_sentence_tokens", "29", check=False)
    changes = "--max_sentence_tokens 256 there, 29 here; pairs 60 there, 44 here"
    assert f"step_000002 was trained on other data ({changes}" in refused.stderr
    for name in ("train.en.gz", "train.de.gz"):  # the same pairs, in another order
        lines = gzip.decompress((corpus_dir / name).read_bytes()).decode().splitlines()
        (corpus_dir / name).write_bytes(gzip.compress(("\n".join(lines[::-1]) + "\n").encode()))
    shuffled = train(run, *resume, check=False)
    assert shuffled.returncode == 1 and "Traceback" not in shuffled.stderr, shuffled.stderr
    assert "the same number of training pairs and tokens, but other pairs or the same pairs in another order" in (
        shuffled.stderr
    )
    assert snapshot(run) == before


@pytest.mark.slow
def test_a_crafted_trainer_state_is_named_with_its_field_before_anything_is_loaded(tmp_path, finished_run):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    checkpoint = run / "checkpoints" / "step_000004"
    state = json.loads((checkpoint / checkpoint_folders.TRAINER_STATE).read_text())
    for field, value, says in (
        ("step", "../../evil", "field 'step' holds '../../evil', not a whole number"),
        ("elapsed_seconds", -1.0, "field 'elapsed_seconds' holds -1.0, not a finite number >= 0"),
        ("run_id", 7, "field 'run_id' holds 7, not a string or null"),
        ("epoch", None, "field 'epoch' holds None, not a whole number"),
    ):
        (checkpoint / checkpoint_folders.TRAINER_STATE).write_text(json.dumps({**state, field: value}))
        checkpoint_folders.write_checksums(checkpoint)  # crafted consistently: the checksums alone cannot tell
        assert says in checkpoint_folders.checkpoint_problem(checkpoint)
    result = train(
        run, "--max_steps", "6", "--save_steps", "2", "--resume_from_checkpoint", str(checkpoint), check=False
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "trainer_state.json: field 'epoch' holds None" in result.stderr


@pytest.mark.slow
def test_resuming_with_other_batches_or_schedule_says_the_continuation_is_not_exact_and_logs_each_step_once(
    tmp_path, finished_run
):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    checkpoint = run / "checkpoints" / "step_000002"
    exact = train(run, "--max_steps", "5", "--save_steps", "2", "--resume_from_checkpoint", str(checkpoint))
    assert "not exactly" not in exact.stdout
    assert sorted(logged_losses(run)) == [1, 2, 3, 4, 5]
    assert len((run / "train_log.jsonl").read_text().splitlines()) == 5  # steps 3-4 of the first run dropped
    changed = train(
        run,
        "--max_steps",
        "7",
        "--save_steps",
        "2",
        "--resume_from_checkpoint",
        "latest",
        "--max_tokens",
        "500",
        "--seed",
        "9",
        "--warmup_steps",
        "20",
        "--label_smoothing",
        "0.2",
    )
    changes = "max_tokens 600 -> 500, seed 42 -> 9, warmup_steps 10 -> 20, label_smoothing 0.1 -> 0.2"
    assert f"[resume] warning: {changes} since the checkpoint" in changed.stdout
    assert len((run / "train_log.jsonl").read_text().splitlines()) == 7


def test_pruning_and_listing_touch_only_the_runs_own_checkpoints(tmp_path):
    for step in (1, 2, 3):
        fake_checkpoint(tmp_path, step, "other")
    for step in (4, 5, 6):
        fake_checkpoint(tmp_path, step, "mine")
    assert [p.name for p in checkpoint_folders.list_checkpoints(tmp_path, "mine")] == [
        "step_000004",
        "step_000005",
        "step_000006",
    ]
    deleted = checkpoint_folders.prune_checkpoints(tmp_path, 1, run_id="mine")
    assert [p.name for p in deleted] == ["step_000004", "step_000005"]
    assert len(checkpoint_folders.list_checkpoints(tmp_path, "other")) == 3


@pytest.mark.slow
def test_a_damaged_file_is_named_and_latest_falls_back_to_the_newest_intact_checkpoint(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    common = ["--save_steps", "2", "--average_last", "1", "--preset", "tiny"]
    train(straight, "--max_steps", "6", *common)
    train(interrupted, "--max_steps", "4", *common)
    rng_file = interrupted / "checkpoints" / "step_000004" / "random_states_0.pkl"
    rng_file.write_bytes(rng_file.read_bytes()[:100])  # truncated, as by a full disk

    explicit = train(
        interrupted, "--max_steps", "6", *common, "--resume_from_checkpoint", str(rng_file.parent), check=False
    )
    assert explicit.returncode != 0 and "random_states_0.pkl has 100 bytes" in explicit.stderr, explicit.stderr

    resumed = train(interrupted, "--max_steps", "6", *common, "--resume_from_checkpoint", "latest")
    assert "skipping step_000004" in resumed.stdout and "random_states_0.pkl" in resumed.stdout
    assert "from " + str(interrupted / "checkpoints" / "step_000002") in resumed.stdout
    expected, losses = logged_losses(straight), logged_losses(interrupted)  # steps 3..6 were trained again
    for step in range(1, 7):
        assert losses[step] == pytest.approx(expected[step], rel=1e-5), step


@pytest.mark.slow
def test_checkpoints_hold_no_pickle_of_ours_and_a_crafted_pickle_is_never_executed(tmp_path):
    output_dir = tmp_path / "run"
    train(output_dir, "--max_steps", "2", "--save_steps", "2")
    checkpoint = output_dir / "checkpoints" / "step_000002"
    assert not list(checkpoint.glob("custom_checkpoint_*"))  # the schedule is in trainer_state.json
    assert checkpoint_folders.trainer_state(checkpoint)["schedule"]["last_epoch"] == 2
    assert checkpoint_folders.checkpoint_problem(checkpoint) is None

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    weights = bytearray((checkpoint / checkpoint_folders.WEIGHTS_NAME).read_bytes())
    weights[-1] ^= 1  # one flipped bit: same size
    (checkpoint / checkpoint_folders.WEIGHTS_NAME).write_bytes(weights)
    assert "model.safetensors does not match the sha256" in checkpoint_folders.checkpoint_problem(checkpoint)
    weights[-1] ^= 1
    (checkpoint / checkpoint_folders.WEIGHTS_NAME).write_bytes(weights)
    (checkpoint / "random_states_0.pkl").write_bytes(pickle.dumps(Exploit()))
    assert "random_states_0.pkl has" in checkpoint_folders.checkpoint_problem(checkpoint)
    (checkpoint / checkpoint_folders.CHECKSUMS_NAME).unlink()  # as a checkpoint saved before checksums existed
    assert "random_states_0.pkl cannot be read" in checkpoint_folders.checkpoint_problem(checkpoint)
    assert not (tmp_path / "pwned").exists()


# --- a full disk ------------------------------------------------------------------------------------------------


def saving_accelerator(write) -> SimpleNamespace:
    """A one-process accelerator whose save_state runs `write(folder)`: the writer that meets the full disk."""

    def save_state(folder: str) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "optimizer.bin").write_bytes(b"the first bytes of the optimizer's state")
        write(Path(folder))

    configuration = SimpleNamespace(save_on_each_node=False)
    return SimpleNamespace(
        save_state=save_state,
        project_configuration=configuration,
        is_main_process=True,
        is_local_main_process=True,
        wait_for_everyone=lambda: None,
    )


def save_step(accelerator, settings: CheckpointSettings, step: int) -> None:
    state = checkpointing.TrainerState("this-run", step)
    checkpointing.save_checkpoint(accelerator, settings, state, SimpleNamespace(state_dict=dict), {}, {})


FULL_DISK = {
    "errno": OSError(errno.ENOSPC, "No space left on device"),
    "torch": RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 14848 vs 14740"),
    "safetensors": Exception("Error while serializing: I/O error: No space left on device (os error 28)"),
}


@pytest.mark.parametrize("error", FULL_DISK.values(), ids=FULL_DISK.keys())
def test_a_full_disk_while_saving_a_checkpoint_is_one_error_that_removes_the_incomplete_folder_and_says_how_to_resume(
    tmp_path, error
):
    settings = CheckpointSettings(OutputSettings(str(tmp_path / "run")), save_steps=2)
    fake_checkpoint(settings.root, 2, "this-run")

    def fill_the_disk(folder: Path) -> None:
        raise error

    with pytest.raises(checkpoint_folders.CheckpointError) as refused:
        save_step(saving_accelerator(fill_the_disk), settings, 4)
    message = str(refused.value)
    assert message.startswith(f"no space left on device while writing the checkpoint of step 4 into {tmp_path}/run")
    assert f"the incomplete {staging_dir(settings.root, 4)} was removed" in message
    assert f"last complete checkpoint, {checkpoint_dir(settings.root, 2)}, with --resume_from_checkpoint latest" in (
        message
    )
    assert sorted(path.name for path in settings.root.iterdir()) == ["step_000002"]


def test_another_error_while_saving_a_checkpoint_goes_through_as_it_is(tmp_path):
    settings = CheckpointSettings(OutputSettings(str(tmp_path / "run")))

    def fail(folder: Path) -> None:
        raise RuntimeError("a bug in the writer")

    with pytest.raises(RuntimeError, match="a bug in the writer"):
        save_step(saving_accelerator(fail), settings, 4)


def test_a_run_that_took_no_optimizer_step_is_refused_naming_max_minutes_instead_of_averaging_nothing(tmp_path):
    settings = CheckpointSettings(OutputSettings(str(tmp_path / "run")))
    fake_checkpoint(settings.root, 2, "an-earlier-run")  # of another run: never averaged into this one
    with pytest.raises(checkpoint_folders.CheckpointError, match="the run took no optimizer step.*--max_minutes"):
        checkpointing.load_averaged_weights(torch.nn.Linear(2, 2), SimpleNamespace(print=print), settings, "this-run")


# --- stop checkpoints: saved at a signal, only to resume from -----------------------------------------------------


def weights_writer(folder: Path) -> None:
    save_file({"weight": torch.zeros(2)}, str(folder / WEIGHTS_NAME))


def test_a_stop_checkpoint_is_neither_pruned_nor_counted_and_goes_once_a_newer_checkpoint_is_saved(tmp_path):
    settings = CheckpointSettings(OutputSettings(str(tmp_path / "run")), save_steps=2, keep_last=2)
    accelerator = saving_accelerator(weights_writer)
    for step in (2, 4):
        save_step(accelerator, settings, step)
    state = checkpointing.TrainerState("this-run", 5)
    checkpointing.save_checkpoint(accelerator, settings, state, SimpleNamespace(state_dict=dict), {}, {}, stop=True)
    assert state.at_stop_checkpoint and checkpoint_folders.is_stop_checkpoint(checkpoint_dir(settings.root, 5))
    assert [path.name for path in checkpoint_folders.regular_checkpoints(settings.root)] == [
        "step_000002",
        "step_000004",
    ]
    assert latest_checkpoint(settings.root) == checkpoint_dir(settings.root, 5)  # where the run continues from
    save_step(accelerator, settings, 6)
    assert [path.name for path in list_checkpoints(settings.root)] == ["step_000004", "step_000006"]


def test_a_stop_checkpoint_is_never_averaged(tmp_path, monkeypatch):
    settings = CheckpointSettings(OutputSettings(str(tmp_path / "run")), average_last=5)
    fake_checkpoint(settings.root, 2, "this-run")
    fake_checkpoint(settings.root, 3, "this-run", stop=True)
    averaged = []
    monkeypatch.setattr(checkpointing, "average_checkpoints", lambda paths, convert: averaged.extend(paths) or {})
    model = torch.nn.Module()
    model.config, model.get_expanded_tied_weights_keys = None, lambda all_submodels: []
    assert checkpointing.load_averaged_weights(model, SimpleNamespace(print=print), settings, "this-run") == 1
    assert averaged == [checkpoint_dir(settings.root, 2)]


def test_a_stop_field_that_is_not_true_or_false_is_named(tmp_path):
    checkpoint = fake_checkpoint(tmp_path, 2, "this-run", stop=True)
    state = json.loads((checkpoint / checkpoint_folders.TRAINER_STATE).read_text())
    state.update(epoch=0, batches_done_in_epoch=0, elapsed_seconds=1.0)
    (checkpoint / checkpoint_folders.TRAINER_STATE).write_text(json.dumps(state))
    assert checkpoint_folders.trainer_state_problem(checkpoint) is None
    (checkpoint / checkpoint_folders.TRAINER_STATE).write_text(json.dumps({**state, "stop": 1}))
    assert checkpoint_folders.trainer_state_problem(checkpoint).endswith("field 'stop' holds 1, not a true or false")


def test_every_file_of_a_checkpoint_is_written_with_the_users_umask(tmp_path, umask):
    checkpoint = write_checkpoint(tmp_path, 2)
    modes = {path.name: path.stat().st_mode & 0o777 for path in checkpoint.iterdir()}
    assert WEIGHTS_NAME in modes and set(modes.values()) == {0o666 & ~umask}, modes
