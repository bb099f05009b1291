"""oneDNN's linear kernel for the project's own inference (translate, the demo, attention maps, `--evaluate_only`).

In float32 on CPU, `nn.Linear` multiplies with MKL's sgemm; oneDNN, in every CPU build of torch, computes the same
products faster on some CPUs, most of all the few-row products of generation: on this project's AMD EPYC machines
the commands' model gives 1.19-1.40x (small) and 1.73-2.01x (base) the tokens per second of MarianMTModel, which the
plain model matches, and on another machine 0.73-0.87x (docs/BENCHMARKS.md, "Generation speed"). It is reached only
through a private torch op, so it stays out of the model's file, which every Hub user runs: the library switches it
on for the models its commands load (`use_onednn_linears`), where it pays, and the model itself stays plain
`nn.Linear`s, as transformers and its tools (quantizers, peft) expect.

`use_onednn_linears(model)` turns each plain `nn.Linear` of `model` into a `OneDNNLinear`, the same layer (the same
parameters, hooks and state) whose class computes float32 inference on CPU through oneDNN and everything else (a
gradient, bf16, autocast, a GPU, torch.compile, a quantizer's tensor) as `nn.Linear` does; if the op is missing or
fails, `F.linear` runs from then on. `plain_linears(model)` turns them back.

Each such layer also keeps its weight in oneDNN's own blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, as
torch's inductor does for frozen graphs), laid out on first use and again when the weight changes, so that oneDNN no
longer reorders the weight at every call. The products are the same to the bit as with the plain weight (tried at
1-39, 63-65, 100-1000 rows; one row, the only count where the bits differ, keeps the plain weight) and 1.1-1.6x
faster at 16-128 rows, the rows of a beam-4 step (docs/BENCHMARKS.md, "Generation speed"). The cost is one more copy
of the linear weights in memory (about 280 MB of weights at the OPUS-MT size, ~230 MB measured), kept for the gain
on a whole translation at that size: 1.09x, every round agreeing (docs/BENCHMARKS.md, "Translating a corpus").
"""

import torch
from torch import nn
from torch.nn import functional as F
from transformers.utils import is_torchdynamo_compiling, logging

logger = logging.get_logger(__name__)

LAYOUT_ROWS = 64  # the rows oneDNN lays a weight out for; every row count but one gives the same bits with it
MIN_WEIGHT_ELEMENTS = 65536  # smaller matrices: oneDNN's fixed cost per call (~30 us vs MKL's ~10) dominates


def onednn_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and all(
            hasattr(torch.ops.mkldnn, op) for op in ("_linear_pointwise", "_reorder_linear_weight")
        )
    except (AttributeError, RuntimeError):
        return False


ONEDNN = {"usable": onednn_available()}  # set to False for good if the op ever fails


class OneDNNLinear(nn.Linear):
    """nn.Linear whose float32 inference on CPU runs through oneDNN's kernel (the same product)."""

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
            try:
                # one row: oneDNN's one-row kernel, which gives other bits with the laid-out weight
                laid_out = weight if input.numel() == input.shape[-1] else self._onednn_weight()
                return torch.ops.mkldnn._linear_pointwise(input, laid_out, self.bias, "none", [], "")
            except Exception as error:  # a private op: any torch may change or drop it
                ONEDNN["usable"] = False
                logger.warning(f"oneDNN linear failed ({type(error).__name__}: {error}); using F.linear from now on")
        return F.linear(input, weight, self.bias)

    def _onednn_weight(self) -> torch.Tensor:
        """The weight in oneDNN's own layout, laid out once and again only when the weight changes (another tensor,
        or the same one written in place: its version counter moves)."""
        weight = self.weight
        if weight.is_inference():  # made under inference_mode: no version counter tells when it changes
            return weight
        key = (weight.data_ptr(), weight._version, weight.shape)
        if self.__dict__.get("_onednn_key") != key:
            self._onednn_packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), LAYOUT_ROWS)
            self._onednn_key = key
        return self._onednn_packed


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
            module.__dict__.pop("_onednn_packed", None)  # its memory back
            module.__dict__.pop("_onednn_key", None)
            module.__class__ = nn.Linear
    return model
