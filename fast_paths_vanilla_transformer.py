"""Speed paths of the vanilla Transformer, beside the paper's code in modeling_vanilla_transformer.py.

Hub-facing: the model file imports this file relatively, so transformers copies it into every saved folder and
fetches it with the model's code. Each path computes what the plain code computes (tests/test_fast_paths.py holds
them against it) and has a switch:

- oneDNN linear layers for float32 inference on CPU (`config.onednn_linear`, default True; up to 2.7x on the
  skinny products of generation on some CPUs, docs/BENCHMARKS.md). The op is private to torch: if it is missing or
  raises, the plain `F.linear` runs from then on.
- The attention's projections of one input as one product: W^Q, W^K, W^V of self-attention, W^K, W^V of the encoder
  output (`config.fused_projections`, default True; one pass over the input instead of three or two). The model's
  parameters stay the paper's separate `q_proj`, `k_proj`, `v_proj`, which tools that adapt or quantize layers by name
  (peft's LoRA, quantize_dynamic) find as in BART or Marian; a layer such a tool wraps or replaces runs its own forward.
- Beam search keeps the encoder-decoder keys and values once per sentence instead of once per beam
  (`config.grouped_beam_cross_attention`, default True; less memory and time per step, docs/BENCHMARKS.md).
- The label-smoothed training loss without the (B, T, V) logits (`model(..., labels=..., return_logits=False)`,
  used by the training script; 12% of a base training step on CPU went to the logits' log-softmax).
"""

from functools import partial

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules import module as torch_module
from transformers.utils import is_torchdynamo_compiling, logging

logger = logging.get_logger(__name__)


# --- oneDNN linear layers --------------------------------------------------------------------------------------
# In float32 on CPU, nn.Linear multiplies with MKL's sgemm; oneDNN (in every CPU build of torch) computes the same
# products faster on some CPUs, most of all the few-row products of generation. Used only when nothing needs
# gradients (training measured no faster), and not on GPUs, in bf16/fp16, under autocast or torch.compile.


def onednn_linear_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


ONEDNN = {"usable": onednn_linear_available()}  # set to False for good if the op ever fails
ONEDNN_MIN_WEIGHT_ELEMENTS = 65536  # smaller matrices: oneDNN's fixed cost per call (~30 us vs MKL's ~10) dominates


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, onednn: bool = True):
    """F.linear (input @ weight^T + bias); through oneDNN for float32 inference on CPU when `onednn`."""
    if (
        onednn
        and ONEDNN["usable"]
        and input.device.type == "cpu"
        and input.dtype == weight.dtype == torch.float32
        and type(weight) in (nn.Parameter, torch.Tensor)  # not a quantizer's tensor subclass (torchao, quanto)
        and weight.numel() > ONEDNN_MIN_WEIGHT_ELEMENTS
        and not (torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))
        and not torch.is_autocast_enabled("cpu")
        and not is_torchdynamo_compiling()
    ):
        try:
            return torch.ops.mkldnn._linear_pointwise(input, weight, bias, "none", [], "")
        except Exception as error:  # a private op: any torch may change or drop it
            ONEDNN["usable"] = False
            logger.warning(f"oneDNN linear failed ({type(error).__name__}: {error}); using F.linear from now on")
    return F.linear(input, weight, bias)


def use_onednn_linears(model: nn.Module, config) -> None:
    """Run the products of `model`'s linear layers through `linear()`: oneDNN for float32 inference on CPU, unless
    `config.onednn_linear` is False (read at each call). The layers stay plain `nn.Linear`s, with only their
    `forward` replaced, so the tools that match layers by type (quantize_dynamic, torchao, quanto, peft) find and
    replace them as in any model; a layer they replace runs its own forward."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.forward = partial(_linear_forward, module, config)


def _linear_forward(module: nn.Linear, config, input: torch.Tensor) -> torch.Tensor:
    return linear(input, module.weight, module.bias, onednn=getattr(config, "onednn_linear", True))


# --- the projections of one input as one product ---------------------------------------------------------------
# Self-attention's W^Q, W^K, W^V read the same input, and encoder-decoder attention's W^K, W^V read the encoder
# output: their stacked weights multiply the input once, then the output is split. Only plain nn.Linear layers are
# stacked, with nothing else watching them (hooks, accelerate's device hooks): a layer that peft wraps, a quantizer
# replaces or a hook watches is called, so that it sees its input. With gradients the weights are stacked at every
# call (autograd splits the gradient); without (generation) the stack is kept on the attention, rebuilt when a weight
# changes (its storage or version: any in-place change through the parameter, as an optimizer step or
# load_state_dict makes; not one through `.data`). torch.compile traces the separate products.


def fused_projections(attention: nn.Module, input: torch.Tensor, *projections: nn.Module) -> tuple[torch.Tensor, ...]:
    """`tuple(projection(input) for projection in projections)`, as one product of the stacked weights when
    `attention.config.fused_projections` (default True) and the projections are plain nn.Linear layers."""
    if (
        getattr(attention.config, "fused_projections", True)
        and not is_torchdynamo_compiling()
        and all(_plain_linear(projection) for projection in projections)
        and len({(p.weight.dtype, p.weight.device, p.bias is None) for p in projections}) == 1
    ):
        weight, bias = _stacked_weights(attention, projections)
        output = linear(input, weight, bias, onednn=getattr(attention.config, "onednn_linear", True))
        return output.split([projection.out_features for projection in projections], dim=-1)
    return tuple(projection(input) for projection in projections)


def _plain_linear(module: nn.Module) -> bool:
    """An nn.Linear whose forward is nn.Linear's (or the oneDNN one), with plain tensors and no hook."""
    forward = module.__dict__.get("forward")
    return (
        type(module) is nn.Linear
        and (forward is None or (isinstance(forward, partial) and forward.func is _linear_forward))
        and all(
            type(tensor) in (nn.Parameter, torch.Tensor)
            for tensor in (module.weight, module.bias)
            if tensor is not None
        )
        and not any(getattr(module, hooks, None) for hooks in MODULE_HOOKS)
        and not any(getattr(torch_module, hooks, None) for hooks in GLOBAL_MODULE_HOOKS)
    )


MODULE_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
GLOBAL_MODULE_HOOKS = tuple(f"_global{hooks}" for hooks in MODULE_HOOKS)  # register_module_forward_hook's, ...


def _stacked_weights(attention: nn.Module, projections) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The projections' weights and biases stacked by rows: at each call where autograd needs them, else kept on
    `attention` and rebuilt when any of them changes."""
    tensors = [tensor for p in projections for tensor in (p.weight, p.bias) if tensor is not None]
    if torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors):
        attention.__dict__.pop("_stacked_projections", None)  # training: no stale copy kept from an evaluation
        return _stack(projections)
    try:
        key = tuple(
            (tensor.data_ptr(), tensor._version, tensor.dtype, tensor.device, tensor.shape) for tensor in tensors
        )
    except RuntimeError:  # inference tensors have no version counter: nothing tells a change, so nothing is kept
        return _stack(projections)
    kept = attention.__dict__.get("_stacked_projections")
    if kept is None or kept[0] != key:
        with torch.inference_mode(False), torch.no_grad():  # a plain tensor, usable outside inference mode too
            kept = (key, *_stack(projections))
        attention.__dict__["_stacked_projections"] = kept
    return kept[1], kept[2]


def _stack(projections) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = torch.cat([projection.weight for projection in projections])
    bias = None if projections[0].bias is None else torch.cat([projection.bias for projection in projections])
    return weight, bias


# --- beam search: encoder-decoder keys and values once per sentence ---------------------------------------------
# generate() repeats each source `num_beams` times, so the encoder-decoder keys and values of a sentence's beams
# are identical, and transformers' beam search never moves a beam to another sentence. After the first step
# `reorder_grouped_cache` keeps them once per sentence; the attention then runs each sentence's beams' queries
# together against its one row (`grouped_beam_attention`). Whether the rows group is checked once per generate()
# (one device-to-host synchronisation), never per step.


def _rows_repeat(tensor: torch.Tensor, group: int) -> bool:
    """Whether the rows (dim 0) of `tensor` come in runs of `group` identical rows."""
    if tensor.shape[0] % group:
        return False
    grouped = tensor.reshape(tensor.shape[0] // group, group, -1)
    return torch.equal(grouped, grouped[:, :1].expand_as(grouped))


def _beam_group_size(tensors: list[torch.Tensor]) -> int:
    """The largest g > 1 such that the rows of every tensor come in runs of g identical rows; 1 if there is none."""
    first = tensors[0]
    run = 1
    while run < first.shape[0] and torch.equal(first[run], first[0]):
        run += 1
    for group in range(run, 1, -1):
        if all(_rows_repeat(tensor, group) for tensor in tensors):
            return group
    return 1


def reorder_grouped_cache(past_key_values, beam_idx: torch.Tensor, attn_implementation: str, enabled: bool):
    """Beam search's cache reorder: the decoder's own keys and values follow `beam_idx`; the encoder-decoder ones,
    the same for all beams of a sentence, are kept once per sentence (if `enabled` and the attention is eager or
    sdpa) and never move, or else reordered like the rest."""
    past_key_values.self_attention_cache.reorder_cache(beam_idx)
    cross = past_key_values.cross_attention_cache
    if cross.get_seq_length() == 0 or getattr(cross, "grouped_rows", 1) > 1:
        return past_key_values  # empty, or already once per sentence: nothing moves
    if enabled and attn_implementation in ("eager", "sdpa") and not getattr(cross, "group_checked", False):
        cross.group_checked = True  # the one check of this generate()
        beams = _beam_group_size([tensor for layer in cross.layers for tensor in (layer.keys, layer.values)])
        if beams > 1:
            for layer in cross.layers:
                layer.keys, layer.values = layer.keys[::beams].contiguous(), layer.values[::beams].contiguous()
            cross.grouped_rows = beams
            return past_key_values
    cross.reorder_cache(beam_idx)
    return past_key_values


def grouped_beam_attention(attention_interface, module, query, key, value, attention_mask, **kwargs):
    """`attention_interface` for B = groups x beams query rows against keys and values kept once per group: each
    group's beams' queries attend together, as beams x Tq queries. query (B, H, Tq, d_k), key/value (B / beams, H, S,
    d_k/d_v); the mask's rows are identical within a group (the sources are), so one per group is taken."""
    beams = query.shape[0] // key.shape[0]
    batch, heads, length, head_dim = query.shape
    query = query.view(batch // beams, beams, heads, length, head_dim).transpose(1, 2)
    query = query.reshape(batch // beams, heads, beams * length, head_dim)
    if attention_mask is not None:  # eager and sdpa masks: (B or 1, 1, Tq or 1, S)
        if attention_mask.shape[0] == batch:
            attention_mask = attention_mask[::beams]
        if attention_mask.shape[2] > 1:
            attention_mask = attention_mask.repeat(1, 1, beams, 1)
    output, weights = attention_interface(module, query, key, value, attention_mask, **kwargs)
    output = output.reshape(batch, length, heads, -1)  # (B / beams, beams * Tq, H, d_v) -> (B, Tq, H, d_v)
    if weights is not None:
        weights = weights.view(batch // beams, heads, beams, length, -1).transpose(1, 2)
        weights = weights.reshape(batch, heads, length, -1)
    return output, weights


# --- the label-smoothed loss without the logits ----------------------------------------------------------------
# Training needs only the loss and its gradient, not the (B, T, V) logits: at the paper's vocabulary (37000) a batch
# of 64 x 36 targets has 85M logits (340 MB in float32, and as much again for their gradient). So this loss projects
# only non-padding positions, a block at a time, and takes each block's gradient right away:
# d loss / d logits = softmax(logits) - (1 - eps) onehot(target) - eps / V.

LOSS_BLOCK_LOGITS = 2**23  # logits per block on CPU (32 MiB in float32)
LOSS_BLOCK_LOGITS_GPU = 2**26  # fewer, larger blocks where each operation is a kernel launch (not measured on GPU)


class VanillaTransformerCrossEntropyFunction(torch.autograd.Function):
    """Summed label-smoothed cross-entropy of `hidden_states @ weight^T` against `targets` (no padding), with both
    gradients computed in the forward pass, block by block."""

    @staticmethod
    def forward(ctx, hidden_states, weight, targets, label_smoothing: float):  # (N, D), (V, D), (N,)
        vocab_size = weight.shape[0]
        autocast = torch.is_autocast_enabled(hidden_states.device.type)
        loss = torch.zeros((), dtype=torch.float32, device=hidden_states.device)
        grad_hidden_states = torch.empty_like(hidden_states)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        block_logits = LOSS_BLOCK_LOGITS if hidden_states.device.type == "cpu" else LOSS_BLOCK_LOGITS_GPU
        block = max(1, block_logits // vocab_size)
        for start in range(0, hidden_states.shape[0], block):
            hidden, target = hidden_states[start : start + block], targets[start : start + block]
            log_probs = torch.log_softmax(linear(hidden, weight).float(), dim=-1)  # (n, V)
            nll = -log_probs.gather(1, target[:, None]).sum()
            loss += (1 - label_smoothing) * nll - label_smoothing / vocab_size * log_probs.sum()
            grad_logits = log_probs.exp_().sub_(label_smoothing / vocab_size)  # softmax - eps / V
            grad_logits[torch.arange(len(target), device=target.device), target] -= 1 - label_smoothing
            grad_logits = grad_logits.to(hidden.dtype)
            grad_hidden_states[start : start + block] = linear(grad_logits, weight.t())
            if autocast:  # the low-precision product, accumulated in float32
                grad_weight += torch.mm(grad_logits.t(), hidden)
            else:
                grad_weight.addmm_(grad_logits.t().float(), hidden.float())
        ctx.save_for_backward(grad_hidden_states, grad_weight.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden_states, grad_weight = ctx.saved_tensors
        return grad_hidden_states * grad_loss.to(grad_hidden_states.dtype), grad_weight * grad_loss, None, None


def label_smoothed_cross_entropy(
    hidden_states: torch.Tensor,  # (B, T, D): the decoder's output
    weight: torch.Tensor,  # (V, D): the pre-softmax projection (the shared embedding matrix, 3.4)
    labels: torch.Tensor,  # (B, T), -100 at padding
    label_smoothing: float,
    reduction: str = "mean",
) -> torch.Tensor:
    """F.cross_entropy(hidden_states @ weight^T, labels, ignore_index=-100, label_smoothing=..., reduction=...),
    value and gradients, without the (B, T, V) logits. reduction: "mean" over non-padding targets, or "sum"."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}.")
    keep = labels != -100
    loss = VanillaTransformerCrossEntropyFunction.apply(hidden_states[keep], weight, labels[keep], label_smoothing)
    return loss / keep.sum() if reduction == "mean" else loss
