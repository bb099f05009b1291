"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Hub-facing: this file is copied beside the weights of every saved model, so it imports nothing from the
training library. The defaults are the paper's base model (Table 3); `VanillaTransformerConfig.from_preset`
gives the named presets.
"""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

# Table 3 of the paper: "base" and "big" (both N=6). "small" is a CPU-sized model (Multi30k on a laptop) and
# "tiny" the embedded synthetic task's model. Each row: d_model, d_ff, h, N (the encoder's and the decoder's), P_drop.
_PRESET_SIZES = {
    "base": (512, 2048, 8, 6, 0.1),
    "big": (1024, 4096, 16, 6, 0.3),
    "small": (256, 1024, 4, 3, 0.1),
    "tiny": (128, 512, 4, 3, 0.1),
}
PRESETS = {
    name: dict(
        d_model=d_model,
        encoder_ffn_dim=d_ff,
        decoder_ffn_dim=d_ff,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_layers=layers,
        decoder_layers=layers,
        dropout=dropout,
    )
    for name, (d_model, d_ff, heads, layers, dropout) in _PRESET_SIZES.items()
}

ACTIVATION_FUNCTIONS = ("relu", "gelu", "gelu_new", "silu", "swish", "tanh")
POSITION_EMBEDDING_TYPES = ("sinusoidal", "learned")
POSITION_LAYOUTS = ("interleaved", "sin_cos")
POSITION_FREQUENCIES = ("paper", "fairseq")


@strict
class VanillaTransformerConfig(PreTrainedConfig):
    r"""
    The post-LN encoder-decoder of the paper. Attribute names follow BART/Marian.

    vocab_size: size of the ONE vocabulary shared by source and target (the paper: 37000 BPE tokens for EN-DE), or
        of the source's where `share_encoder_decoder_embeddings` is False.
    share_encoder_decoder_embeddings: one embedding matrix for the encoder's and the decoder's input (section 3.4,
        the default). False: separate vocabularies (Marian's field), the encoder's of `vocab_size` tokens and the
        decoder's of `decoder_vocab_size`, as published models with separate source and target vocabularies have.
    decoder_vocab_size: size of the target vocabulary; None means `vocab_size`, and with one shared matrix it is
        `vocab_size` whatever it says (as Marian's model reads it).
    d_model: width of every sub-layer output (d_model in the paper); d_v = d_model / heads.
    qk_head_dim: d_k, the per-head size of queries and keys; None means d_model / heads, as in the paper's base
        model. Table 3, row (B) makes it smaller at the same d_v.
    encoder_layers / decoder_layers: N, the number of stacked layers.
    encoder_attention_heads / decoder_attention_heads: h, the number of heads.
    encoder_ffn_dim / decoder_ffn_dim: d_ff, the inner size of the position-wise feed-forward network.
    activation_function: the FFN non-linearity; the paper uses ReLU (section 3.3).
    dropout: P_drop, applied to every sub-layer output and to the sum of embeddings and positions (5.4).
    attention_dropout / activation_dropout: dropout on attention weights / inside the FFN (0 in the paper).
    max_position_embeddings: rows of the position table. Sinusoidal tables grow past it on demand;
        learned positions (Table 3, row E) cannot.
    position_embedding_type: "sinusoidal" (section 3.5) or "learned".
    position_layout: where the sinusoids sit in a position vector: "interleaved", the paper's (sine on even
        dimensions, cosine on odd ones, section 3.5), or "sin_cos" (all sines, then all cosines: Marian, fairseq,
        tensor2tensor). The two only permute dimensions; converted weights need the layout they were trained with.
    position_frequencies: "paper", 1 / 10000^(2i / d_model), or "fairseq", 1 / 10000^(i / (d_model / 2 - 1))
        (fairseq's and FSMT's, i = 0 .. d_model / 2 - 1).
    position_offset: the position of the first token (0 in the paper and Marian; fairseq and FSMT count from
        padding_idx + 1).
    lm_head_bias: add a learned bias to the logits (Marian's `final_logits_bias`); the paper has none.
    scale_embedding: multiply input embeddings by sqrt(d_model) (section 3.4).
    tie_word_embeddings: the decoder's input embedding is also the pre-softmax projection (section 3.4). With the
        defaults, the paper's ONE matrix shared three ways. False: transformers ties no weight at all (its meaning of
        the field for every model, Marian's included): each stack's input and the projection are matrices of their own
        (Marian keeps an unused `shared` matrix then; this model has none).
    layer_norm_eps: epsilon of every LayerNorm.
    init_std: standard deviation of the embedding initialisation; None means d_model ** -0.5, so that the
        scaled embeddings start with unit variance. Linear layers use Xavier-uniform initialisation.

    How the model was trained (label smoothing, the schedule) is not here: a saved config holds what the model is.

    Example:
        >>> config = VanillaTransformerConfig.from_preset("big", vocab_size=37000)
    """

    model_type = "vanilla_transformer"
    _auto_class = "AutoConfig"  # save_pretrained writes `auto_map` and copies this file (Hub remote code)
    keys_to_ignore_at_inference = ["cache"]
    attribute_map = {
        "num_attention_heads": "encoder_attention_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    share_encoder_decoder_embeddings: bool = True
    decoder_vocab_size: int | None = None
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    qk_head_dim: int | None = None
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    activation_function: str = "relu"
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    max_position_embeddings: int = 1024
    position_embedding_type: str = "sinusoidal"
    position_layout: str = "interleaved"
    position_frequencies: str = "paper"
    position_offset: int = 0
    lm_head_bias: bool = False
    scale_embedding: bool = True
    tie_word_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    init_std: float | None = None
    use_cache: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    forced_eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        if self.decoder_vocab_size is not None and self.decoder_vocab_size <= 0:
            raise ValueError(
                f"`decoder_vocab_size` must be a positive integer or None, got {self.decoder_vocab_size}."
            )
        if self.share_encoder_decoder_embeddings or self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        self._check_values()
        super().__post_init__(**kwargs)

    def _check_values(self):
        """Raise a ValueError naming the field for values the model cannot be built with."""
        positive = [
            "vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "max_position_embeddings",
        ]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {getattr(self, name)}.")
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            if self.d_model % getattr(self, name) != 0:
                raise ValueError(
                    f"`d_model` ({self.d_model}) must be divisible by `{name}` ({getattr(self, name)}), "
                    "since d_v = d_model / heads."
                )
        if self.qk_head_dim is not None and self.qk_head_dim <= 0:
            raise ValueError(f"`qk_head_dim` must be a positive integer or None, got {self.qk_head_dim}.")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1), got {getattr(self, name)}.")
        if self.activation_function not in ACTIVATION_FUNCTIONS:
            raise ValueError(
                f"`activation_function` must be one of {ACTIVATION_FUNCTIONS}, got {self.activation_function!r}."
            )
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"`position_embedding_type` must be one of {POSITION_EMBEDDING_TYPES}, "
                f"got {self.position_embedding_type!r}."
            )
        for name, allowed in (("position_layout", POSITION_LAYOUTS), ("position_frequencies", POSITION_FREQUENCIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"`{name}` must be one of {allowed}, got {getattr(self, name)!r}.")
        if self.position_offset < 0:
            raise ValueError(f"`position_offset` must be a non-negative integer, got {self.position_offset}.")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"`layer_norm_eps` must be positive, got {self.layer_norm_eps}.")
        if self.init_std is not None and self.init_std <= 0:
            raise ValueError(f"`init_std` must be positive or None, got {self.init_std}.")
        for name in ("pad_token_id", "bos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"`{name}` ({value}) must be a token id in [0, vocab_size={self.vocab_size}).")
        self._check_end_of_sentence()
        for name in ("pad_token_id", "decoder_start_token_id"):  # the decoder's inputs too
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.decoder_vocab_size:
                raise ValueError(
                    f"`{name}` ({value}) must be a token id in [0, decoder_vocab_size={self.decoder_vocab_size})."
                )

    def _check_end_of_sentence(self):
        """The end-of-sentence id ends a source (its vocabulary) and a translation (the decoder's)."""
        eos_ids = self.eos_token_id if isinstance(self.eos_token_id, list) else [self.eos_token_id]
        for value in eos_ids:
            if value is not None and not 0 <= value < min(self.vocab_size, self.decoder_vocab_size):
                raise ValueError(
                    f"`eos_token_id` ({value}) must be a token id in [0, vocab_size={self.vocab_size}) and "
                    f"[0, decoder_vocab_size={self.decoder_vocab_size})."
                )

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VanillaTransformerConfig":
        """The paper's "base" or "big" model (Table 3), or the CPU-sized "small" and "tiny"; `overrides` win."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})


__all__ = ["VanillaTransformerConfig", "PRESETS"]
