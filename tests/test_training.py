"""train_accelerate.py end to end: multi-process runs, gradient equivalence, exact resume, signals, bad data."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vanilla_transformer import checkpoints
from vanilla_transformer.batching import DataPosition, TokenBatchSampler, TranslationCollator
from vanilla_transformer.evaluation import final_model
from vanilla_transformer.training import (
    inverse_sqrt_learning_rate,
    make_optimizer_and_schedule,
    optimizer_step_batches,
)

from .conftest import ROOT, TINY_RUN, logged_losses, run_without_the_project, train

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


def test_bf16_training_ends_with_a_float32_model_for_evaluation(tiny_model, source_batch):
    """`--mixed_precision bf16` trains under autocast (Accelerate wraps forward); the final averaging, evaluation
    and saving must run the bare float32 model with the default attention, as users will."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

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
            evaluation_model = final_model(accelerator, training_model, "sdpa")
            assert evaluation_model.config._attn_implementation == "sdpa"
            torch.testing.assert_close(evaluation_model(**inputs).logits, reference, rtol=1e-5, atol=1e-5)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


# --- end to end ------------------------------------------------------------------------------------------------


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
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)  # the installed code
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


def test_bf16_run_records_its_precision_and_scores_the_saved_float32_model(tmp_path):
    output_dir = tmp_path / "run"
    arguments = "--max_steps 60 --save_steps 30 --average_last 2 --mixed_precision bf16 --attn_implementation eager"
    train(output_dir, *arguments.split())
    assert json.loads((output_dir / "results.json").read_text())["mixed_precision"] == "bf16"
    assert "| training precision | bf16 autocast |" in (output_dir / "README.md").read_text()
    # the scores of a bf16 run are those of the saved model in float32: evaluation-only reproduces its hypotheses
    train(tmp_path / "evaluation", "--evaluate_only", "--model_name_or_path", str(output_dir))
    assert (tmp_path / "evaluation" / "test.hyp.txt").read_text() == (output_dir / "test.hyp.txt").read_text()


def test_one_step_on_two_processes_equals_one_step_on_one_process(tmp_path):
    """The same global batch, two batches accumulated on one process or one on each of two: same gradients."""
    script = str(ROOT / "tests" / "distributed_gradients.py")
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, script, str(tmp_path / "one.safetensors"), "1"], check=True, cwd=ROOT, env=environment
    )
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += "--num_machines 1 --mixed_precision no --dynamo_backend no".split()
    launch += ["--main_process_port", str(29600 + os.getpid() % 1000)]
    subprocess.run([*launch, script, str(tmp_path / "two.safetensors"), "2"], check=True, cwd=ROOT, env=environment)
    one, two = load_file(tmp_path / "one.safetensors"), load_file(tmp_path / "two.safetensors")
    assert one.keys() == two.keys() and len(one) > 10
    assert torch.allclose(one["loss"], two["loss"], rtol=1e-6)
    for name in one:
        assert torch.allclose(one[name], two[name], rtol=1e-4, atol=1e-7), name
    assert one["model.decoder.layers.0.feed_forward.fc1.weight"].abs().sum() > 0


def test_resume_continues_exactly_and_a_prepared_folder_trains_like_the_cached_corpus(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    common = ["--save_steps", "3", "--average_last", "1", "--preset", "tiny"]
    train(straight, "--max_steps", "6", *common)
    prepared = tmp_path / "prepared"
    command = [sys.executable, "-m", "vanilla_transformer.prepare", "--synthetic_pairs", "400", "--vocab_size", "300"]
    subprocess.run([*command, "--output_dir", str(prepared)], check=True, cwd=ROOT, capture_output=True)
    common += ["--prepared_data", str(prepared)]
    train(interrupted, "--max_steps", "3", *common)
    train(interrupted, "--max_steps", "6", *common, "--resume_from_checkpoint", "latest")
    expected, resumed = logged_losses(straight), logged_losses(interrupted)
    assert sorted(resumed) == list(range(1, 7))
    for step in range(1, 7):
        assert resumed[step] == pytest.approx(expected[step], rel=1e-5), step


def test_a_checkpoint_state_written_before_the_training_refactor_resumes_exactly(tmp_path):
    """tests/fixtures holds what our code wrote at step 2 of a 4-step run before issue 25's redesign
    (trainer_state.json: step, data position, schedule, run id, model config, tokenizer fingerprint) and that run's
    losses. The tensors beside it are accelerate's files (no weights are kept in the repository): trained again here
    for 2 steps, they must equal the old run's, and resumed from the old state, steps 3 and 4 must repeat its losses
    (same model, optimizer, schedule, data order, RNG)."""
    fixture = ROOT / "tests" / "fixtures" / "checkpoint_from_before_the_refactor"
    model = "--d_model 16 --ffn_dim 32 --vocab_size 260 --save_steps 2 --average_last 1".split()
    train(tmp_path / "first", *model, "--max_steps", "2")
    before, first = logged_losses(fixture), logged_losses(tmp_path / "first")
    assert first == pytest.approx({step: before[step] for step in (1, 2)}, rel=1e-5)
    old = tmp_path / "old" / "step_000002"
    shutil.copytree(tmp_path / "first" / "checkpoints" / "step_000002", old)
    shutil.copy(fixture / "trainer_state.json", old / "trainer_state.json")
    checkpoints.write_checksums(old)
    result = train(tmp_path / "run", *model, "--max_steps", "4", "--resume_from_checkpoint", str(old))
    assert f"from {old} at step 2" in result.stdout
    resumed = logged_losses(tmp_path / "run")
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert resumed[step] == pytest.approx(before[step], rel=1e-5), step


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


@pytest.mark.parametrize(
    "make_data, message",
    [
        (lambda d: ((d / "train.en").write_text("a\nb\n"), (d / "train.de").write_text("x\n")), "line"),
        (lambda d: (d / "train.en").write_text("a\n"), "train.de"),
        (lambda d: ((d / "train.en").write_bytes(b"ok\n\xff\xfe\n"), (d / "train.de").write_text("x\ny\n")), "UTF-8"),
    ],
)
def test_bad_data_gets_a_clear_error_without_a_traceback(tmp_path, make_data, message):
    make_data(tmp_path)
    result = train(tmp_path / "out", "--data_dir", str(tmp_path), "--max_steps", "1", check=False)
    assert result.returncode != 0
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]


def test_bad_data_stops_every_process_instead_of_leaving_them_waiting(tmp_path):
    """One process prepares while the other waits: its error must end both, not leave one at the barrier."""
    (tmp_path / "train.en").write_text("a\nb\n")
    (tmp_path / "train.de").write_text("x\n")
    arguments = ["--data_dir", str(tmp_path), "--max_steps", "1", "--data_cache_dir", str(tmp_path / "cache")]
    result = train(tmp_path / "out", *arguments, processes=2, timeout=120, check=False)
    assert result.returncode != 0
    assert "has 2 lines but" in result.stderr and "failed on another process" in result.stderr, result.stderr[-3000:]


def test_a_greedy_run_saves_a_valid_generation_config_a_greedy_card_and_checkpoints_without_warnings(tmp_path):
    result = train(tmp_path / "run", "--max_steps", "2", "--save_steps", "1", "--num_beams", "1")
    folder = tmp_path / "run"
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["num_beams"] == 1 and "length_penalty" not in generation and "early_stopping" not in generation
    assert "Decoding: greedy search" in (folder / "README.md").read_text()
    assert "Removed shared tensor" not in result.stdout + result.stderr
    assert sorted(path.name for path in (folder / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
