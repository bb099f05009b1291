"""Past one machine: machines without a shared filesystem resume from the same step (rehearsed on loopback with the
shipped multi-node config), the collective timeout, DeepSpeed refused, FSDP's full-state checkpoints and synced
generation."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
import torch.distributed as dist
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from vanilla_transformer.training import checkpoint_folders, checkpointing
from vanilla_transformer.training.evaluation import bare_model, sharded_generation_kwargs
from vanilla_transformer.training.run_setup import UnsupportedSetup, check_distributed_setup, make_accelerator
from vanilla_transformer.training.settings import CheckpointSettings, OutputSettings

from .helpers import OFFLINE, ROOT, TINY_RUN, free_port, train

ENVIRONMENT = {**os.environ, **OFFLINE}


def launch_machine(tmp_path: Path, rank: int, port: int, *arguments: str) -> subprocess.Popen:
    """One "machine" on loopback: its own `accelerate launch`, output folder and cache (no shared filesystem),
    through configs/accelerate/multi_node_ddp.yaml with one CPU process per machine; output in machine{rank}.log."""
    config = ROOT / "configs" / "accelerate" / "multi_node_ddp.yaml"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    command += ["--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port)]
    command += ["--num_processes", "2", "--mixed_precision", "no", str(ROOT / "train_accelerate.py")]
    command += ["--output_dir", str(tmp_path / f"node{rank}"), *TINY_RUN, *arguments]
    environment = {**ENVIRONMENT, "HF_HOME": str(tmp_path / f"hf_home{rank}"), "PYTHONUNBUFFERED": "1"}
    with open(tmp_path / f"machine{rank}.log", "w") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=environment)


def two_machines(tmp_path: Path, port: int, *arguments: str, stop_machine_1_after_step: int | None = None):
    """Run both machines to the end (optionally sending SIGTERM to machine 1's training process once machine 0 has
    logged that step); returns their exit codes and outputs."""
    processes = [launch_machine(tmp_path, rank, port, *arguments) for rank in (0, 1)]
    if stop_machine_1_after_step is not None:
        log = tmp_path / "node0" / "train_log.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and (
            not log.is_file() or len(log.read_text().splitlines()) < stop_machine_1_after_step
        ):
            time.sleep(0.2)
        trainers = [
            child
            for child in psutil.Process(processes[1].pid).children(recursive=True)
            if "train_accelerate.py" in " ".join(child.cmdline())
        ]
        trainers[0].send_signal(signal.SIGTERM)  # a preempted machine: its trainer gets the signal
    codes = [process.wait(timeout=240) for process in processes]
    return codes, [(tmp_path / f"machine{rank}.log").read_text() for rank in (0, 1)]


@pytest.mark.slow
def test_two_machines_without_a_shared_filesystem_stop_together_and_resume_from_the_same_step(tmp_path):
    port = 29700 + os.getpid() % 200
    codes, outputs = two_machines(
        tmp_path, port, "--max_steps", "100000", "--save_steps", "100000", stop_machine_1_after_step=3
    )
    assert codes == [0, 0], outputs[1][-3000:]
    assert "not shared between the machines" in outputs[1]
    held = [sorted(path.name for path in (tmp_path / f"node{rank}" / "checkpoints").iterdir()) for rank in (0, 1)]
    assert len(held[0]) == 1 and held[0] == held[1], held  # both stopped at the same step, each saved it
    stopped = checkpoint_folders.checkpoint_step(held[0][0])
    for rank in (0, 1):  # every machine holds the checkpoint, with its own processes' RNG states
        checkpoint = tmp_path / f"node{rank}" / "checkpoints" / held[0][0]
        assert checkpoint_folders.checkpoint_problem(checkpoint) is None
        assert (checkpoint / f"random_states_{rank}.pkl").is_file()

    codes, outputs = two_machines(
        tmp_path, port + 1, "--max_steps", str(stopped + 2), "--save_steps", "1", "--resume_from_checkpoint", "latest"
    )
    assert codes == [0, 0], outputs[0][-3000:]
    for rank, output in enumerate(outputs):
        assert f"[resume] from {tmp_path / f'node{rank}' / 'checkpoints' / held[0][0]} at step {stopped}" in output

    newest = checkpoint_folders.checkpoint_dir(tmp_path / "node1" / "checkpoints", stopped + 2)
    shutil.rmtree(newest)  # lost on one machine only: both resume from the newest step they share
    codes, outputs = two_machines(
        tmp_path, port + 2, "--max_steps", str(stopped + 4), "--save_steps", "1", "--resume_from_checkpoint", "latest"
    )
    assert codes == [0, 0], outputs[0][-3000:]
    for output in outputs:
        assert f"step_{stopped + 1:06d} at step {stopped + 1}" in output
    assert "newer checkpoints are not on every machine" in outputs[0]
    assert json.loads((tmp_path / "node0" / "results.json").read_text())["steps"] == stopped + 4

    shutil.rmtree(tmp_path / "node1" / "checkpoints")  # a machine without any: refused everywhere, no hang
    codes, outputs = two_machines(
        tmp_path, port + 3, "--max_steps", str(stopped + 6), "--resume_from_checkpoint", "latest"
    )
    for code, output in zip(codes, outputs, strict=True):
        assert code != 0 and "that every process holds" in output, output[-3000:]


@pytest.mark.slow
def test_a_process_waiting_past_ddp_timeout_gets_a_clear_error(tmp_path):
    """The flag reaches the process group: with 1 s, the process waiting while the other prepares gives up (or, on
    a loaded machine, the first one waiting for the second to start: the test below)."""
    arguments = "--synthetic_pairs 60000 --ddp_timeout 1 --max_steps 1".split()
    result = train(tmp_path / "run", *arguments, processes=2, check=False)
    assert result.returncode != 0
    waited = re.search(
        r"waited longer than --ddp_timeout for (preparing the data|the other processes to start)", result.stderr
    )
    assert waited, result.stderr[-3000:]


@pytest.mark.slow
def test_a_process_whose_partner_never_starts_gets_a_clear_error_after_ddp_timeout(tmp_path):
    """Rank 0 of 2, launched alone: joining the process group waits --ddp_timeout, then says so, without a trace."""
    rendezvous = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    rendezvous |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    command = [sys.executable, str(ROOT / "train_accelerate.py"), "--output_dir", str(tmp_path / "run"), *TINY_RUN]
    command += ["--ddp_timeout", "2"]
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env={**ENVIRONMENT, **rendezvous}, timeout=120
    )
    assert result.returncode != 0
    assert "error: a process waited longer than --ddp_timeout for the other processes to start" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_deepspeed_is_refused_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(UnsupportedSetup, match="would step the optimizer after every micro-batch"):
        make_accelerator()
    with pytest.raises(UnsupportedSetup, match="DeepSpeed is not supported"):
        check_distributed_setup(SimpleNamespace(distributed_type=DistributedType.DEEPSPEED))

    command = [sys.executable, str(ROOT / "train_accelerate.py"), "--output_dir", str(tmp_path / "run"), *TINY_RUN]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**ENVIRONMENT, "ACCELERATE_USE_DEEPSPEED": "true"},
    )
    assert result.returncode != 0 and "DeepSpeed is not supported" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def fsdp_accelerator(state_dict_type: str) -> SimpleNamespace:
    plugin = FullyShardedDataParallelPlugin(state_dict_type=state_dict_type)
    return SimpleNamespace(
        distributed_type=DistributedType.FSDP,
        state=SimpleNamespace(fsdp_plugin=plugin),
        device=torch.device("cpu"),
        unwrap_model=lambda model, **kwargs: model,
    )


def test_fsdp_needs_full_state_checkpoints_and_decodes_in_step():
    with pytest.raises(UnsupportedSetup, match="SHARDED_STATE_DICT"):
        check_distributed_setup(fsdp_accelerator("SHARDED_STATE_DICT"))
    check_distributed_setup(fsdp_accelerator("FULL_STATE_DICT"))
    assert sharded_generation_kwargs(fsdp_accelerator("FULL_STATE_DICT")) == {"synced_gpus": True}
    assert sharded_generation_kwargs(SimpleNamespace(distributed_type=DistributedType.MULTI_GPU)) == {
        "synced_gpus": False
    }


def test_fsdp_full_state_checkpoints_are_averaged_into_a_plain_final_model(tmp_path, tiny_model):
    """Under FSDP the final model is a plain model of the same config whose weights come from the checkpoints
    (`pytorch_model_fsdp.bin`, tensors read with weights_only), as accelerate writes them with FULL_STATE_DICT."""
    root = tmp_path / "run" / "checkpoints"
    states = []
    for step in (1, 2):
        state = {name: tensor + step for name, tensor in tiny_model.state_dict().items()}
        staging = checkpoint_folders.staging_dir(root, step)
        staging.mkdir(parents=True)
        torch.save(state, staging / checkpoint_folders.FSDP_WEIGHTS_NAME)
        (staging / checkpoint_folders.TRAINER_STATE).write_text(json.dumps({"run_id": "run", "step": step}))
        checkpoint_folders.finalize_checkpoint(staging, checkpoint_folders.checkpoint_dir(root, step))
        states.append(state)
    accelerator = fsdp_accelerator("FULL_STATE_DICT")
    accelerator.print = print
    final = bare_model(accelerator, tiny_model, "sdpa")
    assert final is not tiny_model and final.config.to_dict() == tiny_model.config.to_dict()
    settings = CheckpointSettings(OutputSettings(str(tmp_path / "run")), average_last=2)
    assert checkpointing.load_averaged_weights(final, accelerator, settings, "run") == 2
    name = "model.encoder.layers.0.self_attn.out_proj.weight"
    torch.testing.assert_close(final.state_dict()[name], (states[0][name] + states[1][name]) / 2)


@torch.no_grad()
def test_synced_generation_decodes_the_same_tokens(tiny_model, source_batch):
    """`synced_gpus=True` (FSDP) keeps a process stepping until every process is done: on a process group of one,
    greedy and beam decoding give exactly the tokens of plain decoding."""
    input_ids, attention_mask = source_batch
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{29900 + os.getpid() % 90}", rank=0, world_size=1)
    try:
        for num_beams in (1, 4):
            kwargs = dict(attention_mask=attention_mask, max_new_tokens=12, num_beams=num_beams, do_sample=False)
            plain = tiny_model.generate(input_ids, **kwargs)
            synced = tiny_model.generate(input_ids, synced_gpus=True, **kwargs)
            assert torch.equal(plain, synced), num_beams
    finally:
        dist.destroy_process_group()
