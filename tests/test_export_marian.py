"""vanilla_transformer.converters.export_marian: transformers' MarianMTModel computes what our model computes, decodes as it does,
keeps that through save_pretrained, and configs it cannot express are refused by name."""

import re

import pytest
import torch
from transformers import MarianMTModel

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.converters.export_marian import check_same_function, to_marian, trainable_parameters

from .helpers import TINY


def randomised(model: VanillaTransformerForConditionalGeneration) -> VanillaTransformerForConditionalGeneration:
    """`model` with every parameter drawn at random: freshly made, its biases are 0 and its LayerNorms 1 and 0, as in
    a fresh Marian, so that a bias or LayerNorm the conversion left out would go unnoticed."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    return model


def logits(model, input_ids, attention_mask) -> torch.Tensor:
    decoder_input_ids = torch.randint(4, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"scale_embedding": False, "activation_function": "gelu"},
        # an odd d_model (Marian's table then has one more sine than cosine) and other heads in the decoder
        {"d_model": 33, "encoder_attention_heads": 3, "decoder_attention_heads": 11},
    ],
)
def test_marian_computes_our_logits_on_a_padded_batch(overrides, source_batch):
    ours = randomised(
        VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**{**TINY, **overrides})).eval()
    )
    marian = to_marian(ours)
    assert isinstance(marian, MarianMTModel) and not marian.training
    torch.testing.assert_close(logits(marian, *source_batch), logits(ours, *source_batch), rtol=1e-5, atol=1e-5)
    check_same_function(ours, marian)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_marian_generates_the_memorised_translations_as_ours(memorising_model, num_beams):
    # each token depends on the ones decoded before it: a wrong cache or position offset in Marian changes them
    model, sources, targets = memorising_model
    marian = to_marian(model)
    ours = model.generate(sources, num_beams=num_beams, max_new_tokens=12)
    theirs = marian.generate(sources, num_beams=num_beams, max_new_tokens=12)
    assert torch.equal(theirs, ours)
    assert torch.equal(theirs[:, 1:], targets)  # after the decoder start token


def test_marian_keeps_our_dtype_mode_and_generation_defaults(tiny_model, source_batch):
    tiny_model.generation_config.max_new_tokens = 3
    marian = to_marian(tiny_model.to(torch.bfloat16).train())
    assert {parameter.dtype for parameter in marian.parameters()} == {torch.bfloat16} and marian.training
    assert marian.generate(source_batch[0], attention_mask=source_batch[1]).shape == (2, 1 + 3)


def test_marian_has_as_many_trainable_parameters_as_ours(tiny_model):
    marian = to_marian(tiny_model)
    assert trainable_parameters(marian) == trainable_parameters(tiny_model) == tiny_model.num_parameters()
    assert marian.lm_head.weight is marian.model.shared.weight  # tied, as ours: one matrix, counted once


def test_marian_shares_no_memory_with_ours(tiny_model, source_batch):
    marian = to_marian(tiny_model)
    before = logits(tiny_model, *source_batch)
    with torch.no_grad():
        for parameter in marian.parameters():
            parameter.zero_()
    torch.testing.assert_close(logits(tiny_model, *source_batch), before, rtol=0, atol=0)


def test_a_saved_marian_loads_back_as_the_same_function(tiny_model, source_batch, tmp_path):
    # save_pretrained leaves Marian's position table out and from_pretrained rebuilds its own: ours must be that table
    ours = randomised(tiny_model)
    to_marian(ours).save_pretrained(tmp_path)
    reloaded = MarianMTModel.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(logits(reloaded, *source_batch), logits(ours, *source_batch), rtol=1e-5, atol=1e-5)


def test_check_same_function_refuses_a_marian_with_one_projection_left_out(tiny_model):
    marian = to_marian(tiny_model)
    with torch.no_grad():
        marian.model.decoder.layers[1].encoder_attn.v_proj.weight.normal_()
    with pytest.raises(RuntimeError, match="Ours and Marian disagree"):
        check_same_function(tiny_model, marian)


@pytest.mark.parametrize(
    "overrides, named",
    [
        ({"qk_head_dim": 4}, "qk_head_dim=4"),  # Table 3, row B: d_k 4, d_v 8
        ({"position_embedding_type": "learned"}, "position_embedding_type='learned'"),  # Table 3, row E
        ({"layer_norm_eps": 1e-6}, "layer_norm_eps=1e-06"),
    ],
)
def test_configs_marian_cannot_express_are_refused_naming_the_setting(overrides, named):
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**TINY, **overrides))
    with pytest.raises(ValueError, match=re.escape(f"cannot be converted to MarianMTModel: {named}")):
        to_marian(model)
