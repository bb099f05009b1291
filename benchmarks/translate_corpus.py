"""Translating a corpus with `vanilla-transformer translate` against CTranslate2 and MarianMTModel: lines/s and target
tokens/s on the same file, the batching that makes the command fastest, processes against threads, what a kill -9
half-way costs, and the command's peak memory.

The model: an OPUS-MT-sized MarianMTModel with random weights and a MarianTokenizer (`opus_mt_folder` of
benchmarks/converted_speed.py; `--tiny`: its tiny size), converted by `vanilla_transformer.converters.convert.convert` as a
user's folder is. Random weights end a translation anywhere, so every engine generates exactly K = --new_tokens tokens
a line (beam --num_beams, default 4, the paper's and OPUS-MT's): the command's copy of the converted folder has
`"eos_token_id": null` and no forced </s> in its generation_config.json (with --max_new_tokens K; the CTranslate2
backend maps a null eos_token_id to end_token=[]); MarianMTModel runs generate(eos_token_id=None, max_new_tokens=K,
forced_eos_token_id=None) and CTranslate2 end_token=[], max_decoding_length = K: the way benchmarks/converted_speed.py
fixes the length (a min_new_tokens processor would add a pass over the vocabulary each step to the PyTorch engines). Target tokens are counted
as lines x K; the command's own count (special tokens left out) is kept in the JSON as a check.

Every engine runs in a process of its own (CTranslate2 in a PyTorch process changes speed, docs/BENCHMARKS.md) on the
same input, the first --lines lines of ../shared/data/multi30k/train.en.gz, read here and written to a temporary
folder. Seconds are wall clock from the process's start to its exit, loading included (what a user waits for);
"engine s" is the translation alone (the command's summary line; the workers' own clock). Peak memory is the largest
sum of RSS over the process and its children, polled every 0.1 s. Steps (--skip NAME... leaves some out):

  batching      the command, model backend: --batch_size 32 (sentence batches), then --max_batch_tokens at each of
                --budgets
  ct2_backend   the command, --backend ctranslate2 --compute_type float32, then int8 (--ct2_compute_types), at its
                default batching or at each of --ct2_budgets
  marian        MarianMTModel (the source folder, same weights): generate() on 32 lines at a time in input order
  ctranslate2   CTranslate2's own translate_iterable on the command's export (float32, int8), batch_type "tokens",
                max_batch_size --ct2_batch_tokens (default: the command's default budget / beams, the same batches),
                tokenized and detokenized with the folder's tokenizer; once with one worker of --threads threads,
                once with --threads workers of one thread (inter_threads, as the command's backend runs)
  processes     the fastest `batching` setting as 1 process of --threads threads against --threads processes of 1
                thread (`accelerate launch`, CPU processes over gloo)
  kill          the fastest setting killed (SIGKILL) once half its chunk files are in OUTPUT.partial/, then run again
                (it resumes): killed + resumed - uninterrupted seconds, and the lines translated again
  memory        peak memory on --memory_lines lines (--lines repeated), on the tiny model, beside the same run on
                --lines lines (--memory_lines 0 skips it: the tiny model through generate() does ~100-150 lines/s on
                2 cores, so a million lines take hours)

The first four steps run interleaved (--repeat N: N times in alternating order, the median; 1 by default), then the
processes pair, then the kill, then the memory runs. The table gives each row's ratio to CTranslate2's own float32
and to MarianMTModel; "same as Marian" is the share of output lines identical to MarianMTModel's.

At the OPUS-MT size, beam 4 runs at roughly 240-900 target tokens/s on 2 cores (docs/BENCHMARKS.md, "Generation
speed"), so each row of 20,000 lines x 24 tokens takes about 10-35 minutes: the whole run, memory aside, about 4 hours.

Usage:
    python benchmarks/translate_corpus.py --memory_lines 0 --output results.json   # OPUS-MT size, 20,000 lines
    python benchmarks/translate_corpus.py --lines 2000 --budgets 2000 4000 --skip kill --memory_lines 0
    python benchmarks/translate_corpus.py --tiny --lines 300 --memory_lines 0   # checks that the script runs (1-2 min)
"""

import argparse
import itertools
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from common import (  # noqa: E402
    CORPUS,
    DEFAULT_BUDGET,
    SUMMARY,
    build_folders,
    describe_machine,
    environment,
    machine,
    read_lines,
    tree_rss,
    uptime,
    write_lines,
)
from timing import Stopwatch  # noqa: E402

STEPS = ("batching", "ct2_backend", "marian", "ctranslate2", "processes", "kill", "memory")
MARIAN_BATCH = 32
POLL_SECONDS = 0.1
RESUMED = re.compile(r"(\d+) of (\d+) chunks resumed")

# --- the workers: MarianMTModel and CTranslate2's own API, each in a process of its own ---------------------------


def marian_worker(args: argparse.Namespace) -> None:
    """generate() on MARIAN_BATCH lines at a time in input order, exactly K new tokens each."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    torch.set_num_threads(args.threads)
    tokenizer = MarianTokenizer.from_pretrained(args.model_dir)
    model = MarianMTModel.from_pretrained(args.model_dir).eval()
    lines = read_lines(args.worker_input)
    clock = Stopwatch()
    with open(args.worker_output, "w", encoding="utf-8") as output, torch.inference_mode():
        for start in range(0, len(lines), MARIAN_BATCH):
            batch = tokenizer(lines[start : start + MARIAN_BATCH], return_tensors="pt", padding=True)
            ids = model.generate(
                **batch,
                num_beams=args.num_beams,
                do_sample=False,
                max_new_tokens=args.new_tokens,
                eos_token_id=None,
                forced_eos_token_id=None,
            )
            assert ids.shape[1] == 1 + args.new_tokens, ids.shape
            output.writelines(text + "\n" for text in tokenizer.batch_decode(ids, skip_special_tokens=True))
    print(json.dumps({"seconds": clock.seconds()}), flush=True)


def ctranslate2_worker(args: argparse.Namespace) -> None:
    """translate_iterable on the export, sources tokenized and outputs detokenized with the model folder's tokenizer
    (as the command's CTranslate2 backend does), exactly K tokens each."""
    import ctranslate2

    from vanilla_transformer.data.tokenization import load_tokenizer

    tokenizer = load_tokenizer(args.model_dir)
    workers = args.threads if args.ct2_workers else 1  # one-thread workers (inter_threads), or one of all threads
    translator = ctranslate2.Translator(
        args.export, compute_type=args.compute_type, intra_threads=args.threads // workers, inter_threads=workers
    )
    lines = read_lines(args.worker_input)
    clock = Stopwatch()
    sources = (tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(lines)["input_ids"])
    results = translator.translate_iterable(
        sources,
        max_batch_size=args.ct2_batch_tokens,
        batch_type="tokens",
        beam_size=args.num_beams,
        max_decoding_length=args.new_tokens,
        end_token=[],
    )
    with open(args.worker_output, "w", encoding="utf-8") as output:
        for result in results:
            tokens = result.hypotheses[0]
            assert len(tokens) == args.new_tokens, len(tokens)
            text = tokenizer.decode(tokenizer.convert_tokens_to_ids(tokens), skip_special_tokens=True)
            output.write(text + "\n")
    print(json.dumps({"seconds": clock.seconds()}), flush=True)


# --- running and timing a process -------------------------------------------------------------------------------


def run_process(command: list[str], env: dict, log: Path, stop=None) -> dict:
    """Run `command` from the repository root (stdout and stderr into `log`): wall seconds, peak RSS of its process
    tree, exit code, whether `stop()` (asked every POLL_SECONDS) had it killed with SIGKILL, and its log."""
    with open(log, "w") as output:
        clock = Stopwatch()
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)
        watched, peak, killed = psutil.Process(process.pid), 0, False
        while process.poll() is None:
            peak = max(peak, tree_rss(watched))
            if stop is not None and not killed and stop():
                process.kill()
                killed = True
            try:
                process.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        seconds = clock.seconds()
    text = log.read_text(errors="replace")
    if process.returncode != 0 and not killed:
        raise SystemExit(f"failed ({process.returncode}): {' '.join(command)}\n{text[-3000:]}")
    return {"seconds": seconds, "peak_rss_mb": peak / 2**20, "killed": killed, "log": text}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Bench:
    """The work folder, the input, the folders, and the rows measured so far."""

    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        (work / "out").mkdir()
        self.lines = read_lines(CORPUS, args.lines)
        self.input = write_lines(work / "input.txt", self.lines)
        self.target_tokens = sum(1 for line in self.lines if line.strip()) * args.new_tokens
        size = "tiny" if args.tiny else "opus-mt"
        self.size, self.folders = build_folders(work / "model", size, args.new_tokens, args.threads)

    def command(
        self,
        flags: list[str],
        name: str,
        folder: str = "ours",
        processes: int = 1,
        source: Path | None = None,
        overwrite: bool = True,
    ) -> list[str]:
        """`vanilla-transformer translate` of `source` (default: the input) with the folder `folder` and `flags`,
        into out/NAME.txt (--overwrite: a repetition replaces it); under `accelerate launch` for several
        `processes`."""
        args = self.args
        command = [sys.executable, "-m", "vanilla_transformer", "translate", str(self.folders[folder])]
        command += ["--input", str(source or self.input), "--output", str(self.output(name))]
        command += ["--num_beams", str(args.num_beams), "--max_new_tokens", str(args.new_tokens)]
        command += ["--buffer_size", str(args.buffer_size), *flags] + (["--overwrite"] if overwrite else [])
        if processes == 1:
            return command
        launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes)]
        launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
        launch += ["--num_cpu_threads_per_process", "1", "--main_process_port", str(free_port())]
        return launch + ["-m", *command[2:]]

    def output(self, name: str) -> Path:
        return self.work / "out" / f"{name}.txt"

    def worker(self, kind: str, name: str, extra: list[str]) -> list[str]:
        args = self.args
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--worker_input", str(self.input)]
        command += ["--worker_output", str(self.output(name)), "--threads", str(args.threads)]
        return command + ["--num_beams", str(args.num_beams), "--new_tokens", str(args.new_tokens), *extra]

    def measure(self, row: dict, repetition: int) -> dict:
        """Run a row's command once: its figures (seconds, engine seconds, peak memory, the command's counts)."""
        threads = 1 if row.get("processes", 1) > 1 else self.args.threads
        result = run_process(row["command"], environment(threads), self.work / "out" / f"{row['name']}.log")
        engine_seconds = reported = None
        if row["engine"].startswith("vanilla-transformer"):
            found = SUMMARY.findall(result["log"])
            if not found:
                raise SystemExit(f"no summary line from {' '.join(row['command'])}:\n{result['log'][-3000:]}")
            engine_seconds, reported = float(found[-1][3]), int(found[-1][2])
        else:
            printed = [line for line in result["log"].splitlines() if line.startswith('{"seconds"')]
            if not printed:
                raise SystemExit(f"no timing from {' '.join(row['command'])}:\n{result['log'][-3000:]}")
            engine_seconds = json.loads(printed[-1])["seconds"]
        print(
            f"  {row['engine']} {row['settings']} (#{repetition + 1}): {result['seconds']:.1f} s, "
            f"{self.target_tokens / result['seconds']:,.0f} target tokens/s, peak {result['peak_rss_mb']:,.0f} MB",
            flush=True,
        )
        return {
            "seconds": result["seconds"],
            "engine_seconds": engine_seconds,
            "reported_target_tokens": reported,
            "peak_rss_mb": result["peak_rss_mb"],
        }

    def run_rows(self, rows: list[dict]) -> list[dict]:
        """Measure `rows` interleaved --repeat times in alternating order; each row gets the median seconds."""
        measured = {row["name"]: [] for row in rows}
        for repetition in range(self.args.repeat):
            for row in rows if repetition % 2 == 0 else rows[::-1]:
                measured[row["name"]].append(self.measure(row, repetition))
        for row in rows:
            runs = measured[row["name"]]
            row["seconds"] = statistics.median(run["seconds"] for run in runs)
            row["all_seconds"] = [run["seconds"] for run in runs]
            row["engine_seconds"] = statistics.median(run["engine_seconds"] for run in runs)
            row["reported_target_tokens"] = runs[-1]["reported_target_tokens"]
            row["peak_rss_mb"] = max(run["peak_rss_mb"] for run in runs)
            row["lines"], row["target_tokens"] = len(self.lines), self.target_tokens
            row["lines_per_second"] = len(self.lines) / row["seconds"]
            row["tokens_per_second"] = self.target_tokens / row["seconds"]
        return rows


# --- the steps --------------------------------------------------------------------------------------------------


def first_rows(bench: Bench) -> list[dict]:
    """Steps batching, ct2_backend, marian and ctranslate2: the rows that run interleaved."""
    return command_rows(bench) + engine_rows(bench)


def command_rows(bench: Bench) -> list[dict]:
    """Steps batching and ct2_backend: the translate command, by batching and by the CTranslate2 backend."""
    args, skip, rows = bench.args, set(bench.args.skip), []
    ours = "vanilla-transformer translate"
    if "batching" not in skip:
        settings = [
            ["--batch_size", str(MARIAN_BATCH)],
            *(["--max_batch_tokens", str(budget)] for budget in args.budgets),
        ]
        for flags in settings:
            name = "ours" + "".join(flags).replace("--", "-")
            rows.append(
                {"step": "batching", "engine": ours, "settings": " ".join(flags), "flags": flags, "name": name}
            )
    if "ct2_backend" not in skip:
        for compute_type, budget in itertools.product(args.ct2_compute_types, args.ct2_budgets or [DEFAULT_BUDGET]):
            flags = ["--backend", "ctranslate2", "--compute_type", compute_type]
            flags += ["--max_batch_tokens", str(budget)] if budget != DEFAULT_BUDGET else []
            default = f" (--max_batch_tokens {DEFAULT_BUDGET})" if budget == DEFAULT_BUDGET else ""
            settings = f"{' '.join(flags)}{default}"
            name = f"ours-ct2-{compute_type}" + (f"-{budget}" if budget != DEFAULT_BUDGET else "")
            rows.append(
                {
                    "step": "ct2_backend",
                    "engine": ours,
                    "settings": settings,
                    "flags": flags,
                    "name": name,
                    "folder": "ours_ct2",
                }
            )
    for row in rows:
        row["command"] = bench.command(row["flags"], row["name"], row.pop("folder", "ours"))
    return rows


def engine_rows(bench: Bench) -> list[dict]:
    """Steps marian and ctranslate2: MarianMTModel's generate() and CTranslate2's own API, each in a worker."""
    args, skip, rows = bench.args, set(bench.args.skip), []
    if "marian" not in skip:
        extra = ["--model_dir", str(bench.folders["marian"])]
        rows.append(
            {
                "step": "marian",
                "engine": "MarianMTModel",
                "name": "marian",
                "settings": f"generate(), batch {MARIAN_BATCH}, input order",
                "command": bench.worker("marian", "marian", extra),
            }
        )
    if "ctranslate2" not in skip:
        for workers, compute_type in itertools.product((False, True), ("float32", "int8")):
            extra = ["--model_dir", str(bench.folders["ours_ct2"]), "--export", str(bench.folders["export"])]
            extra += ["--compute_type", compute_type, "--ct2_batch_tokens", str(args.ct2_batch_tokens)]
            extra += ["--ct2_workers"] if workers else []
            settings = f"translate_iterable, {compute_type}, batch_type tokens, max_batch_size {args.ct2_batch_tokens}"
            settings += f", inter_threads {args.threads}, intra_threads 1" if workers else ""
            name = f"ct2-{compute_type}" + ("-workers" if workers else "")
            rows.append(
                {
                    "step": "ctranslate2",
                    "engine": "CTranslate2",
                    "name": name,
                    "settings": settings,
                    "command": bench.worker("ctranslate2", name, extra),
                }
            )
    return rows


def best_flags(rows: list[dict]) -> list[str]:
    """The fastest setting of step batching (the command's default when that step was skipped)."""
    batching = [row for row in rows if row["step"] == "batching"]
    if not batching:
        return ["--max_batch_tokens", str(DEFAULT_BUDGET)]
    return max(batching, key=lambda row: row["tokens_per_second"])["flags"]


def reference_run(rows: list[dict], flags: list[str]) -> dict | None:
    """The latest row that ran the command with `flags` as one process, if any: the kill's uninterrupted run."""
    same = [row for row in rows if row["step"] in ("batching", "processes") and row["flags"] == flags]
    return next((row for row in reversed(same) if row.get("processes", 1) == 1), None)


def process_rows(bench: Bench, flags: list[str]) -> list[dict]:
    """Step processes: the best setting as 1 process x T threads and as T processes x 1 thread."""
    threads, rows = bench.args.threads, []
    for processes in (1, threads):
        each = threads // processes
        label = f"{processes} process{'es' if processes > 1 else ''} x {each} thread{'s' if each > 1 else ''}"
        name = f"ours-processes-{processes}"
        command = bench.command(flags, name, processes=processes)
        rows.append(
            {
                "step": "processes",
                "engine": "vanilla-transformer translate",
                "name": name,
                "flags": flags,
                "settings": f"{' '.join(flags)}, {label}",
                "processes": processes,
                "command": command,
            }
        )
    return bench.run_rows(rows)


def kill_step(bench: Bench, flags: list[str], reference: dict | None) -> dict:
    """Kill -9 the command once half its chunks are recorded, run it again (it resumes), and compare with an
    uninterrupted run of the same command (`reference`; run here when None)."""
    args, env = bench.args, environment(bench.args.threads)
    if reference is None:
        row = {
            "step": "kill",
            "engine": "vanilla-transformer translate",
            "name": "ours-uninterrupted",
            "settings": " ".join(flags),
            "command": bench.command(flags, "ours-uninterrupted"),
        }
        reference = bench.run_rows([row])[0]
    chunks = math.ceil(len(bench.lines) / args.buffer_size)
    partial = bench.output("kill").with_name("kill.txt.partial")

    def chunk_files() -> set[int]:
        names = os.listdir(partial) if partial.is_dir() else []
        return {int(name[6:14]) for name in names if re.fullmatch(r"chunk-\d{8}\.jsonl", name)}

    command, half = bench.command(flags, "kill", overwrite=False), math.ceil(chunks / 2)  # the same command twice
    killed = run_process(command, env, bench.work / "out" / "kill.log", stop=lambda: len(chunk_files()) >= half)
    done = chunk_files()
    resumed = run_process(command, env, bench.work / "out" / "resumed.log")
    found = RESUMED.findall(resumed["log"])
    in_flight = min(set(range(chunks)) - done, default=None)  # one process: the chunk it was translating
    lines_again = 0 if in_flight is None else min(args.buffer_size, len(bench.lines) - in_flight * args.buffer_size)
    result = {
        "settings": " ".join(flags),
        "buffer_size": args.buffer_size,
        "chunks": chunks,
        "killed": killed["killed"],
        "chunks_done_at_kill": len(done),
        "chunks_resumed": int(found[-1][0]) if found else None,
        "killed_seconds": killed["seconds"],
        "resumed_seconds": resumed["seconds"],
        "uninterrupted_seconds": reference["seconds"],
        "cost_seconds": killed["seconds"] + resumed["seconds"] - reference["seconds"],
        "lines_translated_again": lines_again,
        "same_output": bench.output("kill").read_bytes() == bench.output(reference["name"]).read_bytes(),
    }
    if not killed["killed"]:
        print("  kill: the run finished before half its chunks were seen: nothing was killed", flush=True)
    return result


def memory_step(bench: Bench, flags: list[str]) -> dict:
    """Peak memory of the command on --lines lines and on --memory_lines lines (the input repeated), tiny model."""
    args = bench.args
    if not args.tiny:  # the tiny model's folders, beside the others
        _, tiny = build_folders(bench.work / "tiny", "tiny", args.new_tokens, args.threads)
        bench.folders |= {"tiny": tiny["ours"]}
    big = write_lines(bench.work / "memory.txt", itertools.cycle(bench.lines), args.memory_lines)
    folder = "ours" if args.tiny else "tiny"
    results = []
    for name, source, count in (
        ("memory-small", bench.input, len(bench.lines)),
        ("memory-big", big, args.memory_lines),
    ):
        if results:
            rate = results[0]["lines"] / results[0]["seconds"]
            print(
                f"  memory run: {count:,} lines, about {count / rate / 60:.0f} min at {rate:.0f} lines/s", flush=True
            )
        command = bench.command(flags, name, folder, source=source)
        run = run_process(command, environment(args.threads), bench.work / "out" / f"{name}.log")
        bench.output(name).unlink(missing_ok=True)
        results.append({"lines": count, "seconds": run["seconds"], "peak_rss_mb": run["peak_rss_mb"]})
        print(f"  {count:,} lines: peak {run['peak_rss_mb']:,.0f} MB, {run['seconds']:.1f} s", flush=True)
    big.unlink()
    return {"model": "tiny", "settings": " ".join(flags), "runs": results}


# --- the report -------------------------------------------------------------------------------------------------


def agreement(bench: Bench, rows: list[dict]) -> None:
    """Each row's share of output lines identical to MarianMTModel's (None without that row)."""
    reference = bench.work / "out" / "marian.txt"
    expected = read_lines(reference) if reference.is_file() else None
    for row in rows:
        output = read_lines(bench.output(row["name"]))
        if len(output) != len(bench.lines):
            raise SystemExit(f"{row['name']}: {len(output)} output lines for {len(bench.lines)} input lines")
        same = None if expected is None else sum(a == b for a, b in zip(output, expected, strict=True))
        row["same_as_marian"] = None if same is None else same / len(expected)


def ratio(row: dict, reference: dict | None, key: str) -> str:
    return f"{row[key] / reference[key]:.2f}x" if reference else "-"


def table(rows: list[dict]) -> str:
    """Tokens/s two ways: over the whole process (start, loading and exit included: what a user waits for) and over
    the translation alone ("engine": the command's summary line, the workers' own clock); ratios on the latter."""
    for row in rows:
        row["engine_tokens_per_second"] = row["target_tokens"] / max(row["engine_seconds"], 1e-9)
    ct2 = next((row for row in rows if row["name"] == "ct2-float32"), None)
    marian = next((row for row in rows if row["name"] == "marian"), None)
    lines = [
        "| engine | settings | seconds | engine s | lines/s | tokens/s | engine tokens/s | vs CTranslate2 float32 "
        "| vs Marian b32 | peak MB | same as Marian |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        same = "-" if row.get("same_as_marian") is None else f"{100 * row['same_as_marian']:.0f}%"
        lines.append(
            f"| {row['engine']} | {row['settings']} | {row['seconds']:.1f} | {row['engine_seconds']:.1f} | "
            f"{row['lines_per_second']:,.1f} | {row['tokens_per_second']:,.0f} | "
            f"{row['engine_tokens_per_second']:,.0f} | {ratio(row, ct2, 'engine_tokens_per_second')} | "
            f"{ratio(row, marian, 'engine_tokens_per_second')} | {row['peak_rss_mb']:,.0f} | {same} |"
        )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=20000, help="lines of multi30k's train.en to translate")
    parser.add_argument("--tiny", action="store_true", help="a tiny model: checks that the script runs")
    parser.add_argument("--threads", type=int, default=2, help="threads of each engine (and processes of step 5)")
    parser.add_argument("--num_beams", type=int, default=4, help="beam size of every engine")
    parser.add_argument("--new_tokens", type=int, default=24, help="K: tokens generated per line by every engine")
    parser.add_argument("--budgets", type=int, nargs="+", default=[1000, 2000, 4000, 8000], help="--max_batch_tokens")
    parser.add_argument("--ct2_batch_tokens", type=int, help="translate_iterable's max_batch_size (tokens)")
    parser.add_argument(
        "--ct2_budgets", type=int, nargs="+", help="step ct2_backend's --max_batch_tokens (default: its own)"
    )
    parser.add_argument(
        "--ct2_compute_types", nargs="+", default=["float32", "int8"], help="step ct2_backend's --compute_type"
    )
    parser.add_argument("--buffer_size", type=int, default=200, help="the command's --buffer_size (its default)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each row, interleaved; the median")
    parser.add_argument("--memory_lines", type=int, default=1_000_000, help="lines of the memory run (0: skip)")
    parser.add_argument("--skip", nargs="+", default=[], choices=STEPS, help="steps to leave out")
    parser.add_argument("--output", help="also write every figure (and the machine) to this JSON file")
    for hidden in ("--worker", "--worker_input", "--worker_output", "--model_dir", "--export", "--compute_type"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--ct2_workers", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ct2_batch_tokens is None:
        args.ct2_batch_tokens = DEFAULT_BUDGET // args.num_beams  # the command's default batches: budget / beams
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        (marian_worker if args.worker == "marian" else ctranslate2_worker)(args)
        return
    import torch

    torch.set_num_threads(args.threads)  # what machine() records: the engines' threads
    load_before = uptime()
    with tempfile.TemporaryDirectory(prefix="translate-corpus-") as work:
        bench = Bench(args, Path(work))
        print(f"{len(bench.lines)} lines, {bench.target_tokens} target tokens; model {bench.size}", flush=True)
        rows = bench.run_rows(first_rows(bench))
        flags = best_flags(rows)
        if "processes" not in args.skip and args.threads > 1:
            rows += process_rows(bench, flags)
        agreement(bench, rows)
        kill = None if "kill" in args.skip else kill_step(bench, flags, reference_run(rows, flags))
        memory = None if "memory" in args.skip or args.memory_lines <= 0 else memory_step(bench, flags)
        size = bench.size
    info, load_after = machine(), uptime()
    print(f"\n{describe_machine(info)}\nload before: {load_before}\nload after:  {load_after}")
    print(
        f"model: {'tiny' if args.tiny else 'opus-mt'} {size}; beam {args.num_beams}, {args.new_tokens} tokens a line"
    )
    print(f"{len(bench.lines)} lines of {CORPUS.name}, {bench.target_tokens} target tokens")
    if rows:
        print(f"\n{table(rows)}")
    for row in rows:
        if row["reported_target_tokens"] not in (None, row["target_tokens"]):
            print(
                f"note: {row['engine']} {row['settings']} reports {row['reported_target_tokens']} target tokens, not "
                f"lines x K = {row['target_tokens']} (special tokens are left out of its count, or it stopped early)"
            )
    if kill:
        print(
            f"\nkill -9 at {kill['chunks_done_at_kill']} of {kill['chunks']} chunks ({kill['settings']}): killed "
            f"{kill['killed_seconds']:.1f} s + resumed {kill['resumed_seconds']:.1f} s - uninterrupted "
            f"{kill['uninterrupted_seconds']:.1f} s = {kill['cost_seconds']:+.1f} s; {kill['chunks_resumed']} chunks "
            f"resumed, {kill['lines_translated_again']} lines translated again; same output: {kill['same_output']}"
        )
    if memory:
        runs = ", ".join(f"{run['lines']:,} lines {run['peak_rss_mb']:,.0f} MB" for run in memory["runs"])
        print(f"\npeak memory of the command (tiny model, {memory['settings']}): {runs}")
    if args.output:
        for row in rows:
            row.pop("command", None)
        report = {
            "machine": info,
            "load_before": load_before,
            "load_after": load_after,
            "model": size,
            "arguments": vars(args),
            "rows": rows,
            "kill": kill,
            "memory": memory,
        }
        Path(args.output).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
