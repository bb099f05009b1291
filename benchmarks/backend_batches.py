"""The translate command's model backend against CTranslate2 float32 on the very same batches, in one process.

This machine's whole runs move 10-30% from one run to the next (docs/BENCHMARKS.md), more than most single changes
gain. Here every batch is timed --rounds times, by every row one after the other (in reversed order every other
batch, so that a drift of the machine's speed falls on all rows alike), and each row's figure is the sum over the
batches of each batch's best time: what a change to the backend gains, measured against CTranslate2 beside it.

The batches are the command's: `token_batches` at --max_batch_tokens (the command's default budget) over the first --lines
lines of ../shared/data/multi30k/train.en.gz, tokenized by the folder's tokenizer. The model is
benchmarks/translate_corpus.py's OPUS-MT-sized random model (`--tiny`: its tiny size) with its fixed length: every
engine generates --new_tokens tokens a line at beam --num_beams. Rows:

  ctranslate2     the folder's CTranslate2 export, float32, `translate_batch` with the same beam and length, one
                  worker of --threads threads
  backend         `ModelBackend.translate`, as the command runs it
  plain weights   the same with each oneDNN linear given its plain weight, not its copy in oneDNN's own layout
                  (vanilla_transformer/model/onednn.py): what that copy gains
  generate()'s search  the backend with transformers' own beam search, not model/beam_search.py's: what that gains

The backend rows must give the same text (checked).

Usage:
    python benchmarks/backend_batches.py                        # OPUS-MT size, 256 lines, 6 batches, 3 rounds
    python benchmarks/backend_batches.py --tiny --lines 64 --batches 2 --rounds 1   # checks that the script runs
"""

import argparse
import functools
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from common import add_batch_arguments, build_folders, describe_machine, first_batches, machine  # noqa: E402
from timing import timed  # noqa: E402


def rows(folders: dict, args: argparse.Namespace) -> tuple[dict, list]:
    """The rows' callables (each translates one batch of token ids) and the batches."""
    import ctranslate2
    import torch

    from vanilla_transformer.model.decoding import ModelBackend
    from vanilla_transformer.model.onednn import OneDNNLinear
    from vanilla_transformer.serving.translate import load_model_and_tokenizer

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer(folders["ours"])
    backend = ModelBackend(model, tokenizer, args.num_beams, args.new_tokens)
    batches = first_batches(backend.encode, args)
    translator = ctranslate2.Translator(str(folders["export"]), compute_type="float32", intra_threads=args.threads)
    settings = dict(beam_size=args.num_beams, max_decoding_length=args.new_tokens, end_token=[], max_input_length=0)

    def ctranslate2_row(batch):
        return translator.translate_batch([tokenizer.convert_ids_to_tokens(line) for line in batch], **settings)

    def plain_weights_row(batch):
        laid_out = OneDNNLinear._onednn_weight
        OneDNNLinear._onednn_weight = lambda layer: layer.weight
        try:
            return backend.translate(batch)[0]
        finally:
            OneDNNLinear._onednn_weight = laid_out

    library_search = ModelBackend(model, tokenizer, args.num_beams, args.new_tokens)
    library_search.search = {}  # generate() without custom_generate
    return {
        "ctranslate2": ctranslate2_row,
        "backend": lambda batch: backend.translate(batch)[0],
        "plain weights": plain_weights_row,
        "generate()'s search": lambda batch: library_search.translate(batch)[0],
    }, batches


def measure(runs: dict, batches: list, rounds: int) -> dict[str, list[float]]:
    """Each batch's best seconds per row over `rounds` rounds, the rows' order reversed every other batch."""
    best = {name: [float("inf")] * len(batches) for name in runs}
    texts = {}
    for name, run in runs.items():  # one untimed call each: first-call costs (the weights' layout) out of the times
        texts[name] = run(batches[0])
    for name in ("plain weights", "generate()'s search"):
        if texts["backend"] != texts[name]:
            raise SystemExit(f"the backend's text changed with {name}")
    for round_ in range(rounds):
        for index, batch in enumerate(batches):  # each batch by every row in turn: the machine's drift spread evenly
            for name in list(runs) if (round_ + index) % 2 == 0 else list(runs)[::-1]:
                seconds = timed(functools.partial(runs[name], batch))[1]
                best[name][index] = min(best[name][index], seconds)
        print(f"round {round_ + 1}: " + ", ".join(f"{name} {sum(s):.2f} s" for name, s in best.items()), flush=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_batch_arguments(parser, batches=6)
    parser.add_argument("--rounds", type=int, default=3, help="times each batch is timed per row; the best")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="a tiny model: checks that the script runs")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vanilla_transformer.mechanics.memory import keep_freed_memory

    keep_freed_memory()  # as the command's backend does
    print(describe_machine(machine()))
    with tempfile.TemporaryDirectory() as work:
        size = "tiny" if args.tiny else "opus-mt"
        _, folders = build_folders(Path(work) / "model", size, args.new_tokens, args.threads)
        runs, batches = rows(folders, args)
        print(f"{len(batches)} batches of {[len(batch) for batch in batches]} sentences, beam {args.num_beams}")
        best = measure(runs, batches, args.rounds)
    tokens = sum(len(batch) for batch in batches) * args.new_tokens
    print("| row | seconds (best of each batch, summed) | target tokens/s | vs CTranslate2 float32 |")
    print("|---|---:|---:|---:|")
    for name, seconds in best.items():
        total = sum(seconds)
        print(f"| {name} | {total:.2f} | {tokens / total:.0f} | {sum(best['ctranslate2']) / total:.2f}x |")


if __name__ == "__main__":
    main()
