"""The benchmarks' shared parts: the FLOP count behind benchmarks/gpu_training.py's MFU figures covers every matrix
of the model, and benchmarks/timing.py warms up, interleaves and takes the median."""

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

from .helpers import TINY

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from gpu_training import model_flops  # noqa: E402
from timing import median_seconds, timed  # noqa: E402


@pytest.mark.parametrize("qk_head_dim", [None, 4])  # d_k = d_v = 8, and Table 3's row B: d_k = 4
def test_model_flops_counts_every_linear_layer_and_the_attention_products(qk_head_dim):
    tiny_config = VanillaTransformerConfig(**TINY, qk_head_dim=qk_head_dim)
    model = VanillaTransformerForConditionalGeneration(tiny_config)
    weights = sum(module.weight.numel() for module in model.modules() if isinstance(module, nn.Linear))
    # At one source and one target token, each attention (encoder, decoder, encoder-decoder) multiplies 1 x 1 scores:
    # Q K^T over heads x d_k features, the weighted sum over heads x d_v = d_model.
    qk = tiny_config.encoder_attention_heads * (qk_head_dim or 8)
    attention = 2 * (qk + tiny_config.d_model) * (tiny_config.encoder_layers + 2 * tiny_config.decoder_layers)
    one = torch.tensor([1])
    assert model_flops(tiny_config, one, one) == 3 * (2 * weights + attention)
    # Linear layers grow with the tokens, the attention products with their square; pairs add up.
    assert model_flops(tiny_config, 2 * one, 2 * one) == 3 * (2 * 2 * weights + 4 * attention)
    pairs = torch.tensor([1, 2])
    assert model_flops(tiny_config, pairs, pairs) == model_flops(tiny_config, one, one) + model_flops(
        tiny_config, 2 * one, 2 * one
    )


def test_median_seconds_warms_up_each_callable_then_alternates_their_order():
    calls = []
    medians = median_seconds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repetitions=3)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]  # one untimed call each, then A B, B A, A B
    assert set(medians) == {"a", "b"} and all(seconds >= 0 for seconds in medians.values())
    assert timed(lambda: 42)[0] == 42


SAME_STEP = """
import sys, torch
sys.path.insert(0, "benchmarks")
from gpu_training import largest_difference, variant_losses
from configuration_vanilla_transformer import VanillaTransformerConfig
config = VanillaTransformerConfig(**{tiny}, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
generator = torch.Generator().manual_seed(0)
ids = torch.randint(4, config.vocab_size, (4, 9), generator=generator)
labels = torch.randint(4, config.vocab_size, (4, 7), generator=generator)
batch = {{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}}
reference = variant_losses(config, "sdpa", torch.device("cpu"), batch, 3)
losses = variant_losses(config, "{variant}", torch.device("cpu"), batch, 3)
print(largest_difference(losses, reference), reference[0] != reference[-1])
"""


@pytest.mark.slow
def test_the_bf16_weights_variant_trains_as_the_autocast_step_does():
    """benchmarks/gpu_training.py's FSDP2 bf16-weights step (in a process of its own: it makes a process group) is
    the autocast step within bf16's rounding, step by step, while the loss moves."""
    import subprocess

    from .helpers import OFFLINE, ROOT

    script = SAME_STEP.format(tiny=TINY, variant="bf16_weights")
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**__import__("os").environ, **OFFLINE},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    difference, moved = result.stdout.split()
    assert float(difference) < 0.01 and moved == "True"
