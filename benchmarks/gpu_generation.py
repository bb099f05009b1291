"""Generation on a GPU: our model against transformers' `MarianMTModel` with the same weights, and our static cache +
`torch.compile` against the dynamic cache.

Both models are the base preset (37000 tokens) with identical weights (`export_marian.to_marian`, checked to give the
same logits in float32 before anything is timed), cast to `--dtype` (bf16 by default) on `--device`. Work per row, as
in benchmarks/speed.py: sources of 16-32 tokens, exactly 32 new tokens per sentence (no end token), greedy and beam 4,
at batch 1 and 64; throughput counts batch x 32 returned tokens. Rows run their engines interleaved in alternating
order after one untimed warm-up each (compilation, for the compiled engine), median of `--repetitions`, each timed
call ending with `torch.cuda.synchronize`.

Engines: `ours` and `marian` (dynamic cache, eager forward); `ours_static`: `cache_implementation="static"`, whose
forward generate() compiles itself on a GPU (compiled by hand, `fullgraph=True`, elsewhere), at the largest batch only
(a compilation per shape), with the share of its tokens equal to `ours`'s in the same dtype.

Usage:
    python benchmarks/gpu_generation.py                                  # on a GPU
    python benchmarks/gpu_generation.py --device cpu --preset tiny --dtype float32 --batches 2 --repetitions 1
"""

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import build_ours, padded_batch  # noqa: E402
from timing import median_seconds  # noqa: E402

from vanilla_transformer.converters.export_marian import check_same_function, to_marian  # noqa: E402

NEW_TOKENS = 32


def generation(model, batch, num_beams: int, device: torch.device, cache_implementation: str | None = None):
    """A callable generating exactly NEW_TOKENS tokens per source, and waiting for the device; returns the tokens."""
    input_ids, attention_mask = (tensor.to(device) for tensor in batch[:2])
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, do_sample=False, max_new_tokens=NEW_TOKENS)
    if cache_implementation:
        settings["cache_implementation"] = cache_implementation

    def generate() -> torch.Tensor:
        with torch.no_grad():
            output = model.generate(input_ids, eos_token_id=None, **settings)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return output

    return generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab_size", type=int, default=37000)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--no-static", action="store_true", help="skip the static cache engine")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)

    ours = build_ours(args.preset, args.vocab_size).eval()
    marian = to_marian(ours).eval()
    check_same_function(ours, marian)  # float32, on the CPU: the same function before timing anything
    engines = {"ours": ours.to(device, dtype), "marian": marian.to(device, dtype)}
    if not args.no_static:
        static = build_ours(args.preset, args.vocab_size).eval().to(device, dtype)
        if device.type != "cuda":  # on a GPU generate() compiles the forward itself for a static cache
            static.forward = torch.compile(static.forward, fullgraph=True, dynamic=False)
        engines["ours_static"] = static

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# {date}; {name}; torch {torch.__version__}; {args.preset}, vocabulary {args.vocab_size}, {args.dtype}")
    print(
        f"# {NEW_TOKENS} new tokens per sentence, sources of 16-32 tokens; tokens/s (median of {args.repetitions})\n"
    )
    names = list(engines)
    print("| batch | beams | " + " | ".join(names) + " | ours / marian | static / ours | static's tokens = ours' |")
    print("|---:|---:|" + "---:|" * (len(names) + 3))
    for batch_size in args.batches:
        batch = padded_batch(args.vocab_size, batch_size, (16, 32), (16, 32), seed=0)
        for num_beams in (1, 4):
            # the static cache compiles once per shape: only at the largest batch, to keep the run short
            row_engines = [name for name in names if name != "ours_static" or batch_size == max(args.batches)]
            runs = {
                name: generation(engines[name], batch, num_beams, device, "static" if name == "ours_static" else None)
                for name in row_engines
            }
            started = time.perf_counter()
            outputs = {name: run() for name, run in runs.items()}  # warm-up, and compilation for the static cache
            warm_up = time.perf_counter() - started
            seconds = median_seconds(runs, args.repetitions)
            speed = {name: batch_size * NEW_TOKENS / seconds[name] for name in row_engines}
            cells = " | ".join(f"{speed[name]:,.0f}" if name in speed else "-" for name in names)
            static = "-", "-"
            if "ours_static" in speed:
                equal = (outputs["ours_static"] == outputs["ours"]).float().mean().item()
                static = f"{speed['ours_static'] / speed['ours']:.2f}x", f"{equal:.1%}"
            print(
                f"| {batch_size} | {num_beams} | {cells} | {speed['ours'] / speed['marian']:.2f}x | {static[0]} "
                f"| {static[1]} |  <!-- warm-up {warm_up:.0f} s -->",
                flush=True,
            )


if __name__ == "__main__":
    main()
