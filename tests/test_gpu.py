"""What differs on a GPU: bf16 autocast, the fused attention kernels (SDPA) against eager attention, generation's
caches on the device, pinned prefetching. Every test is marked `gpu` and skipped without CUDA (run them on a lent GPU:
benchmarks/gpu_check.sh). VANILLA_TRANSFORMER_GPU_TESTS_ON=cpu runs them on the CPU instead, a dry run to debug them
before the GPU's few minutes; =cuda makes a missing GPU an error instead of a skip."""

import copy
import os

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from torch.nn import functional as F

import train_accelerate
from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.training.steps import prefetch

from .distributed_gradients import GradientRecorder
from .helpers import TINY, random_ids

pytestmark = pytest.mark.gpu

DEVICE_VARIABLE = "VANILLA_TRANSFORMER_GPU_TESTS_ON"


@pytest.fixture(scope="module")
def device() -> torch.device:
    """CUDA, or the module skipped; the CPU where VANILLA_TRANSFORMER_GPU_TESTS_ON=cpu (a dry run)."""
    requested = os.environ.get(DEVICE_VARIABLE, "")
    if requested == "cpu":
        return torch.device("cpu")
    if requested not in ("", "cuda"):
        pytest.fail(f"{DEVICE_VARIABLE}={requested!r}: only 'cpu' (a dry run) or 'cuda' (CUDA required) is understood")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if requested == "cuda":
        pytest.fail(f"{DEVICE_VARIABLE}=cuda, but torch.cuda.is_available() is False (torch {torch.__version__})")
    pytest.skip(f"needs CUDA (torch.cuda.is_available() is False); set {DEVICE_VARIABLE}=cpu for a dry run on the CPU")


def padded_batch(config, seed=1):
    """Two right-padded sentence pairs: the second source has 3 padding positions, the second target 2."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, config.vocab_size, (2, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 6:], attention_mask[1, 6:] = config.pad_token_id, 0
    labels = torch.randint(4, config.vocab_size, (2, 7), generator=generator)
    labels[1, 5:] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def on(batch: dict, device: torch.device) -> dict:
    return {name: tensor.to(device) for name, tensor in batch.items()}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


# --- bf16 autocast, as train_accelerate.py's --mixed_precision bf16 ------------------------------------------------


def loss_and_gradient(model, batch: dict, kind: str, bf16: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss per target token and the gradient of one step of `model`'s weights, in bf16 autocast or float32."""
    if kind == "model":  # the library's plain cross-entropy, from the model's forward
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        loss.backward()
        return loss.detach(), torch.cat([parameter.grad.flatten() for parameter in model.parameters()])
    # the training script's own step (train_accelerate.train_step), under its Accelerator's --mixed_precision
    try:
        accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision="bf16" if bf16 else "no")
        copied = copy.deepcopy(model)
        recorder = GradientRecorder(copied.parameters(), lr=0.0)
        prepared, optimizer = accelerator.prepare(copied, recorder)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        settings = train_accelerate.parse_training_arguments(["--data_dir", "corpus", "--label_smoothing", "0.1"])
        loss, tokens = train_accelerate.train_step(accelerator, prepared, optimizer, schedule, [batch], settings)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
    return loss / tokens, torch.cat([gradient.flatten() for gradient in recorder.gradients])


@pytest.mark.parametrize("kind", ["model", "label_smoothed"])
def test_bf16_autocast_gives_the_float32_loss_and_gradient_directions(device, kind):
    torch.manual_seed(0)
    config = VanillaTransformerConfig(**TINY, dropout=0.0)  # the same forward in both precisions
    model = VanillaTransformerForConditionalGeneration(config).to(device).train()
    batch = on(padded_batch(config), device)
    results = [loss_and_gradient(model, batch, kind, bf16, device) for bf16 in (False, True)]
    (float32_loss, float32_gradient), (bf16_loss, bf16_gradient) = [
        (loss.float(), gradient.float()) for loss, gradient in results
    ]
    assert bf16_loss != float32_loss, "autocast left the loss in float32: the comparison would test nothing"
    torch.testing.assert_close(bf16_loss, float32_loss, rtol=5e-3, atol=0.0)
    assert F.cosine_similarity(bf16_gradient, float32_gradient, dim=0) > 0.999


# --- SDPA against eager attention ------------------------------------------------------------------------------


def logits_of_both_attentions(device, dtype):
    """The logits of one tiny model's weights with eager attention, then with SDPA, on a padded batch whose decoder
    input has several positions (the causal self-attention) and padding of its own."""
    torch.manual_seed(0)
    config = VanillaTransformerConfig(**TINY)
    model = VanillaTransformerForConditionalGeneration(config).to(device, dtype).eval()
    batch = padded_batch(config)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    inputs = on(
        {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": (batch["labels"] != -100).long(),
        },
        device,
    )
    logits = {}
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
        with torch.no_grad():
            logits[implementation] = model(**inputs).logits
    return logits["eager"], logits["sdpa"]


def test_sdpa_gives_the_logits_of_eager_attention_in_float32(device):
    eager, sdpa = logits_of_both_attentions(device, torch.float32)
    assert eager.dtype == torch.float32
    torch.testing.assert_close(sdpa, eager, rtol=1e-4, atol=1e-4)


def test_sdpa_gives_the_logits_of_eager_attention_in_bf16(device):
    """Within bf16's rounding: 3% of the logits' norm. bf16 weights move either attention's logits ~0.8% from
    float32's; SDPA ignoring the sources' padding would move them ~14%, the targets' padding ~6%."""
    eager, sdpa = logits_of_both_attentions(device, torch.bfloat16)
    assert eager.dtype == torch.bfloat16
    assert relative_error(sdpa, eager) < 3e-2


# --- generation's caches on the device ---------------------------------------------------------------------------


@pytest.fixture
def memorised_on_device(memorising_model, device):
    """The memorising model (conftest.py) on the device, its tokens depending on the past, so that a wrong cache
    changes them, and a padded batch: sources 0 and 2 padded by two positions, 1 and 3 two tokens longer."""
    model, sources, targets = memorising_model
    model = copy.deepcopy(model).to(device)
    extra = random_ids(model.config, (4, 2), seed=5)
    input_ids, attention_mask = torch.cat([sources, extra], dim=1), torch.ones(4, 9, dtype=torch.long)
    input_ids[::2, 7:], attention_mask[::2, 7:] = model.config.pad_token_id, 0
    return model, input_ids.to(device), attention_mask.to(device), targets.to(device)


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
@torch.no_grad()
def test_cached_generation_gives_the_uncached_tokens_on_the_device(memorised_on_device, num_beams):
    model, input_ids, attention_mask, targets = memorised_on_device
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, do_sample=False, max_new_tokens=10)
    cached = model.generate(input_ids, use_cache=True, **settings)
    uncached = model.generate(input_ids, use_cache=False, **settings)
    assert torch.equal(cached[::2, 1:], targets[::2])  # the padded memorised sources: the model depends on its past
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("num_beams", [1, 4], ids=["greedy", "beam4"])
@torch.no_grad()
def test_static_cache_generation_gives_the_dynamic_cache_tokens_on_the_device(memorised_on_device, num_beams):
    """The static cache the model declares it supports (_can_compile_fullgraph), here without torch.compile: its
    length is a tensor on the device (tests/test_stock_tools.py compiles it on the CPU)."""
    model, input_ids, attention_mask, targets = memorised_on_device
    assert model._can_compile_fullgraph
    settings = dict(attention_mask=attention_mask, num_beams=num_beams, do_sample=False, max_new_tokens=10)
    dynamic = model.generate(input_ids, **settings)
    static = model.generate(input_ids, cache_implementation="static", **settings)
    assert torch.equal(dynamic[::2, 1:], targets[::2])  # the padded memorised sources: the model depends on its past
    assert torch.equal(static, dynamic)


# --- pinned prefetching, as train_accelerate.py reads its steps ----------------------------------------------------


def step_items():
    """What train_accelerate.py prefetches: (a step's micro-batches, the data position after it)."""
    generator = torch.Generator().manual_seed(0)

    def batch():
        return {
            "input_ids": torch.randint(4, 61, (3, 5), generator=generator),
            "weights": torch.rand(3, 2, generator=generator),
        }

    return [([batch(), batch()], step) for step in range(5)]


def test_pinned_prefetch_yields_the_plain_batches_pinned_on_cuda(device):
    items = step_items()
    prefetched = list(prefetch(iter(items), depth=2, pin_memory=device.type == "cuda"))
    assert [position for _, position in prefetched] == [position for _, position in items]
    for (batches, _), (expected, _) in zip(prefetched, items, strict=True):
        assert len(batches) == len(expected)
        for batch, expected_batch in zip(batches, expected, strict=True):
            assert batch.keys() == expected_batch.keys()
            for name, tensor in batch.items():
                assert torch.equal(tensor, expected_batch[name])
                if device.type == "cuda":  # pinning needs CUDA: the CPU dry run checks the rest
                    assert tensor.is_pinned(), name


def test_non_blocking_copies_of_prefetched_batches_equal_the_batches(device):
    items = step_items()
    for (batches, _), (expected, _) in zip(
        prefetch(iter(items), depth=2, pin_memory=device.type == "cuda"), items, strict=True
    ):
        for batch, expected_batch in zip(batches, expected, strict=True):
            copied = {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}
            for name, tensor in copied.items():
                assert tensor.device.type == device.type
                assert torch.equal(tensor, expected_batch[name].to(device)), name
