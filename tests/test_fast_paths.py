"""The speed paths (fast_paths_vanilla_transformer.py) compute what the plain ones do, each with its switch off:
the training loss without logits, oneDNN linear layers for float32 inference on CPU (guarded: the private op may go
away), and beam search's encoder-decoder keys and values once per sentence, with no host synchronisation per step."""

import copy
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.profiler import profile

import fast_paths_vanilla_transformer as fast_paths
import modeling_vanilla_transformer as modeling
from fast_paths_vanilla_transformer import label_smoothed_cross_entropy, linear

from .helpers import TINY


def random_labels(shape, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    labels = torch.randint(0, vocab_size, shape, generator=generator)
    labels[0, 3:] = -100  # padding
    labels[-1, -1] = -100
    return labels


# --- the training loss without logits ---------------------------------------------------------------------------


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_blockwise_loss_equals_cross_entropy_of_the_logits_with_gradients(monkeypatch, label_smoothing, reduction):
    monkeypatch.setattr(fast_paths, "LOSS_BLOCK_LOGITS", 4 * 61)  # blocks of 4 positions: several blocks
    generator = torch.Generator().manual_seed(0)
    hidden_states = torch.randn(3, 7, 16, generator=generator, requires_grad=True)
    weight = (torch.randn(61, 16, generator=generator) * 0.3).requires_grad_()
    labels = random_labels((3, 7), 61, generator)

    loss = label_smoothed_cross_entropy(hidden_states, weight, labels, label_smoothing, reduction)
    (3 * loss).backward()  # a non-unit upstream gradient must scale both gradients
    gradients = hidden_states.grad.clone(), weight.grad.clone()
    hidden_states.grad = weight.grad = None
    logits = hidden_states @ weight.T
    expected = F.cross_entropy(
        logits.view(-1, 61), labels.view(-1), ignore_index=-100, label_smoothing=label_smoothing, reduction=reduction
    )
    (3 * expected).backward()

    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(gradients[0], hidden_states.grad)  # zero at padding positions
    torch.testing.assert_close(gradients[1], weight.grad)


def test_blockwise_loss_under_bf16_autocast_is_close_to_the_plain_one():
    generator = torch.Generator().manual_seed(0)
    hidden_states = torch.randn(4, 9, 32, generator=generator, requires_grad=True)
    weight = (torch.randn(300, 32, generator=generator) * 0.3).requires_grad_()
    labels = random_labels((4, 9), 300, generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = label_smoothed_cross_entropy(hidden_states, weight, labels, 0.1)
    loss.backward()
    assert loss.dtype == torch.float32 and hidden_states.grad.dtype == weight.grad.dtype == torch.float32
    gradients = hidden_states.grad.clone(), weight.grad.clone()
    hidden_states.grad = weight.grad = None
    expected = F.cross_entropy((hidden_states @ weight.T).view(-1, 300), labels.view(-1), label_smoothing=0.1)
    expected.backward()
    torch.testing.assert_close(loss, expected, atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(gradients[0], hidden_states.grad, atol=2e-3, rtol=5e-2)
    torch.testing.assert_close(gradients[1], weight.grad, atol=2e-3, rtol=5e-2)


def test_blockwise_loss_rejects_an_unknown_reduction():
    with pytest.raises(ValueError, match="reduction"):
        label_smoothed_cross_entropy(
            torch.zeros(1, 2, 4), torch.zeros(5, 4), torch.zeros(1, 2, dtype=torch.long), 0.1, "none"
        )


def test_the_loss_without_logits_has_the_value_and_gradients_of_the_loss_on_the_logits(tiny_config, source_batch):
    """`return_logits=False` (the training script's path) against the plain forward with labels."""
    tiny_config.dropout = 0.0  # the two passes below must see the same network
    torch.manual_seed(0)
    model = modeling.VanillaTransformerForConditionalGeneration(tiny_config).train()
    input_ids, attention_mask = source_batch
    labels = random_labels((2, 6), tiny_config.vocab_size, torch.Generator().manual_seed(2))
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels, epsilon_ls=0.1)

    outputs = model(**batch, return_logits=False)
    assert outputs.logits is None
    outputs.loss.backward()
    gradients = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    model.zero_grad()
    expected = model(**batch)  # the plain path: logits, then F.cross_entropy
    assert expected.logits.shape == (2, 6, tiny_config.vocab_size)
    expected.loss.backward()
    torch.testing.assert_close(outputs.loss, expected.loss)
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(gradients[name], parameter.grad, msg=name)


# --- oneDNN linear layers ---------------------------------------------------------------------------------------

needs_onednn = pytest.mark.skipif(not fast_paths.ONEDNN["usable"], reason="this torch build has no oneDNN linear")


def operators(function) -> set[str]:
    with profile() as profiler:
        function()
    return {event.name for event in profiler.events()}


@needs_onednn
def test_linear_uses_onednn_only_for_float32_inference():
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(512, 256, generator=generator) / 16, torch.randn(512, generator=generator)
    input = torch.randn(3, 5, 256, generator=generator)
    onednn = "mkldnn::_linear_pointwise"

    with torch.no_grad():
        assert onednn in operators(lambda: linear(input, weight, bias))
        # float32 throughout: only the order of the additions differs
        torch.testing.assert_close(linear(input, weight, bias), F.linear(input, weight, bias), rtol=1e-5, atol=1e-5)
        assert onednn not in operators(lambda: linear(input.bfloat16(), weight.bfloat16(), bias.bfloat16()))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert onednn not in operators(lambda: linear(input, weight, bias))
        small = weight[:, :64].contiguous()  # below ONEDNN_MIN_WEIGHT_ELEMENTS: the default BLAS is faster
        assert onednn not in operators(lambda: linear(input[..., :64], small, bias))
    trainable = weight.clone().requires_grad_()  # training: autograd needs nn.functional.linear
    assert onednn not in operators(lambda: linear(input, trainable, bias).sum().backward())
    assert trainable.grad is not None


@needs_onednn
@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_gives_the_same_tokens_with_and_without_onednn(monkeypatch, tiny_model, source_batch, num_beams):
    monkeypatch.setattr(fast_paths, "ONEDNN_MIN_WEIGHT_ELEMENTS", 0)  # the tiny model's matrices take oneDNN too
    input_ids, attention_mask = source_batch
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=12, do_sample=False)
    assert "mkldnn::_linear_pointwise" in operators(lambda: tiny_model.generate(input_ids, **settings))
    with_onednn = tiny_model.generate(input_ids, **settings)
    tiny_model.config.onednn_linear = False  # the switch: plain F.linear
    assert torch.equal(with_onednn, tiny_model.generate(input_ids, **settings))


def test_a_missing_or_failing_onednn_op_falls_back_to_the_plain_linear(monkeypatch):
    """The op is private to torch: gone or broken in some future torch, the plain path must run, not fail."""
    monkeypatch.setattr(torch.ops, "mkldnn", object())  # no `_linear_pointwise`
    assert not fast_paths.onednn_linear_available()

    class BrokenOps:
        def _linear_pointwise(self, *args):
            raise RuntimeError("changed signature")

    monkeypatch.setattr(torch.ops, "mkldnn", BrokenOps())
    monkeypatch.setitem(fast_paths.ONEDNN, "usable", True)
    monkeypatch.setattr(fast_paths, "ONEDNN_MIN_WEIGHT_ELEMENTS", 0)
    input, weight, bias = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    with torch.no_grad():
        torch.testing.assert_close(linear(input, weight, bias), F.linear(input, weight, bias))
    assert fast_paths.ONEDNN["usable"] is False  # not tried again


# --- beam search: the switch, and no host synchronisation per step ---------------------------------------------


@torch.no_grad()
@pytest.mark.parametrize("num_beams", [1, 4])
def test_beam_search_gives_the_same_tokens_with_every_fast_path_off(tiny_model, source_batch, num_beams):
    input_ids, attention_mask = source_batch
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=10, do_sample=False)
    fast = tiny_model.generate(input_ids, **settings)
    tiny_model.config.onednn_linear = tiny_model.config.grouped_beam_cross_attention = False
    assert torch.equal(fast, tiny_model.generate(input_ids, **settings))


@torch.no_grad()
def test_the_model_synchronises_with_the_host_a_fixed_number_of_times_per_generate(
    monkeypatch, tiny_model, source_batch
):
    """Every `torch.equal`, `bool(tensor)`, `.item()` and `.tolist()` called from the model's files is counted (on a
    GPU each waits for the device): decoding 4 or 16 tokens must cost the same number."""
    input_ids, attention_mask = source_batch
    counts = {"syncs": 0}
    model_files = (modeling.__file__, fast_paths.__file__)

    def counting(original):
        def wrapper(*args, **kwargs):
            if sys._getframe(1).f_code.co_filename in model_files:
                counts["syncs"] += 1
            return original(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(torch, "equal", counting(torch.equal))
    for name in ("__bool__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    per_generate = []
    for tokens in (4, 16):
        counts["syncs"] = 0
        settings = dict(attention_mask=attention_mask, num_beams=4, min_new_tokens=tokens, max_new_tokens=tokens)
        tiny_model.generate(input_ids, **settings)
        per_generate.append(counts["syncs"])
    assert per_generate[0] == per_generate[1], per_generate
    assert per_generate[0] > 0  # the input check and the one grouping check are seen


# --- the projections of one input as one product ----------------------------------------------------------------


def counting_stacks(monkeypatch) -> dict:
    """Counts the stackings of projection weights (the fused path's), kept or not."""
    counts = {"stacked": 0}
    stack = fast_paths._stack

    def counting(projections):
        counts["stacked"] += 1
        return stack(projections)

    monkeypatch.setattr(fast_paths, "_stack", counting)
    return counts


@pytest.mark.parametrize("qk_head_dim", [None, 4])  # 4: Table 3 row (B), d_k = 4 against d_v = 8
def test_fused_and_separate_projections_give_the_same_loss_and_gradients(monkeypatch, source_batch, qk_head_dim):
    torch.manual_seed(0)
    config = modeling.VanillaTransformerConfig(**{**TINY, "dropout": 0.0, "qk_head_dim": qk_head_dim})
    model = modeling.VanillaTransformerForConditionalGeneration(config).train()
    input_ids, attention_mask = source_batch
    labels = random_labels((2, 6), config.vocab_size, torch.Generator().manual_seed(2))
    counts = counting_stacks(monkeypatch)
    results = []
    for fused in (True, False):
        model.config.fused_projections = fused
        counts["stacked"] = 0
        model.zero_grad()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        results.append((loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
        # with gradients, stacked at every call: each self-attention and each encoder-decoder attention once
        assert counts["stacked"] == (config.encoder_layers + 2 * config.decoder_layers if fused else 0)
    (fused_loss, fused_gradients), (loss, gradients) = results
    torch.testing.assert_close(fused_loss, loss, rtol=1e-5, atol=1e-5)
    for name, gradient in gradients.items():
        assert gradient.abs().sum() > 0, name  # every projection learns
        torch.testing.assert_close(fused_gradients[name], gradient, rtol=1e-5, atol=1e-5, msg=name)
    assert not any("_stacked_projections" in module.__dict__ for module in model.modules())  # none kept in training


@torch.no_grad()
@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_gives_the_same_tokens_with_fused_projections_on_and_off(monkeypatch, source_batch, num_beams):
    model = modeling.VanillaTransformerForConditionalGeneration(modeling.VanillaTransformerConfig(**TINY)).eval()
    input_ids, attention_mask = source_batch
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=10, do_sample=False)
    counts = counting_stacks(monkeypatch)
    fused = model.generate(input_ids, **settings)
    attentions = [m for m in model.modules() if isinstance(m, modeling.VanillaTransformerAttention)]
    assert counts["stacked"] == len(attentions)  # without gradients: once per attention, then kept
    model.config.fused_projections = False
    assert torch.equal(fused, model.generate(input_ids, **settings))
    assert counts["stacked"] == len(attentions)


@torch.no_grad()
def test_a_weight_changed_in_place_after_a_cached_generate_is_used_by_the_next_one(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    settings = dict(attention_mask=attention_mask, max_new_tokens=8, do_sample=False)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :5])
    before = tiny_model(**inputs).logits
    tiny_model.generate(input_ids, **settings)  # the stacked weights are kept now
    attentions = [tiny_model.model.encoder.layers[0].self_attn, tiny_model.model.decoder.layers[1].encoder_attn]
    assert all("_stacked_projections" in attention.__dict__ for attention in attentions)
    attentions[0].v_proj.weight.mul_(-1)  # in place: the same storage, a new version
    attentions[1].k_proj.bias.add_(1.0)
    tiny_model.model.decoder.layers[0].self_attn.q_proj.weight.copy_(torch.randn(32, 32))
    changed = tiny_model(**inputs).logits
    fused_tokens = tiny_model.generate(input_ids, **settings)
    tiny_model.config.fused_projections = False
    torch.testing.assert_close(changed, tiny_model(**inputs).logits, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(changed, before, atol=1e-3)
    assert torch.equal(fused_tokens, tiny_model.generate(input_ids, **settings))

    other = modeling.VanillaTransformerForConditionalGeneration(tiny_model.config).eval()
    tiny_model.config.fused_projections = True
    tiny_model.load_state_dict(other.state_dict())  # another model's weights, copied into the same storage
    torch.testing.assert_close(tiny_model(**inputs).logits, other(**inputs).logits, rtol=1e-5, atol=1e-5)


def test_the_kept_weights_hold_no_graph_and_the_model_still_copies_and_trains(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    with torch.inference_mode():  # as the translation pipeline decodes
        tiny_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=4)
    kept = tiny_model.model.decoder.layers[0].self_attn.__dict__["_stacked_projections"]
    assert all(t.grad_fn is None and not t.requires_grad and not t.is_inference() for t in kept[1:])
    copied = copy.deepcopy(tiny_model)  # a kept stack must not stop deepcopy (quantize_dynamic copies models)
    # a frozen model under autograd (gradients for its inputs only) runs on the kept weights
    embeddings = copied.get_input_embeddings()(input_ids).detach().requires_grad_()
    for parameter in copied.parameters():
        parameter.requires_grad_(False)
    with torch.no_grad():
        copied.generate(input_ids, attention_mask=attention_mask, max_new_tokens=4)
    output = copied(inputs_embeds=embeddings, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :3])
    output.logits.sum().backward()
    assert embeddings.grad is not None and embeddings.grad.abs().sum() > 0


@torch.no_grad()
def test_a_projection_that_is_hooked_or_replaced_is_called(tiny_model, source_batch):
    """A forward hook (as tools that record activations add) must see its layer's input; so must a replaced layer."""
    input_ids, attention_mask = source_batch
    settings = dict(attention_mask=attention_mask, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    expected = tiny_model.generate(input_ids, **settings)
    attention = tiny_model.model.decoder.layers[0]
    seen = []
    handle = attention.encoder_attn.k_proj.register_forward_hook(lambda module, args, output: seen.append(args[0]))
    assert torch.equal(tiny_model.generate(input_ids, **settings), expected)
    handle.remove()
    assert len(seen) == 1 and seen[0].shape == (2, 9, 32)  # the encoder output, once per generation

    calls = []

    class Replaced(nn.Module):  # e.g. a quantizer's layer, computing the same function
        def __init__(self, linear):
            super().__init__()
            self.linear = linear

        def forward(self, input):
            calls.append(input.shape)
            return self.linear(input)

    attention.self_attn.v_proj = Replaced(attention.self_attn.v_proj)
    assert torch.equal(tiny_model.generate(input_ids, **settings), expected)
    assert calls == [(2, 1, 32)] * 6  # one decoder step per new token
