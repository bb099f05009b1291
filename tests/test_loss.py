"""Section 5.4's training loss (vanilla_transformer/training/loss.py): label-smoothed, summed over the targets, computed
without the logits, with the value and gradients of the cross-entropy of the logits; and the model's own loss, the
library's plain cross-entropy."""

import pytest
import torch
from torch.nn import functional as F

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.training import loss as loss_module
from vanilla_transformer.training.loss import forward_inputs, label_smoothed_cross_entropy, output_head


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


def training_loss(model, batch: dict) -> torch.Tensor:
    """The training script's step: the forward without logits, then the label-smoothed loss (0.1) block by block."""
    outputs = model(**forward_inputs(model, batch), output_hidden_states=True)
    return label_smoothed_cross_entropy(outputs.decoder_hidden_states[-1], output_head(model), batch["labels"], 0.1)


def test_the_training_loss_has_the_value_and_gradients_of_the_loss_on_the_logits(tiny_config, source_batch):
    """The training script's forward and loss against the logits of the model's plain forward."""
    tiny_config.dropout = 0.0  # the two passes below must see the same network
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(tiny_config).train()
    input_ids, attention_mask = source_batch
    labels = random_labels((2, 6), tiny_config.vocab_size, torch.Generator().manual_seed(2))
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)

    training_loss(model, batch).backward()
    gradients = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    model.zero_grad()
    logits = model(**batch).logits
    expected = F.cross_entropy(
        logits.view(-1, logits.shape[-1]), labels.view(-1), label_smoothing=0.1, reduction="sum"
    )
    expected.backward()
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(gradients[name], parameter.grad, msg=name)


def test_the_models_own_loss_is_the_mean_cross_entropy_or_the_sum_over_num_items_in_batch(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    labels = random_labels((2, 5), tiny_model.config.vocab_size, torch.Generator().manual_seed(4))
    output = tiny_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    plain = F.cross_entropy(output.logits.transpose(1, 2), labels, ignore_index=-100)
    torch.testing.assert_close(output.loss, plain)
    accumulated = tiny_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, num_items_in_batch=20)
    torch.testing.assert_close(accumulated.loss, plain * (labels != -100).sum() / 20)


def test_a_training_step_reads_no_tensor_on_the_host(monkeypatch, tiny_config, source_batch):
    """No `.item()`, `bool()`, `int()`, `float()` or `.tolist()` of a tensor in the training forward and backward: on
    a GPU each would make the step wait for the device (by construction here; torch.cuda.set_sync_debug_mode on a GPU)."""
    model = VanillaTransformerForConditionalGeneration(tiny_config).train()
    input_ids, attention_mask = source_batch
    labels = random_labels((2, 6), tiny_config.vocab_size, torch.Generator().manual_seed(2))

    def synchronises(*args, **kwargs):
        raise AssertionError("a tensor was read on the host")

    for method in ("item", "__bool__", "__int__", "__float__", "tolist"):
        monkeypatch.setattr(torch.Tensor, method, synchronises)
    training_loss(model, dict(input_ids=input_ids, attention_mask=attention_mask, labels=labels)).backward()


def test_a_training_step_on_separate_vocabularies_learns_through_the_decoders_matrix(tiny_config, source_batch):
    """The training loss takes the output head, the decoder's matrix with separate vocabularies: one step of the
    training script's loss moves both stacks' embeddings, and its value is the loss of the logits."""
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
    loss = training_loss(model, batch)
    with torch.no_grad():
        logits = model(input_ids, attention_mask=attention_mask, labels=labels).logits
    assert logits.shape[-1] == 23
    expected = F.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum", label_smoothing=0.1
    )
    assert torch.allclose(loss, expected, atol=1e-4)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        assert not torch.equal(before[name], dict(model.named_parameters())[name]), name
