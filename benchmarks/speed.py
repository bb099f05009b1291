"""Speed of our model against transformers' `MarianMTModel` of identical size, and against CTranslate2.

Both PyTorch models get the same shape (d_model, layers, heads, FFN size, vocabulary, ReLU, post-LN, tied and
sqrt(d_model)-scaled embeddings, same dropout) and the same weights: ours converted with
`vanilla_transformer.converters.export_marian.to_marian` (its features reordered so that Marian's sinusoid table is our
positions), and the script checks that both give the same logits before timing anything. The CTranslate2
columns run our model converted with `vanilla_transformer.converters.export_ctranslate2` (float32, and int8 weights), in a
worker process of their own (see `ctranslate2_process`).

Work, per preset (small: the recipe's CPU model, 8000 tokens; base: the paper's, 37000 tokens):
- train: forward, backward and Adam step on one identical padded batch (train mode, dropout 0.1), 64 sentence
  pairs shaped like the recipe's length-sorted token batches; throughput counts non-padding target tokens. Marian
  trains with its own loss (the logits' cross-entropy), ours with the training script's (vanilla_transformer/training/loss.py:
  label-smoothed, without the logits).
- greedy / beam4: generation from identical sources (16-32 tokens) of exactly 32 new tokens per sentence: no end
  token (`eos_token_id=None`; CTranslate2 `end_token=[]`), so every engine does the same work; throughput counts
  batch x 32 (beam search: returned tokens, not beams x tokens).

Every row runs its engines interleaved, in alternating order (A B, B A, A B, ...), after one untimed warm-up
each, and reports the median (of 5 repetitions, 15 for the batch-1 rows, which vary the most).
glibc's malloc thresholds are fixed first (see `fix_malloc_thresholds`; `--system-malloc` keeps them adaptive).

Peak memory runs each engine in a fresh subprocess: after one untimed warm-up of the work, freed memory is
returned to the OS (malloc_trim), the kernel's resident-set high-water mark is reset (/proc/self/clear_refs),
the work runs once and the row reports VmHWM - VmRSS(before): the extra resident memory the work needed on top
of the loaded model (and, for training, Adam's state). "(loaded)" is the process's resident set before that:
Python, torch and transformers (imported by every worker, CTranslate2's too) plus the model. Linux only.

Usage:
    python benchmarks/speed.py                      # small and base, every row (about 9 minutes on 2 cores)
    python benchmarks/speed.py --quick              # 2 repetitions per row
    python benchmarks/speed.py --presets small --no-memory --no-ctranslate2
    python benchmarks/speed.py --bf16 --onednn      # also: our model in bf16, and as the commands run it
    python benchmarks/speed.py --compile            # also: training under torch.compile
"""

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers import MarianMTModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from common import (  # noqa: E402
    WORKLOADS,
    WorkerProcess,
    Workload,
    build_ours,
    describe_machine,
    fix_malloc_thresholds,
    generation,
    machine,
    padded_batch,
)
from timing import median_seconds  # noqa: E402

from configuration_vanilla_transformer import VanillaTransformerConfig  # noqa: E402
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.converters.export_marian import check_same_function, marian_config, to_marian  # noqa: E402
from vanilla_transformer.model.onednn import use_onednn_linears  # noqa: E402
from vanilla_transformer.training.loss import forward_inputs, label_smoothed_cross_entropy, output_head  # noqa: E402

ENGINES = ("ours", "marian", "ct2_float32", "ct2_int8")
TORCH_ENGINES = ("ours", "marian")
# Optional extra engines: table column and the work they run.
EXTRA_ENGINES = {
    "ours_compiled": ("ours+compile tok/s", ("train",)),
    "ours_bf16": ("ours bf16 tok/s", ("greedy", "beam4")),
    "ours_onednn": ("ours+oneDNN tok/s", ("greedy", "beam4")),
}


GENERATION_ROWS = [("greedy", 1, 1), ("greedy", 32, 1), ("beam4", 1, 4), ("beam4", 32, 4)]


@dataclass(frozen=True)
class Row:
    work: str  # train, greedy or beam4
    batch: int
    num_beams: int = 1


def rows_for(workload: Workload) -> list[Row]:
    return [Row("train", workload.train_batch)] + [Row(work, batch, beams) for work, batch, beams in GENERATION_ROWS]


# --- work ----------------------------------------------------------------------------------------------------


def training_step(model, batch, recipe_loss: bool = False) -> Callable[[], None]:
    """One optimizer step: with the model's own loss (the logits' mean cross-entropy), or `recipe_loss`, our training
    script's (vanilla_transformer/training/loss.py: label-smoothed, summed, without the logits)."""
    input_ids, attention_mask, labels = batch
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step() -> None:
        model.train()
        if recipe_loss:
            batch = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
            hidden = model(**forward_inputs(model, batch), output_hidden_states=True).decoder_hidden_states[-1]
            loss = label_smoothed_cross_entropy(hidden, output_head(model), labels, 0.1) / (labels != -100).sum()
        else:
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def ctranslate2_generation(translator, batch, num_beams: int, new_tokens: int) -> Callable[[], None]:
    input_ids, attention_mask, _ = batch
    rows = zip(input_ids, attention_mask.bool(), strict=True)
    tokens = [[f"id_{index}" for index in row[mask].tolist()] for row, mask in rows]  # unpadded sources

    def generate() -> None:
        results = translator.translate_batch(tokens, beam_size=num_beams, max_decoding_length=new_tokens, end_token=[])
        assert all(len(result.hypotheses[0]) == new_tokens for result in results)

    return generate


def work_batch(workload: Workload, row: Row):
    if row.work == "train":
        lengths = (workload.train_source_lengths, workload.train_target_lengths)
        return padded_batch(workload.vocab_size, row.batch, *lengths, seed=1)
    return padded_batch(workload.vocab_size, row.batch, workload.source_lengths, (1, 1), seed=2)


def tokens_per_run(workload: Workload, row: Row, batch) -> int:
    if row.work == "train":
        return int((batch[2] != -100).sum()) * workload.train_steps
    return row.batch * workload.new_tokens


class Engines:
    """The engines of one preset; `run(engine, row, batch)` gives the callable that does the row's work once.

    Extra engines: ours_compiled (--compile) is our model under `torch.compile`, for the training row;
    ours_bf16 (--bf16) is our model with bf16 weights and eager attention, for the generation rows;
    ours_onednn (--onednn) is our model as the project's commands run it (oneDNN linear layers), for the same.
    """

    def __init__(self, preset: str, workload: Workload, names: list[str], threads: int, check: bool = True):
        self.workload = workload
        self.threads = threads
        self.models = {}
        self.translators = {}  # CTranslate2 engines loaded in this process (memory and CTranslate2 workers)
        self.external = {}  # CTranslate2 engines in a process of their own (timing): name -> its WorkerProcess
        if "ours" in names or check:
            ours = build_ours(preset, workload.vocab_size)
            if "ours" in names:
                self.models["ours"] = ours
            if "marian" in names:
                self.models["marian"] = to_marian(ours)
                if check:
                    check_same_function(ours, self.models["marian"])
        elif "marian" in names:  # alone, for its memory: its own random weights, nothing else in the process
            torch.manual_seed(0)
            config = VanillaTransformerConfig.from_preset(preset, vocab_size=workload.vocab_size)
            self.models["marian"] = MarianMTModel(marian_config(config))
        if "ours_compiled" in names:
            compiled = build_ours(preset, workload.vocab_size)
            compiled.forward = torch.compile(compiled.forward)
            self.models["ours_compiled"] = compiled
        if "ours_onednn" in names:  # what the project's commands run: oneDNN linear layers (onednn.py)
            self.models["ours_onednn"] = use_onednn_linears(build_ours(preset, workload.vocab_size))
        if "ours_bf16" in names:  # bf16 weights; eager attention, as torch's CPU sdpa kernels are slow in bf16
            self.models["ours_bf16"] = build_ours(preset, workload.vocab_size).to(torch.bfloat16)
            self.models["ours_bf16"].set_attn_implementation("eager")

    def add_ctranslate2(self, names: list[str], ct2_dir: Path) -> None:
        """Load `ct2_float32` / `ct2_int8` from the models `export_ctranslate2` wrote into `ct2_dir`."""
        import ctranslate2

        for name in names:
            compute_type = name.removeprefix("ct2_")
            self.translators[name] = ctranslate2.Translator(
                str(ct2_dir / compute_type), compute_type=compute_type, intra_threads=self.threads
            )

    def names(self, row: Row) -> list[str]:
        models = [name for name in self.models if name not in EXTRA_ENGINES or row.work in EXTRA_ENGINES[name][1]]
        return models + (list(self.translators) + list(self.external) if row.work != "train" else [])

    def run(self, name: str, row: Row, batch) -> Callable[[], None]:
        if name in self.external:
            return self.external[name].work(name, row.work, row.batch, row.num_beams)
        if name in self.translators:
            return ctranslate2_generation(self.translators[name], batch, row.num_beams, self.workload.new_tokens)
        model = self.models[name]
        if row.work == "train":
            step = training_step(model, batch, recipe_loss=name == "ours")

            def work() -> None:
                for _ in range(self.workload.train_steps):
                    step()
        else:
            work = generation(model, batch, row.num_beams, self.workload.new_tokens)
        return work


def export_ctranslate2(model: VanillaTransformerForConditionalGeneration, folder: Path) -> None:
    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2

    model.save_pretrained(folder / "hf")
    convert_to_ctranslate2(folder / "hf", folder / "float32")
    convert_to_ctranslate2(folder / "hf", folder / "int8", quantization="int8")


def time_row(engines: Engines, row: Row, repetitions: int) -> dict[str, float]:
    """Tokens per second of each engine on this row."""
    batch = work_batch(engines.workload, row)
    runs = {name: engines.run(name, row, batch) for name in engines.names(row)}
    tokens = tokens_per_run(engines.workload, row, batch)
    return {name: tokens / seconds for name, seconds in median_seconds(runs, repetitions).items()}


# --- memory --------------------------------------------------------------------------------------------------


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_extra_memory_mib(run: Callable[[], None]) -> float:
    run()  # warm-up: one-time allocations (Adam state, caches) belong to the baseline
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
    before = _status_mib("VmRSS")
    run()
    return _status_mib("VmHWM") - before


def ctranslate2_process(preset: str, names: list[str], ct2_dir: Path, threads: int) -> WorkerProcess:
    """The CTranslate2 engines of one preset, timed in a process of their own: in the PyTorch engines' process,
    CTranslate2 (which brings its own OpenMP runtime and oneDNN) changed their speed: our model's small greedy
    batch-1 row measured 1.27x Marian without it loaded, 0.92-0.95x with it (docs/BENCHMARKS.md). The worker takes
    [name, work, batch, num_beams] per row (`ctranslate2_worker`)."""
    arguments = ["--ct2-worker", preset, *names, "--ct2-dir", str(ct2_dir), "--threads", str(threads)]
    return WorkerProcess(__file__, arguments)


def ctranslate2_worker(preset: str, names: list[str], ct2_dir: str, threads: int) -> None:
    """Runs in its own process: loads the CTranslate2 engines, then does one row's work per line of stdin."""
    workload = WORKLOADS[preset]
    engines = Engines(preset, workload, [], threads, check=False)
    engines.add_ctranslate2(names, Path(ct2_dir))
    batches = {}
    print("ready", flush=True)
    for line in sys.stdin:
        name, work, batch, num_beams = json.loads(line)
        row = Row(work, batch, num_beams)
        if row not in batches:
            batches[row] = work_batch(workload, row)  # the same seeded batch as the main process's
        engines.run(name, row, batches[row])()
        print("done", flush=True)


def memory_worker(preset: str, name: str, ct2_dir: str | None, threads: int) -> None:
    """Runs in a fresh process: one engine, every row; prints {"loaded": MiB, "<work>/<batch>": MiB, ...}."""
    workload = WORKLOADS[preset]
    engines = Engines(preset, workload, [name] if name in TORCH_ENGINES else [], threads, check=False)
    if name not in TORCH_ENGINES:
        engines.add_ctranslate2([name], Path(ct2_dir))
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    result = {"loaded": _status_mib("VmRSS")}
    for row in rows_for(workload):
        if name in engines.names(row):
            result[f"{row.work}/{row.batch}"] = peak_extra_memory_mib(
                engines.run(name, row, work_batch(workload, row))
            )
    print(json.dumps(result))


def measure_memory(preset: str, engines: list[str], ct2_dir: Path | None, threads: int) -> dict[str, dict]:
    results = {}
    for engine in engines:
        command = [sys.executable, __file__, "--memory-worker", preset, engine, "--threads", str(threads)]
        if ct2_dir is not None:
            command += ["--ct2-dir", str(ct2_dir)]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            raise RuntimeError(f"memory worker {preset}/{engine} failed:\n{completed.stderr[-3000:]}")
        results[engine] = json.loads(completed.stdout.strip().splitlines()[-1])
    return results


# --- report --------------------------------------------------------------------------------------------------


def load() -> str:
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def ratio(numerator: float | None, denominator: float | None) -> str:
    return f"{numerator / denominator:.2f}x" if numerator and denominator else "-"


def number(value: float | None, digits: int = 0) -> str:
    return f"{value:,.{digits}f}" if value is not None else "-"


def speed_table(results: dict) -> str:
    """Tokens per second (higher is better) and the ratios; a column per extra engine that ran."""
    extras = [name for name in EXTRA_ENGINES if any(name in speeds for speeds in results.values())]
    header = "| preset | work | batch | ours tok/s | Marian tok/s | ours/Marian | CT2 f32 tok/s | CT2 int8 tok/s | ours/CT2 f32 |"
    header += "".join(f" {EXTRA_ENGINES[name][0]} |" for name in extras)
    with_bf16 = "ours_bf16" in extras
    header += " ours bf16/CT2 f32 |" * with_bf16  # as named in the docs
    lines = [header, "|---|---|---:" + "|---:" * (6 + len(extras) + with_bf16) + "|"]
    for (preset, row), speeds in results.items():
        ours, marian = speeds.get("ours"), speeds.get("marian")
        ct2_f32, ct2_int8 = speeds.get("ct2_float32"), speeds.get("ct2_int8")
        line = (
            f"| {preset} | {row.work} | {row.batch} | {number(ours)} | {number(marian)} | {ratio(ours, marian)} "
            f"| {number(ct2_f32)} | {number(ct2_int8)} | {ratio(ours, ct2_f32)} |"
        )
        line += "".join(f" {number(speeds.get(name))} |" for name in extras)
        lines.append(line + f" {ratio(speeds.get('ours_bf16'), ct2_f32)} |" * with_bf16)
    return "\n".join(lines)


def memory_table(memory: dict) -> str:
    lines = [
        "| preset | work | batch | ours MiB | Marian MiB | ours/Marian | CT2 f32 MiB | CT2 int8 MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for preset, by_engine in memory.items():
        loaded = [by_engine.get(engine, {}).get("loaded") for engine in ENGINES]
        lines.append(
            f"| {preset} | (loaded) | | {' | '.join(number(value) for value in loaded[:2])} | "
            f"{ratio(*loaded[:2])} | {' | '.join(number(value) for value in loaded[2:])} |"
        )
        for row in rows_for(WORKLOADS[preset]):
            key = f"{row.work}/{row.batch}"
            ours, marian, ct2_f32, ct2_int8 = (by_engine.get(engine, {}).get(key) for engine in ENGINES)
            lines.append(
                f"| {preset} | {row.work} | {row.batch} | {number(ours)} | {number(marian)} | {ratio(ours, marian)} "
                f"| {number(ct2_f32)} | {number(ct2_int8)} |"
            )
    return "\n".join(lines)


def time_presets(args, torch_names: list[str], ct2_names: list[str]) -> tuple[dict, dict]:
    """Tokens per second of every engine on every row of each preset, then (unless --no-memory) peak memory."""
    speeds, memory = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for preset in args.presets:
            workload = WORKLOADS[preset]
            repetitions = args.repetitions or (2 if args.quick else workload.repetitions)
            engines = Engines(preset, workload, torch_names, args.threads)
            ct2_dir = Path(scratch) / preset
            if ct2_names:
                export_ctranslate2(engines.models["ours"], ct2_dir)
                ct2_process = ctranslate2_process(preset, ct2_names, ct2_dir, args.threads)
                engines.external = dict.fromkeys(ct2_names, ct2_process)
            for row in rows_for(workload):
                # batch-1 rows take a fraction of a second per run and vary the most: three times the repetitions
                speeds[(preset, row)] = time_row(engines, row, repetitions * (3 if row.batch == 1 else 1))
                line = ", ".join(f"{name} {value:,.0f}" for name, value in speeds[(preset, row)].items())
                print(f"{preset} {row.work} batch {row.batch}: {line} tok/s (load {load()})", flush=True)
            if ct2_names:
                ct2_process.close()
            del engines
            gc.collect()
            if not args.no_memory:
                memory[preset] = measure_memory(preset, list(TORCH_ENGINES) + ct2_names, ct2_dir, args.threads)
    return speeds, memory


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--repetitions", type=int, default=None, help="timed repetitions per row (median)")
    parser.add_argument("--quick", action="store_true", help="2 repetitions per row")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch and CTranslate2 threads")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory subprocesses")
    parser.add_argument("--no-ctranslate2", action="store_true", help="skip the CTranslate2 rows")
    extra = parser.add_argument_group("extra engines")
    extra.add_argument("--compile", action="store_true", help="also time training of torch.compile(our model)")
    extra.add_argument("--bf16", action="store_true", help="also time generation with bf16 weights (ours_bf16)")
    extra.add_argument("--onednn", action="store_true", help="also time generation as the commands run it (oneDNN)")
    parser.add_argument("--system-malloc", action="store_true", help="keep glibc's adaptive malloc thresholds")
    parser.add_argument("--memory-worker", nargs=2, metavar=("PRESET", "ENGINE"), help=argparse.SUPPRESS)
    parser.add_argument("--ct2-dir", help=argparse.SUPPRESS)
    parser.add_argument("--ct2-worker", nargs="+", metavar="PRESET ENGINE", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_worker:
        memory_worker(*args.memory_worker, args.ct2_dir, args.threads)
        return
    if args.ct2_worker:
        ctranslate2_worker(args.ct2_worker[0], args.ct2_worker[1:], args.ct2_dir, args.threads)
        return
    if not args.system_malloc:
        fix_malloc_thresholds()

    ct2_names = [] if args.no_ctranslate2 else [name for name in ENGINES if name.startswith("ct2_")]
    if ct2_names:
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            print("ctranslate2 is not installed: no CTranslate2 rows", file=sys.stderr)
            ct2_names = []
    torch_names = list(TORCH_ENGINES) + ["ours_compiled"] * args.compile + ["ours_bf16"] * args.bf16
    torch_names += ["ours_onednn"] * args.onednn

    started = datetime.now(timezone.utc)
    print(f"# {started:%Y-%m-%d %H:%M} UTC; {describe_machine(machine())}; load average at start {load()}", flush=True)
    speeds, memory = time_presets(args, torch_names, ct2_names)
    elapsed = (datetime.now(timezone.utc) - started).total_seconds()
    print(f"\nCommand: python {' '.join(sys.argv)}; {elapsed:.0f} s; load average at end {load()}\n")
    print(speed_table(speeds))
    if memory:
        print("\nPeak memory (MiB, lower is better): resident set of the process after loading the engine, and the")
        print("extra resident memory one run of the work needed on top of it.\n")
        print(memory_table(memory))


if __name__ == "__main__":
    main()
