"""The paper's Table 3 as a command: its rows at any scale, a two-row sweep end to end, resumed without re-running."""

import json
import os
import subprocess
import sys

import pytest

from vanilla_transformer.mechanics.outputs import OutputFolderError
from vanilla_transformer.training.sweep import SWEEP_RECORD, Sweep, claim_sweep_dir, table3_variants

from .helpers import OFFLINE, ROOT

SWEEP = ["--rows", "base,B1,E1", "--scale", "tiny", "--steps", "3", "--synthetic_pairs", "400", "--vocab_size", "300"]
SWEEP += ["--max_tokens", "600", "--warmup_steps", "10", "--save_steps", "3", "--eval_batch_size", "16"]
SWEEP += ["--num_beams", "2"]


def variants(output_dir, *arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "vanilla_transformer", "sweep", "--output_dir", str(output_dir), *arguments]
    environment = {**os.environ, **OFFLINE}
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=environment)


def test_the_base_scale_gives_the_papers_rows():
    rows = {row.varied: row for row in table3_variants("base")}
    base = rows[""]
    assert (base.layers, base.d_model, base.ffn_dim, base.heads, base.d_k, base.d_v) == (6, 512, 2048, 8, 64, 64)
    assert [rows[f"h={h}"].d_k for h in (1, 4, 16, 32)] == [512, 128, 32, 16]  # (A): constant compute
    assert [(rows[f"d_k={d_k}"].d_k, rows[f"d_k={d_k}"].d_v) for d_k in (16, 32)] == [(16, 64), (32, 64)]  # (B)
    assert [rows[f"N={n}"].layers for n in (2, 4, 8)] == [2, 4, 8]  # (C)
    assert (rows["d_model=256"].d_k, rows["d_model=1024"].d_k) == (32, 128)
    assert {rows["d_ff=1024"].ffn_dim, rows["d_ff=4096"].ffn_dim} == {1024, 4096}
    assert rows["P_drop=0.0"].dropout == 0.0 and rows["eps_ls=0.2"].label_smoothing == 0.2  # (D)
    assert rows["learned positions"].positions == "learned"  # (E)
    assert table3_variants("big")[0].dropout == 0.3  # big's base row keeps its P_drop


def test_a_folder_is_a_sweeps_once_claimed_and_one_holding_anything_else_is_refused(tmp_path):
    sweep = Sweep(output_dir=str(tmp_path / "table3"), steps=3)
    claim_sweep_dir(sweep)
    (tmp_path / "table3" / "runs").mkdir()
    assert claim_sweep_dir(sweep) == tmp_path / "table3"  # a previous sweep: continued
    (tmp_path / "table3" / "notes.txt").write_text("mine")
    with pytest.raises(OutputFolderError, match="it holds notes.txt, which `vanilla-transformer sweep` does not"):
        claim_sweep_dir(sweep)


def test_the_rows_data_folder_is_never_the_output_nor_holds_it(tmp_path):
    sweep = Sweep(
        output_dir=str(tmp_path / "data" / "table3"), steps=3, training_flags=(f"--data_dir={tmp_path}/data",)
    )
    (tmp_path / "data").mkdir()
    with pytest.raises(OutputFolderError, match=f"is inside --data_dir {tmp_path}/data"):
        claim_sweep_dir(sweep)
    assert not (tmp_path / "data" / "table3").exists()


@pytest.mark.slow
def test_a_three_row_sweep_writes_the_table_and_plots_and_resumes_without_rerunning(tmp_path):
    first = variants(tmp_path, *SWEEP)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    table = json.loads((tmp_path / "table.json").read_text())
    assert [row["name"] for row in table] == ["base", "B1", "E1"]
    assert all(row["steps"] == 3 and row["dev_bleu"] is not None and row["dev_perplexity"] > 1 for row in table)
    assert (table[1]["d_k"], table[1]["d_v"]) == (8, 32) and table[1]["parameters"] < table[0]["parameters"]
    assert json.loads((tmp_path / "runs" / "B1" / "config.json").read_text())["qk_head_dim"] == 8
    assert table[2]["positions"] == "learned" and table[2]["parameters"] > table[0]["parameters"]
    markdown = (tmp_path / "table.md").read_text().splitlines()
    assert (
        markdown[0].startswith("| name | N | d_model | d_ff | h | d_k | d_v | P_drop | eps_ls |")
        and len(markdown) == 5
    )
    assert all((tmp_path / f"table3_{group}.png").read_bytes()[:4] == b"\x89PNG" for group in "BE")

    results = tmp_path / "runs" / "base" / "results.json"
    written = results.stat().st_mtime_ns
    again = variants(tmp_path, *SWEEP)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("finished earlier") == 3 and "training, log" not in again.stdout
    assert results.stat().st_mtime_ns == written


@pytest.mark.slow
def test_flags_that_each_row_sets_are_refused(tmp_path):
    result = variants(tmp_path, "--steps", "3", "--d_model", "64")
    assert result.returncode == 2 and "--d_model: set by each row of the table" in result.stderr


@pytest.mark.slow
def test_a_row_trained_under_other_settings_is_refused_until_restarted_and_a_row_that_died_early_starts_again(
    tmp_path,
):
    one_row = ["--rows", "base", *SWEEP[2:]]
    dead_row = tmp_path / "runs" / "base"
    dead_row.mkdir(parents=True)
    (tmp_path / SWEEP_RECORD).write_text('{"written_by": "vanilla-transformer sweep"}')  # the sweep's, claimed first
    (dead_row / "train_log.jsonl").write_text('{"step": 1, "loss": 9.0}\n')  # killed before its first checkpoint
    first = variants(tmp_path, *one_row)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert "stopped before its first checkpoint; starting it again" in first.stdout

    other = [arg if arg != "400" else "500" for arg in one_row]  # other data (--synthetic_pairs 500)
    other[other.index("--steps") + 1] = "6"
    refused = variants(tmp_path, *other)
    assert refused.returncode != 0 and "finished earlier" not in refused.stdout
    assert "row base" in refused.stderr and "was trained with other settings" in refused.stderr
    assert "budget: {'steps': 3} there, {'steps': 6} now" in refused.stderr and "training_flags" in refused.stderr
    assert "--restart_rows base" in refused.stderr

    restarted = variants(tmp_path, *other, "--restart_rows", "base")
    assert restarted.returncode == 0, restarted.stdout[-2000:] + restarted.stderr[-3000:]
    assert json.loads((tmp_path / "table.json").read_text())[0]["steps"] == 6
