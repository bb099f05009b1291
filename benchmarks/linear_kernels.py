"""float32 linear layers on CPU: torch's default (MKL sgemm) against oneDNN, the kernel the model file's `linear()`
uses for inference.

    python benchmarks/linear_kernels.py

For the shapes of the small (d_model 256, FFN 1024, vocabulary 8000) and base (512, 2048, 37000) models and the
row counts of generation (1 and 32 sentences, 4 beams x 32) and of a training batch (2304 positions), times
`nn.functional.linear` and `torch.ops.mkldnn._linear_pointwise` on the same float32 tensors, interleaved, and prints
microseconds per call (median) and their ratio, with the largest difference between the two results relative to
the largest result (float32 rounding only; neither kernel converts to a lower precision).
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the shared timing module

from timing import median_seconds  # noqa: E402

SHAPES = {  # (in_features, out_features) of every linear layer kind
    "small": [(256, 768), (256, 256), (256, 1024), (1024, 256), (256, 8000)],
    "base": [(512, 1536), (512, 512), (512, 2048), (2048, 512), (512, 37000)],
}
ROWS = [1, 32, 128, 2304]
ONEDNN = torch.ops.mkldnn._linear_pointwise  # input @ weight^T + bias


def compare(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, repetitions: int) -> tuple[float, float]:
    """Median microseconds per call of MKL and of oneDNN, over three interleaved rounds (in each, `repetitions`
    calls of MKL, then of oneDNN, each after one untimed call)."""
    kernels = {
        "mkl": lambda: F.linear(input, weight, bias),
        "onednn": lambda: ONEDNN(input, weight, bias, "none", [], ""),
    }
    medians = {name: [] for name in kernels}
    for _ in range(3):
        for name, kernel in kernels.items():
            medians[name].append(median_seconds({name: kernel}, repetitions)[name] * 1e6)
    return statistics.median(medians["mkl"]), statistics.median(medians["onednn"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repetitions", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.repetitions} (5 for the largest)")
    print("| model | in x out | rows | MKL us | oneDNN us | MKL/oneDNN | max rel. difference |")
    print("|---|---|---:|---:|---:|---:|---:|")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for model, shapes in SHAPES.items():
            for in_features, out_features in shapes:
                weight = torch.randn(out_features, in_features, generator=generator) * in_features**-0.5
                bias = torch.randn(out_features, generator=generator)
                for rows in ROWS:
                    input = torch.randn(rows, in_features, generator=generator)
                    largest = rows * out_features > 2**26  # half a second a call
                    mkl, onednn = compare(
                        input, weight, bias, min(args.repetitions, 5) if largest else args.repetitions
                    )
                    reference = F.linear(input, weight, bias)
                    difference = (ONEDNN(input, weight, bias, "none", [], "") - reference).abs().max()
                    relative = (difference / reference.abs().max()).item()
                    print(
                        f"| {model} | {in_features} x {out_features} | {rows} | {mkl:,.0f} | {onednn:,.0f} "
                        f"| {mkl / onednn:.2f}x | {relative:.1e} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
