"""A user's work is never lost: output folders, checkpoints (integrity, ownership, no unpickling), the model saved
before the final evaluation, and flags checked where they enter. End to end through the real script (tiny runs)."""

import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState
from huggingface_hub import constants as hub_constants
from safetensors.torch import save_file

import train_accelerate
from vanilla_transformer import checkpoints, folder_lock
from vanilla_transformer.batching import TranslationCollator
from vanilla_transformer.commands import prepare as prepare_command
from vanilla_transformer.commands.arguments import parse_training_arguments
from vanilla_transformer.evaluation import evaluation_loader
from vanilla_transformer.folder_lock import LOCK_NAME
from vanilla_transformer.names import CODE_FILES, TRAIN_LOG
from vanilla_transformer.output_folder import (
    RUN_RECORD,
    OutputDirError,
    OutputSettings,
    claim_evaluation_dir,
    claim_output_dir,
    claim_run_folder,
    contents,
)
from vanilla_transformer.training import StopSignals, config_for_tokenizer

from .conftest import CARD_VALUES, ROOT, TINY_RUN, logged_losses, save_tiny_model_folder, train


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its sha256."""
    return {str(path.relative_to(folder)): digest(path) for path in sorted(folder.rglob("*")) if path.is_file()}


# --- output folders ---------------------------------------------------------------------------------------------


def test_a_new_run_into_a_finished_runs_folder_is_refused_and_changes_nothing(tmp_path):
    output_dir = tmp_path / "run"
    train(output_dir, "--max_steps", "4", "--save_steps", "2")
    before = snapshot(output_dir)

    again = train(output_dir, "--max_steps", "4", "--save_steps", "2", check=False)
    assert again.returncode != 0
    assert "already holds a finished run (4 steps" in again.stderr and "--overwrite_output_dir" in again.stderr
    assert "Traceback" not in again.stderr
    assert snapshot(output_dir) == before


def test_overwrite_output_dir_replaces_the_earlier_run_and_keeps_other_files(tmp_path):
    output_dir = tmp_path / "run"
    train(output_dir, "--max_steps", "6", "--save_steps", "2")
    old_model = digest(output_dir / "model.safetensors")
    (output_dir / "notes.txt").write_text("the user's own file")

    result = train(output_dir, "--max_steps", "3", "--save_steps", "1", "--seed", "7", "--overwrite_output_dir")
    assert "--overwrite_output_dir: deleted checkpoints" in result.stdout
    assert sorted(path.name for path in (output_dir / "checkpoints").iterdir()) == [
        "step_000001",
        "step_000002",
        "step_000003",
    ]
    assert json.loads((output_dir / "results.json").read_text())["steps"] == 3
    assert sorted(logged_losses(output_dir)) == [1, 2, 3]  # the old run's log is gone, not appended to
    assert digest(output_dir / "model.safetensors") != old_model
    assert (output_dir / "notes.txt").read_text() == "the user's own file"


def test_resuming_with_another_model_or_tokenizer_is_refused_before_anything_is_touched(tmp_path):
    output_dir = tmp_path / "run"
    train(output_dir, "--max_steps", "4", "--save_steps", "2")
    before = snapshot(output_dir)
    for flags, named in ((["--d_model", "64"], "d_model: 32 there, 64 here"), (["--vocab_size", "320"], "vocab_size")):
        result = train(output_dir, "--max_steps", "6", "--resume_from_checkpoint", "latest", *flags, check=False)
        assert result.returncode != 0 and named in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert snapshot(output_dir) == before


def test_claiming_an_output_folder(tmp_path):
    def output(folder, overwrite=False, resume=None):
        return OutputSettings(str(folder), overwrite, resume)

    claim_output_dir(output(tmp_path / "new"))  # a missing folder is fine, and not created yet
    (tmp_path / "empty").mkdir()
    claim_output_dir(output(tmp_path / "empty"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputDirError, match="is a file"):
        claim_output_dir(output(tmp_path / "file"))

    finished = tmp_path / "finished"
    finished.mkdir()
    (finished / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(OutputDirError, match="no checkpoint left"):  # `latest` would start a new run over it
        claim_output_dir(output(finished, resume="latest"))
    with pytest.raises(OutputDirError, match="already holds 1 entries"):
        claim_output_dir(output(finished))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished tiny run (4 steps, checkpoints at 2 and 4); copy it before changing it."""
    output_dir = tmp_path_factory.mktemp("finished") / "run"
    train(output_dir, "--max_steps", "4", "--save_steps", "2")
    return output_dir


def test_resuming_another_runs_checkpoint_into_a_folder_holding_a_run_is_refused_and_changes_nothing(
    tmp_path, finished_run
):
    other, mine = tmp_path / "A", tmp_path / "B"
    shutil.copytree(finished_run, other)
    train(mine, "--max_steps", "4", "--save_steps", "2", "--seed", "3")
    before = snapshot(mine)
    result = train(
        mine, "--max_steps", "6", "--resume_from_checkpoint", str(other / "checkpoints" / "step_000002"), check=False
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "is from outside it" in result.stderr and "already holds a finished run (4 steps" in result.stderr
    assert "empty --output_dir" in result.stderr and "--overwrite_output_dir" in result.stderr
    assert snapshot(mine) == before


def test_which_checkpoints_may_resume_into_which_folder(tmp_path):
    def claim(folder, resume, overwrite=False):
        claim_output_dir(OutputSettings(str(folder), overwrite, resume))

    elsewhere = fake_checkpoint(tmp_path / "A" / "checkpoints", 2, "run-a")
    folder = tmp_path / "B"
    claim(folder, str(elsewhere))  # a new folder: the other run continues there
    (folder / "notes.txt").parent.mkdir()
    (folder / "notes.txt").write_text("the user's")
    claim(folder, str(elsewhere))  # nor do a user's own files make a run
    own = fake_checkpoint(folder / "checkpoints", 4, "run-b")
    claim(folder, str(own))  # the folder's own run, from any of its checkpoints
    claim(folder, str(folder / "checkpoints" / ".." / "checkpoints" / own.name))
    with pytest.raises(OutputDirError, match="is from outside it"):
        claim(folder, str(elsewhere))
    stray = fake_checkpoint(folder / "checkpoints", 2, "run-c")
    with pytest.raises(OutputDirError, match="of another run than step_000004"):
        claim(folder, str(stray))
    with pytest.raises(OutputDirError, match="would delete --resume_from_checkpoint"):
        claim(folder, str(own), overwrite=True)
    claim(folder, str(elsewhere), overwrite=True)  # the folder's run replaced, the other one continued
    assert not (folder / "checkpoints").exists() and (folder / "notes.txt").exists()


def test_a_crafted_trainer_state_is_named_with_its_field_before_anything_is_loaded(tmp_path, finished_run):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    checkpoint = run / "checkpoints" / "step_000004"
    state = json.loads((checkpoint / checkpoints.TRAINER_STATE).read_text())
    for field, value, says in (
        ("step", "../../evil", "field 'step' holds '../../evil', not a whole number"),
        ("elapsed_seconds", -1.0, "field 'elapsed_seconds' holds -1.0, not a finite number >= 0"),
        ("run_id", 7, "field 'run_id' holds 7, not a string or null"),
        ("epoch", None, "field 'epoch' holds None, not a whole number"),
    ):
        (checkpoint / checkpoints.TRAINER_STATE).write_text(json.dumps({**state, field: value}))
        checkpoints.write_checksums(checkpoint)  # crafted consistently: the checksums alone cannot tell
        assert says in checkpoints.checkpoint_problem(checkpoint)
    result = train(
        run, "--max_steps", "6", "--save_steps", "2", "--resume_from_checkpoint", str(checkpoint), check=False
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "trainer_state.json: field 'epoch' holds None" in result.stderr


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
    )
    assert "[resume] warning: max_tokens 600 -> 500, seed 42 -> 9 since the checkpoint" in changed.stdout
    assert len((run / "train_log.jsonl").read_text().splitlines()) == 7


def test_evaluation_never_writes_over_earlier_hypotheses(tmp_path):
    claim_evaluation_dir(tmp_path, overwrite=False)
    (tmp_path / "test.hyp.txt").write_text("earlier\n")
    with pytest.raises(OutputDirError, match="test.hyp.txt"):
        claim_evaluation_dir(tmp_path, overwrite=False)
    claim_evaluation_dir(tmp_path, overwrite=True)


def test_evaluation_never_writes_through_a_link(tmp_path):
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("mine")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "test.hyp.txt").symlink_to(outside)
    with pytest.raises(OutputDirError, match="test.hyp.txt is a symbolic link"):
        claim_evaluation_dir(tmp_path / "run", overwrite=True)
    assert outside.read_text() == "mine"


# --- what --overwrite_output_dir deletes: only what a run of ours recorded -------------------------------------


def test_overwrite_keeps_a_downloaded_model_that_no_run_wrote(tmp_path):
    downloaded = save_tiny_model_folder(tmp_path / "downloaded", CARD_VALUES)  # config, weights, tokenizer, card, .py
    before = snapshot(downloaded)
    result = train(downloaded, "--max_steps", "2", "--overwrite_output_dir", check=False)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "config.json" in result.stderr and "model.safetensors" in result.stderr
    assert f"no record of a run of this project ({RUN_RECORD})" in result.stderr
    assert snapshot(downloaded) == before and not (downloaded / LOCK_NAME).exists()


def test_overwrite_in_a_copy_of_the_project_deletes_none_of_its_files(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(ROOT / "vanilla_transformer", project / "vanilla_transformer")  # also the tracker logs' name
    for name in ("README.md", "pyproject.toml", *CODE_FILES):
        shutil.copy(ROOT / name, project / name)
    before = snapshot(project)
    with pytest.raises(OutputDirError) as refused:
        claim_run_folder(OutputSettings(str(project), overwrite=True))
    for name in ("README.md", "modeling_vanilla_transformer.py", "vanilla_transformer"):
        assert name in str(refused.value)
    assert "pyproject.toml" not in str(refused.value)  # a run never writes it: not in the way
    assert snapshot(project) == before and sorted(os.listdir(project)) == sorted(os.listdir(tmp_path / "project"))
    assert not (project / LOCK_NAME).exists() and not (project / RUN_RECORD).exists()


def test_a_runs_record_lists_every_entry_it_wrote_and_its_lock_is_gone_at_the_end(finished_run):
    record = json.loads((finished_run / RUN_RECORD).read_text())
    assert sorted(record["entries"]) == contents(finished_run)
    assert record["run_ids"] == [checkpoints.run_id_of(finished_run / "checkpoints" / "step_000004")]
    assert not (finished_run / LOCK_NAME).exists()


def test_overwrite_deletes_the_recorded_run_unlinks_links_and_keeps_everything_else(tmp_path, finished_run, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    precious = tmp_path / "precious.txt"
    precious.write_text("outside the folder")
    (run / TRAIN_LOG).unlink()
    (run / TRAIN_LOG).symlink_to(precious)  # a recorded entry, now a link out of the folder
    (run / "notes.txt").write_text("the user's")
    other_run = fake_checkpoint(run / "checkpoints", 9, "another-run")  # a checkpoint of a run the record lacks
    before = snapshot(run)
    with pytest.raises(OutputDirError, match="checkpoints/step_000009"):  # the new run could write over it
        claim_output_dir(OutputSettings(str(run), overwrite=True))
    assert snapshot(run) == before

    shutil.move(other_run, tmp_path / other_run.name)
    claim_output_dir(OutputSettings(str(run), overwrite=True))
    printed = capsys.readouterr().out
    assert precious.read_text() == "outside the folder" and not os.path.lexists(run / TRAIN_LOG)
    assert sorted(contents(run)) == sorted(["notes.txt", *CODE_FILES])  # .py files are never deleted
    assert "notes.txt (not written by a run of ours)" in printed and ".py files are never deleted" in printed


def test_a_link_where_the_run_writes_is_refused_not_written_through(tmp_path, finished_run):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    outside = tmp_path / "my_card.md"
    outside.write_text("mine")
    (run / "README.md").unlink()
    (run / "README.md").symlink_to(outside)
    with pytest.raises(OutputDirError, match="README.md is a symbolic link"):
        claim_output_dir(OutputSettings(str(run), resume_from="latest"))
    assert outside.read_text() == "mine"


# --- one run per folder: the lock ----------------------------------------------------------------------------------


def write_lock(folder: Path, **holder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_NAME).write_text(json.dumps(holder))


def test_a_second_run_is_refused_while_a_live_process_holds_the_folders_lock(tmp_path, finished_run):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    holder = subprocess.Popen(["sleep", "300"])
    try:
        write_lock(run, **folder_lock.holder_record(holder.pid))
        locked = snapshot(run)
        result = train(run, "--max_steps", "6", "--resume_from_checkpoint", "latest", check=False)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"in use by another training run (pid {holder.pid} on host" in result.stderr
    assert snapshot(run) == locked and {**before, LOCK_NAME: locked[LOCK_NAME]} == locked


def test_a_lock_left_by_a_process_that_ended_is_taken_over_with_a_note(tmp_path, capsys):
    holder = subprocess.Popen(["sleep", "300"])
    record = folder_lock.holder_record(holder.pid)  # with its start time, as the run wrote it
    holder.kill()
    holder.wait()
    write_lock(tmp_path / "run", **record)
    folder = claim_run_folder(OutputSettings(str(tmp_path / "run")))
    assert f"took over the lock of {tmp_path / 'run'} left by a training run that has ended (pid {holder.pid}" in (
        capsys.readouterr().out
    )
    assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["pid"] == os.getpid()
    folder.close()
    assert not (tmp_path / "run" / LOCK_NAME).exists()


def test_a_lock_whose_pid_now_runs_another_program_is_taken_over(tmp_path):
    record = folder_lock.holder_record(os.getpid())
    write_lock(tmp_path / "run", **{**record, "process_start": record["process_start"] - 1})  # a reused pid
    folder = claim_run_folder(OutputSettings(str(tmp_path / "run")))
    assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["token"] != record["token"]
    folder.close()


def test_a_lock_from_another_host_is_refused_naming_the_host_pid_and_lock_file(tmp_path):
    write_lock(tmp_path / "run", **{**folder_lock.holder_record(12345), "host": "gpu-node-7"})
    with pytest.raises(OutputDirError) as refused:
        claim_run_folder(OutputSettings(str(tmp_path / "run")))
    message = str(refused.value)
    assert "pid 12345 on host 'gpu-node-7'" in message and "cannot be checked from here" in message
    assert f"delete {tmp_path / 'run' / LOCK_NAME}" in message


def claim_at_the_same_moment(folder: Path, start: threading.Barrier, outcomes: list) -> None:
    start.wait()
    try:
        outcomes.append(claim_run_folder(OutputSettings(str(folder))))
    except OutputDirError as error:
        outcomes.append(error)


def test_of_two_runs_claiming_one_empty_folder_at_once_exactly_one_wins(tmp_path):
    for attempt in range(10):
        folder, start, outcomes = tmp_path / f"run{attempt}", threading.Barrier(2), []
        threads = [threading.Thread(target=claim_at_the_same_moment, args=(folder, start, outcomes)) for _ in "ab"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winners = [outcome for outcome in outcomes if not isinstance(outcome, OutputDirError)]
        losers = [str(outcome) for outcome in outcomes if isinstance(outcome, OutputDirError)]
        assert len(winners) == 1 and len(losers) == 1, outcomes
        assert f"pid {os.getpid()}" in losers[0] or "at the same moment" in losers[0], losers[0]
        winners[0].close()


# --- checkpoints ------------------------------------------------------------------------------------------------


def fake_checkpoint(root: Path, step: int, run_id: str | None) -> Path:
    staging = checkpoints.staging_dir(root, step)
    staging.mkdir(parents=True)
    save_file({"weight": torch.full((2,), float(step))}, str(staging / checkpoints.WEIGHTS_NAME))
    (staging / checkpoints.TRAINER_STATE).write_text(json.dumps({"run_id": run_id, "step": step}))
    return checkpoints.finalize_checkpoint(staging, checkpoints.checkpoint_dir(root, step))


def test_pruning_and_listing_touch_only_the_runs_own_checkpoints(tmp_path):
    for step in (1, 2, 3):
        fake_checkpoint(tmp_path, step, "other")
    for step in (4, 5, 6):
        fake_checkpoint(tmp_path, step, "mine")
    assert [p.name for p in checkpoints.list_checkpoints(tmp_path, "mine")] == [
        "step_000004",
        "step_000005",
        "step_000006",
    ]
    deleted = checkpoints.prune_checkpoints(tmp_path, 1, run_id="mine")
    assert [p.name for p in deleted] == ["step_000004", "step_000005"]
    assert len(checkpoints.list_checkpoints(tmp_path, "other")) == 3


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


def test_checkpoints_hold_no_pickle_of_ours_and_a_crafted_pickle_is_never_executed(tmp_path):
    output_dir = tmp_path / "run"
    train(output_dir, "--max_steps", "2", "--save_steps", "2")
    checkpoint = output_dir / "checkpoints" / "step_000002"
    assert not list(checkpoint.glob("custom_checkpoint_*"))  # the schedule is in trainer_state.json
    assert checkpoints.trainer_state(checkpoint)["schedule"]["last_epoch"] == 2
    assert checkpoints.checkpoint_problem(checkpoint) is None

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    weights = bytearray((checkpoint / checkpoints.WEIGHTS_NAME).read_bytes())
    weights[-1] ^= 1  # one flipped bit: same size
    (checkpoint / checkpoints.WEIGHTS_NAME).write_bytes(weights)
    assert "model.safetensors does not match the sha256" in checkpoints.checkpoint_problem(checkpoint)
    weights[-1] ^= 1
    (checkpoint / checkpoints.WEIGHTS_NAME).write_bytes(weights)
    (checkpoint / "random_states_0.pkl").write_bytes(pickle.dumps(Exploit()))
    assert "random_states_0.pkl has" in checkpoints.checkpoint_problem(checkpoint)
    (checkpoint / checkpoints.CHECKSUMS_NAME).unlink()  # as a checkpoint saved before checksums existed
    assert "random_states_0.pkl cannot be read" in checkpoints.checkpoint_problem(checkpoint)
    assert not (tmp_path / "pwned").exists()


# --- the final evaluation ---------------------------------------------------------------------------------------


def test_an_over_long_evaluation_line_is_truncated_and_counted():
    examples = [{"input_ids": [5, 6, 2], "labels": [7, 2]}, {"input_ids": list(range(3, 10_003)), "labels": [7, 2]}]
    loader, truncated = evaluation_loader(examples, TranslationCollator(pad_token_id=0), batch_size=2, max_tokens=8)
    batch = next(iter(loader))
    assert truncated == 1 and batch["input_ids"].shape == (2, 8)
    assert batch["input_ids"][1, -1].item() == 10_002  # the last token (</s>) is kept


def test_an_over_long_validation_line_does_not_stop_the_run(tmp_path):
    (tmp_path / "train.tsv").write_text("".join(f"a{i} b c\tx{i} y z\n" for i in range(200)))
    (tmp_path / "valid.tsv").write_text("a b c\tx y z\n" + " ".join(["a"] * 10_000) + "\t" + "x y\n")
    files = ["--train_file", str(tmp_path / "train.tsv"), "--validation_file", str(tmp_path / "valid.tsv")]
    result = train(tmp_path / "run", *files, "--max_steps", "2", "--max_eval_tokens", "16")
    assert "[validation] 1 of 2 pairs have a side longer than 16 tokens; truncated" in result.stdout
    assert len((tmp_path / "run" / "validation.hyp.txt").read_text().splitlines()) == 2


def test_the_model_folder_is_saved_before_a_crash_in_the_final_evaluation(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("evaluation crashed")

    monkeypatch.setattr(train_accelerate, "score_splits", crash)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(RuntimeError, match="evaluation crashed"):
            train_accelerate.train(["--output_dir", str(tmp_path / "run"), *TINY_RUN, "--max_steps", "2"])
    finally:  # main ran in this process: leave no accelerator state or signal handler behind
        AcceleratorState._reset_state(reset_partial_state=True)
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    folder = tmp_path / "run"
    assert (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()
    assert json.loads((folder / "results.json").read_text())["steps"] == 2


def test_signals_are_requests_while_training_and_stop_the_program_once_defaults_are_restored():
    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        stop_signals = StopSignals()
        signal.raise_signal(signal.SIGINT)  # while training, or while the model folder is written: a request
        assert stop_signals.requested and stop_signals.number == signal.SIGINT
        stop_signals.restore_defaults()
        with pytest.raises(KeyboardInterrupt):  # during the final evaluation: stops at once
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def test_ctrl_c_during_the_final_evaluation_stops_the_program_after_the_model_is_saved(tmp_path):
    output_dir = tmp_path / "run"
    command = [sys.executable, "-u", str(ROOT / "train_accelerate.py"), "--output_dir", str(output_dir), *TINY_RUN]
    command += "--synthetic_pairs 20000 --max_steps 2 --num_beams 4".split()
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment
    )
    output = ""
    for line in process.stdout:  # the final evaluation starts once the folder is saved
        output += line
        if line.startswith("[save] model folder"):
            break
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode != 0, output + rest
    assert "interrupted during the final evaluation" in rest and "Traceback" not in rest, rest[-3000:]
    assert (output_dir / "model.safetensors").is_file() and not (output_dir / "test.hyp.txt").exists()


# --- flags ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--warmup_steps", "-5"], "--warmup_steps: must be an integer >= 1, got -5"),
        (["--warmup_steps", "0"], "--warmup_steps"),
        (["--save_steps", "0"], "--save_steps"),
        (["--logging_steps", "0"], "--logging_steps"),
        (["--gradient_accumulation_steps", "0"], "--gradient_accumulation_steps"),
        (["--average_last", "0"], "--average_last"),
        (["--max_tokens", "many"], "--max_tokens: must be an integer >= 2, got 'many'"),
        (["--dropout", "1.5"], "--dropout: must be a number in [0, 1)"),
        (["--label_smoothing", "nan"], "--label_smoothing"),
        (["--learning_rate_scale", "0"], "--learning_rate_scale"),
        (["--max_minutes", "-1"], "--max_minutes"),
        (["--vocab_size", "100"], "--vocab_size: must be an integer >= 260"),
        (["--max_length_ratio", "0.5"], "--max_length_ratio"),
        (["--source_lang", "de", "--target_lang", "de"], "would learn to copy"),
        (["--d_model", "30", "--heads", "4"], "(30) must be divisible by `encoder_attention_heads` (4)"),
        (["--resume_from_checkpoint", "latest", "--overwrite_output_dir"], "--overwrite_output_dir deletes it"),
    ],
)
def test_bad_flags_are_refused_when_parsed_naming_the_flag(flags, named, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse_training_arguments(flags)
    assert stopped.value.code == 2
    assert named in capsys.readouterr().err


def test_push_to_hub_is_refused_before_training_when_the_hub_is_offline(monkeypatch, capsys):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit) as stopped:
        parse_training_arguments(["--push_to_hub", "--hub_model_id", "someone/x"])
    assert stopped.value.code == 2
    assert "--push_to_hub with HF_HUB_OFFLINE set" in capsys.readouterr().err
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    assert parse_training_arguments(["--push_to_hub", "--hub_model_id", "someone/x"]).push_to_hub


def test_model_flags_reach_the_config_over_the_preset():
    settings = parse_training_arguments(
        ["--preset", "small", "--dropout", "0.3", "--attention_dropout", "0.1", "--activation_dropout", "0.05"]
    )

    class Tokenizer:
        pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

        def __len__(self):
            return 300

    config = config_for_tokenizer(settings.preset, Tokenizer(), **settings.model_overrides)
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.3, 0.1, 0.05)
    assert config.d_model == 256 and config.vocab_size == 300


def test_the_prepare_command_checks_its_flags_too(capsys):
    for flags in (["--source_lang", "en", "--target_lang", "en"], ["--preprocessing_num_workers", "0"]):
        with pytest.raises(SystemExit):
            prepare_command.main([*flags, "--output_dir", "unused"])
        assert flags[-2] in capsys.readouterr().err or "copy" in capsys.readouterr().err


def test_training_data_without_validation_or_test_split_trains_and_says_so(tmp_path):
    (tmp_path / "train.tsv").write_text("".join(f"a{i} b c\tx{i} y z\n" for i in range(200)))
    result = train(
        tmp_path / "run", "--train_file", str(tmp_path / "train.tsv"), "--max_steps", "2", "--eval_steps", "1"
    )
    assert "no validation split" in result.stdout and "no test split" in result.stdout
    assert (tmp_path / "run" / "model.safetensors").is_file()
