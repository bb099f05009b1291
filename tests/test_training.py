"""The training loop's pieces (vanilla_transformer/training/: steps, schedule, log, signals) and train_accelerate.py end to end: multi-process runs,
gradient equivalence, exact resume, signals, the final evaluation after the model is saved, bad data."""

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers.modeling_utils
from accelerate.state import AcceleratorState
from huggingface_hub import constants as hub_constants
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import train_accelerate
import vanilla_transformer
from vanilla_transformer.data.batching import DataPosition, TokenBatchSampler, TranslationCollator
from vanilla_transformer.data.readers import DataError
from vanilla_transformer.training import checkpoint_folders, checkpointing, evaluation
from vanilla_transformer.training.evaluation import bare_model
from vanilla_transformer.training.log import TrainingLog
from vanilla_transformer.training.output_folder import final_model_problem
from vanilla_transformer.training.schedule import inverse_sqrt_learning_rate, make_optimizer_and_schedule
from vanilla_transformer.training.settings import CheckpointSettings, OutputSettings
from vanilla_transformer.training.signals import StopSignals
from vanilla_transformer.training.steps import optimizer_step_batches, prefetch

from .helpers import (
    OFFLINE,
    ROOT,
    SIGNALLED_RUN,
    TINY_RUN,
    fake_checkpoint,
    launcher,
    logged_losses,
    run_without_the_project,
    train,
    train_until_signalled,
)

# --- the recipe's pieces ---------------------------------------------------------------------------------------


def test_schedule_follows_equation_3():
    model = torch.nn.Linear(2, 2)
    optimizer, schedule = make_optimizer_and_schedule(model, d_model=512, warmup_steps=4000, scale=2.0)
    assert optimizer.defaults["betas"] == (0.9, 0.98) and optimizer.defaults["eps"] == 1e-9
    rates = []
    for step in range(1, 10001):
        rates.append(optimizer.param_groups[0]["lr"])  # the rate used by optimizer step number `step`
        expected = 2.0 * 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert rates[-1] == pytest.approx(expected, rel=1e-9)
        optimizer.step()
        schedule.step()
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == 4000  # peak at the end of warm-up
    assert inverse_sqrt_learning_rate(16000, 512, 4000) == pytest.approx(512**-0.5 * 16000**-0.5)


def test_step_stream_resumes_at_the_next_batch_and_ranks_run_equal_steps():
    lengths = [3, 5, 4, 9, 2, 7, 6, 8, 5, 3, 4, 6, 7]
    examples = [{"input_ids": list(range(n)), "labels": list(range(n))} for n in lengths]
    collator = TranslationCollator(pad_token_id=0)

    def steps(start, num_replicas=1, rank=0, epochs=2):
        sampler = TokenBatchSampler(lengths, lengths, max_tokens=12, seed=3, num_replicas=num_replicas, rank=rank)
        return list(optimizer_step_batches(sampler, collator, examples, 2, start, max_epochs=epochs))

    straight = steps(DataPosition())
    position_after_three = straight[2][1]
    resumed = steps(position_after_three)
    assert len(resumed) == len(straight) - 3
    for (batches_a, _), (batches_b, _) in zip(straight[3:], resumed, strict=True):
        assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches_a, batches_b, strict=True))
    assert len(steps(DataPosition(), 2, 0)) == len(steps(DataPosition(), 2, 1)) > 0


def test_prefetch_yields_the_same_items_passes_errors_and_stops_its_thread():
    assert list(prefetch(iter(range(50)), depth=3)) == list(range(50))
    assert list(prefetch(iter(range(5)), depth=0)) == list(range(5))

    def failing():
        yield 1
        raise DataError("bad line")

    with pytest.raises(DataError, match="bad line"):
        list(prefetch(failing(), depth=2))
    stream = prefetch(iter(range(10**9)), depth=2)
    assert next(stream) == 0
    stream.close()
    assert not [thread for thread in threading.enumerate() if thread.name == "prefetch"]


def test_bf16_training_ends_with_a_float32_model_for_evaluation(tiny_model, source_batch):
    """`--mixed_precision bf16` trains under autocast (Accelerate wraps forward); the final averaging, evaluation
    and saving must run the bare float32 model with the default attention, as users will."""
    from accelerate import Accelerator

    input_ids, attention_mask = source_batch
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": input_ids[:, :5]}
    with torch.no_grad():
        reference = tiny_model(**inputs).logits  # float32, sdpa
    try:
        accelerator = Accelerator(cpu=True, mixed_precision="bf16")
        tiny_model.set_attn_implementation("eager")
        training_model = accelerator.prepare(tiny_model)
        with torch.no_grad():
            assert not torch.allclose(training_model(**inputs).logits, reference, atol=1e-4)  # bf16 matmuls
            evaluation_model = bare_model(accelerator, training_model, "sdpa")
            assert evaluation_model.config._attn_implementation == "sdpa"
            torch.testing.assert_close(evaluation_model(**inputs).logits, reference, rtol=1e-5, atol=1e-5)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


# --- end to end ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_process_run_saves_a_folder_that_reloads_and_translates(tmp_path):
    output_dir = tmp_path / "run"
    arguments = [*"--max_steps 4 --save_steps 2 --average_last 2".split(), "--data_cache_dir", str(tmp_path / "cache")]
    run = train(output_dir, *arguments, processes=2)
    assert (run.stdout + run.stderr).count("[prepare] prepared") == 1  # one process prepares, the other waits
    assert len(list((tmp_path / "cache").iterdir())) == 1
    results = json.loads((output_dir / "results.json").read_text())
    assert results["processes"] == 2 and results["mixed_precision"] == "no"
    assert results["steps"] == 4 and results["checkpoints_averaged"] == 2
    assert {"validation", "test"} <= set(results["results"])
    assert "tok:13a" in results["results"]["test"]["signature"]
    hypotheses = (output_dir / "test.hyp.txt").read_text().split("\n")[:-1]
    assert len(hypotheses) == 40  # one per test sentence: no duplicates from the padded last batch
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md"):
        assert (output_dir / name).is_file(), name
    generation = json.loads((output_dir / "generation_config.json").read_text())
    assert generation["num_beams"] == 2  # the run's --num_beams, with which it was scored
    # a Hub user (the folder's own code, without this project) gets the translations of the trained model
    sources = ["the red dog sees a cat", "a bird"]
    translate = f"""
        import json
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        model = AutoModelForSeq2SeqLM.from_pretrained("{output_dir}", trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained("{output_dir}", trust_remote_code=True)
        batch = tokenizer({sources!r}, return_tensors="pt", padding=True)
        out = model.generate(**batch, max_new_tokens=8)
        print(json.dumps([out.tolist(), tokenizer.batch_decode(out, skip_special_tokens=True)]))
        """
    hub_tokens, hub_translations = json.loads(run_without_the_project(translate, cwd=tmp_path))
    vanilla_transformer.register()  # the installed code, for the Auto classes (the run was another process)
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    expected = model.generate(**tokenizer(sources, return_tensors="pt", padding=True), max_new_tokens=8)
    assert hub_tokens == expected.tolist() and len(hub_tokens) == 2
    assert hub_translations == tokenizer.batch_decode(expected, skip_special_tokens=True)

    # evaluation-only mode: the saved folder reproduces the hypotheses written at the end of training
    train(tmp_path / "evaluation", "--evaluate_only", "--model_name_or_path", str(output_dir))
    assert (tmp_path / "evaluation" / "test.hyp.txt").read_text() == (output_dir / "test.hyp.txt").read_text()

    # ... and with a file named, scores exactly that file (not the embedded task) and says so
    named = tmp_path / "named.tsv"
    named.write_text("the red dog sleeps\tter roder hunt slafet\na bird\taine fogel\n")
    run = train(
        tmp_path / "named", "--evaluate_only", "--model_name_or_path", str(output_dir), "--validation_file", str(named)
    )
    assert len((tmp_path / "named" / "validation.hyp.txt").read_text().splitlines()) == 2
    assert not (tmp_path / "named" / "test.hyp.txt").exists()
    assert "named.tsv: kept 2 pairs" in run.stdout


@pytest.mark.slow
def test_bf16_run_records_its_precision_and_scores_the_saved_float32_model(tmp_path):
    output_dir = tmp_path / "run"
    arguments = "--max_steps 60 --save_steps 30 --average_last 2 --mixed_precision bf16 --attn_implementation eager"
    train(output_dir, *arguments.split())
    assert json.loads((output_dir / "results.json").read_text())["mixed_precision"] == "bf16"
    assert "| training precision | bf16 autocast |" in (output_dir / "README.md").read_text()
    # the scores of a bf16 run are those of the saved model in float32: evaluation-only reproduces its hypotheses
    train(tmp_path / "evaluation", "--evaluate_only", "--model_name_or_path", str(output_dir))
    assert (tmp_path / "evaluation" / "test.hyp.txt").read_text() == (output_dir / "test.hyp.txt").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("precision, autocast", [("bf16", True), ("no", False)])
def test_the_loss_projects_onto_the_vocabulary_in_the_training_precision(tmp_path, monkeypatch, precision, autocast):
    """The output projection is the step's largest matrix product (a third of the base model's FLOPs): under
    --mixed_precision bf16 it runs under autocast as the forward does (Accelerate autocasts the forward only)."""
    from vanilla_transformer.training import loss

    forward, seen = loss.BlockwiseCrossEntropy.forward, []

    def recording(ctx, hidden_states, *args):
        seen.append(torch.is_autocast_enabled(hidden_states.device.type))
        return forward(ctx, hidden_states, *args)

    monkeypatch.setattr(loss.BlockwiseCrossEntropy, "forward", staticmethod(recording))
    train(tmp_path / "run", "--max_steps", "2", "--mixed_precision", precision, "--save_steps", "2")
    assert seen and set(seen) == {autocast}


@pytest.mark.slow
def test_one_step_on_two_processes_equals_one_step_on_one_process(tmp_path):
    """The same global batch, two batches accumulated on one process or one on each of two: same gradients."""
    script = ["-m", "tests.distributed_gradients"]
    environment = {**os.environ, **OFFLINE}
    subprocess.run(
        [sys.executable, *script, str(tmp_path / "one.safetensors"), "1"], check=True, cwd=ROOT, env=environment
    )
    command = [*launcher(2), *script, str(tmp_path / "two.safetensors"), "2"]
    subprocess.run(command, check=True, cwd=ROOT, env=environment)
    one, two = load_file(tmp_path / "one.safetensors"), load_file(tmp_path / "two.safetensors")
    assert one.keys() == two.keys() and len(one) > 10
    assert torch.allclose(one["loss"], two["loss"], rtol=1e-6)
    for name in one:
        assert torch.allclose(one[name], two[name], rtol=1e-4, atol=1e-7), name
    assert one["model.decoder.layers.0.feed_forward.fc1.weight"].abs().sum() > 0


@pytest.mark.slow
def test_resume_continues_exactly_and_a_prepared_folder_trains_like_the_cached_corpus(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    common = ["--save_steps", "3", "--average_last", "1", "--preset", "tiny"]
    train(straight, "--max_steps", "6", *common)
    prepared = tmp_path / "prepared"
    command = [
        sys.executable,
        "-m",
        "vanilla_transformer",
        "prepare",
        "--synthetic_pairs",
        "400",
        "--vocab_size",
        "300",
    ]
    subprocess.run([*command, "--output_dir", str(prepared)], check=True, cwd=ROOT, capture_output=True)
    common += ["--prepared_data", str(prepared)]
    train(interrupted, "--max_steps", "3", *common)
    train(interrupted, "--max_steps", "6", *common, "--resume_from_checkpoint", "latest")
    expected, resumed = logged_losses(straight), logged_losses(interrupted)
    assert sorted(resumed) == list(range(1, 7))
    for step in range(1, 7):
        assert resumed[step] == pytest.approx(expected[step], rel=1e-5), step


@pytest.mark.slow
def test_a_checkpoint_state_written_before_the_training_refactor_resumes_exactly(tmp_path):
    """tests/fixtures holds what our code wrote at step 2 of a 4-step run before the checkpoint format's redesign
    (trainer_state.json: step, data position, schedule, run id, model config, tokenizer fingerprint). The tensors
    beside it are accelerate's files (no weights are kept in the repository), trained here for 2 steps: resumed from
    the old state, steps 3 and 4 must repeat the losses of an uninterrupted 4-step run (same model, optimizer,
    schedule, data order, RNG). (The fixture's own losses were those of a model whose stacks' embeddings were the
    shared module; since they are tied parameters, a seed draws another model.)"""
    fixture = ROOT / "tests" / "fixtures" / "checkpoint_from_before_the_refactor"
    model = "--d_model 16 --ffn_dim 32 --vocab_size 260 --save_steps 2 --average_last 1".split()
    train(tmp_path / "first", *model, "--max_steps", "2")
    train(tmp_path / "straight", *model, "--max_steps", "4")
    before = logged_losses(tmp_path / "straight")
    assert logged_losses(tmp_path / "first") == pytest.approx({step: before[step] for step in (1, 2)}, rel=1e-5)
    old = tmp_path / "old" / "step_000002"
    shutil.copytree(tmp_path / "first" / "checkpoints" / "step_000002", old)
    shutil.copy(fixture / "trainer_state.json", old / "trainer_state.json")
    checkpoint_folders.write_checksums(old)
    result = train(tmp_path / "run", *model, "--max_steps", "4", "--resume_from_checkpoint", str(old))
    assert f"from {old} at step 2" in result.stdout
    resumed = logged_losses(tmp_path / "run")
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert resumed[step] == pytest.approx(before[step], rel=1e-5), step


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_before_exiting(tmp_path):
    output_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "train_accelerate.py"), "--output_dir", str(output_dir), *TINY_RUN]
    command += ["--max_steps", "100000", "--save_steps", "100000"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = output_dir / "train_log.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not log.is_file() or len(log.read_text().splitlines()) < 3):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output[-3000:]
    steps = sorted(logged_losses(output_dir))
    saved = sorted((output_dir / "checkpoints").glob("step_*"))
    assert [path.name for path in saved] == [f"step_{steps[-1]:06d}"]
    assert "resume_from_checkpoint" in output
    assert not (output_dir / "results.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "make_data, message",
    [
        (
            lambda d: ((d / "train.en").write_text("a\nb\n"), (d / "train.de").write_text("x\n")),
            "{d}/train.en has 2 lines but {d}/train.de has 1",
        ),
        (lambda d: (d / "train.en").write_text("a\n"), "No file train.de or train.de.gz in {d}"),
        (
            lambda d: ((d / "train.en").write_bytes(b"ok\n\xff\xfe\n"), (d / "train.de").write_text("x\ny\n")),
            "{d}/train.en:2: invalid UTF-8",
        ),
    ],
)
def test_bad_data_gets_a_clear_error_without_a_traceback(tmp_path, make_data, message):
    make_data(tmp_path)
    result = train(tmp_path / "out", "--data_dir", str(tmp_path), "--max_steps", "1", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"error: {message.format(d=tmp_path)}" in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_bad_data_stops_every_process_instead_of_leaving_them_waiting(tmp_path):
    """One process prepares while the other waits: its error must end both, not leave one at the barrier."""
    (tmp_path / "train.en").write_text("a\nb\n")
    (tmp_path / "train.de").write_text("x\n")
    arguments = ["--data_dir", str(tmp_path), "--max_steps", "1", "--data_cache_dir", str(tmp_path / "cache")]
    result = train(tmp_path / "out", *arguments, processes=2, timeout=120, check=False)
    assert result.returncode != 0
    assert "has 2 lines but" in result.stderr and "failed on another process" in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_a_greedy_run_saves_a_valid_generation_config_a_greedy_card_and_checkpoints_without_warnings(tmp_path):
    result = train(tmp_path / "run", "--max_steps", "2", "--save_steps", "1", "--num_beams", "1")
    folder = tmp_path / "run"
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["num_beams"] == 1 and "length_penalty" not in generation and "early_stopping" not in generation
    assert "Decoding: greedy search" in (folder / "README.md").read_text()
    assert "Removed shared tensor" not in result.stdout + result.stderr
    assert sorted(path.name for path in (folder / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


# --- the final evaluation: after the model is saved, stopped by a signal, over-long lines, missing splits -----


@pytest.mark.slow
def test_an_over_long_validation_line_does_not_stop_the_run(tmp_path):
    (tmp_path / "train.tsv").write_text("".join(f"a{i} b c\tx{i} y z\n" for i in range(200)))
    (tmp_path / "valid.tsv").write_text("a b c\tx y z\n" + " ".join(["a"] * 10_000) + "\t" + "x y\n")
    files = ["--train_file", str(tmp_path / "train.tsv"), "--validation_file", str(tmp_path / "valid.tsv")]
    result = train(tmp_path / "run", *files, "--max_steps", "2", "--max_eval_tokens", "16")
    assert "[validation] 1 of 2 pairs have a side longer than 16 tokens; truncated" in result.stdout
    assert len((tmp_path / "run" / "validation.hyp.txt").read_text().splitlines()) == 2


def test_the_card_and_results_json_are_written_once_each_after_the_final_evaluation(tmp_path, monkeypatch):
    """results.json says that a run finished: a run killed in its final evaluation has none yet (a sweep would read
    its row as finished, without scores), and the card is written once, with the scores."""
    folder, score_splits, seen, writes = tmp_path / "run", evaluation.score_splits, {}, []
    names = ("config.json", "model.safetensors", "README.md", "results.json")

    def look_then_score(*args, **kwargs):
        seen.update({name: (folder / name).exists() for name in names})
        return score_splits(*args, **kwargs)

    def counted_write_text(path, *args, write_text=Path.write_text, **kwargs):
        writes.extend([path.name] if path.parent == folder and path.name in names[2:] else [])
        return write_text(path, *args, **kwargs)

    monkeypatch.setattr(evaluation, "score_splits", look_then_score)
    monkeypatch.setattr(Path, "write_text", counted_write_text)
    train(folder, "--max_steps", "2")
    assert seen == {"config.json": True, "model.safetensors": True, "README.md": False, "results.json": False}
    assert sorted(writes) == ["README.md", "results.json"]
    signature = json.loads((folder / "results.json").read_text())["results"]["test"]["signature"]
    assert signature.startswith("nrefs:1") and signature in (folder / "README.md").read_text()


@pytest.mark.slow
def test_a_run_killed_in_its_final_evaluation_is_finished_by_resuming_it(tmp_path, finished_run):
    run = shutil.copytree(finished_run, tmp_path / "run")
    (run / "results.json").unlink()  # as a kill -9 in the final evaluation leaves it: the model folder, no records
    (run / "README.md").unlink()
    refused = train(run, "--max_steps", "4", "--save_steps", "2", check=False)
    assert "already holds an interrupted run (its final save or evaluation did not finish" in refused.stderr
    train(run, "--max_steps", "4", "--save_steps", "2", "--resume_from_checkpoint", "latest")
    assert json.loads((run / "results.json").read_text())["steps"] == 4 and (run / "README.md").is_file()
    assert (run / "model.safetensors").read_bytes() == (finished_run / "model.safetensors").read_bytes()


def test_the_model_folder_is_saved_before_a_crash_in_the_final_evaluation(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("evaluation crashed")

    monkeypatch.setattr(evaluation, "score_splits", crash)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(RuntimeError, match="evaluation crashed"):
            argv = ["--output_dir", str(tmp_path / "run"), *TINY_RUN, "--max_steps", "2"]
            train_accelerate.train(train_accelerate.parse_training_arguments(argv))
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


@pytest.mark.slow
def test_ctrl_c_during_the_final_evaluation_stops_the_program_after_the_model_is_saved(tmp_path):
    output_dir = tmp_path / "run"
    command = [sys.executable, "-u", str(ROOT / "train_accelerate.py"), "--output_dir", str(output_dir), *TINY_RUN]
    command += "--synthetic_pairs 60000 --max_steps 2 --num_beams 4".split()  # 1500 + 1500 pairs: seconds to score
    environment = {**os.environ, **OFFLINE}
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment
    )
    output = ""
    for line in process.stdout:  # the final evaluation starts once the folder is saved
        output += line
        if line.startswith("[save] model folder"):
            break
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode != 0, output + rest
    assert "interrupted during the final evaluation" in rest and "Traceback" not in rest, rest[-3000:]
    assert (output_dir / "model.safetensors").is_file() and not (output_dir / "test.hyp.txt").exists()


@pytest.mark.slow
def test_training_data_without_validation_or_test_split_trains_and_says_so(tmp_path):
    (tmp_path / "train.tsv").write_text("".join(f"a{i} b c\tx{i} y z\n" for i in range(200)))
    result = train(
        tmp_path / "run", "--train_file", str(tmp_path / "train.tsv"), "--max_steps", "2", "--eval_steps", "1"
    )
    assert "no validation split" in result.stdout and "no test split" in result.stdout
    assert (tmp_path / "run" / "model.safetensors").is_file()


# --- a step too large for the data, a log line cut by a kill, a full disk at the end ------------------------------


def test_gradient_accumulation_over_the_batches_of_an_epoch_is_refused_at_once_naming_the_flags():
    lengths = [3, 5, 4, 9, 2, 7]
    examples = [{"input_ids": list(range(n)), "labels": list(range(n))} for n in lengths]
    sampler = TokenBatchSampler(lengths, lengths, max_tokens=12, seed=3)
    expected = (
        f"--gradient_accumulation_steps 1000 needs at least 1000 batches per epoch, and the corpus gives {len(sampler)} "
        "per process at --max_tokens 12"
    )
    with pytest.raises(DataError, match=expected):  # when the stream is made, before any model step
        optimizer_step_batches(sampler, TranslationCollator(0), examples, 1000, DataPosition(), max_epochs=None)


@pytest.mark.parametrize(
    ("last_line", "steps"),
    [('{"step": 2, "loss": 1.', [1, 3]), ('{"step": 2, "loss": 1.5}', [1, 2, 3])],
    ids=["a cut record", "a whole record without its newline"],
)
def test_a_log_line_cut_by_a_kill_leaves_every_later_record_a_line_of_its_own(tmp_path, last_line, steps):
    log_file = tmp_path / "train_log.jsonl"
    log_file.write_text('{"step": 1, "loss": 2.0}\n' + last_line)  # killed while writing step 2's line
    accelerator = SimpleNamespace(
        is_main_process=True, reduce=lambda value, op: value, log=lambda *a, **k: None, print=print
    )
    progress = SimpleNamespace(set_postfix=lambda **kwargs: None)
    log = TrainingLog(
        accelerator,
        log_file,
        progress,
        start_step=2,
        run=CheckpointSettings(OutputSettings(str(tmp_path))),
    )
    log.add(torch.tensor(6.0), 3.0)
    log.write(3, 1e-3, 0)
    assert [json.loads(line)["step"] for line in log_file.read_text().splitlines()] == steps


class FullDisk(type(Path())):
    """A path on a full disk: opening it to append fails as a full disk's write does."""

    def open(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))


def test_a_full_disk_while_logging_is_one_error_naming_the_log_and_the_checkpoint_to_resume_from(tmp_path):
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoints", 2, "the-run")
    accelerator = SimpleNamespace(is_main_process=True, reduce=lambda value, op: value, log=lambda *a, **k: None)
    log_file = FullDisk(run / "train_log.jsonl")
    log = TrainingLog(
        accelerator,
        log_file,
        SimpleNamespace(set_postfix=dict),
        2,
        CheckpointSettings(OutputSettings(str(run))),
    )
    log.add(torch.tensor(6.0), 3.0)
    with pytest.raises(checkpoint_folders.CheckpointError) as refused:
        log.write(3, 1e-3, 0)
    message = str(refused.value)
    assert message.startswith(f"no space left on device while writing the training log train_log.jsonl into {run}.")
    assert f"checkpoint, {run / 'checkpoints' / 'step_000002'}, with --resume_from_checkpoint latest" in message


@pytest.mark.slow
def test_a_full_disk_during_the_final_save_is_one_error_and_resume_latest_then_saves_the_model(tmp_path, monkeypatch):
    folder = tmp_path / "run"

    def fill_the_disk(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"the first bytes of the weights")
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    with monkeypatch.context() as full_disk:
        full_disk.setattr(transformers.modeling_utils, "safe_save_file", fill_the_disk)
        result = train(folder, "--max_steps", "2", check=False)  # in this process: the monkeypatch reaches it
    assert result.returncode == 1
    stderr = result.stderr
    assert f"error: no space left on device while writing the final model folder into {folder}. " in stderr
    last_checkpoint = folder / "checkpoints" / "step_000002"
    assert f"continue from the last complete checkpoint, {last_checkpoint}, with --resume_from_checkpoint latest" in (
        stderr
    )
    assert "Traceback" not in stderr and final_model_problem(folder) is not None
    train(folder, "--max_steps", "2", "--resume_from_checkpoint", "latest")
    assert final_model_problem(folder) is None


# --- when the loop stops: one place, train_accelerate.stop_reason, before each step -------------------------------


def stop_reason_of(
    *flags: str, processes: int, step: int = 0, epoch: int = 0, signal: bool = False, minutes_spent: float = 0.0
):
    """train_accelerate.stop_reason for a run of `flags` standing at `step` of `epoch`, this process's view (with
    several processes, the others vote as this one)."""
    settings = train_accelerate.parse_training_arguments(["--data_dir", "corpus", *flags])
    state = checkpointing.TrainerState("run", step=step, position=DataPosition(epoch, 0))
    accelerator = SimpleNamespace(device="cpu", num_processes=processes, reduce=lambda tensor: tensor * processes)
    signals = SimpleNamespace(requested=signal)
    return train_accelerate.stop_reason(accelerator, settings, state, signals, time.time() - 60 * minutes_spent)


@pytest.mark.parametrize(
    "flags, where, reason",
    [
        (["--max_steps", "5"], {"step": 5}, "max_steps"),
        (["--max_steps", "5"], {"step": 4}, None),
        (["--max_epochs", "2"], {"step": 9, "epoch": 2}, "max_epochs"),
        (["--max_epochs", "2"], {"step": 9, "epoch": 1}, None),
        (["--max_minutes", "1"], {"minutes_spent": 1.5}, "max_minutes"),
        (["--max_minutes", "1"], {"minutes_spent": 0.5}, None),
        (["--max_steps", "5"], {"step": 1, "signal": True}, "signal"),
    ],
)
@pytest.mark.parametrize("processes", [1, 2])
def test_the_run_stops_before_the_step_that_would_pass_a_limit_or_at_a_signal(flags, where, reason, processes):
    assert stop_reason_of(*flags, processes=processes, **where) == reason


def test_one_process_decides_to_stop_without_a_collective_so_without_waiting_for_the_device():
    settings = train_accelerate.parse_training_arguments(["--data_dir", "corpus", "--max_minutes", "1"])
    state = checkpointing.TrainerState("run", step=3, position=DataPosition(0, 0))

    def collective(tensor):
        raise AssertionError("a collective, whose result the host must wait for")

    accelerator = SimpleNamespace(device="cpu", num_processes=1, reduce=collective)
    go_on = train_accelerate.stop_reason(accelerator, settings, state, SimpleNamespace(requested=False), time.time())
    assert go_on is None


@pytest.mark.slow
def test_max_epochs_trains_every_step_of_the_epochs_and_no_more(tmp_path):
    result = train(tmp_path / "run", "--max_epochs", "1", "--save_steps", "1000", "--average_last", "1")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    batches = int(result.stdout.split(" batches per process per epoch")[0].rsplit(", ", 1)[1])
    assert (results["stop_reason"], results["steps"]) == ("max_epochs", batches)


def test_a_failed_upload_at_the_end_names_the_complete_folder_and_the_command_to_upload_it_later(
    monkeypatch, tmp_path
):
    def refused(*args, **kwargs):
        raise train_accelerate.upload.HubUploadError("could not upload: the Hub refused it.")

    monkeypatch.setattr(train_accelerate.upload, "push_folder_to_hub", refused)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    flags = ["--output_dir", str(tmp_path / "run"), "--push_to_hub", "--hub_model_id", "someone/x"]
    message = train_accelerate.push(train_accelerate.parse_training_arguments(flags))
    assert message == (
        f"error: could not upload: the Hub refused it. The model folder {tmp_path / 'run'} is complete; upload it "
        f"later with vanilla-transformer push {tmp_path / 'run'} --hub_model_id someone/x"
    )


# --- a run stopped by a signal resumes to the uninterrupted run's model -------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "signals", [(signal.SIGTERM,), (signal.SIGINT, signal.SIGINT)], ids=["sigterm", "double-ctrl-c"]
)
def test_a_run_stopped_by_a_signal_and_resumed_saves_the_byte_identical_model_of_an_uninterrupted_run(
    tmp_path, uninterrupted_run, signals
):
    run = tmp_path / "run"
    stopped_at, _ = train_until_signalled(run, *SIGNALLED_RUN, signals=signals)
    assert 0 < stopped_at < 40, "the signal must stop the run before its end"
    train(run, *SIGNALLED_RUN, "--resume_from_checkpoint", "latest")
    names = lambda folder: sorted(path.name for path in (folder / "checkpoints").iterdir())  # noqa: E731
    assert names(run) == names(uninterrupted_run) == ["step_000040"]  # the stop's checkpoint is gone
    weights = "model.safetensors"
    assert (run / weights).read_bytes() == (uninterrupted_run / weights).read_bytes()


@pytest.mark.slow
def test_a_run_resumed_from_a_stop_checkpoint_and_ending_there_averages_it_as_a_regular_checkpoint(tmp_path):
    run = tmp_path / "run"
    stopped_at, _ = train_until_signalled(run, *SIGNALLED_RUN)
    ending_there = ("--max_steps", str(stopped_at), "--resume_from_checkpoint", "latest")
    result = train(run, *SIGNALLED_RUN[2:], *ending_there)
    assert f"averages 1 checkpoint(s): ['step_{stopped_at:06d}']" in result.stdout
    assert not checkpoint_folders.is_stop_checkpoint(run / "checkpoints" / f"step_{stopped_at:06d}")
