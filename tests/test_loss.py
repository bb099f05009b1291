"""Section 5.4's training loss (vanilla_transformer/training/loss.py): label-smoothed, summed over the targets, computed
without the logits, with the value and gradients of the cross-entropy of the logits; the training script's own step
(`train_accelerate.train_step`), whose gradients are those of the mean over the step's target tokens; and the model's
own loss, the library's plain cross-entropy."""

import sys

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from torch.nn import functional as F

import train_accelerate
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.training import loss as loss_module
from vanilla_transformer.training.loss import label_smoothed_cross_entropy, output_head
from vanilla_transformer.training.steps import count_target_tokens

from .distributed_gradients import GradientRecorder
from .helpers import random_ids


def random_labels(shape, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    labels = torch.randint(0, vocab_size, shape, generator=generator)
    labels[0, 3:] = -100  # padding
    labels[-1, -1] = -100
    return labels


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
def test_blockwise_loss_equals_cross_entropy_of_the_logits_with_gradients(monkeypatch, label_smoothing, bias):
    monkeypatch.setattr(loss_module, "LOSS_BLOCK_LOGITS", 4 * 61)  # blocks of 4 positions: several blocks
    generator = torch.Generator().manual_seed(0)
    hidden_states = torch.randn(3, 7, 16, generator=generator, requires_grad=True)
    head = torch.nn.Linear(16, 61, bias=bias)
    labels = random_labels((3, 7), 61, generator)

    loss = label_smoothed_cross_entropy(hidden_states, head, labels, label_smoothing)
    (3 * loss).backward()  # a non-unit upstream gradient must scale both gradients
    gradients = hidden_states.grad.clone(), head.weight.grad.clone()
    hidden_states.grad = head.weight.grad = None
    expected = F.cross_entropy(
        head(hidden_states).view(-1, 61), labels.view(-1), label_smoothing=label_smoothing, reduction="sum"
    )
    (3 * expected).backward()

    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(gradients[0], hidden_states.grad)  # zero at padding positions
    torch.testing.assert_close(gradients[1], head.weight.grad)


def test_blockwise_loss_under_bf16_autocast_is_close_to_the_plain_one():
    generator = torch.Generator().manual_seed(0)
    hidden_states = torch.randn(4, 9, 32, generator=generator, requires_grad=True)
    head = torch.nn.Linear(32, 300, bias=False)
    labels = random_labels((4, 9), 300, generator)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = label_smoothed_cross_entropy(hidden_states, head, labels, 0.1)
    loss.backward()
    assert loss.dtype == torch.float32 and hidden_states.grad.dtype == head.weight.grad.dtype == torch.float32
    gradients = hidden_states.grad.clone(), head.weight.grad.clone()
    hidden_states.grad = head.weight.grad = None
    expected = F.cross_entropy(
        head(hidden_states).view(-1, 300), labels.view(-1), label_smoothing=0.1, reduction="sum"
    )
    expected.backward()
    torch.testing.assert_close(loss, expected, atol=0.5, rtol=1e-2)
    torch.testing.assert_close(gradients[0], hidden_states.grad, atol=2e-3, rtol=5e-2)
    torch.testing.assert_close(gradients[1], head.weight.grad, atol=2e-2, rtol=5e-2)


@pytest.fixture
def accelerator():
    """The training script's Accelerator on one CPU process; its state goes after the test."""
    try:
        yield Accelerator(cpu=True)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def training_step(accelerator, model, step_batches: list[dict], *flags: str, learning_rate: float = 0.0):
    """The training script's own step (`train_accelerate.train_step`) under the training flags `flags`, with SGD at
    `learning_rate` (0: the weights stay) and a constant schedule; returns (summed loss, target tokens, the gradients
    the optimizer was given, by parameter name)."""
    settings = train_accelerate.parse_training_arguments(["--data_dir", "corpus", *flags])
    optimizer = GradientRecorder(model.parameters(), lr=learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    loss, tokens = train_accelerate.train_step(accelerator, model, optimizer, schedule, step_batches, settings)
    names = [name for name, _ in model.named_parameters()]
    return loss, tokens, dict(zip(names, optimizer.gradients, strict=True))


def micro_batch(config, sources: tuple[int, int], targets: tuple[int, int], seed: int) -> dict:
    """Random right-padded pairs: the last source has 2 padding positions, the targets padding (random_labels)."""
    input_ids, attention_mask = random_ids(config, sources, seed), torch.ones(sources, dtype=torch.long)
    input_ids[-1, -2:], attention_mask[-1, -2:] = config.pad_token_id, 0
    labels = random_labels(targets, config.vocab_size, torch.Generator().manual_seed(seed + 1))
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.01], ids=["unclipped", "clipped"])
def test_a_training_step_gives_the_gradients_of_the_mean_loss_over_its_target_tokens(
    accelerator, tiny_config, max_grad_norm
):
    """A step of two micro-batches of 8 and 10 target tokens: the optimizer gets the gradients of the label-smoothed
    cross-entropy of the logits summed over both and divided by their 18 tokens (not each micro-batch's mean), scaled
    to --max_grad_norm when given; the step returns the summed loss and the 18 tokens."""
    tiny_config.dropout = 0.0  # the step and the forward below must see the same network
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(tiny_config)
    batches = [micro_batch(tiny_config, (2, 9), (2, 6), seed=1), micro_batch(tiny_config, (3, 5), (3, 4), seed=3)]
    assert [count_target_tokens(batch) for batch in batches] == [8, 10]
    flags = ("--label_smoothing", "0.1", "--max_grad_norm", str(max_grad_norm))
    step_loss, step_tokens, gradients = training_step(accelerator, model, batches, *flags)

    summed = 0.0
    for batch in batches:  # the same weights: the step's learning rate is 0
        logits = model(**batch).logits
        summed += F.cross_entropy(
            logits.flatten(0, 1), batch["labels"].flatten(), label_smoothing=0.1, reduction="sum"
        )
    (summed / 18).backward()
    expected = {name: parameter.grad for name, parameter in model.named_parameters()}
    if max_grad_norm:
        norm = torch.cat([gradient.flatten() for gradient in expected.values()]).norm()
        assert norm > 10 * max_grad_norm, "the clipping would change nothing"
        expected = {name: gradient * max_grad_norm / (norm + 1e-6) for name, gradient in expected.items()}
    torch.testing.assert_close(step_loss, summed.detach())
    assert step_tokens.item() == 18
    for name, gradient in expected.items():
        torch.testing.assert_close(gradients[name], gradient, msg=name)


def test_the_models_own_loss_is_the_mean_cross_entropy_or_the_sum_over_num_items_in_batch(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    labels = random_labels((2, 5), tiny_model.config.vocab_size, torch.Generator().manual_seed(4))
    output = tiny_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    plain = F.cross_entropy(output.logits.transpose(1, 2), labels, ignore_index=-100)
    torch.testing.assert_close(output.loss, plain)
    accumulated = tiny_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, num_items_in_batch=20)
    torch.testing.assert_close(accumulated.loss, plain * (labels != -100).sum() / 20)


def test_a_training_step_reads_no_tensor_on_the_host(monkeypatch, accelerator, tiny_config, source_batch):
    """No `.item()`, `bool()`, `int()`, `float()` or `.tolist()` of a tensor in the training script's step (forward,
    loss, backward, clipping, optimizer and schedule steps) but the count of the host's own batches' targets, before
    their copy to the device: on a GPU each would make the step wait for the device (by construction here;
    torch.cuda.set_sync_debug_mode on a GPU)."""
    model = VanillaTransformerForConditionalGeneration(tiny_config)
    input_ids, attention_mask = source_batch
    labels = random_labels((2, 6), tiny_config.vocab_size, torch.Generator().manual_seed(2))
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)

    def read_by_the_host_count_only(method: str):
        original = getattr(torch.Tensor, method)

        def read(*args, **kwargs):
            if sys._getframe(1).f_code is not count_target_tokens.__code__:
                raise AssertionError(f"a tensor was read on the host (Tensor.{method})")
            return original(*args, **kwargs)

        return read

    for method in ("item", "__bool__", "__int__", "__float__", "tolist"):
        monkeypatch.setattr(torch.Tensor, method, read_by_the_host_count_only(method))
    training_step(accelerator, model, [batch, batch], "--max_grad_norm", "1.0", learning_rate=0.1)


def test_a_training_step_on_separate_vocabularies_learns_through_the_decoders_matrix(
    accelerator, tiny_config, source_batch
):
    """The training loss takes the output head, the decoder's matrix with separate vocabularies: one step of the
    training script moves both stacks' embeddings, and its loss is the loss of the logits."""
    from configuration_vanilla_transformer import VanillaTransformerConfig

    config = VanillaTransformerConfig(
        **{
            **tiny_config.to_dict(),
            "share_encoder_decoder_embeddings": False,
            "decoder_vocab_size": 23,
            "dropout": 0.0,
        }
    )
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).train()
    input_ids, attention_mask = source_batch
    labels = random_labels((2, 5), 23, torch.Generator().manual_seed(2))
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    assert output_head(model).weight is model.model.decoder.embed_tokens.weight
    with torch.no_grad():
        logits = model(input_ids, attention_mask=attention_mask, labels=labels).logits
    assert logits.shape[-1] == 23
    expected = F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum", label_smoothing=0.1
    )
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss, _, _ = training_step(accelerator, model, [batch], "--label_smoothing", "0.1", learning_rate=0.1)
    assert torch.allclose(loss, expected, atol=1e-4)
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        assert not torch.equal(before[name], dict(model.named_parameters())[name]), name
