"""The training recipe's pieces (paper section 5) used by `train_accelerate.py`: the learning-rate schedule,
the token-normalised loss, the stream of optimizer steps, and evaluation with BLEU under Accelerate."""

import contextlib
import math
import os
import queue
import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from pipeline_vanilla_transformer import output_length

from . import checkpoints
from .batching import TokenBatchSampler, TranslationCollator


class UnsupportedSetup(Exception):
    """An accelerate set-up this recipe cannot run correctly; the message says what to use instead."""


def make_accelerator(**kwargs):
    """An Accelerator that really is distributed when launched as several processes, refusing set-ups that would
    train differently from the recipe (DeepSpeed, sharded FSDP checkpoints).

    On a machine without an accelerator device, `accelerate launch --multi_gpu --num_processes N` (or torchrun)
    starts N processes; without `cpu=True` each would build a single-process Accelerator and train alone.
    """
    from accelerate import Accelerator

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes"):
        raise UnsupportedSetup(DEEPSPEED_REFUSED)  # before Accelerator() imports and configures DeepSpeed
    has_device = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    has_device = has_device or torch.backends.mps.is_available()
    accelerator = Accelerator(cpu=not has_device, **kwargs)
    launched_as = int(os.environ.get("WORLD_SIZE", "1"))
    if accelerator.num_processes != launched_as:
        raise RuntimeError(
            f"Launched as {launched_as} processes but Accelerate set up {accelerator.num_processes}; "
            "check the launch command and the accelerate config."
        )
    check_distributed_setup(accelerator)
    accelerator.register_save_state_pre_hook(checkpoints.save_tied_weights_once)
    return accelerator


DEEPSPEED_REFUSED = (
    "DeepSpeed is not supported: this script accumulates gradients itself (each optimizer step divides the summed "
    "loss by the step's target tokens over all micro-batches and processes, section 5.1), and DeepSpeed's engine "
    "would step the optimizer after every micro-batch. Use DDP (configs/accelerate/ddp_8gpu.yaml) or, for models "
    "past `big`, FSDP (configs/accelerate/fsdp.yaml)."
)


def check_distributed_setup(accelerator) -> None:
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise UnsupportedSetup(DEEPSPEED_REFUSED)
    if accelerator.distributed_type == DistributedType.FSDP:
        state_dict_type = str(accelerator.state.fsdp_plugin.state_dict_type)
        if "FULL_STATE_DICT" not in state_dict_type:
            raise UnsupportedSetup(
                f"FSDP with fsdp_state_dict_type {state_dict_type}: checkpoints must be FULL_STATE_DICT (one file of "
                "tensors, read without unpickling), which averaging and the final model need; see "
                "configs/accelerate/fsdp.yaml"
            )


def sharded_generation_kwargs(accelerator) -> dict:
    """generate() on an FSDP-sharded model gathers the parameters in every forward, a collective: the processes
    decode in step until all are done (`synced_gpus`), however long their own sentences are."""
    from accelerate.utils import DistributedType

    return {"synced_gpus": accelerator.distributed_type == DistributedType.FSDP}


# --- 5.3: Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 and the inverse square root schedule ---------------


def inverse_sqrt_learning_rate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """Equation (3): lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), for step >= 1."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def make_optimizer_and_schedule(model: torch.nn.Module, d_model: int, warmup_steps: int, scale: float):
    """Adam (5.3) and a LambdaLR whose k-th optimizer step (counting from 1) uses equation (3)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda done: inverse_sqrt_learning_rate(done + 1, d_model, warmup_steps, scale)
    )
    return optimizer, schedule


# --- 5.4: label-smoothed loss, normalised by the target tokens of the whole optimizer step ---------------------


def count_target_tokens(batch: dict) -> int:
    return int((batch["labels"] != -100).sum())


def forward_backward(accelerator, model, step_batches: list[dict], global_tokens: float, label_smoothing: float):
    """Gradients of one optimizer step: the sum of the label-smoothed loss (epsilon_ls = `label_smoothing`) over
    every target token of the step, on all processes, divided by their global count. Returns this process's summed
    loss (detached). The model computes the loss without the logits (`return_logits=False`, the fast paths).

    DDP averages gradients over processes, hence the factor num_processes; gradients are only synchronised on
    the last micro-batch (accumulation without needless all-reduces).
    """
    step_loss = torch.zeros((), device=accelerator.device)
    for index, batch in enumerate(step_batches):
        batch = {name: tensor.to(accelerator.device, non_blocking=True) for name, tensor in batch.items()}
        is_last = index == len(step_batches) - 1
        with contextlib.nullcontext() if is_last else accelerator.no_sync(model):
            mean_loss = model(  # the decoder's inputs: the labels shifted right
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                labels=batch["labels"],
                epsilon_ls=label_smoothing,
                return_logits=False,
            ).loss
            loss = mean_loss * (batch["labels"] != -100).sum()  # a tensor: no host sync per micro-batch
            accelerator.backward(loss * accelerator.num_processes / global_tokens)
            step_loss += loss.detach()
    return step_loss


# --- the stream of batches: epochs of token-based batches, grouped into optimizer steps ---------------------


@dataclass
class DataPosition:
    """Where the stream of batches stands: exactly enough to continue the same data order after a resume."""

    epoch: int = 0
    batches_done_in_epoch: int = 0


def optimizer_step_batches(
    sampler: TokenBatchSampler,
    collator: TranslationCollator,
    examples: Sequence[dict],
    accumulation_steps: int,
    start: DataPosition,
    max_epochs: int | None,
) -> Iterator[tuple[list[dict], DataPosition]]:
    """Yield, per optimizer step, `accumulation_steps` collated batches and the data position after them.

    Epoch after epoch from `start`; every rank runs the same number of steps (the sampler gives each rank the
    same number of batches; a step never spans two epochs). Saving the position of the last trained step and
    passing it back as `start` continues with the very next batch.
    """
    epoch, first_batch = start.epoch, start.batches_done_in_epoch
    while max_epochs is None or epoch < max_epochs:
        sampler.set_epoch(epoch)
        batches = sampler.rank_batches()
        usable = len(batches) - len(batches) % accumulation_steps
        if usable == 0:
            raise ValueError(
                f"An epoch has {len(batches)} batches per process, fewer than --gradient_accumulation_steps "
                f"({accumulation_steps}): lower --max_tokens or the accumulation, or add data."
            )
        for begin in range(first_batch, usable, accumulation_steps):
            step_batches = [
                collator([examples[i] for i in batch]) for batch in batches[begin : begin + accumulation_steps]
            ]
            done = begin + accumulation_steps
            yield step_batches, DataPosition(epoch + 1, 0) if done == usable else DataPosition(epoch, done)
        epoch, first_batch = epoch + 1, 0


def prefetch(iterable: Iterable, depth: int, pin_memory: bool = False) -> Iterator:
    """Run `iterable` (e.g. `optimizer_step_batches`) `depth` items ahead in a background thread, so that collation
    overlaps the model's step; with `pin_memory`, tensors are pinned there too, for `non_blocking` copies to a GPU.
    Yields the same items in the same order. `depth=0` runs inline. Closing the generator stops the thread."""
    if depth <= 0:
        yield from iterable
        return
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def pin(item):
        if isinstance(item, torch.Tensor):
            return item.pin_memory()
        if isinstance(item, dict):
            return {name: pin(value) for name, value in item.items()}
        if isinstance(item, (list, tuple)):
            return type(item)(pin(value) for value in item)
        return item

    def put(item) -> bool:
        while not stop.is_set():
            try:
                items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for item in iterable:
                if not put(pin(item) if pin_memory else item):
                    return
            put(done)
        except BaseException as error:  # handed to the consumer, raised there
            put(error)

    thread = threading.Thread(target=produce, name="prefetch", daemon=True)
    thread.start()
    try:
        while (item := items.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


class StopSignals:
    """SIGTERM and SIGINT (Ctrl-C) while training are requests: the loop finishes its step, saves a checkpoint and
    exits, every process at the same step (`requested` goes into the step's vote). `restore_defaults()` ends that
    once the model folder is saved: a Ctrl-C then stops the program at once (KeyboardInterrupt), as usual."""

    def __init__(self):
        self.number = 0
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self._request)

    def _request(self, number, frame):
        self.number = number

    @property
    def requested(self) -> bool:
        return bool(self.number)

    @staticmethod
    def restore_defaults():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# --- evaluation ---------------------------------------------------------------------------------------------


def final_model(accelerator, model, attn_implementation: str):
    """The bare model (no DDP, no mixed-precision wrapper) with `attn_implementation`, for the final averaging,
    evaluation and saving: scores are then measured in float32, as users run the saved model. Under FSDP the shards
    are no model to run or save: a plain model of the same config is built on every process, and the caller loads
    its weights from the checkpoints (which hold the full state)."""
    from accelerate.utils import DistributedType

    model = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    if accelerator.distributed_type == DistributedType.FSDP:
        model = type(model)(model.config).to(accelerator.device)
    model.set_attn_implementation(attn_implementation)
    return model


@torch.no_grad()
def validation_loss(accelerator, model, loader) -> dict[str, float]:
    """Per-token negative log-likelihood (no smoothing) and perplexity over the whole validation set.

    Per-sentence sums go through `gather_for_metrics`, so the examples that pad the last batch count once.
    """
    model.eval()
    total_loss, total_tokens = 0.0, 0
    for batch in loader:
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        ).logits
        token_losses = F.cross_entropy(
            logits.float().transpose(1, 2), batch["labels"], ignore_index=-100, reduction="none"
        )
        sentence_losses, sentence_tokens = accelerator.gather_for_metrics(
            (token_losses.sum(dim=1), (batch["labels"] != -100).sum(dim=1))
        )
        total_loss += sentence_losses.double().sum().item()
        total_tokens += int(sentence_tokens.sum())
    nll = total_loss / max(total_tokens, 1)
    return {"nll": nll, "perplexity": math.exp(min(nll, 50.0))}


@torch.no_grad()
def translate_for_evaluation(accelerator, model, loader, tokenizer, generation_kwargs: dict) -> list[str]:
    """Translate every example of a prepared evaluation loader; returns hypotheses in the dataset's order.

    Generation goes through the unwrapped model (DDP has no generate). Generated tensors differ in length
    between processes, so they are padded across processes before gathering, and `gather_for_metrics` drops
    the duplicates that pad the last batch (accelerate issues #1326, #1674).
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    unwrapped = accelerator.unwrap_model(model)
    unwrapped.eval()
    hypotheses: dict[int, str] = {}
    gathered = contextlib.nullcontext()
    if isinstance(model, FullyShardedDataParallel):  # FSDP1 wraps the root: its shards gathered while decoding
        gathered = FullyShardedDataParallel.summon_full_params(model, writeback=False)
    with gathered:
        for batch in loader:
            max_new_tokens = output_length(
                batch["attention_mask"], unwrapped.config, generation_kwargs.get("max_new_tokens")
            )
            generated = unwrapped.generate(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                **{**generation_kwargs, "max_new_tokens": max_new_tokens},
            )
            generated = accelerator.pad_across_processes(generated, dim=1, pad_index=tokenizer.pad_token_id)
            generated, indices = accelerator.gather_for_metrics((generated, batch["example_index"]))
            for index, tokens in zip(indices.tolist(), generated, strict=True):
                hypotheses[index] = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    return [hypotheses[i] for i in range(len(hypotheses))]


def evaluation_loader(examples: Sequence[dict], collator: TranslationCollator, batch_size: int, max_tokens: int):
    """A plain DataLoader (to be prepared by Accelerate) whose batches carry each example's index, and how many
    examples were truncated: sources and targets longer than `max_tokens` keep their first `max_tokens - 1` tokens
    and their last (`</s>`), so one over-long line cannot blow up evaluation's memory (the text references stay
    whole, so such a sentence scores as translated from its truncated source)."""

    def collate_with_index(items):
        batch = collator([item for _, item in items])
        batch["example_index"] = torch.tensor([index for index, _ in items])
        return batch

    def truncated(ids):
        return ids if len(ids) <= max_tokens else np.concatenate([ids[: max_tokens - 1], ids[-1:]])

    # Sorting by length keeps padding low; indices restore the original order afterwards.
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    indexed, too_long = [], 0
    for i in order:
        example = examples[i]
        too_long += max(len(example["input_ids"]), len(example["labels"])) > max_tokens
        indexed.append((i, {name: truncated(example[name]) for name in ("input_ids", "labels")}))
    loader = torch.utils.data.DataLoader(indexed, batch_size=batch_size, shuffle=False, collate_fn=collate_with_index)
    return loader, too_long
