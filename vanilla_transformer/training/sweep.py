"""The paper's Table 3 as a command: train its variations of the base model under a fixed budget each, then write the
table (JSON, CSV, markdown) and one plot per row group.

    vanilla-transformer sweep --data_dir ../shared/data/multi30k --source_lang en --target_lang de \\
        --validation_split val --test_split test_2016_flickr --scale small --rows base,A,D,E --minutes 10 \\
        --output_dir outputs/table3
    vanilla-transformer sweep ... --scale base --steps 20000 \\
        --launcher "accelerate launch --multi_gpu --num_processes 8"      # on GPUs, through Accelerate

Each row is one run of `vanilla-transformer train` (its own folder under --output_dir/runs; every flag this command does
not know goes to it), so the rows train, average and score exactly as the recipe does; dev BLEU and perplexity are
the final model's on the validation split (beam 4, length penalty 0.6). Resumable: a finished row is read, not
re-run; an interrupted one continues from its last checkpoint (its budget counts the time already spent), and one
that stopped before its first checkpoint starts again. Each row records its settings (model, scale, budget, training
flags) in `runs/<row>/variant.json`: a row trained under other settings is refused, naming what differs, until
`--restart_rows ROW` deletes it or another --output_dir is given. The --output_dir is decided by the one rule
(vanilla_transformer/mechanics/outputs.py): a new or empty folder, or a previous sweep to continue, known by its
record (`SWEEP_RECORD`, written first) and holding nothing a sweep does not write; never a data folder or file given to
the rows, nor inside or holding one.

Rows, relative to the base row of --scale (the paper's, with --scale base):
- base: the preset as it is (P_drop 0.1; 0.3 for big), epsilon_ls 0.1, sinusoidal positions.
- (A) heads h/8, h/2, 2h, 4h at constant d_model (so d_k = d_v = d_model / heads shrinks as heads grow).
- (B) d_k / 4 and d_k / 2 (queries and keys) at the same heads and d_v.
- (C) N/3, 2N/3, 4N/3 layers; d_model / 2 and 2 d_model at the same heads; d_ff / 2 and 2 d_ff.
- (D) P_drop 0.0 and 0.2; epsilon_ls 0.0 and 0.2.
- (E) learned positions instead of sinusoids.
"""

import csv
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.names import CHECKPOINTS_DIR, RESULTS
from vanilla_transformer.mechanics.outputs import check_output_folder

GROUPS = ("base", "A", "B", "C", "D", "E")


class SweepError(VanillaTransformerError, RuntimeError):
    """A row that cannot run or failed; the message names it and its log."""


SETTINGS_FILE = "variant.json"  # in each row's run folder: what it was trained with (`row_settings`)
WRITTEN_BY = "vanilla-transformer sweep"
SWEEP_RECORD = ".vanilla_transformer_sweep.json"  # {"written_by": WRITTEN_BY}, written when a sweep claims its folder
SWEEP_NAMES = ("runs", "logs", "table.json", "table.csv", "table.md", "table3_*.png", SWEEP_RECORD)  # what it writes
INPUT_FLAGS = ("--data_dir", "--train_file", "--validation_file", "--test_file", "--prepared_data")  # the rows' data


@dataclass(frozen=True)
class Sweep:
    """What the command was asked: which rows, at which scale and budget, where, and the flags passed on to each
    row's training run."""

    output_dir: str
    scale: str = "small"
    minutes: float | None = None  # a row's budget: minutes, or else steps
    steps: int | None = None
    launcher: str | None = None  # the prefix of each training command, e.g. "accelerate launch ..."
    rows: tuple[str, ...] = GROUPS  # groups or single rows
    restart_rows: tuple[str, ...] = ()
    training_flags: tuple[str, ...] = ()

    @property
    def budget(self) -> dict:
        return {"minutes": self.minutes} if self.minutes else {"steps": self.steps}


@dataclass(frozen=True)
class Variant:
    """One row of the table: the model and regularisation it trains with."""

    name: str  # base, A1, A2, ..., E1
    group: str
    varied: str  # what differs from the base row, e.g. "h=16", or "" for the base row
    layers: int
    d_model: int
    ffn_dim: int
    heads: int
    qk_head_dim: int | None = None  # d_k when it is not d_model / heads (row B)
    dropout: float = 0.1
    label_smoothing: float = 0.1
    positions: str = "sinusoidal"

    @property
    def d_v(self) -> int:
        return self.d_model // self.heads

    @property
    def d_k(self) -> int:
        return self.qk_head_dim or self.d_v


def table3_variants(scale: str) -> list[Variant]:
    """Every row of the table for the base row of `scale` (a preset name)."""
    from configuration_vanilla_transformer import PRESETS

    preset = PRESETS[scale]
    base = Variant(
        "base",
        "base",
        "",
        preset["encoder_layers"],
        preset["d_model"],
        preset["encoder_ffn_dim"],
        preset["encoder_attention_heads"],
        dropout=preset["dropout"],
    )
    rows = [base]

    def add(group: str, varied: str, **changes) -> None:
        index = sum(row.group == group for row in rows) + 1
        rows.append(replace(base, name=f"{group}{index}", group=group, varied=varied, **changes))

    for heads in sorted({max(1, base.heads // 8), max(1, base.heads // 2), 2 * base.heads, 4 * base.heads}):
        if heads != base.heads and base.d_model % heads == 0:
            add("A", f"h={heads}", heads=heads)
    for d_k in (base.d_k // 4, base.d_k // 2):
        add("B", f"d_k={d_k}", qk_head_dim=d_k)
    for layers in sorted({max(1, round(base.layers * k / 3)) for k in (1, 2, 4)} - {base.layers}):
        add("C", f"N={layers}", layers=layers)
    for d_model in (base.d_model // 2, base.d_model * 2):
        add("C", f"d_model={d_model}", d_model=d_model)
    for ffn_dim in (base.ffn_dim // 2, base.ffn_dim * 2):
        add("C", f"d_ff={ffn_dim}", ffn_dim=ffn_dim)
    for dropout in sorted({0.0, 0.2} - {base.dropout}):
        add("D", f"P_drop={dropout}", dropout=dropout)
    for label_smoothing in (0.0, 0.2):
        add("D", f"eps_ls={label_smoothing}", label_smoothing=label_smoothing)
    add("E", "learned positions", positions="learned")
    return rows


# --- running a row --------------------------------------------------------------------------------------------


def training_command(variant: Variant, sweep: Sweep, run_dir: Path) -> list[str]:
    launcher = shlex.split(sweep.launcher) if sweep.launcher else [sys.executable]
    command = [
        *launcher,
        "-m",  # the package's command, for python and for `accelerate launch` alike
        "vanilla_transformer",
        "train",
        *sweep.training_flags,
        "--output_dir",
        str(run_dir),
        "--preset",
        sweep.scale,
        "--layers",
        str(variant.layers),
        "--d_model",
        str(variant.d_model),
        "--ffn_dim",
        str(variant.ffn_dim),
        "--heads",
        str(variant.heads),
        "--dropout",
        str(variant.dropout),
        "--label_smoothing",
        str(variant.label_smoothing),
        "--position_embedding_type",
        variant.positions,
    ]
    if variant.qk_head_dim:
        command += ["--qk_head_dim", str(variant.qk_head_dim)]
    command += ["--max_minutes", str(sweep.minutes)] if sweep.minutes else ["--max_steps", str(sweep.steps)]
    if any((run_dir / CHECKPOINTS_DIR).glob("step_*")):
        command += ["--resume_from_checkpoint", "latest"]  # an interrupted row: continue it
    elif run_dir.is_dir() and any(run_dir.iterdir()):
        print(f"[variants] {variant.name}: its earlier run stopped before its first checkpoint; starting it again")
        command += ["--overwrite"]  # nothing to continue: only that run's own files go
    return command


def row_settings(variant: Variant, sweep: Sweep) -> dict:
    """What a row's result depends on: its model, the scale, the budget and every flag passed to training."""
    flags = list(sweep.training_flags)
    return {"variant": asdict(variant), "scale": sweep.scale, "budget": sweep.budget, "training_flags": flags}


def check_row_settings(run_dir: Path, settings: dict, name: str) -> None:
    """A row trained (or begun) under other settings, or under unrecorded ones, is never reused or continued:
    RuntimeError saying what differs."""
    recorded_file = run_dir / SETTINGS_FILE
    if not recorded_file.is_file():  # a row that died before its first checkpoint starts again (`training_command`)
        if (run_dir / RESULTS).is_file() or any((run_dir / CHECKPOINTS_DIR).glob("step_*")):
            raise SweepError(
                f"row {name} in {run_dir} has no {SETTINGS_FILE}: what it was trained with is unknown; use another "
                f"--output_dir, or retrain it with --restart_rows {name} (deletes that row's run)"
            )
        return
    recorded = json.loads(recorded_file.read_text())
    if differing := [key for key in settings if recorded.get(key) != settings[key]]:
        details = "; ".join(f"{key}: {recorded.get(key)} there, {settings[key]} now" for key in differing)
        raise SweepError(
            f"row {name} in {run_dir} was trained with other settings ({details}): use another --output_dir, "
            f"or retrain it with --restart_rows {name} (deletes that row's run)"
        )


def run_variant(variant: Variant, sweep: Sweep) -> dict:
    """Train and score one row (or read it, if finished under the same settings); returns its line of the table."""
    run_dir = Path(sweep.output_dir) / "runs" / variant.name
    results_file = run_dir / RESULTS
    settings = row_settings(variant, sweep)
    if variant.name in sweep.restart_rows and run_dir.exists():
        print(f"[variants] {variant.name}: --restart_rows: deleting {run_dir}")
        shutil.rmtree(run_dir)
    check_row_settings(run_dir, settings, variant.name)
    if results_file.is_file():
        print(f"[variants] {variant.name} ({variant.varied or 'base'}): finished earlier, read from {results_file}")
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SETTINGS_FILE).write_text(json.dumps(settings, indent=2))
        log_file = Path(sweep.output_dir) / "logs" / f"{variant.name}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        command = training_command(variant, sweep, run_dir)
        print(f"[variants] {variant.name} ({variant.varied or 'base'}): training, log in {log_file}", flush=True)
        with open(log_file, "a") as log:
            finished = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT)
        if finished.returncode != 0 or not results_file.is_file():
            raise SweepError(f"row {variant.name} failed (exit {finished.returncode}): see {log_file}")
    return table_line(variant, json.loads(results_file.read_text()))


def table_line(variant: Variant, results: dict) -> dict:
    validation = results.get("results", {}).get("validation", {})
    return {
        **asdict(variant),
        "d_k": variant.d_k,
        "d_v": variant.d_v,
        "parameters": results["parameters"],
        "dev_perplexity": validation.get("perplexity"),
        "dev_bleu": validation.get("bleu"),
        "steps": results["steps"],
        "minutes": round(results["training_minutes"], 1),
    }


# --- the table and the plots -------------------------------------------------------------------------------------

COLUMNS = [
    ("name", ""),
    ("N", "layers"),
    ("d_model", "d_model"),
    ("d_ff", "ffn_dim"),
    ("h", "heads"),
    ("d_k", "d_k"),
    ("d_v", "d_v"),
    ("P_drop", "dropout"),
    ("eps_ls", "label_smoothing"),
    ("positions", "positions"),
    ("params (M)", "parameters"),
    ("dev PPL", "dev_perplexity"),
    ("dev BLEU", "dev_bleu"),
    ("steps", "steps"),
    ("minutes", "minutes"),
]


def cell(line: dict, key: str) -> str:
    value = line[key or "name"]
    if key == "parameters":
        return f"{value / 1e6:.1f}"
    if key in ("dev_perplexity", "dev_bleu"):
        return "-" if value is None else f"{value:.2f}"
    return str(value)


def write_table(lines: list[dict], output_dir: Path) -> Path:
    """table.json, table.csv and table.md (shaped like the paper's Table 3) in `output_dir`."""
    (output_dir / "table.json").write_text(json.dumps(lines, indent=2))
    with open(output_dir / "table.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(lines[0]))
        writer.writeheader()
        writer.writerows(lines)
    header = "| " + " | ".join(title or "" for title, _ in COLUMNS) + " |"
    rule = "|" + "---|" * len(COLUMNS)
    body = ["| " + " | ".join(cell(line, key) for _, key in COLUMNS) + " |" for line in lines]
    (output_dir / "table.md").write_text("\n".join([header, rule, *body]) + "\n")
    return output_dir / "table.md"


def plot_groups(lines: list[dict], output_dir: Path) -> list[Path]:
    """One PNG per row group: dev BLEU and perplexity of each row. Where the group varies one number (heads, P_drop),
    the base row takes its place among the values; otherwise it comes first."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    base = next(line for line in lines if line["group"] == "base")
    keys = dict(COLUMNS)
    written = []
    for group in sorted({line["group"] for line in lines} - {"base"}):
        varied = [line for line in lines if line["group"] == group]
        titles = {line["varied"].partition("=")[0] for line in varied}
        title = titles.pop() if len(titles) == 1 else None
        if title in keys:
            rows = sorted([base, *varied], key=lambda line: line[keys[title]])
            labels = [f"{title}={line[keys[title]]}" + (" (base)" if line is base else "") for line in rows]
        else:
            rows, labels = [base, *varied], ["base", *(line["varied"] for line in varied)]
        figure, bleu_axis = pyplot.subplots(figsize=(1.2 * len(rows) + 2, 3.5))
        bleu_axis.bar(range(len(rows)), [line["dev_bleu"] or 0 for line in rows], color="tab:blue")
        bleu_axis.set_ylabel("dev BLEU", color="tab:blue")
        perplexity_axis = bleu_axis.twinx()
        perplexity_axis.plot(range(len(rows)), [line["dev_perplexity"] for line in rows], "o-", color="tab:red")
        perplexity_axis.set_ylabel("dev perplexity", color="tab:red")
        bleu_axis.set_xticks(range(len(rows)), labels, rotation=20)
        bleu_axis.set_title(f"Table 3 ({group}): each row against the base row")
        figure.tight_layout()
        path = output_dir / f"table3_{group}.png"
        figure.savefig(path, dpi=100)
        pyplot.close(figure)
        written.append(path)
    return written


def why_not_a_sweep(folder: Path) -> str | None:
    """None if `folder` is a previous sweep's: its record, and nothing a sweep does not write; else why not."""
    try:
        written_by = json.loads((folder / SWEEP_RECORD).read_text(encoding="utf-8")).get("written_by")
    except (OSError, ValueError, AttributeError):
        written_by = None
    if written_by != WRITTEN_BY:
        return f"it has no record ({SWEEP_RECORD}) of a `{WRITTEN_BY}`"
    if others := sorted(path.name for path in folder.iterdir() if not any(path.match(n) for n in SWEEP_NAMES)):
        return f"it holds {', '.join(others[:5])}, which `{WRITTEN_BY}` does not write"
    return None


def data_paths(training_flags: tuple[str, ...]) -> list[tuple[str, str]]:
    """The (flag, path) pairs of INPUT_FLAGS among the flags passed on to the rows (`--flag PATH`, `--flag=PATH`)."""
    pairs = []
    for index, flag in enumerate(training_flags):
        name, equals, value = flag.partition("=")
        if name in INPUT_FLAGS and (equals or index + 1 < len(training_flags)):
            pairs.append((name, value if equals else training_flags[index + 1]))
    return pairs


def claim_sweep_dir(sweep: Sweep) -> Path:
    """`sweep.output_dir` by the one rule (the module docstring), then its record: a new or empty folder becomes a
    sweep's, a previous sweep's is continued; anything else is an OutputFolderError naming it."""
    output_dir = Path(sweep.output_dir)
    check_output_folder(
        output_dir,
        overwrite=True,  # a previous sweep is continued in place, never replaced: no flag
        why_not_previous=why_not_a_sweep,
        previous=f"a previous `{WRITTEN_BY}` output to continue (or new or empty)",
        inputs=data_paths(sweep.training_flags),
        flag=None,
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    if not (output_dir / SWEEP_RECORD).is_file():
        (output_dir / SWEEP_RECORD).write_text(json.dumps({"written_by": WRITTEN_BY}) + "\n", encoding="utf-8")
    return output_dir


def run_sweep(sweep: Sweep) -> None:
    """Train (or read) each row asked for, then write the table and the plots into `sweep.output_dir`."""
    output_dir = claim_sweep_dir(sweep)
    variants = [row for row in table3_variants(sweep.scale) if row.group in sweep.rows or row.name in sweep.rows]
    lines = [run_variant(variant, sweep) for variant in variants]
    print((write_table(lines, output_dir)).read_text())
    for path in plot_groups(lines, output_dir):
        print(f"[variants] plot: {path}")
