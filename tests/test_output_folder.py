"""A user's work is never lost: the output folder (vanilla_transformer/training/output_folder.py) is claimed before anything is
written, an earlier run is replaced only on request and only with what it recorded, no link is written through, one
run per folder (mechanics/lock.py). End to end through the real script (tiny runs) where it matters."""

import errno
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from vanilla_transformer.mechanics import lock
from vanilla_transformer.mechanics.lock import LOCK_NAME
from vanilla_transformer.mechanics.names import CODE_FILES, TRAIN_LOG
from vanilla_transformer.training import checkpoint_folders, output_folder
from vanilla_transformer.training.output_folder import (
    RUN_RECORD,
    OutputDirError,
    claim_evaluation_dir,
    claim_output_dir,
    claim_run_folder,
    contents,
)
from vanilla_transformer.training.settings import OutputSettings

from .helpers import (
    CARD_VALUES,
    ROOT,
    digest,
    fake_checkpoint,
    logged_losses,
    save_tiny_model_folder,
    snapshot,
    train,
)

# --- output folders ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_new_run_into_a_finished_runs_folder_is_refused_and_changes_nothing(tmp_path):
    output_dir = tmp_path / "run"
    train(output_dir, "--max_steps", "4", "--save_steps", "2")
    before = snapshot(output_dir)

    again = train(output_dir, "--max_steps", "4", "--save_steps", "2", check=False)
    assert again.returncode != 0
    assert "already holds a finished run (4 steps" in again.stderr and "--overwrite" in again.stderr
    assert "Traceback" not in again.stderr
    assert snapshot(output_dir) == before


@pytest.mark.slow
def test_overwrite_replaces_the_earlier_run_and_keeps_other_files(tmp_path):
    output_dir = tmp_path / "run"
    train(output_dir, "--max_steps", "6", "--save_steps", "2")
    old_model = digest(output_dir / "model.safetensors")
    (output_dir / "notes.txt").write_text("the user's own file")

    result = train(output_dir, "--max_steps", "3", "--save_steps", "1", "--seed", "7", "--overwrite")
    assert "--overwrite: deleted checkpoints" in result.stdout
    assert sorted(path.name for path in (output_dir / "checkpoints").iterdir()) == [
        "step_000001",
        "step_000002",
        "step_000003",
    ]
    assert json.loads((output_dir / "results.json").read_text())["steps"] == 3
    assert sorted(logged_losses(output_dir)) == [1, 2, 3]  # the old run's log is gone, not appended to
    assert digest(output_dir / "model.safetensors") != old_model
    assert (output_dir / "notes.txt").read_text() == "the user's own file"


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


@pytest.mark.slow
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
    assert "empty --output_dir" in result.stderr and "--overwrite" in result.stderr
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


def test_evaluation_never_writes_over_earlier_hypotheses(tmp_path):
    claim_evaluation_dir(tmp_path, overwrite=False).release()
    (tmp_path / "test.hyp.txt").write_text("earlier\n")
    with pytest.raises(OutputDirError, match="already holds test.hyp.txt; choose another --output_dir"):
        claim_evaluation_dir(tmp_path, overwrite=False)
    claim_evaluation_dir(tmp_path, overwrite=True).release()


def test_an_evaluation_is_refused_in_a_folder_a_training_run_holds_and_gives_its_lock_back(tmp_path):
    training = claim_run_folder(OutputSettings(str(tmp_path / "run")))
    with pytest.raises(OutputDirError, match=f"is in use by another run \\(pid {os.getpid()} "):
        claim_evaluation_dir(tmp_path / "run", overwrite=True)
    training.close()
    evaluation = claim_evaluation_dir(tmp_path / "run", overwrite=True)
    with pytest.raises(OutputDirError, match="is in use by another training run"):
        claim_run_folder(OutputSettings(str(tmp_path / "run"), overwrite=True))
    evaluation.release()
    assert not (tmp_path / "run" / LOCK_NAME).exists()


def test_evaluation_never_writes_through_a_link(tmp_path):
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("mine")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "test.hyp.txt").symlink_to(outside)
    with pytest.raises(OutputDirError, match="test.hyp.txt is a symbolic link"):
        claim_evaluation_dir(tmp_path / "run", overwrite=True)
    assert outside.read_text() == "mine"


# --- what --overwrite deletes: only what a run of ours recorded -------------------------------------


@pytest.mark.slow
def test_overwrite_keeps_a_downloaded_model_that_no_run_wrote(tmp_path):
    downloaded = save_tiny_model_folder(tmp_path / "downloaded", CARD_VALUES)  # config, weights, tokenizer, card, .py
    before = snapshot(downloaded)
    result = train(downloaded, "--max_steps", "2", "--overwrite", check=False)
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


@pytest.mark.slow
def test_a_runs_record_lists_every_entry_it_wrote_and_its_lock_is_gone_at_the_end(finished_run):
    record = json.loads((finished_run / RUN_RECORD).read_text())
    assert sorted(record["entries"]) == contents(finished_run)
    assert record["run_ids"] == [checkpoint_folders.run_id_of(finished_run / "checkpoints" / "step_000004")]
    assert not (finished_run / LOCK_NAME).exists()


@pytest.mark.slow
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
    assert sorted(contents(run)) == sorted(
        ["notes.txt", *CODE_FILES, "custom_generate"]
    )  # .py files are never deleted
    assert "notes.txt (not written by a run of ours)" in printed and ".py files are never deleted" in printed


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_second_run_is_refused_while_a_live_process_holds_the_folders_lock(tmp_path, finished_run):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    holder = subprocess.Popen(["sleep", "300"])
    try:
        write_lock(run, **lock.holder_record(holder.pid))
        locked = snapshot(run)
        result = train(run, "--max_steps", "6", "--resume_from_checkpoint", "latest", check=False)
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"in use by another training run (pid {holder.pid} on host" in result.stderr
    assert snapshot(run) == locked and {**before, LOCK_NAME: locked[LOCK_NAME]} == locked


@pytest.mark.slow
def test_a_lock_left_by_a_process_that_ended_is_taken_over_with_a_note(tmp_path, capsys):
    holder = subprocess.Popen(["sleep", "300"])
    record = lock.holder_record(holder.pid)  # with its start time, as the run wrote it
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
    record = lock.holder_record(os.getpid())
    write_lock(tmp_path / "run", **{**record, "process_start": record["process_start"] - 1})  # a reused pid
    folder = claim_run_folder(OutputSettings(str(tmp_path / "run")))
    assert json.loads((tmp_path / "run" / LOCK_NAME).read_text())["token"] != record["token"]
    folder.close()


def test_a_lock_from_another_host_is_refused_naming_the_host_pid_and_lock_file(tmp_path):
    write_lock(tmp_path / "run", **{**lock.holder_record(12345), "host": "gpu-node-7"})
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


def cut_the_weights(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def finish(folder: Path) -> None:
    (folder / "results.json").write_text(json.dumps({"steps": 2}))  # written last, once the run has finished


@pytest.mark.parametrize(
    ("interrupt", "described"),
    [
        (
            cut_the_weights,
            "an interrupted run (its final save or evaluation did not finish: model.safetensors is cut ",
        ),
        (lambda folder: (folder / "README.md").unlink(), "an interrupted run (its final save or evaluation did not "),
        (lambda folder: None, "an interrupted run (its final save or evaluation did not finish: no results.json; "),
        (finish, "a finished run (2 steps, results.json)"),
    ],
    ids=["weights cut short", "no card yet", "no results yet", "finished"],
)
def test_a_run_killed_or_out_of_space_during_its_final_save_or_evaluation_is_told_from_a_finished_run(
    tmp_path, interrupt, described
):
    folder = save_tiny_model_folder(tmp_path / "run", CARD_VALUES)
    fake_checkpoint(folder / "checkpoints", 2, "the-run")
    interrupt(folder)
    with pytest.raises(OutputDirError) as refused:
        claim_output_dir(OutputSettings(str(folder)))
    assert f"already holds {described}" in str(refused.value)
    assert "Continue that run with --resume_from_checkpoint latest" in str(refused.value)


def test_a_run_folder_closed_on_a_full_disk_gives_its_lock_back_without_raising_over_the_runs_error(
    tmp_path, monkeypatch
):
    folder = claim_run_folder(OutputSettings(str(tmp_path / "run")))
    folder.record([TRAIN_LOG, "results.json"])  # results.json is never written: closing rewrites the record
    (tmp_path / "run" / TRAIN_LOG).write_text("")

    def full_disk(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output_folder, "replace_file", full_disk)
    folder.close()
    assert not (tmp_path / "run" / LOCK_NAME).exists()
    assert "results.json" in json.loads((tmp_path / "run" / RUN_RECORD).read_text())["entries"]  # dropped next time


def test_claiming_a_folder_on_a_full_disk_is_refused_saying_so_and_leaves_nothing(tmp_path, monkeypatch):
    def full_disk(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output_folder, "replace_file", full_disk)  # the record: the first file a claim writes
    with pytest.raises(OutputDirError, match=f"--output_dir {tmp_path / 'run'}: no space left on device"):
        claim_run_folder(OutputSettings(str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()  # made by the claim, its lock given back, then removed
