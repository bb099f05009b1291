"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers PreTrainedModel.

Hub-facing: this file is copied beside the weights of every saved model and runs as remote code, so it imports
only torch, transformers and its sibling files (the configuration, the translation pipeline). Classes go from leaf
to top, as the paper's section 3: positions (3.5), attention (3.2), feed-forward (3.3), encoder and decoder layers
(3.1), the stacks, the model with its one shared embedding matrix (3.4), the pre-softmax head.

Every sub-layer is post-LN: LayerNorm(x + Dropout(Sublayer(x))).
Shapes: B = batch, S = source length, T = target length, D = d_model, H = heads, V = vocabulary; per head, queries
and keys have d_k and values d_v = D / H features (d_k = d_v but in Table 3's row B).

The library's contract, as `modeling_marian.py` keeps it: the one embedding matrix is tied through
`_tied_weights_keys` (one Parameter, reported missing like any other weight), and Marian's separate vocabularies
(`share_encoder_decoder_embeddings`, `decoder_vocab_size`) and untied head change only the embeddings and which
weights are tied; the decoder cache is `cache` (the old
name `past_key_values` through `deprecate_kwarg`), `**kwargs: Unpack[TransformersKwargs]` reach the attention, and the
loss is transformers' cross-entropy. How the project trains (label smoothing, the loss without logits) lives in its
training library, and folders saved by its earlier releases are upgraded by `vanilla-transformer refresh-code`.
"""

import inspect
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
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, is_torchdynamo_compiling
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

# Sibling files, relatively imported (transformers fetches them with the model's code from the Hub): the
# configuration, and the pipeline file's output length (section 6.1's input + 50), which `paper_max_new_tokens` gives
try:  # as Hub remote code (a package)
    from .configuration_vanilla_transformer import VanillaTransformerConfig
    from .pipeline_vanilla_transformer import output_length
except ImportError:  # as installed top-level modules
    from configuration_vanilla_transformer import VanillaTransformerConfig
    from pipeline_vanilla_transformer import output_length

SUPPORTED_TRANSFORMERS = ">=5.24"  # the `cache` name; pyproject.toml declares the same, .ci/run tests it


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
    if frequencies == "fairseq":  # fairseq's own arithmetic, in float32: converted models get its table exactly
        frequency = torch.exp(torch.arange(half, dtype=torch.float32) * -(math.log(10000.0) / max(dim // 2 - 1, 1)))
        angle = torch.arange(offset, offset + num_positions, dtype=torch.float32).unsqueeze(1) * frequency  # (P, half)
    else:
        position = torch.arange(offset, offset + num_positions, dtype=torch.float64).unsqueeze(1)  # (P, 1)
        angle = position / torch.pow(10000.0, torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (P, half)
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
    unless `config.qk_head_dim` says otherwise (Table 3, row B).
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

    def _heads(self, projected: torch.Tensor, head_dim: int) -> torch.Tensor:
        # (B, L, H * head_dim) -> (B, H, L, head_dim)
        return projected.view(*projected.shape[:-1], self.num_heads, head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,  # (B, Tq, D)
        attention_mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,  # encoder output (B, S, D) for encoder-decoder attention
        cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        query = self._heads(self.q_proj(hidden_states), self.qk_head_dim)
        if self.is_cross_attention and cache is not None and cache.is_updated.get(self.layer_idx):
            layer_cache = cache.cross_attention_cache.layers[self.layer_idx]  # the encoder output's, from step 1
            key, value = layer_cache.keys, layer_cache.values
        else:
            source = key_value_states if self.is_cross_attention else hidden_states
            key = self._heads(self.k_proj(source), self.qk_head_dim)
            value = self._heads(self.v_proj(source), self.head_dim)
            if cache is not None and self.is_cross_attention:
                key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
                cache.is_updated[self.layer_idx] = True
            elif cache is not None:  # append this step's keys and values to the decoder's cache
                key, value = cache.self_attention_cache.update(key, value, self.layer_idx)

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

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs: Unpack[TransformersKwargs]
    ) -> torch.Tensor:
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
        **kwargs: Unpack[TransformersKwargs],
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


def _token_embedding(config: VanillaTransformerConfig, vocab_size: int) -> nn.Embedding:
    """A stack's token embedding, which VanillaTransformerModel makes its `shared` matrix (3.4): built empty, as
    its values are the shared matrix's (with separate vocabularies, the stack's own, initialised as any weight)."""
    weight = torch.empty(vocab_size, config.d_model)
    return nn.Embedding(vocab_size, config.d_model, padding_idx=config.pad_token_id, _weight=weight)


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

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.embed_tokens = _token_embedding(config, config.vocab_size)
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
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` and `inputs_embeds` to the encoder.")
        if inputs_embeds is None:
            _check_token_ids(input_ids, self.embed_tokens.num_embeddings, "input_ids", values=not self.training)
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale  # 3.4: scaled by sqrt(d_model)
        _check_attention_mask(attention_mask, inputs_embeds.shape[:2], "attention_mask")

        # 3.5 and 5.4: dropout on the sum of embeddings and positions
        positions = self.embed_positions(0, inputs_embeds.shape[1])
        hidden_states = inputs_embeds + positions.to(inputs_embeds.dtype)  # (B, S, D)
        hidden_states = F.dropout(hidden_states, p=self.config.dropout, training=self.training)

        attention_mask = create_bidirectional_mask(  # skipping a full mask reads it: not in a training step
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            allow_is_bidirectional_skip=not self.training,
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

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.embed_tokens = _token_embedding(config, config.decoder_vocab_size)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_positions = _position_embedding(config)
        self.layers = nn.ModuleList(
            [VanillaTransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)]
        )
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, past + T)
        encoder_hidden_states: torch.Tensor | None = None,  # (B, S, D)
        encoder_attention_mask: torch.Tensor | None = None,  # (B, S)
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `decoder_input_ids` and `decoder_inputs_embeds`.")
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states` (the encoder output).")
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        # A static cache counts its length in a tensor (torch.compile traces it; reading it would synchronise): the
        # checks of the user's inputs run where the length is a Python int (no cache, a dynamic cache, a static
        # cache's first call), which covers every call with user inputs.
        first_call = isinstance(past_length, int) and past_length == 0
        if inputs_embeds is None:
            if first_call:  # the user's ids; generate's later steps feed back the model's own
                _check_token_ids(
                    input_ids, self.embed_tokens.num_embeddings, "decoder_input_ids", values=not self.training
                )
            inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale  # 3.4: scaled by sqrt(d_model)
        self._check_shapes(inputs_embeds, past_length, attention_mask, encoder_hidden_states, encoder_attention_mask)
        if first_call and cache is not None and hasattr(self.embed_positions, "grow"):
            # a static cache's size (-1 for one that grows), before decoding: later steps only index the table
            self.embed_positions.grow(cache.self_attention_cache.get_max_length())
        positions = self.embed_positions(past_length, inputs_embeds.shape[1])
        hidden_states = inputs_embeds + positions.to(inputs_embeds.dtype)  # (B, T, D)
        hidden_states = F.dropout(hidden_states, p=self.config.dropout, training=self.training)

        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=cache.self_attention_cache if cache is not None else None,
            allow_is_causal_skip=not self.training,  # skipping a mask reads it: not in a training step
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
            allow_is_bidirectional_skip=not self.training,
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
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, cache=cache)

    @staticmethod
    def _check_shapes(inputs_embeds, past_length, attention_mask, encoder_hidden_states, encoder_attention_mask):
        batch_size, length = inputs_embeds.shape[:2]
        if encoder_hidden_states.shape[0] != batch_size:
            raise ValueError(
                f"The encoder output has batch size {encoder_hidden_states.shape[0]} but the decoder inputs have "
                f"{batch_size}."
            )
        if isinstance(past_length, int):
            _check_attention_mask(attention_mask, (batch_size, past_length + length), "decoder_attention_mask")
        _check_attention_mask(encoder_attention_mask, encoder_hidden_states.shape[:2], "attention_mask")


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """Encoder and decoder over ONE embedding matrix shared by source and target (3.4). With
    `share_encoder_decoder_embeddings=False` (separate vocabularies, as Marian's option) or `tie_word_embeddings=False`
    each stack keeps its own."""

    _auto_class = "AutoModel"  # save_pretrained writes `auto_map` and copies the code files (Hub remote code)

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings and config.tie_word_embeddings:
            self.shared = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        else:  # separate vocabularies, or transformers ties nothing (`tie_word_embeddings=False`): no shared matrix
            self._tied_weights_keys = None
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens  # tied to `shared` (3.4), or the source vocabulary's own

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        if hasattr(self, "shared"):
            self.shared = value
            self.decoder.embed_tokens = value
        self.encoder.embed_tokens = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
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
        **kwargs: Unpack[TransformersKwargs],
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
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
    """The model plus the pre-softmax linear layer, which shares the embedding matrix (3.4): the decoder's input
    embedding, with separate vocabularies; a matrix of its own where `tie_word_embeddings` is False."""

    _auto_class = "AutoModelForSeq2SeqLM"

    _tied_weights_keys = {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        if not config.share_encoder_decoder_embeddings:
            self._tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        self.lm_head = nn.Linear(config.d_model, config.decoder_vocab_size, bias=config.lm_head_bias)
        self.loss_type = "ForMaskedLM"  # the labels are the targets as they are: no shift inside the loss
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
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
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`, *optional*):
            Target token ids; -100 marks padding. The decoder inputs are the labels shifted right from
            `config.decoder_start_token_id` unless `decoder_input_ids` are given. The loss is the cross-entropy over
            non-padding targets: their mean, or their sum divided by `num_items_in_batch` where the Trainer passes it
            (gradient accumulation), as transformers' models compute it. Label smoothing (section 5.4) is a training
            setting: the Trainer's `label_smoothing_factor`, or the project's training library.
        logits_to_keep (`int` or `torch.LongTensor`, *optional*, defaults to 0):
            The decoder positions to compute logits for: the last `logits_to_keep` (0: all), or these indices (an
            empty tensor: none, for a loss computed from the decoder's output elsewhere).
        """
        if labels is not None:
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
            **kwargs,
        )
        positions = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(outputs.last_hidden_state[:, positions])  # (B, T, V)
        loss = None if labels is None else self.loss_function(logits, labels, logits.shape[-1], **kwargs)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    # generate() reads this signature at every step of a model with remote code (whether it takes `cache_position`):
    # read once here instead, the same signature (inspect's own, through the decorators)
    forward.__signature__ = inspect.signature(forward)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def paper_max_new_tokens(self, attention_mask: torch.Tensor) -> int:
        """Section 6.1's output length for a batch of sources, input length + 50 (and within a learned position
        table): what the folder's custom_generate/generate.py gives `generate()` when the call sets no length."""
        return output_length(attention_mask, self.config)


# --- inputs ------------------------------------------------------------------------------------------------------


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs are the labels shifted one step right, starting from `decoder_start_token_id`."""
    decoder_input_ids = labels.new_empty(labels.shape)
    decoder_input_ids[:, 1:] = labels[:, :-1]
    decoder_input_ids[:, 0] = decoder_start_token_id
    return decoder_input_ids.masked_fill_(decoder_input_ids == -100, pad_token_id)


def _check_token_ids(ids: torch.Tensor, vocab_size: int, name: str, values: bool) -> None:
    """Clear errors for ids the embedding cannot look up (instead of an IndexError deep in torch). The values are
    read (one device-to-host copy) only where `values`: outside training, so a training step never waits on it."""
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"`{name}` must hold integer token ids, got dtype {ids.dtype}.")
    if ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape (batch, length), got {tuple(ids.shape)}.")
    if ids.shape[1] == 0:
        raise ValueError(f"`{name}` is empty (length 0): every sequence needs at least one token, e.g. </s>.")
    if not values or is_torchdynamo_compiling():
        return
    valid = (ids >= 0) & (ids < vocab_size)
    if not bool(valid.all()):
        raise ValueError(
            f"`{name}` holds ids outside the vocabulary [0, {vocab_size}): e.g. {ids[~valid][:5].tolist()}. "
            "Was the input made with this model's tokenizer?"
        )


def _check_attention_mask(mask: torch.Tensor | None, expected_shape: tuple, name: str) -> None:
    if mask is None or mask.dim() != 2:  # a prepared 4D mask is passed through as it is
        return
    if tuple(mask.shape) != tuple(expected_shape):
        raise ValueError(f"`{name}` has shape {tuple(mask.shape)} but the inputs need {tuple(expected_shape)}.")


__all__ = [
    "VanillaTransformerPreTrainedModel",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
]
