"""Whether a sentence's translation depends on the sentences that share its batch: the same Multi30k sentences
translated by one backend in three batchings, and the sentences whose text differs counted.

- `sorted`: `translate`'s batches (`batches.token_batches`: longest first, little padding);
- `arrival`: batches of sentences that arrived in a random order and wait together, each the oldest and every later one
  that fits the token budget (mixed lengths: more padding, other batch sizes than `sorted`);
- `alone`: each sentence a batch of its own (the first --alone sentences; 0 skips it).

A difference can come from padding (a sentence padded to a longer one's length: attention over more masked keys) or
from the kernels (a matrix product's blocking and summation order depend on its row count). Each sentence that differs
is printed with its versions, so a reader sees whether a near tie in the beam decided it.

Usage:
    python benchmarks/batch_invariance.py MODEL_DIR --sentences 2000 --alone 300
    python benchmarks/batch_invariance.py MODEL_DIR --backend ctranslate2 --compute_type int8
"""

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from common import describe_machine, machine, read_lines, uptime  # noqa: E402

from vanilla_transformer.serving.batches import token_batches  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "multi30k"
SOURCES = ("test_2016_flickr.en.gz", "val.en.gz")  # 1,000 + 1,014 sentences the model was not trained on


def arrival_batches(lengths: list[int], max_tokens: int, beams: int, seed: int) -> list[list[int]]:
    """Batches of sentences that arrived in a random order and wait together: each batch the oldest waiting and every
    later one that still fits n * longest * beams <= max_tokens."""
    queue = list(range(len(lengths)))
    random.Random(seed).shuffle(queue)
    batches = []
    while queue:
        batch, kept, longest = [], [], 0
        for index in queue:
            if not batch or (len(batch) + 1) * max(longest, lengths[index]) * beams <= max_tokens:
                batch.append(index)
                longest = max(longest, lengths[index])
            else:
                kept.append(index)
        batches.append(batch)
        queue = kept
    return batches


def translate_in(backend, ids: list[list[int]], batches: list[list[int]]) -> tuple[list[str], float]:
    """Each sentence's translation when the sentences are batched as `batches`; the seconds it took."""
    texts: list[str | None] = [None] * len(ids)
    started = time.monotonic()
    translated_batches = backend.translate_batches([[ids[index] for index in batch] for batch in batches])
    for batch, (translated, _) in zip(batches, translated_batches, strict=True):
        for index, text in zip(batch, translated, strict=True):
            texts[index] = text
    return texts, time.monotonic() - started


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--alone", type=int, default=300, help="sentences also translated one a batch (0: none)")
    parser.add_argument("--seed", type=int, default=0, help="the arrival order's")
    parser.add_argument("--output", help="also write the figures and the differing sentences to this JSON file")
    args, backend_flags = parser.parse_known_args(argv)
    args.backend_flags = backend_flags  # serve's: --backend, --max_batch_tokens, --num_beams, ...
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from vanilla_transformer.commands.serve import parse_args as serve_args
    from vanilla_transformer.commands.translate import make_backend, the_export

    info = machine()
    print(describe_machine(info), "\nbefore:", uptime(), flush=True)
    served = serve_args([args.model_dir, *args.backend_flags])
    served.model_dir = args.model_dir  # as serve gives each folder its own settings
    backend = make_backend(served, "cpu", the_export(served), True)
    lines = list(itertools.islice((line for name in SOURCES for line in read_lines(DATA / name)), args.sentences))
    ids = backend.encode(lines)
    lengths = [len(sentence) for sentence in ids]
    batchings = {
        "sorted": token_batches(lengths, served.max_batch_tokens, None, backend.beams),
        "arrival": arrival_batches(lengths, served.max_batch_tokens, backend.beams, args.seed),
    }
    if args.alone:
        batchings["alone"] = [[n] for n in range(args.alone)]
    texts, figures = {}, {}
    for name, batches in batchings.items():
        texts[name], seconds = translate_in(backend, ids, batches)
        figures[name] = {"batches": len(batches), "seconds": round(seconds, 1)}
        print(f"{name}: {len(batches)} batches, {seconds:.1f} s", flush=True)
    differing = {}
    for name in ("arrival", "alone"):
        if name in texts:
            count = args.alone if name == "alone" else len(ids)
            differ = [n for n in range(count) if texts[name][n] != texts["sorted"][n]]
            figures[name]["differ_from_sorted"] = len(differ)
            figures[name]["compared"] = count
            differing[name] = [
                {"line": n, "source": lines[n], "sorted": texts["sorted"][n], name: texts[name][n]} for n in differ
            ]
            print(f"{name} against sorted: {len(differ)} of {count} sentences differ")
            for example in differing[name][:10]:
                print(json.dumps(example, ensure_ascii=False))
    print("after:", uptime())
    if args.output:
        record = {"machine": info, "flags": args.backend_flags, "figures": figures, "differing": differing}
        Path(args.output).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    sys.exit(main())
