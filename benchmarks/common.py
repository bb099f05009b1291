"""What several benchmarks share: the workloads of the speed benchmarks, our model as they build it, a seeded padded
batch, generation as they time it, glibc's malloc thresholds, the machine they ran on; and for the corpus and serving
benchmarks, the converted OPUS-MT-sized folders, Multi30k's lines, the processes' environment and memory.

Run from a checkout, `benchmarks/` is the script's folder and so on `sys.path`: `from common import padded_batch`
(the clock is in timing.py). The repository root must be on `sys.path` too, for the model's files.
"""

import argparse
import ctypes
import gzip
import itertools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil
import torch

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.serving.settings import DEFAULT_BATCH_TOKENS

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = ("torch", "transformers", "datasets", "ctranslate2")  # versions recorded where installed


@dataclass(frozen=True)
class Workload:
    vocab_size: int
    repetitions: int
    train_steps: int = 1  # optimizer steps per timed repetition
    # A training batch as the recipe's token batching makes them (sorted by length): 64 sentence pairs, sources of
    # nearly equal length, targets that vary; ~1900 target tokens. Lengths are drawn from these ranges (inclusive).
    train_batch: int = 64
    train_source_lengths: tuple[int, int] = (28, 32)
    train_target_lengths: tuple[int, int] = (24, 36)
    source_lengths: tuple[int, int] = (16, 32)  # generation sources
    new_tokens: int = 32  # output length of every generated sequence


WORKLOADS = {
    "small": Workload(vocab_size=8000, repetitions=5, train_steps=2),  # the recipe's CPU preset and vocabulary
    "base": Workload(vocab_size=37000, repetitions=5),  # the paper's base model and vocabulary size
}


def build_ours(preset: str, vocab_size: int) -> VanillaTransformerForConditionalGeneration:
    """Our model, seeded."""
    torch.manual_seed(0)
    return VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig.from_preset(preset, vocab_size=vocab_size)
    )


def random_lengths(batch: int, lengths: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    return torch.randint(lengths[0], lengths[1] + 1, (batch,), generator=generator)


def padded_batch(
    vocab_size: int, batch: int, source_lengths: tuple[int, int], target_lengths: tuple[int, int], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random right-padded (input_ids, attention_mask, labels), each sequence ending with </s> (id 2);
    padded to the longest sequence of the batch, labels padded with -100."""
    generator = torch.Generator().manual_seed(seed)
    source_lengths = random_lengths(batch, source_lengths, generator)
    target_lengths = random_lengths(batch, target_lengths, generator)
    source_positions = torch.arange(int(source_lengths.max()))
    target_positions = torch.arange(int(target_lengths.max()))
    input_ids = torch.randint(4, vocab_size, (batch, len(source_positions)), generator=generator)
    labels = torch.randint(4, vocab_size, (batch, len(target_positions)), generator=generator)
    input_ids[source_positions == source_lengths[:, None] - 1] = 2
    labels[target_positions == target_lengths[:, None] - 1] = 2
    attention_mask = (source_positions < source_lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = labels.masked_fill(target_positions >= target_lengths[:, None], -100)
    return input_ids, attention_mask, labels


def generation(model, batch, num_beams: int, new_tokens: int) -> Callable[[], None]:
    """A callable that generates exactly `new_tokens` tokens per source of `batch` (no end token)."""
    input_ids, attention_mask, _ = batch

    def generate() -> None:
        model.eval()
        output = model.generate(
            input_ids,
            attention_mask=attention_mask,
            num_beams=num_beams,
            do_sample=False,
            max_new_tokens=new_tokens,
            eos_token_id=None,  # no end token: exactly `new_tokens` tokens, no per-step logits processor
        )
        assert output.shape == (input_ids.shape[0], 1 + new_tokens), output.shape

    return generate


def fix_malloc_thresholds() -> None:
    """Keep freed memory in glibc's heap instead of unmapping it and page-faulting it back in on the next large
    allocation. glibc adapts these thresholds to the allocations it has seen, so without this the engines that run
    in one process change each other's speed; with it every engine runs with the same allocator. (The same as
    setting MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ in the environment.)"""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # from malloc.h
    libc.mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's maximum; larger allocations are still mapped
    libc.mallopt(m_trim_threshold, 2**30)


def machine() -> dict:
    """The machine and software a benchmark ran on, as recorded beside its results: cpu, cpus, threads (torch's),
    memory_gb, python, load (1/5/15-minute averages now) and the version of each of PACKAGES that is installed
    (read from its metadata: nothing is imported)."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        cpu = names[0] if names else cpu
    info = {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "load": os.getloadavg(),
    }
    for package in PACKAGES:
        try:
            info[package] = version(package)
        except PackageNotFoundError:
            pass
    return info


def describe_machine(info: dict) -> str:
    """A `machine()` dict in one line, e.g.
    "AMD EPYC, 2 CPUs, 2 threads, 23.5 GB; torch 2.13.0+cpu, transformers 5.24.0; Python 3.11.7"."""
    versions = ", ".join(f"{package} {info[package]}" for package in PACKAGES if package in info)
    return (
        f"{info['cpu']}, {info['cpus']} CPUs, {info['threads']} threads, {info['memory_gb']} GB; {versions}; "
        f"Python {info['python']}"
    )


class WorkerProcess:
    """A benchmark's engines in a process of their own (`python SCRIPT ARGUMENTS`), driven over a pipe: the worker
    prints "ready" once loaded, then does one piece of work per JSON line of stdin and prints "done". `work(*request)`
    gives a callable that has it do that work once and returns when it is done, so the main process can interleave
    and time it like its own engines (the pipe round trip is microseconds)."""

    def __init__(self, script: str, arguments: list[str]):
        command = [sys.executable, script, *arguments]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._expect("ready")

    def _expect(self, word: str) -> None:
        if (line := self.process.stdout.readline().strip()) != word:
            raise RuntimeError(f"worker: expected {word!r}, got {line!r} (exit code {self.process.poll()})")

    def work(self, *request) -> Callable[[], None]:
        def run() -> None:
            self.process.stdin.write(json.dumps(list(request)) + "\n")
            self.process.stdin.flush()
            self._expect("done")

        return run

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


# --- the corpus and serving benchmarks: the converted folders, the lines, the processes ---------------------------

SUMMARY = re.compile(r"translated (\d+) lines \((\d+) sentences, (\d+) target tokens\) in ([\d.]+) s")
CORPUS = ROOT.parent / "shared" / "data" / "multi30k" / "train.en.gz"
DEFAULT_BUDGET = DEFAULT_BATCH_TOKENS  # the command's default --max_batch_tokens


# converted_speed's `opus_mt_folder`, run in a process of its own rather than imported: pyproject's deptry
# known_first_party lists common, timing and gpu_training but not converted_speed, so an import here would fail
# tests/test_dependencies.py. The same process converts the folder.
BUILD = """
import json, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from converted_speed import SIZES, opus_mt_folder
from vanilla_transformer.converters.convert import convert
work = Path(sys.argv[3])
convert(opus_mt_folder(work / "marian", SIZES[sys.argv[4]]), work / "converted")
print(json.dumps(SIZES[sys.argv[4]]))
"""


def read_lines(path: str | Path, count: int | None = None) -> list[str]:
    """The first `count` lines of a text file (gzip by its suffix), without their line breaks."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as file:
        return [line.rstrip("\n") for line in itertools.islice(file, count)]


def write_lines(path: Path, lines, count: int | None = None) -> Path:
    with open(path, "w", encoding="utf-8") as file:
        file.writelines(line + "\n" for line in itertools.islice(lines, count))
    return path


def tree_rss(process: psutil.Process) -> int:
    """Bytes of RSS of a process and its children (shared pages counted in each)."""
    total = 0
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for member in members:
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def environment(threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1")
    return env | {"TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


def build_folders(work: Path, size_name: str, new_tokens: int, threads: int) -> tuple[dict, dict]:
    """The random MarianMTModel folder, its conversion, and the converted folder's fixed-length copy "ours"
    (no end token, no forced </s>) with its CTranslate2 export made here (the command's cache beside it), so no
    timed run makes it."""
    work.mkdir(parents=True)
    benchmarks = str(Path(__file__).resolve().parent)
    command = [sys.executable, "-c", BUILD, benchmarks, str(ROOT), str(work), size_name]
    built = subprocess.run(command, cwd=ROOT, env=environment(threads), capture_output=True, text=True)
    if built.returncode != 0:
        raise SystemExit(f"building the model folder failed:\n{built.stderr[-3000:]}")
    size = json.loads(built.stdout.strip().splitlines()[-1])
    folders = {"marian": work / "marian", "converted": work / "converted"}
    folders["ours"] = folders["ours_ct2"] = work / "ours"  # both backends read eos_token_id
    shutil.copytree(work / "converted", folders["ours"])
    path = folders["ours"] / "generation_config.json"
    generation = json.loads(path.read_text())
    generation["eos_token_id"] = None  # no end token: with --max_new_tokens K, exactly K new tokens (both backends)
    generation["forced_eos_token_id"] = None  # K ordinary tokens, as the other engines (no </s> forced last)
    path.write_text(json.dumps(generation, indent=2) + "\n")
    from vanilla_transformer.serving.ctranslate2_backend import cached_export

    folders["export"] = cached_export(folders["ours_ct2"])
    return size, folders


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def add_batch_arguments(parser: argparse.ArgumentParser, batches: int) -> None:
    """The arguments of the in-process benchmarks' batches (backend_batches.py, engine_scaling.py): --lines, --batches
    (default `batches`), --max_batch_tokens, --num_beams and --new_tokens."""
    parser.add_argument("--lines", type=int, default=256, help="lines of multi30k's train.en to batch")
    parser.add_argument("--batches", type=int, default=batches, help="the first this many of the command's batches")
    parser.add_argument("--max_batch_tokens", type=int, default=DEFAULT_BUDGET, help="as the command's")
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--new_tokens", type=int, default=24, help="tokens generated per line by every engine")


def first_batches(encode, args: argparse.Namespace) -> list[list[list[int]]]:
    """The command's first --batches batches (`token_batches` at --max_batch_tokens) of the first --lines lines of CORPUS,
    as token ids from `encode` (texts -> token ids)."""
    from vanilla_transformer.serving.batches import token_batches

    ids = encode(read_lines(CORPUS, args.lines))
    batches = token_batches([len(line) for line in ids], args.max_batch_tokens, None, args.num_beams)[: args.batches]
    return [[ids[index] for index in batch] for batch in batches]
