"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers PreTrainedModel.

Hub-facing: this file is copied beside the weights of every saved model and runs as remote code, so it imports
only torch, transformers and its own configuration file. Classes go from leaf to top, as the paper's section 3:
positions (3.5), attention (3.2), feed-forward (3.3), encoder and decoder layers (3.1), the stacks, the model
with its one shared embedding matrix (3.4).

Every sub-layer is post-LN: LayerNorm(x + Dropout(Sublayer(x))).
Shapes: B = batch, S = source length, T = target length, D = d_model, H = heads, K = D / H.
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import can_return_tuple, is_torchdynamo_compiling, logging
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

try:  # as Hub remote code (a package) or as an installed top-level module
    from .configuration_vanilla_transformer import VanillaTransformerConfig
except ImportError:
    from configuration_vanilla_transformer import VanillaTransformerConfig


logger = logging.get_logger(__name__)


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs are the labels shifted one step right, starting from `decoder_start_token_id`."""
    decoder_input_ids = labels.new_empty(labels.shape)
    decoder_input_ids[:, 1:] = labels[:, :-1]
    decoder_input_ids[:, 0] = decoder_start_token_id
    return decoder_input_ids.masked_fill_(decoder_input_ids == -100, pad_token_id)


def _check_token_ids(ids: torch.Tensor, vocab_size: int, name: str, allow_ignore_index: bool = False) -> None:
    """Clear errors for ids the embedding cannot look up (instead of an IndexError deep in torch)."""
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"`{name}` must hold integer token ids, got dtype {ids.dtype}.")
    if ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape (batch, length), got {tuple(ids.shape)}.")
    if ids.shape[1] == 0:
        raise ValueError(f"`{name}` is empty (length 0): every sequence needs at least one token, e.g. </s>.")
    if is_torchdynamo_compiling():
        return
    valid = (ids >= 0) & (ids < vocab_size)
    if allow_ignore_index:
        valid |= ids == -100
    if not bool(valid.all()):
        bad = ids[~valid]
        raise ValueError(
            f"`{name}` holds ids outside the vocabulary [0, {vocab_size}): e.g. {bad[:5].tolist()}. "
            "Was the input made with this model's tokenizer?"
        )


def _check_attention_mask(mask: torch.Tensor | None, expected_shape: tuple, name: str) -> None:
    if mask is None or mask.dim() != 2:  # a prepared 4D mask is passed through as it is
        return
    if tuple(mask.shape) != tuple(expected_shape):
        raise ValueError(f"`{name}` has shape {tuple(mask.shape)} but the inputs need {tuple(expected_shape)}.")


# --- Linear layers: oneDNN for inference on CPU ------------------------------------------------------------------
# In float32 on CPU, nn.Linear multiplies with MKL's sgemm. oneDNN (part of every CPU build of torch, which uses it
# for bf16) computes the same float32 products up to 2.7x as fast on some CPUs (AMD Zen 4, docs/BENCHMARKS.md),
# most of all the skinny multiplies of generation, which read the whole weight matrix for a few rows. Every linear
# layer goes through `linear()`: oneDNN when nothing needs gradients (inference, generate), nn.functional.linear
# everywhere else (training, where it measured no faster; GPU; bf16/fp16; autocast; torch.compile; no oneDNN).


def _onednn_linear_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):
        return False


ONEDNN_LINEAR = _onednn_linear_available()
ONEDNN_MIN_WEIGHT_ELEMENTS = 65536  # smaller matrices: oneDNN's fixed cost per call (~30 us vs MKL's ~10) dominates


def linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """nn.functional.linear (input @ weight^T + bias); through oneDNN for float32 inference on CPU."""
    if (
        ONEDNN_LINEAR
        and input.device.type == "cpu"
        and input.dtype == weight.dtype == torch.float32
        and weight.numel() > ONEDNN_MIN_WEIGHT_ELEMENTS
        and not (torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad))
        and not torch.is_autocast_enabled("cpu")
        and not is_torchdynamo_compiling()
    ):
        return torch.ops.mkldnn._linear_pointwise(input, weight, bias, "none", [], "")
    return F.linear(input, weight, bias)


class VanillaTransformerLinear(nn.Linear):
    """nn.Linear whose multiply runs through `linear()` (oneDNN for float32 on CPU)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return linear(input, self.weight, self.bias)


def sinusoidal_position_table(num_positions: int, dim: int) -> torch.Tensor:
    """3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Interleaved: sine on even dimensions, cosine on odd ones. Returns (num_positions, dim) in float32.
    """
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    two_i = torch.arange(0, dim, 2, dtype=torch.float64)  # (ceil(D/2),)
    angle = position / torch.pow(10000.0, two_i / dim)  # (P, ceil(D/2))
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table.float()


class VanillaTransformerSinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoidal positions (3.5). The table is a non-persistent buffer that grows on demand, so
    sequences longer than `max_position_embeddings` work (the paper's reason for choosing sinusoids)."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.dim = config.d_model
        self.register_buffer("table", sinusoidal_position_table(config.max_position_embeddings, self.dim), False)

    def forward(self, past_length: int, length: int) -> torch.Tensor:  # -> (length, D)
        end = past_length + length
        if end > self.table.shape[0]:
            new_size = max(end, 2 * self.table.shape[0])
            self.table = sinusoidal_position_table(new_size, self.dim).to(self.table.device)
        return self.table[past_length:end]


class VanillaTransformerLearnedPositionalEmbedding(nn.Embedding):
    """Learned positions: Table 3, row (E). Limited to `max_position_embeddings`."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config.max_position_embeddings, config.d_model)

    def forward(self, past_length: int, length: int) -> torch.Tensor:  # -> (length, D)
        end = past_length + length
        if end > self.num_embeddings:
            raise ValueError(
                f"Position {end - 1} is beyond the learned position table (max_position_embeddings="
                f"{self.num_embeddings}); use shorter inputs or position_embedding_type='sinusoidal'."
            )
        return self.weight[past_length:end]


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    # 3.2.1: softmax(Q K^T / sqrt(d_k)) V; query (B, H, Tq, K), key/value (B, H, Tk, K)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, Tq, Tk)
    if attention_mask is not None:  # additive: 0 where allowed, the dtype's minimum where masked
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, Tq, H, K)
    return output, weights


def _rows_repeat(tensor: torch.Tensor | None, group: int) -> bool:
    """Whether the rows (dim 0) of `tensor` come in runs of `group` identical rows (None and one row broadcast)."""
    if tensor is None or tensor.shape[0] == 1:
        return True
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


def _group_beams(
    query: torch.Tensor, attention_mask: torch.Tensor | None, beams: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, H, Tq, K) queries -> (B / beams, H, beams * Tq, K): each group of `beams` rows as one row of queries, to
    attend to keys and values stored once per group. The mask's rows (identical within a group) are taken once."""
    batch, heads, length, head_dim = query.shape
    query = query.view(batch // beams, beams, heads, length, head_dim).transpose(1, 2)
    query = query.reshape(batch // beams, heads, beams * length, head_dim)
    if attention_mask is not None:  # eager and sdpa masks: (B or 1, 1, Tq or 1, S)
        if attention_mask.shape[0] == batch:
            attention_mask = attention_mask[::beams]
        if attention_mask.shape[2] > 1:
            attention_mask = attention_mask.repeat(1, 1, beams, 1)
    return query, attention_mask


def _ungroup_beams(
    output: torch.Tensor, weights: torch.Tensor | None, beams: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Undo `_group_beams` on the attention output (B / beams, beams * Tq, H, K) and weights (.., H, beams * Tq, S)."""
    groups, grouped_length, heads, head_dim = output.shape
    length = grouped_length // beams
    output = output.reshape(groups * beams, length, heads, head_dim)
    if weights is not None:
        weights = weights.view(groups, heads, beams, length, -1).transpose(1, 2)
        weights = weights.reshape(groups * beams, heads, length, -1)
    return output, weights


class VanillaTransformerAttention(nn.Module):
    """3.2.2: MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The per-head projections of all heads are one matrix: `qkv_proj` (D -> 3D) for self-attention and
    `q_proj` + `kv_proj` (D -> 2D) for encoder-decoder attention, whose keys and values come from the encoder
    output and are computed once per generation (cached).
    """

    def __init__(
        self,
        config: VanillaTransformerConfig,
        num_heads: int,
        is_cross_attention: bool = False,
        is_causal: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.is_cross_attention = is_cross_attention
        self.is_causal = is_causal  # read by the sdpa/flash attention functions
        self.layer_idx = layer_idx
        if is_cross_attention:
            self.q_proj = VanillaTransformerLinear(config.d_model, config.d_model)
            self.kv_proj = VanillaTransformerLinear(config.d_model, 2 * config.d_model)
        else:
            self.qkv_proj = VanillaTransformerLinear(config.d_model, 3 * config.d_model)
        self.out_proj = VanillaTransformerLinear(config.d_model, config.d_model)

    def _split_heads(self, projected: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        # (B, L, parts * D) -> parts x (B, H, L, K)
        batch, length, _ = projected.shape
        return projected.view(batch, length, parts, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def forward(
        self,
        hidden_states: torch.Tensor,  # (B, Tq, D)
        attention_mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,  # encoder output (B, S, D) for encoder-decoder attention
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.is_cross_attention:
            (query,) = self._split_heads(self.q_proj(hidden_states), 1)
            cache = past_key_values.cross_attention_cache if past_key_values is not None else None
            if past_key_values is not None and past_key_values.is_updated.get(self.layer_idx):
                key, value = cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
            else:
                key, value = self._split_heads(self.kv_proj(key_value_states), 2)
                if cache is not None:
                    key, value = cache.update(key, value, self.layer_idx)
                    past_key_values.is_updated[self.layer_idx] = True
        else:
            query, key, value = self._split_heads(self.qkv_proj(hidden_states), 3)
            if past_key_values is not None:  # append this step's keys and values to the decoder's cache
                cache = getattr(past_key_values, "self_attention_cache", past_key_values)
                key, value = cache.update(key, value, self.layer_idx)

        # Beam search keeps the encoder-decoder keys and values once per sentence (see `_reorder_cache`): the queries
        # of a sentence's `beams` rows attend to its one row together, as `beams * Tq` queries.
        beams = query.shape[0] // key.shape[0]
        if beams > 1 and not _rows_repeat(attention_mask, beams):  # a group's rows have different masks: row by row
            key, value, beams = key.repeat_interleave(beams, dim=0), value.repeat_interleave(beams, dim=0), 1
        if beams > 1:
            query, attention_mask = _group_beams(query, attention_mask, beams)
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )  # output: (B, Tq, H, K)
        if beams > 1:
            output, weights = _ungroup_beams(output, weights, beams)
        output = self.out_proj(output.reshape(*hidden_states.shape[:-1], -1))  # Concat(heads) W^O: (B, Tq, D)
        return output, weights


class VanillaTransformerFeedForward(nn.Module):
    """3.3: FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = VanillaTransformerLinear(config.d_model, ffn_dim)
        self.fc2 = VanillaTransformerLinear(ffn_dim, config.d_model)
        self.activation = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # (B, L, D) -> (B, L, D)
        hidden_states = self.activation(self.fc1(hidden_states))
        hidden_states = F.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


class VanillaTransformerEncoderLayer(GradientCheckpointingLayer):
    """3.1: self-attention, then the feed-forward network, each as LayerNorm(x + Dropout(Sublayer(x)))."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int):
        super().__init__()
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.feed_forward = VanillaTransformerFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = config.dropout

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs) -> torch.Tensor:
        # hidden_states: (B, S, D)
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.self_attn_layer_norm(residual + hidden_states)

        residual = hidden_states
        hidden_states = self.feed_forward(hidden_states)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.final_layer_norm(residual + hidden_states)
        return hidden_states  # (B, S, D)


class VanillaTransformerDecoderLayer(GradientCheckpointingLayer):
    """3.1: masked self-attention, encoder-decoder attention (queries from the decoder, keys and values from the
    encoder output), then the feed-forward network; each as LayerNorm(x + Dropout(Sublayer(x)))."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int):
        super().__init__()
        heads = config.decoder_attention_heads
        self.self_attn = VanillaTransformerAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VanillaTransformerAttention(config, heads, is_cross_attention=True, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.feed_forward = VanillaTransformerFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = config.dropout

    def forward(
        self,
        hidden_states: torch.Tensor,  # (B, T, D)
        attention_mask: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor,  # (B, S, D)
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.self_attn(
            hidden_states, attention_mask=attention_mask, past_key_values=past_key_values, **kwargs
        )
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.self_attn_layer_norm(residual + hidden_states)

        residual = hidden_states
        hidden_states, _ = self.encoder_attn(
            hidden_states,
            attention_mask=encoder_attention_mask,
            key_value_states=encoder_hidden_states,
            past_key_values=past_key_values,
            **kwargs,
        )
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.encoder_attn_layer_norm(residual + hidden_states)

        residual = hidden_states
        hidden_states = self.feed_forward(hidden_states)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.final_layer_norm(residual + hidden_states)
        return hidden_states  # (B, T, D)


# --- 5.4: the label-smoothed loss, computed a block of target positions at a time -------------------------------
# Training needs only the loss and its gradient, not the (B, T, V) logits: at the paper's vocabulary (37000) a batch
# of 64 x 36 targets has 85M logits (340 MB in float32, and as much again for their gradient), and log-softmax over
# them, forward and backward, took 12% of a base training step on CPU (docs/BENCHMARKS.md). So the training loss
# projects only non-padding positions, a block at a time, and takes each block's gradient right away:
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


class VanillaTransformerPreTrainedModel(PreTrainedModel):
    config: VanillaTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # The paper does not say; Xavier-uniform linear layers and N(0, d_model^-0.5) embeddings are the
        # usual choice for post-LN Transformers (the scaled input embeddings then start with unit variance).
        std = self.config.init_std or self.config.d_model**-0.5
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, VanillaTransformerSinusoidalPositionalEmbedding):
            init.copy_(module.table, sinusoidal_position_table(*module.table.shape))


def _position_embedding(config: VanillaTransformerConfig) -> nn.Module:
    if config.position_embedding_type == "learned":
        return VanillaTransformerLearnedPositionalEmbedding(config)
    return VanillaTransformerSinusoidalPositionalEmbedding(config)


class VanillaTransformerEncoder(VanillaTransformerPreTrainedModel):
    """N encoder layers over the scaled shared embeddings plus positions."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__(config)
        self.embed_tokens = embed_tokens  # the shared matrix (3.4), owned by VanillaTransformerModel
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = _position_embedding(config)
        self.layers = nn.ModuleList(
            [VanillaTransformerEncoderLayer(config, layer_idx=i) for i in range(config.encoder_layers)]
        )
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,  # (B, S)
        attention_mask: torch.Tensor | None = None,  # (B, S): 1 for tokens, 0 for padding
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` and `inputs_embeds` to the encoder.")
        if inputs_embeds is None:
            _check_token_ids(input_ids, self.config.vocab_size, "input_ids")
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale  # 3.4: scaled by sqrt(d_model)
        _check_attention_mask(attention_mask, inputs_embeds.shape[:2], "attention_mask")

        # 3.5 and 5.4: dropout on the sum of embeddings and positions
        positions = self.embed_positions(0, inputs_embeds.shape[1])
        hidden_states = inputs_embeds + positions.to(inputs_embeds.dtype)  # (B, S, D)
        hidden_states = F.dropout(hidden_states, p=self.config.dropout, training=self.training)

        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)  # (B, S, D); no final LayerNorm (post-LN)


class VanillaTransformerDecoder(VanillaTransformerPreTrainedModel):
    """N decoder layers; position i attends to positions < = i only (3.2.3), and to the whole encoder output."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerDecoderLayer,
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__(config)
        self.embed_tokens = embed_tokens  # the shared matrix (3.4), owned by VanillaTransformerModel
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = _position_embedding(config)
        self.layers = nn.ModuleList(
            [VanillaTransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)]
        )
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, past + T)
        encoder_hidden_states: torch.Tensor | None = None,  # (B, S, D)
        encoder_attention_mask: torch.Tensor | None = None,  # (B, S)
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `decoder_input_ids` and `decoder_inputs_embeds`.")
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states` (the encoder output).")
        if inputs_embeds is None:
            _check_token_ids(input_ids, self.config.vocab_size, "decoder_input_ids")
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale  # 3.4: scaled by sqrt(d_model)
        batch_size, length = inputs_embeds.shape[:2]
        if encoder_hidden_states.shape[0] != batch_size:
            raise ValueError(
                f"The encoder output has batch size {encoder_hidden_states.shape[0]} but the decoder inputs have "
                f"{batch_size}."
            )

        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        _check_attention_mask(attention_mask, (batch_size, past_length + length), "decoder_attention_mask")
        _check_attention_mask(encoder_attention_mask, encoder_hidden_states.shape[:2], "attention_mask")

        positions = self.embed_positions(past_length, length)
        hidden_states = inputs_embeds + positions.to(inputs_embeds.dtype)  # (B, T, D)
        hidden_states = F.dropout(hidden_states, p=self.config.dropout, training=self.training)

        self_attention_cache = getattr(past_key_values, "self_attention_cache", past_key_values)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=self_attention_cache,
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, for gradient checkpointing
                encoder_attention_mask=encoder_attention_mask,
                past_key_values=past_key_values,
                **kwargs,
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, past_key_values=past_key_values
        )


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """Encoder and decoder over ONE embedding matrix shared by source and target (3.4)."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        self.encoder = VanillaTransformerEncoder(config, self.shared)
        self.decoder = VanillaTransformerDecoder(config, self.shared)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        self.encoder.embed_tokens = value
        self.decoder.embed_tokens = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            past_key_values=decoder_outputs.past_key_values,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
    """The model plus the pre-softmax linear layer, which shares the embedding matrix (3.4)."""

    _tied_weights_keys = {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = VanillaTransformerLinear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`, *optional*):
            Target token ids; -100 marks padding. The decoder inputs are the labels shifted right from
            `config.decoder_start_token_id` unless `decoder_input_ids` are given. The loss is the mean
            cross-entropy over non-padding targets, label-smoothed by `config.label_smoothing` (5.4). In training
            mode with gradients enabled only the loss is computed (`logits` is None): see
            `label_smoothed_cross_entropy`. For logits in training, pass no labels and compute the loss yourself.
        """
        if labels is not None:
            _check_token_ids(labels, self.config.vocab_size, "labels", allow_ignore_index=True)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = shift_tokens_right(
                    labels, self.config.pad_token_id, self.config.decoder_start_token_id
                )
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state  # (B, T, D)
        logits = loss = None
        if labels is not None and self._training_loss_only():  # 5.4, without the (B, T, V) logits
            loss = label_smoothed_cross_entropy(
                hidden_states, self.lm_head.weight, labels, self.config.label_smoothing
            )
        else:
            logits = self.lm_head(hidden_states)  # (B, T, V)
            if labels is not None:
                loss = F.cross_entropy(
                    logits.float().view(-1, logits.shape[-1]),
                    labels.reshape(-1),
                    ignore_index=-100,
                    label_smoothing=self.config.label_smoothing,
                )
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def _training_loss_only(self) -> bool:
        """Training with labels: return the loss (and no logits), computed by `label_smoothed_cross_entropy`."""
        return (
            self.training
            and torch.is_grad_enabled()
            and type(self.lm_head) is VanillaTransformerLinear
            and self.lm_head.bias is None
            and not is_torchdynamo_compiling()
        )

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def _reorder_cache(self, past_key_values: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
        """Beam search, after each step: row i of the cache continues beam `beam_idx[i]`.

        Only the decoder's own keys and values move. All beams of a sentence share the encoder-decoder keys and
        values (`generate` repeats each source `num_beams` times), and beams never change sentence, so those never
        move: after the first step they are kept once per group of identical rows, and the encoder-decoder
        attention reads each group's row once for all its beams. If a beam ever moves to another group's row, they
        are expanded back to one row per beam and reordered, as `generate`'s default reorder does.
        """
        past_key_values.self_attention_cache.reorder_cache(beam_idx)
        cross_attention_cache = past_key_values.cross_attention_cache
        if cross_attention_cache.get_seq_length() == 0:
            return past_key_values
        layers = cross_attention_cache.layers
        rows, stored_rows = len(beam_idx), layers[0].keys.shape[0]
        if stored_rows < rows:  # already one row per group
            beams = rows // stored_rows
        else:
            beams = _beam_group_size([tensor for layer in layers for tensor in (layer.keys, layer.values)])
        if beams > 1 and torch.equal(beam_idx // beams, torch.arange(rows, device=beam_idx.device) // beams):
            # Every beam stays in its group, whose rows are all the same: nothing moves.
            if stored_rows == rows and self.config._attn_implementation in ("eager", "sdpa"):  # `_group_beams` fits
                for layer in layers:
                    layer.keys, layer.values = layer.keys[::beams].contiguous(), layer.values[::beams].contiguous()
            return past_key_values
        if stored_rows < rows:
            for layer in layers:
                layer.keys = layer.keys.repeat_interleave(beams, dim=0)
                layer.values = layer.values.repeat_interleave(beams, dim=0)
        cross_attention_cache.reorder_cache(beam_idx)
        return past_key_values


def _register_auto_classes() -> None:
    """Make the Auto classes know this model on import, and make `save_pretrained` write `auto_map`
    and copy the two .py files beside the weights (Hub sharing with trust_remote_code)."""
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    try:
        AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig)
        AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel)
        AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration)
    except ValueError:  # already registered (e.g. the module was imported twice under different names)
        pass
    VanillaTransformerConfig.register_for_auto_class()
    VanillaTransformerModel.register_for_auto_class("AutoModel")
    VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


_register_auto_classes()

__all__ = [
    "VanillaTransformerPreTrainedModel",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
]
