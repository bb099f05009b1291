"""What each speed path that issue 40 removed from the model gained, measured on the code that still had them.

The three paths were switches in the config of commit 012f86b: `onednn_linear` (float32 inference through oneDNN's
linear kernel), `fused_projections` (W^Q, W^K, W^V of one input as one product) and `grouped_beam_cross_attention`
(beam search's encoder-decoder keys and values once per sentence). This script builds that commit's model (from a
checkout of it) and times generation with all paths on, each path alone off, and all off, interleaved in one
process (one untimed warm-up each, alternating order, the median), against the same model's `MarianMTModel` twin as
benchmarks/speed.py builds it. Work as in benchmarks/speed.py's generation rows: sources of 16-32 tokens, exactly 32
new tokens, no end token.

Usage (the checkout of the paths' last commit, then this script from the current one):
    git worktree add /tmp/before 012f86b
    python benchmarks/removed_speed_paths.py --checkout /tmp/before
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

PATHS = ("onednn_linear", "fused_projections", "grouped_beam_cross_attention")
ROWS = [("greedy", 1, 1), ("greedy", 32, 1), ("beam4", 1, 4), ("beam4", 32, 4)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", required=True, help="a checkout of commit 012f86b")
    parser.add_argument("--presets", nargs="+", default=["small", "base"])
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    sys.path[:0] = [args.checkout, str(Path(args.checkout) / "benchmarks")]
    from common import WORKLOADS, build_ours, fix_malloc_thresholds, padded_batch

    from vanilla_transformer.converters.export_marian import to_marian

    fix_malloc_thresholds()
    print(
        "| preset | work | batch | all on/Marian | "
        + " | ".join(f"{p} off/all on" for p in PATHS)
        + " | all off/Marian |"
    )
    print("|---|---|---:|---:|" + "---:|" * len(PATHS) + "---:|")
    for preset in args.presets:
        workload = WORKLOADS[preset]
        ours = build_ours(preset, workload.vocab_size).eval()
        marian = to_marian(ours).eval()
        for work, batch_size, beams in ROWS:
            batch = padded_batch(workload.vocab_size, batch_size, workload.source_lengths, (1, 1), seed=2)
            variants = {"marian": (marian, {}), "all on": (ours, {})}
            variants |= {f"{path} off": (ours, {path: False}) for path in PATHS}
            variants["all off"] = (ours, dict.fromkeys(PATHS, False))
            seconds = time_variants(variants, batch, beams, workload.new_tokens, args.repetitions)
            on = seconds["all on"]
            cells = [seconds["marian"] / on] + [on / seconds[f"{path} off"] for path in PATHS]
            cells.append(seconds["marian"] / seconds["all off"])
            print(f"| {preset} | {work} | {batch_size} | " + " | ".join(f"{cell:.2f}x" for cell in cells) + " |")


def time_variants(variants: dict, batch, beams: int, new_tokens: int, repetitions: int) -> dict[str, float]:
    """Median seconds of each variant's generation, interleaved in alternating order after one warm-up each."""
    from common import generation

    def run(name: str) -> float:
        model, switches = variants[name]
        saved = {name: getattr(model.config, name) for name in switches}
        for switch, value in switches.items():
            setattr(model.config, switch, value)
        try:
            work = generation(model, batch, beams, new_tokens)
            start = time.perf_counter()
            work()
            return time.perf_counter() - start
        finally:
            for switch, value in saved.items():
                setattr(model.config, switch, value)

    names = list(variants)
    for name in names:
        run(name)
    times = {name: [] for name in names}
    for repetition in range(repetitions):
        for name in names if repetition % 2 == 0 else names[::-1]:
            times[name].append(run(name))
    return {name: statistics.median(values) for name, values in times.items()}


if __name__ == "__main__":
    main()
