"""The model backend against CTranslate2 float32, engine against engine at each way of using 2 cores: where the gap
between them is (per decoder step, or the encoder) and which of them gains more from the second core.

Each engine runs in a process of its own (`common.WorkerProcess`: CTranslate2 in a PyTorch process changes speed),
both idle while the other works, on the same batches: `token_batches` at --max_batch_tokens over the first --lines lines of
../shared/data/multi30k/train.en.gz, the first --batches of them, tokenized by the folder's tokenizer. The model is
benchmarks/translate_corpus.py's OPUS-MT-sized random model with its fixed length (`--tiny`: its tiny size); every
engine generates exactly --new_tokens tokens a line at beam --num_beams. Ways, each timed --rounds times alternating
with the other engine's, the best kept:

  1 thread        the batches one after the other on one thread (backend: `ModelBackend.translate`; CTranslate2:
                  `translate_batch`, intra_threads 1), at --new_tokens tokens and at 2: the difference over
                  --new_tokens - 2 steps is the engine's time per decoder step of a batch, what is left at 2 tokens its
                  encoder, first steps, tokenizer and one step
  2 threads       the batches on one worker of two threads (torch's threads; intra_threads 2)
  2 workers       twice the batches on two workers of one thread each, two batches at once (`ModelBackend(threads=2)`,
                  as the translate command runs on 2 cores; inter_threads 2, intra_threads 1)

The table gives each way's speed against the same engine's one thread (2 workers: twice the work, so 2 x the one-
thread seconds over its own) and the backend's against CTranslate2's. The backend's text is the same in every way
(checked).

Usage:
    python benchmarks/engine_scaling.py                               # OPUS-MT size, 4 batches, 2 rounds (~8 min)
    python benchmarks/engine_scaling.py --tiny --lines 64 --batches 2 --rounds 1   # checks that the script runs
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from common import WorkerProcess, add_batch_arguments, build_folders, describe_machine, first_batches, machine  # noqa: E402
from timing import timed  # noqa: E402

ENGINES = ("backend", "ctranslate2")
WAYS = ("1 thread", "1 thread, 2 tokens", "2 threads", "2 workers")


def engine_ways(args: argparse.Namespace) -> dict:
    """This worker's engine: for each way, a callable that translates the batches (twice them for 2 workers) and
    returns the texts or tokens."""
    return backend_ways(args) if args.worker == "backend" else ctranslate2_ways(args)


def backend_ways(args: argparse.Namespace) -> dict:
    """The ways of the model backend (`ModelBackend`), which returns texts."""
    import torch

    from vanilla_transformer.mechanics.memory import keep_freed_memory
    from vanilla_transformer.model.decoding import ModelBackend
    from vanilla_transformer.serving.translate import load_model_and_tokenizer

    keep_freed_memory()  # as the command's backend does
    model, tokenizer = load_model_and_tokenizer(args.model_dir)
    batches = first_batches(lambda texts: tokenizer(texts, verbose=False)["input_ids"], args)
    one = ModelBackend(model, tokenizer, args.num_beams, args.new_tokens)
    short = ModelBackend(model, tokenizer, args.num_beams, 2)
    workers = ModelBackend(model, tokenizer, args.num_beams, args.new_tokens, threads=2)

    def sequential(backend, threads):
        torch.set_num_threads(threads)
        return [text for batch in batches for text in backend.translate(batch)[0]]

    return {
        "1 thread": lambda: sequential(one, 1),
        "1 thread, 2 tokens": lambda: sequential(short, 1),
        "2 threads": lambda: sequential(one, 2),
        "2 workers": lambda: [text for texts, _ in workers.translate_batches(batches + batches) for text in texts],
    }


def ctranslate2_ways(args: argparse.Namespace) -> dict:
    """The ways of CTranslate2 float32 on the export, which returns tokens."""
    import ctranslate2

    from vanilla_transformer.data.tokenization import load_tokenizer

    tokenizer = load_tokenizer(args.model_dir)
    batches = first_batches(lambda texts: tokenizer(texts, verbose=False)["input_ids"], args)
    sources = [[tokenizer.convert_ids_to_tokens(line) for line in batch] for batch in batches]
    settings = dict(beam_size=args.num_beams, end_token=[], max_input_length=0)
    one, two = (ctranslate2.Translator(args.export, intra_threads=threads) for threads in (1, 2))
    workers = ctranslate2.Translator(args.export, intra_threads=1, inter_threads=2)

    def sequential(translator, tokens):
        return [
            result.hypotheses[0]
            for batch in sources
            for result in translator.translate_batch(batch, max_decoding_length=tokens, **settings)
        ]

    def two_at_once():
        pending = [
            workers.translate_batch(batch, asynchronous=True, max_decoding_length=args.new_tokens, **settings)
            for batch in sources + sources
        ]
        return [result.result().hypotheses[0] for batch in pending for result in batch]

    return {
        "1 thread": lambda: sequential(one, args.new_tokens),
        "1 thread, 2 tokens": lambda: sequential(one, 2),
        "2 threads": lambda: sequential(two, args.new_tokens),
        "2 workers": two_at_once,
    }


def worker(args: argparse.Namespace) -> None:
    """A WorkerProcess: each request [way] runs that way once; the backend checks that its text stays the same."""
    ways = engine_ways(args)
    texts = {}
    for way in ways.values():  # first calls (the weights' layout, the workers' threads) out of the times
        way()
    print("ready", flush=True)
    for line in sys.stdin:
        (way,) = json.loads(line)
        output = ways[way]()
        if args.worker == "backend":
            once = output[: len(output) // 2] if way == "2 workers" else output  # the batches' texts, once
            if texts.setdefault(way == "1 thread, 2 tokens", once) != once:
                raise SystemExit(f"the backend's text changed with {way}")
        print("done", flush=True)


def measure(processes: dict, rounds: int) -> dict:
    """Each (engine, way)'s best seconds over `rounds`, the engines alternating (and their order every other time)."""
    best = {(engine, way): float("inf") for engine in ENGINES for way in WAYS}
    for round_ in range(rounds):
        for index, way in enumerate(WAYS):
            for engine in ENGINES if (round_ + index) % 2 == 0 else ENGINES[::-1]:
                seconds = timed(processes[engine].work(way))[1]
                best[engine, way] = min(best[engine, way], seconds)
        print(f"round {round_ + 1}: " + ", ".join(f"{e} {w} {s:.2f} s" for (e, w), s in best.items()), flush=True)
    return best


def table(best: dict, args: argparse.Namespace) -> str:
    """The markdown table: seconds, each way's speed against its engine's one thread, the backend's against
    CTranslate2's, and the time per decoder step."""

    def against_one_thread(engine: str, way: str) -> str:
        work = 2 if way == "2 workers" else 1  # twice the batches
        return "" if way.startswith("1 thread") else f"{work * best[engine, '1 thread'] / best[engine, way]:.2f}x"

    lines = [
        "| way | backend (s) | vs its 1 thread | CTranslate2 (s) | vs its 1 thread | backend vs CTranslate2 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for way in WAYS:
        ours, theirs = best["backend", way], best["ctranslate2", way]
        lines.append(
            f"| {way} | {ours:.2f} | {against_one_thread('backend', way)} | {theirs:.2f} | "
            f"{against_one_thread('ctranslate2', way)} | {theirs / ours:.2f}x |"
        )
    steps = args.batches * (args.new_tokens - 2)
    ours, theirs = ((best[e, "1 thread"] - best[e, "1 thread, 2 tokens"]) / steps * 1e3 for e in ENGINES)
    lines.append(
        f"| 1 thread: a decoder step of a batch (ms) | {ours:.1f} | | {theirs:.1f} | | {theirs / ours:.2f}x |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_arguments(parser, batches=4)
    parser.add_argument("--rounds", type=int, default=2, help="times each way is timed per engine; the best")
    parser.add_argument("--tiny", action="store_true", help="a tiny model: checks that the script runs")
    for hidden in ("--worker", "--model_dir", "--export"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.worker:
        return worker(args)
    if args.new_tokens < 3:
        parser.error("--new_tokens must be 3 or more: a step's time is the difference from 2 tokens")
    print(describe_machine(machine()))
    with tempfile.TemporaryDirectory() as work:
        _, folders = build_folders(Path(work) / "model", "tiny" if args.tiny else "opus-mt", args.new_tokens, 2)
        shared = [
            a
            for name in ("lines", "batches", "max_batch_tokens", "num_beams", "new_tokens")
            for a in (f"--{name}", str(getattr(args, name)))
        ]
        shared += ["--model_dir", str(folders["ours"]), "--export", str(folders["export"])]
        processes = {engine: WorkerProcess(__file__, ["--worker", engine, *shared]) for engine in ENGINES}
        try:
            best = measure(processes, args.rounds)
        finally:
            for process in processes.values():
                process.close()
    print(table(best, args))


if __name__ == "__main__":
    main()
