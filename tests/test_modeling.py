"""The model against the paper (sections 3.1-3.5) and transformers' contracts."""

import json
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from modeling_vanilla_transformer import (
    VanillaTransformerDecoderLayer,
    VanillaTransformerEncoderLayer,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    shift_tokens_right,
    sinusoidal_position_table,
)

from .helpers import TINY, model_with_attention, random_ids

# --- configuration -------------------------------------------------------------------------------------------


def test_defaults_are_the_paper_base_model():
    config = VanillaTransformerConfig()
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
    assert (config.encoder_ffn_dim, config.encoder_attention_heads, config.dropout) == (2048, 8, 0.1)
    assert config.activation_function == "relu" and config.position_embedding_type == "sinusoidal"
    assert config.scale_embedding and config.tie_word_embeddings


def test_base_preset_has_about_the_paper_parameter_count():
    config = VanillaTransformerConfig.from_preset("base", vocab_size=37000)
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    count = sum(p.numel() for p in model.parameters())  # parameters() counts the shared matrix once
    assert 62_000_000 < count < 64_000_000, count  # the paper reports 65M; the difference is the vocabulary
    embedding = 37000 * 512
    assert count == embedding + 6 * (4 * 512 * 513 + 2 * 512 * 2048 + 2048 + 512 + 4 * 512) + 6 * (
        8 * 512 * 513 + 2 * 512 * 2048 + 2048 + 512 + 6 * 512
    )


def test_big_preset_matches_table_3():
    config = VanillaTransformerConfig.from_preset("big")
    assert (config.d_model, config.encoder_ffn_dim, config.encoder_attention_heads, config.dropout) == (
        1024,
        4096,
        16,
        0.3,
    )
    assert set(PRESETS) >= {"base", "big", "small", "tiny"}
    with pytest.raises(ValueError, match="Unknown preset"):
        VanillaTransformerConfig.from_preset("huge")


@pytest.mark.parametrize(
    "field, value",
    [
        ("encoder_attention_heads", 5),
        ("decoder_attention_heads", 3),
        ("dropout", -0.1),
        ("attention_dropout", 1.0),
        ("activation_function", "sigmoidish"),
        ("position_embedding_type", "rotary"),
        ("d_model", 0),
        ("vocab_size", -1),
        ("pad_token_id", 1000),
        ("qk_head_dim", 0),
        ("decoder_vocab_size", 0),
    ],
)
def test_invalid_config_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        VanillaTransformerConfig(**{**TINY, field: value})


def test_config_round_trip(tmp_path, tiny_config):
    tiny_config.save_pretrained(tmp_path)
    loaded = VanillaTransformerConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == tiny_config.to_dict()


# --- positions (3.5) -----------------------------------------------------------------------------------------


def test_sinusoidal_table_is_the_paper_formula_interleaved():
    dim = 10
    table = sinusoidal_position_table(50, dim)
    for pos in (0, 1, 7, 49):
        for i in range(dim // 2):
            angle = pos / 10000 ** (2 * i / dim)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_positions_extrapolate_past_max_position_embeddings(tiny_model, tiny_config):
    long_source = random_ids(tiny_config, (1, tiny_config.max_position_embeddings * 2 + 3))
    long_target = random_ids(tiny_config, (1, tiny_config.max_position_embeddings + 5), seed=1)
    logits = tiny_model(input_ids=long_source, decoder_input_ids=long_target).logits
    assert logits.shape == (1, long_target.shape[1], tiny_config.vocab_size)
    table = tiny_model.model.encoder.embed_positions.table
    assert torch.allclose(table, sinusoidal_position_table(table.shape[0], tiny_config.d_model))


def test_learned_positions_work_and_refuse_overlong_inputs(tiny_config, tmp_path):
    config = VanillaTransformerConfig(**{**TINY, "position_embedding_type": "learned"})
    model = VanillaTransformerForConditionalGeneration(config).eval()
    source = random_ids(config, (2, 5))
    logits = model(input_ids=source, decoder_input_ids=source).logits
    model.save_pretrained(tmp_path)
    reloaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert torch.equal(reloaded(input_ids=source, decoder_input_ids=source).logits, logits)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=random_ids(config, (1, config.max_position_embeddings + 1)), decoder_input_ids=source)


# --- layers against torch's reference implementation ---------------------------------------------------------


def copy_attention(ours, theirs):
    """torch's in_proj_weight holds W^Q, W^K, W^V by rows."""
    for projection, weight, bias in zip(
        (ours.q_proj, ours.k_proj, ours.v_proj),
        theirs.in_proj_weight.chunk(3),
        theirs.in_proj_bias.chunk(3),
        strict=True,
    ):
        projection.weight.copy_(weight)
        projection.bias.copy_(bias)
    ours.out_proj.load_state_dict(theirs.out_proj.state_dict())


def copy_feed_forward_and_norms(ours, theirs, norm_names):
    ours.feed_forward.fc1.load_state_dict(theirs.linear1.state_dict())
    ours.feed_forward.fc2.load_state_dict(theirs.linear2.state_dict())
    for our_norm, their_norm in norm_names:
        getattr(ours, our_norm).load_state_dict(getattr(theirs, their_norm).state_dict())


@torch.no_grad()
def test_encoder_layer_matches_torch_transformer_encoder_layer(tiny_config):
    ours = VanillaTransformerEncoderLayer(tiny_config, layer_idx=0).eval()
    theirs = nn.TransformerEncoderLayer(
        tiny_config.d_model,
        tiny_config.encoder_attention_heads,
        tiny_config.encoder_ffn_dim,
        dropout=0.1,
        activation="relu",
        batch_first=True,
        norm_first=False,
    ).eval()
    copy_attention(ours.self_attn, theirs.self_attn)
    copy_feed_forward_and_norms(ours, theirs, [("self_attn_layer_norm", "norm1"), ("final_layer_norm", "norm2")])
    hidden = torch.randn(3, 7, tiny_config.d_model)
    expected = theirs(hidden)
    assert torch.allclose(ours(hidden, attention_mask=None), expected, atol=1e-5)


@torch.no_grad()
def test_decoder_layer_matches_torch_transformer_decoder_layer(tiny_config):
    config = VanillaTransformerConfig(**{**TINY, "_attn_implementation": "eager"})
    ours = VanillaTransformerDecoderLayer(config, layer_idx=0).eval()
    theirs = nn.TransformerDecoderLayer(
        config.d_model,
        config.decoder_attention_heads,
        config.decoder_ffn_dim,
        dropout=0.1,
        activation="relu",
        batch_first=True,
        norm_first=False,
    ).eval()
    copy_attention(ours.self_attn, theirs.self_attn)
    copy_attention(ours.encoder_attn, theirs.multihead_attn)
    copy_feed_forward_and_norms(
        ours,
        theirs,
        [("self_attn_layer_norm", "norm1"), ("encoder_attn_layer_norm", "norm2"), ("final_layer_norm", "norm3")],
    )
    target, memory = torch.randn(3, 6, config.d_model), torch.randn(3, 8, config.d_model)
    causal = nn.Transformer.generate_square_subsequent_mask(6)  # 0 on and below the diagonal, -inf above
    expected = theirs(target, memory, tgt_mask=causal, tgt_is_causal=True)
    ours_out = ours(target, causal[None, None], memory, encoder_attention_mask=None)
    assert torch.allclose(ours_out, expected, atol=1e-5)


# --- Table 3, row (B): d_k other than d_v --------------------------------------------------------------------


@torch.no_grad()
def test_row_b_attention_is_softmax_of_q_k_over_sqrt_d_k_times_v_with_d_v_values():
    config = VanillaTransformerConfig(**{**TINY, "qk_head_dim": 4, "_attn_implementation": "eager"})
    layer = VanillaTransformerEncoderLayer(config, layer_idx=0).eval()
    attention, heads, d_k, d_v = layer.self_attn, 4, 4, 8  # TINY: d_model 32, 4 heads
    assert attention.q_proj.weight.shape == attention.k_proj.weight.shape == (heads * d_k, 32)
    assert attention.v_proj.weight.shape == (heads * d_v, 32)
    assert attention.out_proj.weight.shape == (32, heads * d_v)
    hidden = torch.randn(2, 5, 32)
    query, key, value = attention.q_proj(hidden), attention.k_proj(hidden), attention.v_proj(hidden)
    query, key = query.view(2, 5, heads, d_k).transpose(1, 2), key.view(2, 5, heads, d_k).transpose(1, 2)
    value = value.view(2, 5, heads, d_v).transpose(1, 2)
    weights = torch.softmax(query @ key.transpose(2, 3) / math.sqrt(d_k), dim=-1)
    expected = attention.out_proj((weights @ value).transpose(1, 2).reshape(2, 5, heads * d_v))
    output, _ = attention(hidden)
    assert torch.allclose(output, expected, atol=1e-6)


@torch.no_grad()
def test_row_b_model_generates_the_same_tokens_on_every_path(source_batch):
    """d_k = 4 against d_v = 8: sdpa = eager, cached = uncached."""
    eager, sdpa = model_with_attention("eager", qk_head_dim=4), model_with_attention("sdpa", qk_head_dim=4)
    sdpa.load_state_dict(eager.state_dict())
    input_ids, attention_mask = source_batch
    target = random_ids(eager.config, (2, 6), seed=2)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=target)
    assert torch.allclose(eager(**inputs).logits, sdpa(**inputs).logits, atol=1e-5)
    settings = dict(attention_mask=attention_mask, num_beams=4, max_new_tokens=10, do_sample=False)
    beams = sdpa.generate(input_ids, **settings)
    assert torch.equal(beams, sdpa.generate(input_ids, use_cache=False, **settings))


def test_row_b_model_saves_and_loads_with_its_d_k(tmp_path, source_batch):
    model = model_with_attention("sdpa", qk_head_dim=4)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["qk_head_dim"] == 4
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    input_ids, attention_mask = source_batch
    with torch.no_grad():
        assert torch.equal(
            model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6),
            loaded.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6),
        )


# --- masks: no future leakage, padding invariance, no NaN ----------------------------------------------------


@torch.no_grad()
def test_changing_a_future_target_token_never_changes_earlier_logits(tiny_model, tiny_config, source_batch):
    input_ids, attention_mask = source_batch
    target = random_ids(tiny_config, (2, 8), seed=3)
    logits = tiny_model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=target).logits
    for position in (3, 7):
        changed = target.clone()
        changed[:, position] = (changed[:, position] + 1 - 4) % (tiny_config.vocab_size - 4) + 4
        changed_logits = tiny_model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=changed)
        assert torch.allclose(changed_logits.logits[:, :position], logits[:, :position], atol=1e-6)
        assert not torch.allclose(changed_logits.logits[:, position:], logits[:, position:], atol=1e-4)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@torch.no_grad()
def test_source_padding_never_changes_the_logits(tiny_config, attn_implementation):
    model = model_with_attention(attn_implementation)
    source = random_ids(tiny_config, (1, 6))
    target = random_ids(tiny_config, (1, 5), seed=1)
    alone = model(input_ids=source, decoder_input_ids=target).logits
    padded = torch.cat([source, torch.full((1, 4), tiny_config.pad_token_id)], dim=1)
    mask = torch.cat([torch.ones(1, 6, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long)], dim=1)
    assert torch.allclose(
        model(input_ids=padded, attention_mask=mask, decoder_input_ids=target).logits, alone, atol=1e-5
    )


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@torch.no_grad()
def test_a_fully_padded_row_gives_no_nan(tiny_config, attn_implementation):
    model = model_with_attention(attn_implementation)
    source = random_ids(tiny_config, (2, 5))
    mask = torch.ones_like(source)
    mask[1] = 0
    logits = model(input_ids=source, attention_mask=mask, decoder_input_ids=source[:, :3]).logits
    assert torch.isfinite(logits).all()


@torch.no_grad()
def test_eager_and_sdpa_agree(tiny_config, source_batch):
    input_ids, attention_mask = source_batch
    eager, sdpa = model_with_attention("eager"), model_with_attention("sdpa")
    sdpa.load_state_dict(eager.state_dict())
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    target = random_ids(tiny_config, (2, 6), seed=2)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=target)
    assert torch.allclose(eager(**inputs).logits, sdpa(**inputs).logits, atol=1e-5)


# --- embeddings (3.4) ------------------------------------------------------------------------------------------


def test_one_embedding_matrix_scaled_on_the_input_side_only(tiny_model, tiny_config):
    shared = tiny_model.model.shared.weight
    assert tiny_model.lm_head.weight is shared
    assert tiny_model.model.encoder.embed_tokens.weight is shared
    assert tiny_model.model.decoder.embed_tokens.weight is shared
    # the encoder's first layer input is sqrt(d_model) * E[x] + PE (dropout is off in eval mode)
    source = random_ids(tiny_config, (1, 4))
    captured = {}
    tiny_model.model.encoder.layers[0].register_forward_pre_hook(lambda m, args: captured.update(x=args[0]))
    tiny_model(input_ids=source, decoder_input_ids=source)
    expected = shared[source] * math.sqrt(tiny_config.d_model) + sinusoidal_position_table(4, tiny_config.d_model)
    assert torch.allclose(captured["x"], expected, atol=1e-5)
    # and the pre-softmax projection is the unscaled matrix
    hidden = torch.randn(1, 1, tiny_config.d_model)
    assert torch.allclose(tiny_model.lm_head(hidden), hidden @ shared.T, atol=1e-6)


# --- separate vocabularies: Marian's fields, the same model --------------------------------------------------------

SEPARATE = dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=43)


def embedding_matrices(model) -> dict[str, int]:
    """The data pointer of each token matrix: the encoder's and decoder's input, and the pre-softmax projection."""
    return {
        "encoder": model.model.encoder.embed_tokens.weight.data_ptr(),
        "decoder": model.model.decoder.embed_tokens.weight.data_ptr(),
        "lm_head": model.lm_head.weight.data_ptr(),
    }


def test_the_default_model_has_one_matrix_three_ways(tiny_model):
    assert set(embedding_matrices(tiny_model).values()) == {tiny_model.model.shared.weight.data_ptr()}


@pytest.mark.parametrize("tie_word_embeddings", [True, False])
def test_separate_vocabularies_give_each_stack_its_own_matrix_and_logits_of_the_target_vocabulary(
    tie_word_embeddings,
):
    config = VanillaTransformerConfig(**{**TINY, **SEPARATE, "tie_word_embeddings": tie_word_embeddings})
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    assert not hasattr(model.model, "shared")
    assert model.model.encoder.embed_tokens.weight.shape == (TINY["vocab_size"], TINY["d_model"])
    assert model.model.decoder.embed_tokens.weight.shape == (43, TINY["d_model"])
    assert model.lm_head.weight.shape == (43, TINY["d_model"])
    matrices = embedding_matrices(model)
    assert matrices["encoder"] != matrices["decoder"]
    assert (matrices["lm_head"] == matrices["decoder"]) == tie_word_embeddings
    assert model.get_input_embeddings() is model.model.encoder.embed_tokens

    source = random_ids(config, (2, 5))  # ids up to vocab_size: the source vocabulary
    target = torch.randint(4, 43, (2, 4), generator=torch.Generator().manual_seed(1))
    captured = {}
    model.model.decoder.layers[0].register_forward_pre_hook(lambda m, args: captured.update(x=args[0]))
    logits = model(input_ids=source, decoder_input_ids=target).logits
    assert logits.shape == (2, 4, 43)
    # the decoder's input is its own matrix, scaled by sqrt(d_model), plus the same sinusoids
    decoder_matrix = model.model.decoder.embed_tokens.weight
    expected = decoder_matrix[target] * math.sqrt(TINY["d_model"]) + sinusoidal_position_table(4, TINY["d_model"])
    assert torch.allclose(captured["x"], expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"decoder_input_ids.*\[0, 43\)"):
        model(input_ids=source, decoder_input_ids=torch.full((1, 2), 50))


@pytest.mark.parametrize(
    "fields",
    [{}, SEPARATE, {**SEPARATE, "tie_word_embeddings": False}, {"tie_word_embeddings": False}],
    ids=["paper", "separate", "separate-untied", "shared-untied"],
)
def test_every_embedding_layout_saves_and_loads_exactly_with_its_matrices(tmp_path, fields, source_batch):
    config = VanillaTransformerConfig(**{**TINY, **fields})
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).eval()
    model.save_pretrained(tmp_path)
    loaded, loading = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(loading[kind] for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert loaded.config.decoder_vocab_size == config.decoder_vocab_size
    assert hasattr(loaded.model, "shared") == (config.share_encoder_decoder_embeddings and config.tie_word_embeddings)
    pointers, loaded_pointers = embedding_matrices(model), embedding_matrices(loaded)
    assert (pointers["encoder"] == pointers["decoder"]) == (
        config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    )
    assert (pointers["lm_head"] == pointers["decoder"]) == config.tie_word_embeddings
    assert [pointers[a] == pointers[b] for a in pointers for b in pointers] == [
        loaded_pointers[a] == loaded_pointers[b] for a in loaded_pointers for b in loaded_pointers
    ]
    input_ids, attention_mask = source_batch
    target = input_ids[:, :4] % config.decoder_vocab_size
    assert torch.equal(
        model(input_ids, attention_mask=attention_mask, decoder_input_ids=target).logits,
        loaded(input_ids, attention_mask=attention_mask, decoder_input_ids=target).logits,
    )


def test_one_shared_matrix_makes_the_decoder_vocabulary_the_vocabulary():
    assert VanillaTransformerConfig(**TINY).decoder_vocab_size == TINY["vocab_size"]
    assert VanillaTransformerConfig(**{**TINY, "decoder_vocab_size": 43}).decoder_vocab_size == TINY["vocab_size"]
    separate = VanillaTransformerConfig(**{**TINY, "share_encoder_decoder_embeddings": False})
    assert separate.decoder_vocab_size == TINY["vocab_size"]


def test_a_decoder_token_outside_the_target_vocabulary_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="decoder_start_token_id.*decoder_vocab_size=3"):
        VanillaTransformerConfig(**{**TINY, **SEPARATE, "decoder_vocab_size": 3, "decoder_start_token_id": 5})


def test_resize_token_embeddings_keeps_the_tie(tiny_model):
    old_size = tiny_model.config.vocab_size
    tiny_model.resize_token_embeddings(old_size + 7)
    assert tiny_model.config.vocab_size == old_size + 7
    shared = tiny_model.model.shared.weight
    assert shared.shape[0] == old_size + 7
    assert tiny_model.lm_head.weight is shared
    assert tiny_model.model.encoder.embed_tokens.weight is shared
    assert tiny_model.model.decoder.embed_tokens.weight is shared
    new_token = torch.tensor([[old_size + 3, 2]])
    assert tiny_model(input_ids=new_token, decoder_input_ids=new_token).logits.shape[-1] == old_size + 7


# --- loss ----------------------------------------------------------------------------------------------------


def test_labels_give_the_plain_loss_and_the_logits_as_bart_and_marian_do(tiny_config, source_batch):
    model = VanillaTransformerForConditionalGeneration(tiny_config).train()  # training mode with gradients, too
    input_ids, attention_mask = source_batch
    labels = random_ids(tiny_config, (2, 5), seed=4)
    labels[1, 3:] = -100
    torch.manual_seed(0)
    output = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    decoder_input_ids = shift_tokens_right(labels, tiny_config.pad_token_id, tiny_config.decoder_start_token_id)
    assert decoder_input_ids[0, 0] == tiny_config.decoder_start_token_id
    assert torch.equal(decoder_input_ids[:, 1:4], labels[:, :3].clamp(min=0))
    assert output.logits is not None and output.logits.shape == (2, 5, tiny_config.vocab_size)
    plain = F.cross_entropy(output.logits.transpose(1, 2), labels, ignore_index=-100)
    torch.testing.assert_close(output.loss, plain)


def test_model_overfits_one_batch(tiny_config, source_batch):
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**{**TINY, "dropout": 0.0}))
    input_ids, attention_mask = source_batch
    labels = random_ids(tiny_config, (2, 6), seed=5)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    first = None
    for _ in range(60):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        first = first if first is not None else loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.1 * first
    model.eval()
    generated = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(generated[:, 1:7], labels)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_config, source_batch):
    config = VanillaTransformerConfig(**{**TINY, "dropout": 0.0})
    input_ids, attention_mask = source_batch
    labels = random_ids(config, (2, 5), seed=6)
    gradients = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = VanillaTransformerForConditionalGeneration(config).train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert model.model.encoder.gradient_checkpointing
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        gradients.append(model.model.decoder.layers[0].self_attn.q_proj.weight.grad.clone())
    assert torch.allclose(gradients[0], gradients[1], atol=1e-6)


# --- outputs -------------------------------------------------------------------------------------------------


def test_attentions_and_hidden_states_are_returned(tiny_config, source_batch):
    model = model_with_attention("eager")
    input_ids, attention_mask = source_batch
    target = random_ids(tiny_config, (2, 4))
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=target,
        output_attentions=True,
        output_hidden_states=True,
    )
    heads, layers = tiny_config.encoder_attention_heads, tiny_config.encoder_layers
    assert len(out.encoder_attentions) == layers and out.encoder_attentions[0].shape == (2, heads, 9, 9)
    assert len(out.decoder_attentions) == layers and out.decoder_attentions[0].shape == (2, heads, 4, 4)
    assert len(out.cross_attentions) == layers and out.cross_attentions[0].shape == (2, heads, 4, 9)
    assert len(out.encoder_hidden_states) == layers + 1 and len(out.decoder_hidden_states) == layers + 1
    # attention weights are probabilities; padded source positions get none; the decoder never looks ahead
    assert torch.allclose(out.cross_attentions[0].sum(-1), torch.ones(2, heads, 4), atol=1e-5)
    assert out.cross_attentions[0][1, :, :, 6:].abs().max() < 1e-6
    assert torch.triu(out.decoder_attentions[0], diagonal=1).abs().max() < 1e-6
    assert torch.equal(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)


def test_base_model_returns_seq2seq_model_output(tiny_config, source_batch):
    model = VanillaTransformerModel(tiny_config).eval()
    input_ids, attention_mask = source_batch
    out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :3])
    assert out.last_hidden_state.shape == (2, 3, tiny_config.d_model)
    assert out.encoder_last_hidden_state.shape == (2, 9, tiny_config.d_model)


# --- bad input gets a clear error ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda b: {**b, "input_ids": b["input_ids"] + 1000}, "outside the vocabulary"),
        (lambda b: {**b, "input_ids": -b["input_ids"]}, "outside the vocabulary"),
        (lambda b: {**b, "input_ids": b["input_ids"].float()}, "integer token ids"),
        (lambda b: {**b, "input_ids": b["input_ids"][:, :0], "attention_mask": None}, "empty"),
        (lambda b: {**b, "attention_mask": b["attention_mask"][:, :-1]}, "attention_mask` has shape"),
        (lambda b: {**b, "decoder_input_ids": b["decoder_input_ids"] + 1000}, "decoder_input_ids` holds ids"),
        (lambda b: {**b, "decoder_input_ids": b["decoder_input_ids"][:, :0]}, "empty"),
        (lambda b: {**b, "decoder_attention_mask": torch.ones(2, 9)}, "decoder_attention_mask` has shape"),
        (lambda b: {**b, "input_ids": b["input_ids"][0]}, r"shape \(batch, length\)"),
    ],
)
def test_bad_inputs_get_clear_errors(tiny_model, source_batch, change, message):
    input_ids, attention_mask = source_batch
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4])
    with pytest.raises(ValueError, match=message):
        tiny_model(**change(batch))
