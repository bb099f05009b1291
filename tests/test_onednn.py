"""oneDNN's linear kernel for the project's own inference (vanilla_transformer/model/onednn.py): the same products for
float32 inference on CPU, the plain path for everything else, and a fallback when the private op is gone."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.profiler import profile

from vanilla_transformer.model import onednn
from vanilla_transformer.model.onednn import OneDNNLinear, plain_linears, use_onednn_linears
from vanilla_transformer.serving.translate import load_model_and_tokenizer

from .helpers import save_tiny_model_folder

needs_onednn = pytest.mark.skipif(not onednn.ONEDNN["usable"], reason="this torch build has no oneDNN linear")
ONEDNN_OP = "mkldnn::_linear_pointwise"


def operators(function) -> set[str]:
    with profile() as profiler:
        function()
    return {event.name for event in profiler.events()}


def layer(in_features: int = 256, out_features: int = 512) -> OneDNNLinear:
    torch.manual_seed(0)
    return use_onednn_linears(nn.Sequential(nn.Linear(in_features, out_features)))[0]


@needs_onednn
def test_onednn_runs_only_float32_inference_and_gives_the_plain_product():
    linear, input = layer(), torch.randn(3, 5, 256)
    with torch.no_grad():
        assert ONEDNN_OP in operators(lambda: linear(input))
        # float32 throughout: only the order of the additions differs
        torch.testing.assert_close(linear(input), F.linear(input, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
        assert ONEDNN_OP not in operators(lambda: linear.bfloat16()(input.bfloat16()))
        linear.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert ONEDNN_OP not in operators(lambda: linear(input))
        small = layer(64, 512)  # below MIN_WEIGHT_ELEMENTS: the default BLAS is faster
        assert ONEDNN_OP not in operators(lambda: small(input[..., :64]))
    assert ONEDNN_OP not in operators(lambda: linear(input).sum().backward())  # training: autograd's F.linear
    assert linear.weight.grad is not None


@needs_onednn
def test_the_weight_in_onednns_layout_gives_the_same_product_to_the_bit_for_any_rows():
    linear = layer()
    with torch.no_grad():
        for shape in [(1, 256), (2, 256), (7, 256), (64, 256), (300, 256), (3, 5, 256)]:
            input = torch.randn(shape)
            plain = torch.ops.mkldnn._linear_pointwise(input, linear.weight, linear.bias, "none", [], "")
            assert torch.equal(linear(input), plain), shape
        assert linear.__dict__["_onednn_packed"].layout == torch._mkldnn  # laid out once, kept


@needs_onednn
def test_a_changed_weight_is_laid_out_again():
    linear, input = layer(), torch.randn(4, 256)
    with torch.no_grad():
        linear(input)
        linear.weight.mul_(2)  # in place: the same tensor, a new version
        torch.testing.assert_close(linear(input), F.linear(input, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
        linear.load_state_dict({"weight": torch.randn(512, 256), "bias": linear.bias.clone()})
        torch.testing.assert_close(linear(input), F.linear(input, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
        linear.weight = nn.Parameter(torch.randn(512, 256))  # another tensor
        torch.testing.assert_close(linear(input), F.linear(input, linear.weight, linear.bias), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        made_here = use_onednn_linears(nn.Sequential(nn.Linear(256, 512)))[0]  # no version counter: not laid out
        torch.testing.assert_close(made_here(input), F.linear(input, made_here.weight, made_here.bias))
        assert "_onednn_packed" not in made_here.__dict__
    plain_linears(nn.Sequential(linear))
    assert "_onednn_packed" not in linear.__dict__  # the copy's memory given back


@needs_onednn
@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_gives_the_same_tokens_with_and_without_onednn(monkeypatch, tiny_model, source_batch, num_beams):
    monkeypatch.setattr(onednn, "MIN_WEIGHT_ELEMENTS", 0)  # the tiny model's matrices take oneDNN too
    input_ids, attention_mask = source_batch
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, max_new_tokens=12, do_sample=False)
    plain = tiny_model.generate(input_ids, **settings)
    use_onednn_linears(tiny_model)
    assert ONEDNN_OP in operators(lambda: tiny_model.generate(input_ids, **settings))
    assert torch.equal(tiny_model.generate(input_ids, **settings), plain)
    plain_linears(tiny_model)
    assert not any(type(module) is OneDNNLinear for module in tiny_model.modules())


def test_the_layers_stay_the_same_layers_with_the_same_parameters(tiny_model):
    before = {name: parameter for name, parameter in tiny_model.named_parameters()}
    use_onednn_linears(tiny_model)
    assert dict(tiny_model.named_parameters()) == before  # the same Parameter objects: nothing copied
    linears = [module for module in tiny_model.modules() if isinstance(module, nn.Linear)]
    assert linears and all(type(module) is OneDNNLinear and "forward" not in module.__dict__ for module in linears)
    assert tiny_model.lm_head.weight is tiny_model.model.shared.weight  # the tie holds


def test_a_missing_or_failing_onednn_op_falls_back_to_the_plain_linear(monkeypatch):
    """The op is private to torch: gone or broken in some future torch, the plain path must run, not fail."""
    monkeypatch.setattr(torch.ops, "mkldnn", object())  # no `_linear_pointwise`
    assert not onednn.onednn_available()

    class BrokenOps:
        def _linear_pointwise(self, *args):
            raise RuntimeError("changed signature")

    monkeypatch.setattr(torch.ops, "mkldnn", BrokenOps())
    monkeypatch.setitem(onednn.ONEDNN, "usable", True)
    monkeypatch.setattr(onednn, "MIN_WEIGHT_ELEMENTS", 0)
    linear, input = layer(8, 5), torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(linear(input), F.linear(input, linear.weight, linear.bias))
    assert onednn.ONEDNN["usable"] is False  # not tried again


@needs_onednn
def test_the_commands_load_their_models_with_onednn_linears_and_hub_users_get_plain_ones(tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    folder = save_tiny_model_folder(tmp_path / "model")
    model, _ = load_model_and_tokenizer(folder)
    assert any(type(module) is OneDNNLinear for module in model.modules())
    hub_model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
    assert all(type(module) is nn.Linear for module in hub_model.modules() if isinstance(module, nn.Linear))
