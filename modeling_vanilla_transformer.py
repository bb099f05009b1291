"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers PreTrainedModel.

Hub-facing: this file is copied beside the weights of every saved model and runs as remote code, so it imports
only torch, transformers and its sibling files (configuration, the translation pipeline, the speed paths). Classes go
from leaf to top, as the paper's section 3: positions (3.5), attention (3.2), feed-forward (3.3), encoder and decoder
layers (3.1), the stacks, the model with its one shared embedding matrix (3.4), the pre-softmax head.

Every sub-layer is post-LN: LayerNorm(x + Dropout(Sublayer(x))).
Shapes: B = batch, S = source length, T = target length, D = d_model, H = heads, V = vocabulary; per head, queries
and keys have d_k and values d_v = D / H features (d_k = d_v but in Table 3's row B).

The speed paths (oneDNN linear layers on CPU, the projections of one input as one product, beam search's
encoder-decoder keys and values kept once per sentence, the training loss without logits) live in
fast_paths_vanilla_transformer.py, each with a switch.
"""

import inspect
import math
from collections.abc import Callable
from functools import partial

import torch
import transformers
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

# Sibling files, relatively imported so that transformers copies them into every saved folder (and fetches them
# with the model's code from the Hub); the pipeline is the one config.json's `custom_pipelines` names.
try:  # as Hub remote code (a package)
    from .configuration_vanilla_transformer import VanillaTransformerConfig
    from .fast_paths_vanilla_transformer import (
        fused_projections,
        grouped_beam_attention,
        label_smoothed_cross_entropy,
        reorder_grouped_cache,
        use_onednn_linears,
    )
    from .pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline, output_length  # noqa: F401
except ImportError:  # as installed top-level modules
    from configuration_vanilla_transformer import VanillaTransformerConfig
    from fast_paths_vanilla_transformer import (
        fused_projections,
        grouped_beam_attention,
        label_smoothed_cross_entropy,
        reorder_grouped_cache,
        use_onednn_linears,
    )
    from pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline, output_length  # noqa: F401


logger = logging.get_logger(__name__)


def sinusoidal_position_table(
    num_positions: int, dim: int, layout: str = "interleaved", frequencies: str = "paper", offset: int = 0
) -> torch.Tensor:
    """3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Interleaved, as the paper: sine on even dimensions, cosine on odd ones. Converted models keep their own choices
    (`config.position_layout`, `position_frequencies`, `position_offset`): "sin_cos" puts all sines first, then all
    cosines; "fairseq" frequencies are 1 / 10000^(i / (d/2 - 1)); row p is position p + offset. Returns
    (num_positions, dim) in float32.
    """
    half = (dim + 1) // 2  # sines; cosines: dim // 2
    position = torch.arange(offset, offset + num_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
    i = torch.arange(half, dtype=torch.float64)
    exponent = 2 * i / dim if frequencies == "paper" else i / max(dim // 2 - 1, 1)
    angle = position / torch.pow(10000.0, exponent)  # (P, half)
    sines, cosines = torch.sin(angle), torch.cos(angle[:, : dim // 2])
    if layout == "sin_cos":
        return torch.cat([sines, cosines], dim=1).float()
    table = torch.empty(num_positions, dim, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = sines, cosines
    return table.float()


def position_table(config: VanillaTransformerConfig, num_positions: int) -> torch.Tensor:
    """The model's sinusoidal table of `num_positions` rows, with the config's layout, frequencies and offset."""
    return sinusoidal_position_table(
        num_positions, config.d_model, config.position_layout, config.position_frequencies, config.position_offset
    )


class VanillaTransformerSinusoidalPositionalEmbedding(nn.Module):
    """Fixed sinusoidal positions (3.5). The table is a non-persistent buffer that grows on demand, so
    sequences longer than `max_position_embeddings` work (the paper's reason for choosing sinusoids)."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.config = config
        self.register_buffer("table", position_table(config, config.max_position_embeddings), False)

    def forward(self, past_length: int | torch.Tensor, length: int) -> torch.Tensor:  # -> (length, D)
        if not isinstance(past_length, int):  # a static cache's length, a tensor: index without reading it
            return self.table.index_select(0, torch.arange(length, device=self.table.device) + past_length)
        end = past_length + length
        if end > self.table.shape[0]:
            self.grow(end)
        return self.table[past_length:end]

    def grow(self, positions: int) -> None:
        """Make the table hold at least `positions` rows (a static cache's size is known before decoding)."""
        if positions > self.table.shape[0]:
            new_size = max(positions, 2 * self.table.shape[0])
            self.table = position_table(self.config, new_size).to(self.table.device)


class VanillaTransformerLearnedPositionalEmbedding(nn.Embedding):
    """Learned positions: Table 3, row (E). Limited to `max_position_embeddings`."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config.max_position_embeddings, config.d_model)

    def forward(self, past_length: int | torch.Tensor, length: int) -> torch.Tensor:  # -> (length, D)
        if not isinstance(past_length, int):  # a static cache's length: generate() keeps within the table
            return self.weight.index_select(0, torch.arange(length, device=self.weight.device) + past_length)
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
    # 3.2.1: softmax(Q K^T / sqrt(d_k)) V; query/key (B, H, Tq/Tk, d_k), value (B, H, Tk, d_v)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, Tq, Tk)
    if attention_mask is not None:  # additive: 0 where allowed, the dtype's minimum where masked
        scores = scores + attention_mask
    weights = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, Tq, H, d_v)
    return output, weights


class VanillaTransformerAttention(nn.Module):
    """3.2.2: MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The per-head projections of all heads are one matrix each: `q_proj` and `k_proj` (D -> H d_k), `v_proj`
    (D -> H d_v), `out_proj` (H d_v -> D), as in every attention of BART and Marian. Encoder-decoder attention takes
    its keys and values from the encoder output, computed once per generation (cached). d_v = D / H; d_k = D / H too
    unless `config.qk_head_dim` says otherwise (Table 3, row B). The projections of one input (Q, K and V of
    self-attention; K and V of the encoder output) run as one product in the fast paths (`fused_projections`).
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
        self.head_dim = config.d_model // num_heads  # d_v
        self.qk_head_dim = config.qk_head_dim or self.head_dim  # d_k
        self.scaling = self.qk_head_dim**-0.5
        self.dropout = config.attention_dropout
        self.is_cross_attention = is_cross_attention
        self.is_causal = is_causal  # read by the sdpa/flash attention functions
        self.layer_idx = layer_idx
        qk_size, v_size = num_heads * self.qk_head_dim, num_heads * self.head_dim
        self.q_proj = nn.Linear(config.d_model, qk_size)  # W^Q
        self.k_proj = nn.Linear(config.d_model, qk_size)  # W^K
        self.v_proj = nn.Linear(config.d_model, v_size)  # W^V
        self.out_proj = nn.Linear(v_size, config.d_model)  # W^O
        # Xavier-initialised as one matrix with the projections of the same input, as when they were one layer:
        # a seed gives the model it gave before (`_init_weights`)
        same_input = (self.k_proj, self.v_proj) if is_cross_attention else (self.q_proj, self.k_proj, self.v_proj)
        for projection in same_input:
            projection.xavier_fan_out = sum(layer.out_features for layer in same_input)
        self.register_load_state_dict_pre_hook(split_fused_projections)  # checkpoints saved before they were separate

    def _heads(self, projected: torch.Tensor, head_dim: int) -> torch.Tensor:
        # (B, L, H * head_dim) -> (B, H, L, head_dim)
        return projected.view(*projected.shape[:-1], self.num_heads, head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,  # (B, Tq, D)
        attention_mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,  # encoder output (B, S, D) for encoder-decoder attention
        cache: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.is_cross_attention:
            query = self._heads(self.q_proj(hidden_states), self.qk_head_dim)
            if cache is not None and cache.is_updated.get(self.layer_idx):
                layer_cache = cache.cross_attention_cache.layers[self.layer_idx]
                key, value = layer_cache.keys, layer_cache.values
            else:  # K W^K and V W^V of the encoder output, as one product where they can be (fast paths)
                key, value = fused_projections(self, key_value_states, self.k_proj, self.v_proj)
                key, value = self._heads(key, self.qk_head_dim), self._heads(value, self.head_dim)
                if cache is not None:
                    key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
                    cache.is_updated[self.layer_idx] = True
        else:  # Q W^Q, K W^K and V W^V of the same input, as one product where they can be (fast paths)
            query, key, value = fused_projections(self, hidden_states, self.q_proj, self.k_proj, self.v_proj)
            query, key = self._heads(query, self.qk_head_dim), self._heads(key, self.qk_head_dim)
            value = self._heads(value, self.head_dim)
            if cache is not None:  # append this step's keys and values to the decoder's cache
                key, value = cache.self_attention_cache.update(key, value, self.layer_idx)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if key.shape[0] < query.shape[0]:  # beam search, keys and values kept once per sentence (fast paths)
            attention_interface = partial(grouped_beam_attention, attention_interface)
        output, weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )  # output: (B, Tq, H, d_v)
        output = self.out_proj(output.reshape(*hidden_states.shape[:-1], -1))  # Concat(heads) W^O: (B, Tq, D)
        return output, weights


class VanillaTransformerFeedForward(nn.Module):
    """3.3: FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
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
        cache: EncoderDecoderCache | None = None,
        **kwargs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states, attention_mask=attention_mask, cache=cache, **kwargs)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.self_attn_layer_norm(residual + hidden_states)

        residual = hidden_states
        hidden_states, _ = self.encoder_attn(
            hidden_states,
            attention_mask=encoder_attention_mask,
            key_value_states=encoder_hidden_states,
            cache=cache,
            **kwargs,
        )
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.encoder_attn_layer_norm(residual + hidden_states)

        residual = hidden_states
        hidden_states = self.feed_forward(hidden_states)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.final_layer_norm(residual + hidden_states)
        return hidden_states  # (B, T, D)


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
        if isinstance(module, nn.Linear):  # Xavier-uniform; the attention's projections of one input as one matrix
            fan_out = getattr(module, "xavier_fan_out", module.out_features)
            bound = math.sqrt(3.0) * math.sqrt(2.0 / float(module.in_features + fan_out))  # as xavier_uniform_'s
            init.uniform_(module.weight, -bound, bound)
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
            init.copy_(module.table, position_table(module.config, module.table.shape[0]))

    def post_init(self) -> None:
        super().post_init()
        use_onednn_linears(self, self.config)  # the fast paths' oneDNN products; the layers stay nn.Linear


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
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: Cache | None = None,  # the cache's name before transformers 5.24
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `decoder_input_ids` and `decoder_inputs_embeds`.")
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states` (the encoder output).")
        cache = decoder_cache(cache, past_key_values, kwargs, use_cache, self.config)
        past_length = cache.get_seq_length() if cache is not None else 0
        # A static cache counts its length in a tensor (torch.compile traces it; reading it would synchronise): the
        # checks of the user's inputs run where the length is a Python int (no cache, a dynamic cache, a static
        # cache's first call), which covers every call with user inputs.
        length_known = isinstance(past_length, int)
        if inputs_embeds is None:
            if length_known and past_length == 0:  # the user's ids; generate's later steps feed back the model's own
                _check_token_ids(input_ids, self.config.vocab_size, "decoder_input_ids")
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale  # 3.4: scaled by sqrt(d_model)
        batch_size, length = inputs_embeds.shape[:2]
        if encoder_hidden_states.shape[0] != batch_size:
            raise ValueError(
                f"The encoder output has batch size {encoder_hidden_states.shape[0]} but the decoder inputs have "
                f"{batch_size}."
            )
        if length_known:
            _check_attention_mask(attention_mask, (batch_size, past_length + length), "decoder_attention_mask")
        _check_attention_mask(encoder_attention_mask, encoder_hidden_states.shape[:2], "attention_mask")

        if length_known and past_length == 0 and cache is not None and hasattr(self.embed_positions, "grow"):
            # a static cache's size (-1 for one that grows), before decoding: later steps only index the table
            self.embed_positions.grow(cache.self_attention_cache.get_max_length())
        positions = self.embed_positions(past_length, length)
        hidden_states = inputs_embeds + positions.to(inputs_embeds.dtype)  # (B, T, D)
        hidden_states = F.dropout(hidden_states, p=self.config.dropout, training=self.training)

        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            **{MASK_CACHE_ARGUMENT: cache.self_attention_cache if cache is not None else None},
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
                cache=cache,
                **kwargs,
            )
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, **{CACHE_NAME: cache})


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
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        past_key_values: Cache | None = None,  # the cache's name before transformers 5.24
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
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            past_key_values=past_key_values,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **{CACHE_NAME: getattr(decoder_outputs, CACHE_NAME)},
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
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.lm_head_bias)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, **kwargs):
        """`GenerationMixin.generate`, whose output length is section 6.1's, input length + 50 (ending early at
        </s>), when neither the call nor the generation config sets one: transformers' own fallback, 20 new tokens,
        cuts translations mid-sentence. `max_new_tokens` or `max_length`, in the call or in generation_config.json,
        is used as given."""
        config = generation_config if generation_config is not None else self.generation_config
        lengths = ("max_new_tokens", "max_length")
        if all(kwargs.get(name) is None and getattr(config, name, None) is None for name in lengths):
            if (source_mask := self._source_mask(inputs, kwargs)) is not None:
                kwargs["max_new_tokens"] = output_length(source_mask, self.config)
        return super().generate(inputs, generation_config, **kwargs)

    @staticmethod
    def _source_mask(inputs: torch.Tensor | None, kwargs: dict) -> torch.Tensor | None:
        """The (batch, source length) mask of the sources a generate() call translates, from whatever it was given."""
        if kwargs.get("attention_mask") is not None:
            return kwargs["attention_mask"]
        encoder_outputs = kwargs.get("encoder_outputs")
        for source in (
            inputs,
            kwargs.get("input_ids"),
            kwargs.get("inputs_embeds"),
            encoder_outputs and encoder_outputs[0],
        ):
            if isinstance(source, torch.Tensor) and source.dim() >= 2:
                return torch.ones(source.shape[:2], dtype=torch.long)
        return None

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
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        epsilon_ls: float = 0.0,
        return_logits: bool = True,
        num_items_in_batch: int | torch.Tensor | None = None,
        past_key_values: Cache | None = None,  # the cache's name before transformers 5.24
        **kwargs,
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`, *optional*):
            Target token ids; -100 marks padding. The decoder inputs are the labels shifted right from
            `config.decoder_start_token_id` unless `decoder_input_ids` are given. The loss is the mean cross-entropy
            over non-padding targets, as in BART and Marian.
        epsilon_ls (`float`, *optional*, defaults to 0):
            The loss's label smoothing (section 5.4 trains with 0.1). A training setting, never saved with the model.
            Named without "label" because the Trainer takes every forward() parameter with "label" in its name
            for a label column. `label_smoothing=` is still read.
        num_items_in_batch (*optional*):
            The non-padding targets of the whole (accumulated) batch, as the Trainer passes it: the loss is then the
            sum over this micro-batch divided by it, so gradient accumulation gives the mean over the whole batch.
        return_logits (`bool`, *optional*, defaults to True):
            False computes the loss without the (B, T, V) logits (`logits` is None), block by block, with the
            same value and gradients (`label_smoothed_cross_entropy` in the fast paths); the training script's path.
        """
        epsilon_ls = kwargs.pop("label_smoothing", epsilon_ls)
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
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            past_key_values=past_key_values,
            **kwargs,
        )
        logits, loss = self._logits_and_loss(outputs.last_hidden_state, labels, epsilon_ls, return_logits)
        if loss is not None and num_items_in_batch is not None:  # the sum, over the whole accumulated batch's count
            loss = loss * (labels != -100).sum() / num_items_in_batch
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_NAME: getattr(outputs, CACHE_NAME)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def _logits_and_loss(self, hidden_states, labels, epsilon_ls: float, return_logits: bool):
        """The pre-softmax projection (B, T, D) -> (B, T, V) and the mean cross-entropy over non-padding labels; with
        `return_logits=False`, the loss alone, without the logits (fast paths)."""
        if labels is not None and not return_logits and self.lm_head.bias is None:
            return None, label_smoothed_cross_entropy(hidden_states, self.lm_head.weight, labels, epsilon_ls)
        logits = self.lm_head(hidden_states)  # (B, T, V)
        if labels is None:
            return logits, None
        loss = F.cross_entropy(
            logits.float().view(-1, logits.shape[-1]),
            labels.reshape(-1),
            ignore_index=-100,
            label_smoothing=epsilon_ls,
        )
        return logits, loss

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def _reorder_cache(self, cache: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
        """Beam search, after each step: row i of the cache continues beam `beam_idx[i]`. The encoder-decoder keys
        and values, the same for all beams of a sentence, are kept once per sentence (`reorder_grouped_cache`).
        generate() calls this hook, where a model has one, from 5.4 to 5.24 at least."""
        return reorder_grouped_cache(
            cache, beam_idx, self.config._attn_implementation, self.config.grouped_beam_cross_attention
        )


# --- the decoder cache, under the installed transformers' name ---------------------------------------------------
# transformers 5.24 renamed the decoder's key/value cache from `past_key_values` to `cache`: generate() passes it to
# forward() and reads it back from the outputs under the name of the output classes' field, and the mask functions
# take it under the new name. This file runs under whatever release a user has, so it reads the names from what is
# installed (the output classes' fields, the mask function's parameters), never from a table of version numbers;
# forward() accepts the cache under either name.

CACHE_NAME = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"
MASK_CACHE_ARGUMENT = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"
SUPPORTED_TRANSFORMERS = ">=5.23"  # tested at 5.23.0 and the newest by .ci/run; pyproject.toml declares the same


def decoder_cache(
    cache: Cache | None, past_key_values: Cache | None, kwargs: dict, use_cache: bool | None, config
) -> EncoderDecoderCache | None:
    """The decoder's cache, given under either name (a new one when `use_cache` and none is given). A cache under
    any other name means the installed transformers passes it as this file cannot know: refuse, rather than decode
    without it (every step would then attend to its own token only)."""
    if cache is not None and past_key_values is not None:
        raise ValueError("Pass the decoder cache once, as `cache` (or `past_key_values` before transformers 5.24).")
    cache = cache if cache is not None else past_key_values
    unknown = [name for name, value in kwargs.items() if isinstance(value, Cache)]
    if unknown:
        raise TypeError(
            f"transformers {transformers.__version__} passed the decoder cache as `{unknown[0]}`, a name this model's "
            f"code does not read (it reads `cache` and `past_key_values`; it supports transformers"
            f"{SUPPORTED_TRANSFORMERS}). Refresh the folder's code with `vanilla-transformer refresh-code "
            "FOLDER`, or install a supported transformers."
        )
    if use_cache and cache is None:
        cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    elif cache is not None and not isinstance(cache, EncoderDecoderCache):  # a decoder-only cache: add the encoder's
        cache = EncoderDecoderCache(cache, DynamicCache(config=config))
    return cache


# --- inputs ------------------------------------------------------------------------------------------------------


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


# --- checkpoints saved before the attention's projections were separate layers --------------------------------------
# Until issue 33, self-attention's W^Q, W^K, W^V were one layer `qkv_proj` (rows q, k, v) and encoder-decoder
# attention's W^K, W^V one layer `kv_proj` (rows k, v; its W^Q was `q_proj` already). Their weights load into the
# separate layers: through `from_pretrained` by transformers' checkpoint conversion (registered below), and through
# nn.Module.load_state_dict (accelerate's load_state, the training script's checkpoint averaging) by each
# attention's pre-hook. Nothing writes the old names back: saving writes the layers as they are.

FUSED_PROJECTIONS = {  # sub-layer: (the old fused layer, the layers it splits into, in its row order)
    "self_attn": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "encoder_attn": ("kv_proj", ("k_proj", "v_proj")),
}


def split_fused_projections(attention: VanillaTransformerAttention, state_dict: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook of an attention: an old checkpoint's fused `qkv_proj` or `kv_proj` weight and bias,
    split into the rows of the separate projections (in place; `state_dict` is load_state_dict's own copy). One of
    another size (another model's) is left as it is, for load_state_dict to report."""
    fused, parts = FUSED_PROJECTIONS["encoder_attn" if attention.is_cross_attention else "self_attn"]
    qk_size, v_size = attention.num_heads * attention.qk_head_dim, attention.num_heads * attention.head_dim
    sizes = [v_size if part == "v_proj" else qk_size for part in parts]
    for name in ("weight", "bias"):
        key = f"{prefix}{fused}.{name}"
        if key in state_dict and state_dict[key].dim() > 0 and state_dict[key].shape[0] == sum(sizes):
            for part, rows in zip(parts, state_dict.pop(key).split(sizes), strict=True):
                state_dict[f"{prefix}{part}.{name}"] = rows


def split_fused_projections_of(model: nn.Module, state_dict: dict) -> dict:
    """`state_dict` (of `model`, with any module prefix `model` has) with the fused projections of an old checkpoint
    split as `model.load_state_dict` splits them; a new dict. For code that reads checkpoints by key (averaging)."""
    state_dict = dict(state_dict)
    for name, module in model.named_modules():
        if isinstance(module, VanillaTransformerAttention):
            split_fused_projections(module, state_dict, f"{name}." if name else "")
    return state_dict


def _register_checkpoint_conversion() -> None:
    """Make from_pretrained split the fused layers of old checkpoints (transformers' conversion mapping, read for
    this model type whether the class is installed or Hub code). The rows are split at the sizes of the model's own
    layers (d_k may differ from d_v: Table 3, row B). Conversions are reversed when a model is saved; this one is
    not: a loaded model saves its separate layers."""
    try:
        from transformers.conversion_mapping import register_checkpoint_conversion_mapping
        from transformers.core_model_loading import Split, WeightConverter, WeightRenaming
    except ImportError:  # a transformers without the API: old checkpoints then load only through load_state_dict
        return

    class SplitFusedProjections(WeightConverter):
        __slots__ = ()

        def reverse_transform(self) -> WeightRenaming:  # saving: a renaming that matches no key
            return WeightRenaming(source_patterns="(?!)", target_patterns="(?!)")

    conversions = [
        SplitFusedProjections(f"{layer}.{fused}", [f"{layer}.{part}" for part in parts], operations=[Split(dim=0)])
        for layer, (fused, parts) in FUSED_PROJECTIONS.items()
    ]
    register_checkpoint_conversion_mapping(VanillaTransformerConfig.model_type, conversions, overwrite=True)


_register_checkpoint_conversion()


def _register_auto_classes() -> None:
    """Make the Auto classes know this model on import, and make `save_pretrained` write `auto_map`
    and copy this file, the configuration and the relatively imported siblings beside the weights (Hub sharing
    with trust_remote_code)."""
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
