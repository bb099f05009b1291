"""Static cache + torch.compile against the dynamic cache, for generate() on this CPU.

The model declares `_can_compile_fullgraph`: with `cache_implementation="static"` its forward compiles with
`fullgraph=True` (tests/test_stock_tools.py holds the tokens equal to eager decoding). On a GPU transformers compiles
the forward itself for a static cache; here the forward is compiled by hand (inductor, `dynamic=False`), as a user
would. Rows: greedy and beam 4 over 32 sources of 16-32 tokens, exactly 32 new tokens (no end token), the same work
as benchmarks/speed.py's generation rows. Compilation is done in the untimed warm-up; its seconds are printed apart.

Usage:
    python benchmarks/compiled_generation.py                   # the small preset, batch 32, greedy and beam 4
    python benchmarks/compiled_generation.py --preset base --repetitions 3
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import WORKLOADS, build_ours, describe_machine, fix_malloc_thresholds, machine, padded_batch  # noqa: E402
from timing import median_seconds  # noqa: E402


def generation(model, batch, num_beams: int, new_tokens: int, cache_implementation: str | None):
    input_ids, attention_mask, _ = batch
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, do_sample=False, max_new_tokens=new_tokens)
    if cache_implementation:
        settings["cache_implementation"] = cache_implementation

    def generate() -> torch.Tensor:
        with torch.no_grad():
            return model.generate(input_ids, eos_token_id=None, **settings)

    return generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small", choices=sorted(WORKLOADS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    fix_malloc_thresholds()
    workload = WORKLOADS[args.preset]
    batch = padded_batch(workload.vocab_size, args.batch, workload.source_lengths, workload.source_lengths, seed=0)
    eager = build_ours(args.preset, workload.vocab_size).eval()
    compiled = build_ours(args.preset, workload.vocab_size).eval()
    compiled.forward = torch.compile(compiled.forward, fullgraph=True, dynamic=False)
    print(f"# {describe_machine(machine())}")
    print(
        "| preset | batch | beams | dynamic cache, eager (s) | static cache, compiled (s) | speed-up | compile (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for num_beams in (1, 4):
        runs = {
            "eager": generation(eager, batch, num_beams, workload.new_tokens, None),
            "compiled": generation(compiled, batch, num_beams, workload.new_tokens, "static"),
        }
        started = time.perf_counter()
        same = torch.equal(runs["eager"](), runs["compiled"]())  # compiles; the tokens must be the same
        compile_seconds = time.perf_counter() - started
        assert same, "compiled static-cache decoding gave other tokens than eager decoding"
        seconds = median_seconds(runs, args.repetitions)
        print(
            f"| {args.preset} | {args.batch} | {num_beams} | {seconds['eager']:.2f} | {seconds['compiled']:.2f} "
            f"| {seconds['eager'] / seconds['compiled']:.2f}x | {compile_seconds:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
