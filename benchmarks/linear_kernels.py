"""float32 linear layers on CPU: torch's default (MKL sgemm) against oneDNN, the kernel the commands' inference uses
(`vanilla_transformer/model/onednn.py`), given the plain weight or the weight laid out once in oneDNN's own layout.

    python benchmarks/linear_kernels.py

For the shapes of the small (d_model 256, FFN 1024, vocabulary 8000) and base (512, 2048, 37000) models and the
row counts of generation (1 and 32 sentences, 4 beams x 32) and of a training batch (2304 positions), times
`nn.functional.linear` and `torch.ops.mkldnn._linear_pointwise` (with the plain weight, and with the weight laid out
by `torch.ops.mkldnn._reorder_linear_weight` as `OneDNNLinear` keeps it) on the same float32 tensors, interleaved, and
prints microseconds per call (median) and the ratios, with the largest difference between MKL's and oneDNN's results
relative to the largest result (float32 rounding only; neither kernel converts to a lower precision) and whether the
laid-out weight gives oneDNN's plain-weight result to the bit.
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the shared timing module
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from timing import median_seconds  # noqa: E402

from vanilla_transformer.model.onednn import LAYOUT_ROWS  # noqa: E402

SHAPES = {  # (in_features, out_features) of every linear layer kind
    "small": [(256, 768), (256, 256), (256, 1024), (1024, 256), (256, 8000)],
    "base": [(512, 1536), (512, 512), (512, 2048), (2048, 512), (512, 37000)],
    "opus-mt": [(512, 58101)],  # the OPUS-MT size's output projection (its layers are base's)
}
ROWS = [1, 16, 64, 128, 2304]
ONEDNN = torch.ops.mkldnn._linear_pointwise  # input @ weight^T + bias


def compare(input, weight, laid_out, bias, repetitions: int) -> dict[str, float]:
    """Median microseconds per call of MKL, oneDNN and oneDNN with the laid-out weight, over three interleaved rounds
    (in each, `repetitions` calls of each kernel in turn, each after one untimed call)."""
    kernels = {
        "mkl": lambda: F.linear(input, weight, bias),
        "onednn": lambda: ONEDNN(input, weight, bias, "none", [], ""),
        "laid_out": lambda: ONEDNN(input, laid_out, bias, "none", [], ""),
    }
    medians = {name: [] for name in kernels}
    for _ in range(3):
        for name, kernel in kernels.items():
            medians[name].append(median_seconds({name: kernel}, repetitions)[name] * 1e6)
    return {name: statistics.median(values) for name, values in medians.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repetitions", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.repetitions} (5 for the largest)")
    print(
        "| model | in x out | rows | MKL us | oneDNN us | laid out us | MKL/oneDNN | oneDNN/laid out "
        "| max rel. difference | laid out: same bits |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for model, shapes in SHAPES.items():
            for in_features, out_features in shapes:
                weight = torch.randn(out_features, in_features, generator=generator) * in_features**-0.5
                bias = torch.randn(out_features, generator=generator)
                laid_out = torch.ops.mkldnn._reorder_linear_weight(weight, LAYOUT_ROWS)
                for rows in ROWS:
                    input = torch.randn(rows, in_features, generator=generator)
                    largest = rows * out_features > 2**26  # half a second a call
                    us = compare(
                        input, weight, laid_out, bias, min(args.repetitions, 5) if largest else args.repetitions
                    )
                    reference, onednn = F.linear(input, weight, bias), ONEDNN(input, weight, bias, "none", [], "")
                    relative = ((onednn - reference).abs().max() / reference.abs().max()).item()
                    same = torch.equal(ONEDNN(input, laid_out, bias, "none", [], ""), onednn)
                    print(
                        f"| {model} | {in_features} x {out_features} | {rows} | {us['mkl']:,.0f} | {us['onednn']:,.0f} "
                        f"| {us['laid_out']:,.0f} | {us['mkl'] / us['onednn']:.2f}x "
                        f"| {us['onednn'] / us['laid_out']:.2f}x | {relative:.1e} | {'yes' if same else 'no'} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
