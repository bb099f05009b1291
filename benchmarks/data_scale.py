"""The data path at WMT scale on this machine: preparing, caching and memory-mapping a corpus of millions of pairs.

    python benchmarks/data_scale.py                                   # 1M and 4.5M pairs (long on 2 cores)
    python benchmarks/data_scale.py --pairs 20000 --vocab_size 8000   # end to end in ~1.5 minutes
    python benchmarks/data_scale.py --pairs 1000000 --skip_two_processes --throughput_seconds 60

For each corpus size N:

1. A synthetic corpus of N training pairs (plus 3000 validation and 3000 test pairs) shaped like WMT14 EN-DE is
   written as line-aligned `train.en`/`train.de`, `val.*`, `test.*` into `--work_dir/corpus_<N>/` (skipped when the
   files exist, so the prepared caches stay valid): words per sentence from a lognormal of mean ~25 clipped to
   1..150, the German side's count correlated with the English one, every sentence ending in " .", words drawn with
   Zipf-Mandelbrot frequencies from ~50k random lowercase words per language (frequent words short, some with a
   common suffix), so that BPE training and tokenization do real work.
2. `train_accelerate.py` is launched as a subprocess (one optimizer step of `--preset tiny`, `--logging_steps 1`)
   four times: `first launch` (a fresh `--data_cache_dir`: it prepares the corpus), `relaunch` (the same command,
   a new output folder), `second experiment` (the same cache, `--preset small --learning_rate_scale 2`) and
   `two processes, fresh cache` (`accelerate launch --multi_gpu --num_processes 2`: CPU processes with gloo, as
   tests/test_training.py launches them; one of them prepares while the other waits).
   Each launch is measured from its start to the first line of `train_log.jsonl` (written right after the first
   optimizer step); then its whole process tree is terminated (SIGTERM, SIGKILL after 3 s): the final evaluation
   is not measured. Meanwhile the process tree is polled every 0.25 s: peak RSS of each training process (the
   kernel's high-water mark VmHWM, exact between polls; the 2-process launch reports each worker, not the
   launcher), and every `--pss_interval` s its PSS (proportional set size: memory-mapped Arrow pages that several
   processes share count once in total, while RSS counts them in full in each) and the PSS of the whole tree
   (launcher and tokenizing workers included). For fresh caches it also reports how often `[prepare] prepared`
   was printed (1 with two processes) and the preparation's seconds (from the prepared folder's manifest).
3. Input pipeline throughput without a model: the prepared folder is loaded (`prepare.load_prepared`) and the
   stream of `optimizer_step_batches` (TokenBatchSampler with max_tokens 4096, TranslationCollator) iterated for
   `--throughput_seconds` after its first step; reports target tokens per second, and the sampler's time to cut
   the batches (once per process) and to build one epoch's shuffled batch list (once per epoch).

Prints a markdown table and writes everything to `<work_dir>/data_scale_results.json` (after each size). Launch
logs are kept in `<work_dir>/runs/<N>/<launch>/launch.log` (checkpoints are deleted). Linux only (/proc).
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the shared timing and common modules
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from common import describe_machine, machine  # noqa: E402
from timing import Stopwatch, timed  # noqa: E402

from vanilla_transformer.data import prepare  # noqa: E402
from vanilla_transformer.data.batching import (  # noqa: E402
    DataPosition,
    TokenBatchSampler,
    TokenizedPairs,
    TranslationCollator,
)
from vanilla_transformer.training.steps import count_target_tokens, optimizer_step_batches  # noqa: E402

MB = 2**20
HELD_OUT_PAIRS = 3000  # validation and test pairs each
CHUNK_PAIRS = 50_000  # pairs generated and written at a time
POLL_SECONDS = 0.25
KILL_GRACE_SECONDS = 3.0
PREPARED = re.compile(r"\[prepare\] prepared (\S+) in (\d+) s")
PREPARED_CORPUS = re.compile(r"\[data\] prepared corpus: (\S+)")
# Lines of train_accelerate.py's output that end a phase: prepared (fresh cache only), memory-mapped, batches cut
# (TokenizedPairs, TokenBatchSampler, padding statistics), model built.
MILESTONES = {
    "prepared": "[prepare] prepared ",
    "corpus_loaded": "[data] prepared corpus: ",
    "batches_cut": " batches per process per epoch",
    "model_built": "[model] ",
}


@dataclass(frozen=True)
class Language:
    """How one side's synthetic words look: mean letters per word (before suffixes) and common suffixes."""

    code: str
    mean_letters: float
    suffixes: tuple[str, ...]


ENGLISH = Language("en", 7.0, ("s", "ed", "ing", "ly", "er", "tion", "ness", "ment", "able", "es"))
GERMAN = Language("de", 8.5, ("en", "er", "ung", "e", "es", "lich", "keit", "heit", "ten", "st", "chen", "isch"))
TARGET_WORD_RATIO = 0.93  # German sentences have slightly fewer (longer) words


@dataclass(frozen=True)
class Launch:
    name: str
    cache: str  # the cache folder's name (per size): launches with the same one share it
    preset_args: tuple[str, ...]
    processes: int = 1
    fresh_cache: bool = False


LAUNCHES = (
    Launch("first launch", "single", ("--preset", "tiny"), fresh_cache=True),
    Launch("relaunch", "single", ("--preset", "tiny")),
    Launch("second experiment", "single", ("--preset", "small", "--learning_rate_scale", "2")),
    Launch("two processes, fresh cache", "two", ("--preset", "tiny"), processes=2, fresh_cache=True),
)


# --- 1. a WMT-like synthetic corpus ------------------------------------------------------------------------------


@dataclass
class Vocabulary:
    """Words stored back to back, each followed by a space, in one byte buffer; id `period` is "."."""

    buffer: np.ndarray  # uint8
    starts: np.ndarray  # int64, a word's first byte
    lengths: np.ndarray  # int64, without the space
    cdf: np.ndarray  # cumulative Zipf-Mandelbrot frequencies of the words (not of the period)
    period: int


def make_vocabulary(rng: np.random.Generator, language: Language, size: int) -> Vocabulary:
    """`size` distinct random lowercase words with skewed letter frequencies, the frequent ones mostly short (lengths
    sorted by rank, with noise); a third of the rarer words end in a common suffix, which gives BPE shared subwords
    to find. A word that exists already gets random letters appended until it is new."""
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz"))[rng.permutation(26)]
    letter_p = 1 / np.arange(1, 27) ** 0.9
    lengths = 1 + rng.poisson(language.mean_letters - 1, size)
    lengths = lengths[np.argsort(lengths + rng.normal(0, 3, size), kind="stable")]
    pool = "".join(rng.choice(alphabet, size=int(lengths.sum()) + 10 * size, p=letter_p / letter_p.sum()))
    suffixed = rng.random(size) < 0.33
    suffixes = rng.integers(len(language.suffixes), size=size)
    words, seen, cursor = [], set(), 0
    for rank, length in enumerate(lengths.tolist()):
        word, cursor = pool[cursor : cursor + length], cursor + length
        if rank >= 200 and suffixed[rank]:
            word += language.suffixes[suffixes[rank]]
        while word in seen:
            word, cursor = word + pool[cursor], cursor + 1
        seen.add(word)
        words.append(word)
    words.append(".")
    encoded = [word.encode("ascii") + b" " for word in words]
    word_lengths = np.array([len(word) - 1 for word in encoded], dtype=np.int64)
    frequencies = 1 / (np.arange(size) + 2.7) ** 1.0  # Zipf-Mandelbrot
    return Vocabulary(
        buffer=np.frombuffer(b"".join(encoded), dtype=np.uint8),
        starts=np.concatenate([[0], np.cumsum(word_lengths + 1)[:-1]]),
        lengths=word_lengths,
        cdf=np.cumsum(frequencies) / frequencies.sum(),
        period=size,
    )


def sentence_lengths(rng: np.random.Generator, pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """Words per source and target sentence (without the final period): lognormal, mean ~25, 1..150, correlated."""
    sigma = 0.6
    source = np.clip(np.rint(rng.lognormal(np.log(25) - sigma**2 / 2, sigma, pairs)), 1, 150)
    target = np.clip(np.rint(source * TARGET_WORD_RATIO * rng.lognormal(0.0, 0.15, pairs)), 1, 150)
    return source.astype(np.int64), target.astype(np.int64)


def render_lines(rng: np.random.Generator, vocabulary: Vocabulary, words_per_line: np.ndarray) -> bytes:
    """Lines of Zipf-distributed words ending in " .\\n", built with one vectorised gather from the word buffer."""
    tokens_per_line = words_per_line + 1
    line_ends = np.cumsum(tokens_per_line) - 1  # the period's token position
    word_ids = np.searchsorted(vocabulary.cdf, rng.random(int(tokens_per_line.sum())), side="right")
    word_ids = np.minimum(word_ids, vocabulary.period - 1)
    word_ids[line_ends] = vocabulary.period
    sizes = vocabulary.lengths[word_ids] + 1  # each word and the space (or newline) after it
    ends = np.cumsum(sizes)
    shift = np.repeat(vocabulary.starts[word_ids] - (ends - sizes), sizes)
    text = vocabulary.buffer[np.arange(int(ends[-1]), dtype=np.int64) + shift]
    text[ends[line_ends] - 1] = ord("\n")
    return text.tobytes()


def write_split(folder: Path, split: str, pairs: int, rng: np.random.Generator, vocabularies: dict) -> None:
    """`{split}.en` and `{split}.de`, written under temporary names and renamed when complete."""
    temporary = {code: folder / f"{split}.{code}.incomplete" for code in vocabularies}
    files = {code: path.open("wb") for code, path in temporary.items()}
    try:
        for begin in range(0, pairs, CHUNK_PAIRS):
            source_words, target_words = sentence_lengths(rng, min(CHUNK_PAIRS, pairs - begin))
            files["en"].write(render_lines(rng, vocabularies["en"], source_words))
            files["de"].write(render_lines(rng, vocabularies["de"], target_words))
    finally:
        for file in files.values():
            file.close()
    for code, path in temporary.items():
        os.replace(path, folder / f"{split}.{code}")


def ensure_corpus(folder: Path, pairs: int, seed: int, vocabulary_size: int) -> float | None:
    """Write the corpus of `pairs` training pairs into `folder` unless it is there; returns the seconds it took
    (None when skipped)."""
    splits = {"train": pairs, "val": HELD_OUT_PAIRS, "test": HELD_OUT_PAIRS}
    if all((folder / f"{split}.{code}").is_file() for split in splits for code in ("en", "de")):
        return None
    stopwatch = Stopwatch()
    folder.mkdir(parents=True, exist_ok=True)
    vocabularies = {
        language.code: make_vocabulary(np.random.default_rng([seed, index]), language, vocabulary_size)
        for index, language in enumerate((ENGLISH, GERMAN))
    }
    for index, (split, count) in enumerate(splits.items()):
        write_split(folder, split, count, np.random.default_rng([seed, 100 + index]), vocabularies)
    return stopwatch.seconds()


def corpus_statistics(folder: Path) -> dict:
    """Size and words per line of the training files (a check that the generator does what it says)."""
    statistics = {}
    for code in ("en", "de"):
        path = folder / f"train.{code}"
        with path.open("rb") as file:
            head = [len(line.split()) - 1 for _, line in zip(range(20000), file, strict=False)]
        statistics[code] = {
            "mb": round(path.stat().st_size / MB, 1),
            "mean_words_first_20k": round(float(np.mean(head)), 1),
        }
    return statistics


# --- 2. launches of train_accelerate.py ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_command(launch: Launch, args, corpus: Path, cache: Path, output_dir: Path) -> list[str]:
    if launch.processes > 1:
        one_machine = "--num_machines 1 --mixed_precision no --dynamo_backend no".split()
        launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"]
        launcher += ["--num_processes", str(launch.processes), *one_machine, "--main_process_port", str(free_port())]
    else:
        launcher = [sys.executable]
    data = ["--data_dir", str(corpus), *"--source_lang en --target_lang de".split()]
    data += "--validation_split val --test_split test".split()
    sizes = ["--vocab_size", str(args.vocab_size), "--max_tokens", str(args.max_tokens), "--max_steps", "1"]
    workers = ["--logging_steps", "1", "--preprocessing_num_workers", str(args.preprocessing_num_workers)]
    folders = ["--data_cache_dir", str(cache), "--output_dir", str(output_dir)]
    return [*launcher, "train_accelerate.py", *data, *launch.preset_args, *sizes, *workers, *folders]


def resident_high_water(process: psutil.Process) -> int:
    """The kernel's peak resident set of a process (VmHWM), or its current RSS where /proc does not say."""
    try:
        match = re.search(r"^VmHWM:\s+(\d+) kB", Path(f"/proc/{process.pid}/status").read_text(), re.MULTILINE)
    except OSError:
        match = None
    return int(match.group(1)) * 1024 if match else process.memory_info().rss


class TreeMemory:
    """Peak memory of a launch's process tree, polled. Training processes run `train_accelerate.py` and are not the
    `accelerate launch` process nor a fork of another training process (the tokenizing workers of `Dataset.map`);
    each is named by its RANK."""

    def __init__(self, root_pid: int, pss_interval: float):
        self.root = psutil.Process(root_pid)
        self.pss_interval = pss_interval
        self.labels: dict[int, str] = {}
        self.peak_rss: dict[str, int] = {}
        self.peak_pss: dict[str, int] = {}
        self.peak_tree_rss = self.peak_tree_pss = 0
        self._last_pss = -float("inf")

    def _label(self, process: psutil.Process) -> str | None:
        """The training process's name, or None; only names are remembered, because a process that torchrun has
        just forked still has the launcher's command line until it runs the training script."""
        if process.pid not in self.labels:
            command = process.cmdline()
            parent = process.parent()
            forked = parent is not None and parent.pid != os.getpid() and parent.cmdline() == command
            is_training = "train_accelerate.py" in " ".join(command) and "accelerate.commands.launch" not in command
            if not is_training or forked:
                return None
            self.labels[process.pid] = f"rank {process.environ().get('RANK', '0')}"
        return self.labels[process.pid]

    def poll(self, force_pss: bool = False) -> None:
        with_pss = self.pss_interval > 0 and (force_pss or time.monotonic() - self._last_pss >= self.pss_interval)
        tree_rss = tree_pss = 0
        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        for process in processes:
            try:
                label = self._label(process)
                tree_rss += process.memory_info().rss
                if label:
                    self.peak_rss[label] = max(self.peak_rss.get(label, 0), resident_high_water(process))
                if with_pss:
                    pss = process.memory_full_info().pss
                    tree_pss += pss
                    if label:
                        self.peak_pss[label] = max(self.peak_pss.get(label, 0), pss)
            except psutil.Error:  # gone, or a zombie, between listing and reading
                continue
        self.peak_tree_rss = max(self.peak_tree_rss, tree_rss)
        if with_pss:
            self.peak_tree_pss, self._last_pss = max(self.peak_tree_pss, tree_pss), time.monotonic()

    def summary(self) -> dict:
        def megabytes(values: dict) -> dict:
            return {label: round(value / MB) for label, value in sorted(values.items())}

        return {
            "peak_rss_mb": megabytes(self.peak_rss),
            "peak_pss_mb": megabytes(self.peak_pss),
            "tree_peak_rss_mb": round(self.peak_tree_rss / MB),
            "tree_peak_pss_mb": round(self.peak_tree_pss / MB) if self.pss_interval > 0 else None,
        }


def has_first_line(log_file: Path) -> bool:
    try:
        return b"\n" in log_file.read_bytes()
    except FileNotFoundError:
        return False


def terminate_tree(process: subprocess.Popen) -> None:
    """SIGTERM to the launched process and all its descendants, SIGKILL to those alive after a grace period."""
    try:
        root = psutil.Process(process.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for member in tree:
        try:
            member.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=KILL_GRACE_SECONDS)
    for member in alive:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=KILL_GRACE_SECONDS)
    process.wait()


class LogMilestones:
    """Seconds from the launch until each of `MILESTONES` first appears in the launch's output (unbuffered)."""

    def __init__(self, log_path: Path, stopwatch: Stopwatch):
        self.log_path, self.stopwatch = log_path, stopwatch
        self.offset, self.tail, self.seen = 0, "", {}

    def update(self) -> None:
        with self.log_path.open("rb") as log:
            log.seek(self.offset)
            new = log.read()
        self.offset += len(new)
        text = self.tail + new.decode("utf-8", errors="replace")
        for name, marker in MILESTONES.items():
            if name not in self.seen and marker in text:
                self.seen[name] = round(self.stopwatch.seconds(), 1)
        self.tail = text[-200:]


def watch(
    process: subprocess.Popen, train_log: Path, memory: TreeMemory, milestones: LogMilestones, timeout: float
) -> tuple[float | None, str]:
    """Poll until the first training-log line, the process's exit or the timeout; returns (seconds, outcome)."""
    while True:
        memory.poll()
        milestones.update()
        elapsed = milestones.stopwatch.seconds()
        if has_first_line(train_log):
            memory.poll(force_pss=True)
            milestones.update()
            return elapsed, "first step"
        if process.poll() is not None:
            return None, f"exited with code {process.returncode} before the first step"
        if elapsed > timeout:
            return None, f"no first step after {timeout:.0f} s"
        time.sleep(POLL_SECONDS)


def folder_megabytes(folder: Path) -> float:
    """Space on disk (allocated blocks) of every file under `folder`."""
    blocks = sum(path.stat().st_blocks for path in folder.rglob("*") if path.is_file())
    return round(blocks * 512 / MB, 1)


def prepared_details(text: str, cache: Path) -> dict:
    """From a launch's output: how often it prepared, the folder it used, and that folder's manifest figures."""
    preparations = PREPARED.findall(text)
    used = PREPARED_CORPUS.findall(text)
    folder = Path(used[-1]) if used else None
    details = {"prepare_count": len(preparations), "prepared_folder": str(folder) if folder else None}
    if folder and (folder / prepare.MANIFEST).is_file():
        manifest = json.loads((folder / prepare.MANIFEST).read_text())
        details["manifest_prepared_seconds"] = manifest.get("prepared_seconds")
        details["train_report"] = manifest["reports"]["train"]
        details["cache_mb"] = folder_megabytes(folder)
    details["cache_dir_mb"] = folder_megabytes(cache) if cache.is_dir() else None
    return details


def run_launch(launch: Launch, args, corpus: Path, cache: Path, output_dir: Path) -> dict:
    """Launch training, measure until its first optimizer step, terminate it; returns the measurements."""
    if launch.fresh_cache:
        shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(output_dir, ignore_errors=True)
    output_dir.mkdir(parents=True)
    run_dir = output_dir / "run"  # the training's own folder: it refuses one that already holds files (launch.log)
    command = launch_command(launch, args, corpus, cache, run_dir)
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    log_path = output_dir / "launch.log"
    with log_path.open("wb") as log:
        stopwatch = Stopwatch()
        process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT)
        try:
            memory, milestones = TreeMemory(process.pid, args.pss_interval), LogMilestones(log_path, stopwatch)
            seconds, outcome = watch(process, run_dir / "train_log.jsonl", memory, milestones, args.launch_timeout)
        finally:
            terminate_tree(process)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the final checkpoint it may have saved
    text = log_path.read_text(errors="replace")
    result = {
        "launch": launch.name,
        "processes": launch.processes,
        "command": command,
        "outcome": outcome,
        "seconds_to_first_step": None if seconds is None else round(seconds, 1),
        "seconds_to": milestones.seen,
        **memory.summary(),
        **prepared_details(text, cache),
        "log": str(log_path),
    }
    if launch.fresh_cache and result["prepare_count"] and result.get("manifest_prepared_seconds") is not None:
        result["prepare_seconds"] = result["manifest_prepared_seconds"]
    if seconds is None:
        print(f"  {launch.name}: {outcome}; the end of {log_path}:\n{text[-3000:]}", file=sys.stderr)
    return result


# --- 3. the input pipeline without a model ------------------------------------------------------------------------


def load_training_pairs(folder: Path) -> tuple[prepare.PreparedCorpus, TokenizedPairs]:
    corpus = prepare.load_prepared(folder)
    return corpus, TokenizedPairs(corpus.splits["train"])


def pipeline_throughput(folder: Path, seconds: float, max_tokens: int) -> dict:
    """Target tokens per second that `optimizer_step_batches` delivers from a prepared folder (one process), and
    the sampler's set-up times."""
    (corpus, examples), load_seconds = timed(lambda: load_training_pairs(folder))
    sampler, cut_seconds = timed(
        lambda: TokenBatchSampler(examples.source_lengths, examples.target_lengths, max_tokens=max_tokens, seed=1)
    )
    sampler.set_epoch(0)
    epoch_batches, epoch_seconds = timed(lambda: len(sampler.epoch_batches()))
    collator = TranslationCollator(corpus.tokenizer.pad_token_id)
    steps = optimizer_step_batches(sampler, collator, examples, 1, DataPosition(), max_epochs=None)
    next(steps)  # the first epoch's sampler set-up
    tokens = sentences = batches = 0
    position, stopwatch = DataPosition(), Stopwatch()
    while (elapsed := stopwatch.seconds()) < seconds:
        step_batches, position = next(steps)
        for batch in step_batches:
            tokens += count_target_tokens(batch)
            sentences += len(batch["labels"])
            batches += 1
    return {
        "pairs": len(examples),
        "load_seconds": round(load_seconds, 2),
        "sampler_cut_seconds": round(cut_seconds, 2),
        "sampler_epoch_seconds": round(epoch_seconds, 3),
        "batches_per_epoch": epoch_batches,
        "seconds": round(elapsed, 1),
        "batches": batches,
        "epochs_reached": position.epoch,
        "target_tokens_per_second": round(tokens / elapsed),
        "sentences_per_second": round(sentences / elapsed),
        "batches_per_second": round(batches / elapsed, 1),
    }


# --- report ------------------------------------------------------------------------------------------------------


def per_process(values: dict) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{next(iter(values.values())):,}"
    return " / ".join(f"{value:,} (r{label.split()[-1]})" for label, value in values.items())


def cell(value, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown_table(sizes: dict) -> str:
    lines = [
        "| pairs | launch | s to first step | s to batches cut | peak RSS MB per process | "
        "peak PSS MB per process | tree peak PSS MB | prepare s | prepare count | cache MB |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pairs, size in sizes.items():
        for row in size["launches"]:
            first_step = cell(row["seconds_to_first_step"], 1) if row["seconds_to_first_step"] else row["outcome"]
            lines.append(
                f"| {int(pairs):,} | {row['launch']} | {first_step} | "
                f"{cell(row['seconds_to'].get('batches_cut'), 1)} | {per_process(row['peak_rss_mb'])} | "
                f"{per_process(row['peak_pss_mb'])} | {cell(row['tree_peak_pss_mb'])} | "
                f"{cell(row.get('prepare_seconds'), 1)} | {row['prepare_count']} | "
                f"{cell(row.get('cache_mb'), 1)} |"
            )
    return "\n".join(lines)


def throughput_lines(sizes: dict) -> str:
    lines = []
    for pairs, size in sizes.items():
        t = size.get("pipeline")
        if t:
            lines.append(
                f"- {int(pairs):,} pairs ({t['pairs']:,} kept): {t['target_tokens_per_second']:,} target "
                f"tokens/s, {t['batches_per_second']} batches/s over {t['seconds']} s; load "
                f"{t['load_seconds']} s, sampler: cut batches {t['sampler_cut_seconds']} s, one epoch's "
                f"{t['batches_per_epoch']:,} batches {t['sampler_epoch_seconds']} s"
            )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, nargs="+", default=[1_000_000, 4_500_000], help="training pairs")
    parser.add_argument("--work_dir", default="outputs/data_scale", help="corpora, caches, runs and results")
    parser.add_argument("--skip_two_processes", action="store_true", help="no 2-process launch")
    parser.add_argument("--throughput_seconds", type=float, default=20.0, help="input pipeline timing per size")
    parser.add_argument("--vocab_size", type=int, default=37000, help="the BPE vocabulary (paper: 37000)")
    parser.add_argument("--max_tokens", type=int, default=4096)
    parser.add_argument("--preprocessing_num_workers", type=int, default=2)
    parser.add_argument("--word_types", type=int, default=50_000, help="synthetic words per language")
    parser.add_argument("--seed", type=int, default=0, help="of the synthetic corpus")
    parser.add_argument("--pss_interval", type=float, default=1.0, help="seconds between PSS polls; 0: no PSS")
    parser.add_argument("--launch_timeout", type=float, default=4 * 3600, help="seconds to wait for a first step")
    return parser.parse_args(argv)


def measure_size(pairs: int, args, work_dir: Path) -> dict:
    corpus = work_dir / f"corpus_{pairs}"
    generation_seconds = ensure_corpus(corpus, pairs, args.seed, args.word_types)
    generated = "existing files" if generation_seconds is None else f"generated in {generation_seconds:.1f} s"
    print(f"[{pairs:,} pairs] corpus {corpus}: {generated}", flush=True)
    launches = [launch for launch in LAUNCHES if not (args.skip_two_processes and launch.processes > 1)]
    results = []
    for launch in launches:
        cache = work_dir / f"cache_{pairs}_{launch.cache}"
        output_dir = work_dir / "runs" / str(pairs) / launch.name.replace(",", "").replace(" ", "_")
        results.append(run_launch(launch, args, corpus, cache, output_dir))
        row = results[-1]
        print(
            f"[{pairs:,} pairs] {launch.name}: {row['outcome']} after {row['seconds_to_first_step']} s, "
            f"peak RSS MB {row['peak_rss_mb']}, PSS MB {row['peak_pss_mb']}",
            flush=True,
        )
    prepared = next((row["prepared_folder"] for row in results if row.get("prepared_folder")), None)
    pipeline = pipeline_throughput(Path(prepared), args.throughput_seconds, args.max_tokens) if prepared else None
    return {
        "corpus": str(corpus),
        "generation_seconds": generation_seconds,
        "corpus_files": corpus_statistics(corpus),
        "launches": results,
        "pipeline": pipeline,
    }


def main() -> None:
    args = parse_args()
    work_dir = Path(args.work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine(), "settings": vars(args), "sizes": {}}
    results_file = work_dir / "data_scale_results.json"
    for pairs in args.pairs:
        results["sizes"][str(pairs)] = measure_size(pairs, args, work_dir)
        results_file.write_text(json.dumps(results, indent=2))
    print(
        f"\n{describe_machine(results['machine'])}; vocabulary {args.vocab_size}, "
        f"{args.preprocessing_num_workers} tokenizing workers\n"
    )
    print(markdown_table(results["sizes"]))
    print(f"\nInput pipeline without a model (one process, max_tokens {args.max_tokens}):")
    print(throughput_lines(results["sizes"]))
    print(f"\nwritten to {results_file}")


if __name__ == "__main__":
    main()
