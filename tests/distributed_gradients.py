"""Run by tests/test_training.py, alone or under `accelerate launch --num_processes 2`: one step of the training
script's own loop (`train_accelerate.train_loop`) over the same two batches, accumulated on one process or one on each
of two. Rank 0 saves the gradients the optimizer was given and the step's logged loss per target token."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

import train_accelerate
from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from tests.helpers import TINY  # run as `python -m tests.distributed_gradients` from the repository's root
from vanilla_transformer.data.batching import DataPosition, TranslationCollator
from vanilla_transformer.mechanics.names import TRAIN_LOG
from vanilla_transformer.training.checkpointing import TrainerState
from vanilla_transformer.training.run_setup import make_accelerator
from vanilla_transformer.training.signals import StopSignals


class GradientRecorder(torch.optim.SGD):
    """An optimizer that records the gradients of its step (learning rate 0: the weights stay)."""

    def step(self, closure=None):
        self.gradients = [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]
        return super().step(closure)


def random_example(generator, length: int) -> dict[str, list[int]]:
    source = torch.randint(4, TINY["vocab_size"], (length,), generator=generator).tolist()
    labels = torch.randint(4, TINY["vocab_size"], (length + 2,), generator=generator).tolist()
    return {"input_ids": source, "labels": labels}


def main(output_file: Path, processes: int) -> None:
    accelerator = make_accelerator()
    assert accelerator.num_processes == processes, f"expected {processes} processes, got {accelerator.num_processes}"
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**TINY, dropout=0.0))
    names = [name for name, _ in model.named_parameters()]
    optimizer = GradientRecorder(model.parameters(), lr=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    generator, collator = torch.Generator().manual_seed(1), TranslationCollator(pad_token_id=0)
    # two batches of different sizes and token counts: the loss must be weighted per token, not per batch
    batches = [collator([random_example(generator, n) for n in sizes]) for sizes in ([3, 7, 5], [9])]
    mine = batches if processes == 1 else [batches[accelerator.process_index]]
    output_dir = output_file.with_suffix("")  # the loop's log and its last checkpoint
    output_dir.mkdir(exist_ok=True)
    settings = train_accelerate.parse_training_arguments(
        ["--output_dir", str(output_dir), "--max_steps", "1", "--logging_steps", "1", "--prefetch_batches", "0"]
    )
    run = SimpleNamespace(
        model=model,
        optimizer=optimizer,
        schedule=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
        state=TrainerState("gradients"),
        steps=SimpleNamespace(from_position=lambda position: iter([(mine, DataPosition(0, 1))])),
        validation=None,
        identity={},
        continuation={},
    )
    train_accelerate.train_loop(accelerator, settings, run, StopSignals())
    if accelerator.is_main_process:
        gradients = dict(zip(names, optimizer.optimizer.gradients, strict=True))
        loss = json.loads((output_dir / TRAIN_LOG).read_text().splitlines()[0])["loss"]
        save_file({**gradients, "loss": torch.tensor([loss])}, output_file)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
