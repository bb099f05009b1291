"""Convert our model to transformers' `MarianMTModel`: the same function in a stock transformers class.

The converted model loads without `trust_remote_code`, and it is what benchmarks/speed.py compares our model against.

Marian is the same architecture: post-LN layers (LayerNorm(x + Dropout(Sublayer(x)))), no final LayerNorm, one
embedding matrix shared by the encoder, the decoder and the (bias-free) pre-softmax projection, optionally scaled by
sqrt(d_model), fixed sinusoidal positions, the same activation functions, and the same layers in every attention
(`q_proj`, `k_proj`, `v_proj`, `out_proj`), copied one to one. One difference is bridged: Marian's sinusoid table
holds the sines in its first half of the features and the cosines in the second, ours interleaves them (section
3.5): the same features in another order. The conversion puts every d_model-sized axis (embeddings, the residual side
of every projection, the LayerNorms) in Marian's order, so Marian's own table adds exactly our positions, and a
converted model saved with `save_pretrained` (which leaves Marian's table out and rebuilds it on loading) loads back
as the same function.

Configs Marian cannot express are refused with a ValueError naming the setting (`marian_problem`): d_k other than
d_model / heads (`qk_head_dim`, Table 3 row B), learned positions (Marian's table is a fixed sinusoid, never
trained nor saved), fairseq's sinusoid frequencies or a position offset (a converted fairseq model) and a LayerNorm
epsilon other than 1e-5 (Marian's LayerNorms use PyTorch's default). A logits bias is Marian's `final_logits_bias`.

Marian's position table has `max_position_embeddings` rows and does not grow (ours does): sources and outputs
longer than that fail in Marian.

Usage:
    from vanilla_transformer.converters.export_marian import check_same_function, to_marian

    marian = to_marian(model)  # a MarianMTModel on the model's device, in its dtype and train/eval mode
    check_same_function(model, marian)  # RuntimeError if their logits differ
    marian.save_pretrained("marian-model")  # MarianMTModel.from_pretrained("marian-model"): no custom code
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import MarianConfig, MarianMTModel

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import (
    VanillaTransformerAttention,
    VanillaTransformerForConditionalGeneration,
    sinusoidal_position_table,
)

MARIAN_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which every Marian LayerNorm uses
# the fields of our config that MarianConfig has under the same name and meaning
MARIAN_SAME_FIELDS = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "activation_function",
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "max_position_embeddings",
    "scale_embedding",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "decoder_start_token_id",
    "forced_eos_token_id",
)


def marian_problem(config: VanillaTransformerConfig) -> str | None:
    """None if a MarianMTModel can compute what a model of `config` computes; else what Marian cannot express."""
    for stack in ("encoder", "decoder"):
        heads = getattr(config, f"{stack}_attention_heads")
        d_v = config.d_model // heads
        if config.qk_head_dim not in (None, d_v):
            return (
                f"qk_head_dim={config.qk_head_dim} (d_k) while the {stack}'s d_v = d_model / heads = {d_v} "
                "(Table 3, row B): Marian's attention has d_k = d_v = d_model / heads"
            )
    if config.position_embedding_type != "sinusoidal":
        return (
            f"position_embedding_type={config.position_embedding_type!r}: Marian's positions are a fixed sinusoid "
            "table, never trained, left out by save_pretrained and rebuilt on loading"
        )
    if (config.position_frequencies, config.position_offset) != ("paper", 0):
        return (
            f"position_frequencies={config.position_frequencies!r}, position_offset={config.position_offset}: "
            "Marian's sinusoids have the paper's frequencies and start at position 0"
        )
    if config.layer_norm_eps != MARIAN_LAYER_NORM_EPS:
        return f"layer_norm_eps={config.layer_norm_eps}: Marian's LayerNorms have epsilon {MARIAN_LAYER_NORM_EPS}"
    return None


def marian_config(config: VanillaTransformerConfig) -> MarianConfig:
    """The MarianConfig of the same architecture and size; ValueError if Marian cannot express `config`."""
    problem = marian_problem(config)
    if problem:
        raise ValueError(f"This model cannot be converted to MarianMTModel: {problem}.")
    same = {name: getattr(config, name) for name in MARIAN_SAME_FIELDS}
    return MarianConfig(**same, share_encoder_decoder_embeddings=True, tie_word_embeddings=True)


def marian_feature_order(d_model: int, layout: str = "interleaved") -> torch.Tensor:
    """Marian's feature j is our feature `order[j]`: our even features (sines), then our odd ones (cosines); with
    Marian's own layout ("sin_cos", a converted OPUS-MT model), the same order."""
    if layout == "sin_cos":
        return torch.arange(d_model)
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def _copy_attention(target: nn.Module, source: VanillaTransformerAttention, order: torch.Tensor) -> None:
    for name in ("q_proj", "k_proj", "v_proj"):  # they read the residual stream: their input features reordered
        getattr(target, name).weight.copy_(getattr(source, name).weight[:, order])
        getattr(target, name).bias.copy_(getattr(source, name).bias)
    _copy_to_residual(target.out_proj, source.out_proj, order)


def _copy_to_residual(target: nn.Module, source: nn.Module, order: torch.Tensor) -> None:
    """A linear layer that writes to the residual stream, or a LayerNorm: its output features reordered."""
    target.weight.copy_(source.weight[order])
    target.bias.copy_(source.bias[order])


@torch.no_grad()
def copy_weights_into_marian(model: VanillaTransformerForConditionalGeneration, marian: MarianMTModel) -> None:
    """Write `model`'s weights into `marian` (built from `marian_config(model.config)`), in Marian's feature order."""
    order = marian_feature_order(model.config.d_model, model.config.position_layout).to(model.device)
    marian.model.shared.weight.copy_(model.model.shared.weight[:, order])  # also the pre-softmax projection
    if model.lm_head.bias is not None:
        marian.final_logits_bias.copy_(model.lm_head.bias[None])
    for stack in ("encoder", "decoder"):
        our_layers, marian_layers = getattr(model.model, stack).layers, getattr(marian.model, stack).layers
        for ours, theirs in zip(our_layers, marian_layers, strict=True):
            _copy_attention(theirs.self_attn, ours.self_attn, order)
            _copy_to_residual(theirs.self_attn_layer_norm, ours.self_attn_layer_norm, order)
            if stack == "decoder":
                _copy_attention(theirs.encoder_attn, ours.encoder_attn, order)
                _copy_to_residual(theirs.encoder_attn_layer_norm, ours.encoder_attn_layer_norm, order)
            theirs.fc1.weight.copy_(ours.feed_forward.fc1.weight[:, order])
            theirs.fc1.bias.copy_(ours.feed_forward.fc1.bias)
            _copy_to_residual(theirs.fc2, ours.feed_forward.fc2, order)
            _copy_to_residual(theirs.final_layer_norm, ours.final_layer_norm, order)


def _check_positions(marian: MarianMTModel) -> None:
    """Marian's sinusoid table must be ours in Marian's feature order (else this transformers release changed it)."""
    table = marian.model.encoder.embed_positions.weight.cpu()
    ours = sinusoidal_position_table(*table.shape)
    if not torch.allclose(table, ours[:, marian_feature_order(table.shape[1])], atol=1e-6):
        raise RuntimeError(
            "This transformers release's Marian position table is not ours with its features reordered: "
            "the conversion would change the model's outputs."
        )


def to_marian(model: VanillaTransformerForConditionalGeneration) -> MarianMTModel:
    """A MarianMTModel that computes what `model` computes, with its weights (copied: the two share no memory), its
    generation defaults, device, dtype and train/eval mode. ValueError if Marian cannot express the model's config
    (`marian_problem` says why)."""
    marian = MarianMTModel(marian_config(model.config)).to(model.device)
    _check_positions(marian)
    copy_weights_into_marian(model, marian)
    marian.generation_config = copy.deepcopy(model.generation_config)
    return marian.to(model.dtype).train(model.training)


def trainable_parameters(model: nn.Module) -> int:
    """Parameters that training updates (Marian's position table is a parameter too, a frozen one)."""
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)


@torch.no_grad()
def check_same_function(
    model: VanillaTransformerForConditionalGeneration, marian: MarianMTModel, tolerance: float = 1e-3
) -> None:
    """RuntimeError unless `marian` gives `model`'s logits (within `tolerance`) on a seeded, padded batch of random
    tokens and has as many trainable parameters: the proof that the two are one architecture, size and function."""
    modes = model.training, marian.training
    model.eval(), marian.eval()
    generator = torch.Generator().manual_seed(0)
    length = min(9, model.config.max_position_embeddings)
    input_ids = torch.randint(model.config.vocab_size, (2, length), generator=generator).to(model.device)
    decoder_input_ids = torch.randint(model.config.vocab_size, (2, length), generator=generator).to(model.device)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, length // 2 :] = 0  # the second source is padded
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    difference = (model(**inputs).logits.float() - marian(**inputs).logits.float()).abs().max().item()
    model.train(modes[0]), marian.train(modes[1])
    if not difference <= tolerance:
        raise RuntimeError(
            f"Ours and Marian disagree (max |logit difference| {difference:.2e} > {tolerance:g}): not the same model."
        )
    ours, theirs = trainable_parameters(model), trainable_parameters(marian)
    if ours != theirs:
        raise RuntimeError(f"Trainable parameters differ: ours {ours:,}, Marian {theirs:,}.")
