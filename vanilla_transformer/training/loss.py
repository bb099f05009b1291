"""Section 5.4's training loss: label-smoothed cross-entropy, summed over the target tokens, computed without the
(B, T, V) logits.

Training needs only the loss and its gradient: at the paper's vocabulary (37000) a batch of 64 x 36 targets has 85M
logits (340 MB in float32, and as much again for their gradient). So the loss projects the decoder's output of the
non-padding positions onto the shared embedding matrix (3.4) a block at a time and takes each block's gradient right
away: d loss / d logits = softmax(logits) - (1 - eps) onehot(target) - eps / V. The model's own forward computes the
library's plain cross-entropy, as any transformers model. The training script's step reads

    outputs = model(**forward_inputs(model, batch), output_hidden_states=True)  # the decoder's output, no logits
    with accelerator.autocast():  # in the training's precision, as the forward (Accelerate autocasts only that)
        loss = label_smoothed_cross_entropy(outputs.decoder_hidden_states[-1], output_head(model), batch["labels"], eps)
"""

import torch
from torch.nn import functional as F

LOSS_BLOCK_LOGITS = 2**23  # logits per block on CPU (32 MiB in float32)
LOSS_BLOCK_LOGITS_GPU = 2**26  # fewer, larger blocks where each operation is a kernel launch (not measured on GPU)


def forward_inputs(model, batch: dict) -> dict[str, torch.Tensor]:
    """The training forward's inputs for `batch` (input_ids, attention_mask, labels with -100 at padding) under
    `model` (the VanillaTransformerForConditionalGeneration, or the wrapper Accelerate prepared around it, through
    which the forward must run for DDP's gradient synchronisation): the sources, the targets shifted right (teacher
    forcing), and no position's logits, which the loss computes block by block instead."""
    labels = batch["labels"]
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": batch["attention_mask"],
        "decoder_input_ids": getattr(model, "module", model).prepare_decoder_input_ids_from_labels(labels),
        "logits_to_keep": torch.zeros(0, dtype=torch.long, device=labels.device),
    }


def output_head(model) -> torch.nn.Linear:
    """The pre-softmax projection of `model` (or of the model inside Accelerate's wrapper): the shared embedding."""
    return getattr(model, "module", model).lm_head


def label_smoothed_cross_entropy(
    hidden_states: torch.Tensor,  # (B, T, D): the decoder's output
    head: torch.nn.Linear,  # the pre-softmax projection (V, D): the shared embedding matrix (3.4), maybe a bias
    labels: torch.Tensor,  # (B, T), -100 at padding
    label_smoothing: float,
) -> torch.Tensor:
    """F.cross_entropy(head(hidden_states), labels, ignore_index=-100, label_smoothing=..., reduction="sum"), value
    and gradients, without the (B, T, V) logits."""
    keep = labels != -100
    if head.bias is not None:  # a converted model's logits bias: the plain computation
        logits = head(hidden_states[keep]).float()
        return F.cross_entropy(logits, labels[keep], label_smoothing=label_smoothing, reduction="sum")
    return BlockwiseCrossEntropy.apply(hidden_states[keep], head.weight, labels[keep], label_smoothing)


class BlockwiseCrossEntropy(torch.autograd.Function):
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
            log_probs = torch.log_softmax(F.linear(hidden, weight).float(), dim=-1)  # (n, V)
            nll = -log_probs.gather(1, target[:, None]).sum()
            loss += (1 - label_smoothing) * nll - label_smoothing / vocab_size * log_probs.sum()
            grad_logits = log_probs.exp_().sub_(label_smoothing / vocab_size)  # softmax - eps / V
            grad_logits[torch.arange(len(target), device=target.device), target] -= 1 - label_smoothing
            grad_logits = grad_logits.to(hidden.dtype)
            grad_hidden_states[start : start + block] = F.linear(grad_logits, weight.t())
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
