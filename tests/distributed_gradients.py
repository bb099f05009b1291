"""Run by tests/test_training.py, alone or under `accelerate launch --num_processes 2`: the gradients of one
optimizer step over the same two batches, accumulated on one process or split over two, saved by rank 0."""

import sys

import torch
from safetensors.torch import save_file

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from train_accelerate import forward_backward
from vanilla_transformer.data.batching import TranslationCollator
from vanilla_transformer.training.recipe import count_target_tokens, make_accelerator

accelerator = make_accelerator()
assert accelerator.num_processes == int(sys.argv[2]), (
    f"expected {sys.argv[2]} processes, got {accelerator.num_processes}"
)
torch.manual_seed(0)
config = VanillaTransformerConfig(
    vocab_size=40,
    d_model=16,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    dropout=0.0,
)
model = accelerator.prepare(VanillaTransformerForConditionalGeneration(config))
generator = torch.Generator().manual_seed(1)
collator = TranslationCollator(pad_token_id=0)


def random_example(length: int) -> dict[str, list[int]]:
    source = torch.randint(4, 40, (length,), generator=generator).tolist()
    return {"input_ids": source, "labels": torch.randint(4, 40, (length + 2,), generator=generator).tolist()}


# two batches of different sizes and token counts: the loss must be weighted per token, not per batch
batches = [collator([random_example(n) for n in sizes]) for sizes in ([3, 7, 5], [9])]
mine = batches if accelerator.num_processes == 1 else [batches[accelerator.process_index]]
global_tokens = sum(count_target_tokens(batch) for batch in batches)
loss = forward_backward(accelerator, model, mine, global_tokens, label_smoothing=0.1)
loss = accelerator.reduce(loss, "sum") / global_tokens
if accelerator.is_main_process:
    gradients = {name: p.grad.contiguous() for name, p in accelerator.unwrap_model(model).named_parameters()}
    save_file({**gradients, "loss": loss.reshape(1)}, sys.argv[1])
