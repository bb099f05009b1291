"""oneDNN's linear kernel for the project's own inference (translate, the demo, attention maps, `--evaluate_only`).

In float32 on CPU, `nn.Linear` multiplies with MKL's sgemm; oneDNN, in every CPU build of torch, computes the same
products faster on some CPUs, most of all the few-row products of generation (on this project's AMD EPYC machines
1.1-1.8x the tokens per second of the plain model: docs/BENCHMARKS.md). It is reached only through a private torch
op, so it stays out of the model's file, which every Hub user runs: the library switches it on for the models its
commands load (`use_onednn_linears`), where it pays, and the model itself stays plain `nn.Linear`s, as transformers
and its tools (quantizers, peft) expect.

`use_onednn_linears(model)` turns each plain `nn.Linear` of `model` into a `OneDNNLinear`, the same layer (the same
parameters, hooks and state) whose class computes float32 inference on CPU through oneDNN and everything else (a
gradient, bf16, autocast, a GPU, torch.compile, a quantizer's tensor) as `nn.Linear` does; if the op is missing or
fails, `F.linear` runs from then on. `plain_linears(model)` turns them back.

`packed_linears(modules, rows)`: for the length of a `with` block (one generate() call), each OneDNNLinear of `modules`
multiplies inputs of exactly `rows` rows by a copy of its weight in MKL's packed layout (`cblas_sgemm_pack`, packed
for that many rows, as MKL requires), the same product as oneDNN's up to float rounding. Decoding multiplies the same
(batch x beams)-row inputs by the same weights at every step: at the OPUS-MT size, MKL's packed product of the
58,101-row output projection takes 11.7 ms against oneDNN's 16.0 at 32 rows (26.7 against 32.4 at 128), packing it
34-42 ms once (docs/BENCHMARKS.md). The copies are dropped at the end of the block.
"""

from contextlib import contextmanager

import torch
from torch import nn
from torch.nn import functional as F
from transformers.utils import is_torchdynamo_compiling, logging

logger = logging.get_logger(__name__)

MIN_WEIGHT_ELEMENTS = 65536  # smaller matrices: oneDNN's fixed cost per call (~30 us vs MKL's ~10) dominates


def onednn_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


def mkl_packing_available() -> bool:
    try:
        return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")
    except (AttributeError, RuntimeError):
        return False


ONEDNN = {"usable": onednn_available(), "packing": mkl_packing_available()}  # set to False for good if an op fails


class OneDNNLinear(nn.Linear):
    """nn.Linear whose float32 inference on CPU runs through oneDNN's kernel (the same product), or MKL's packed
    weight inside `packed_linears`."""

    packed: tuple[int, torch.Tensor] | None = None  # (rows, the weight packed for inputs of that many rows)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if (
            ONEDNN["usable"]
            and input.device.type == "cpu"
            and input.dtype == weight.dtype == torch.float32
            and type(weight) in (nn.Parameter, torch.Tensor)  # not a quantizer's tensor subclass (torchao, quanto)
            and weight.numel() > MIN_WEIGHT_ELEMENTS
            and not (torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))
            and not torch.is_autocast_enabled("cpu")
            and not is_torchdynamo_compiling()
        ):
            if self.packed is not None and ONEDNN["packing"] and input.numel() == self.packed[0] * self.in_features:
                try:
                    return self._packed_product(input)
                except Exception as error:  # a private op: any torch may change or drop it
                    ONEDNN["packing"] = False
                    logger.warning(f"MKL's packed linear failed ({type(error).__name__}: {error}); not packing again")
            try:
                return torch.ops.mkldnn._linear_pointwise(input, weight, self.bias, "none", [], "")
            except Exception as error:  # a private op: any torch may change or drop it
                ONEDNN["usable"] = False
                logger.warning(f"oneDNN linear failed ({type(error).__name__}: {error}); using F.linear from now on")
        return F.linear(input, weight, self.bias)

    def _packed_product(self, input: torch.Tensor) -> torch.Tensor:
        rows, packed = self.packed
        output = torch.ops.mkl._mkl_linear(input.reshape(rows, self.in_features), packed, self.weight, self.bias, rows)
        return output.view(*input.shape[:-1], self.out_features)


@contextmanager
def packed_linears(modules: list[nn.Module], rows: int):
    """Within the block, the OneDNNLinear layers of `modules` multiply `rows`-row float32 CPU inputs by their weight in
    MKL's packed layout (the module docstring); other inputs, and every layer when packing is unavailable, as before."""
    layers = [
        layer
        for module in modules
        for layer in module.modules()
        if type(layer) is OneDNNLinear
        and layer.weight.device.type == "cpu"
        and layer.weight.dtype == torch.float32
        and type(layer.weight) in (nn.Parameter, torch.Tensor)
        and layer.weight.numel() > MIN_WEIGHT_ELEMENTS
    ]
    try:
        for layer in layers if ONEDNN["usable"] and rows > 0 else []:
            if not _pack(layer, rows):
                break
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("packed", None)


def _pack(layer: OneDNNLinear, rows: int) -> bool:
    """Give `layer` its weight packed for `rows` rows; False (and no packing from now on) if MKL cannot."""
    if not ONEDNN["packing"]:
        return False
    try:
        with torch.no_grad():
            layer.packed = (rows, torch.ops.mkl._mkl_reorder_linear_weight(layer.weight, rows))
        return True
    except Exception as error:  # a private op: any torch may change or drop it
        ONEDNN["packing"] = False
        logger.warning(f"MKL's weight packing failed ({type(error).__name__}: {error}); not packing from now on")
        return False


def use_onednn_linears(model: nn.Module) -> nn.Module:
    """`model` with each plain nn.Linear computing through oneDNN where it can (in place; returned for chaining)."""
    if ONEDNN["usable"]:
        for module in model.modules():
            if type(module) is nn.Linear:
                module.__class__ = OneDNNLinear
    return model


def plain_linears(model: nn.Module) -> nn.Module:
    """`model` with its OneDNNLinear layers plain nn.Linear again (in place; returned for chaining)."""
    for module in model.modules():
        if type(module) is OneDNNLinear:
            module.__class__ = nn.Linear
    return model
