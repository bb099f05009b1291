"""The training recipe's pieces (paper section 5) used by `train_accelerate.py`: the Accelerator, the model's
config, Adam with the learning-rate schedule, the stream of optimizer steps, the training log and stop
signals. Evaluation is `evaluation.py`, checkpoints `checkpoints.py`."""

import json
import os
import queue
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from vanilla_transformer.data.batching import DataPosition, TokenBatchSampler, TranslationCollator
from vanilla_transformer.data.readers import DataError
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import on_full_disk, replace_file
from vanilla_transformer.training import checkpoints
from vanilla_transformer.training.settings import CheckpointSettings


class UnsupportedSetup(VanillaTransformerError):
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


def config_for_tokenizer(preset: str, tokenizer, **overrides):
    """The model config of a preset (configuration_vanilla_transformer.PRESETS) with `overrides`, sized to the
    tokenizer's vocabulary and using its special tokens (the decoder starts from <s>)."""
    from configuration_vanilla_transformer import VanillaTransformerConfig

    return VanillaTransformerConfig.from_preset(
        preset,
        **overrides,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )


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


# --- 5.4: the loss is normalised by the target tokens of the whole optimizer step (the loop, loss.py) -----------


def count_target_tokens(batch: dict) -> int:
    return int((batch["labels"] != -100).sum())


# --- the stream of batches: epochs of token-based batches, grouped into optimizer steps ---------------------


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
    passing it back as `start` continues with the very next batch. DataError at once (not at the first step) when an
    epoch has fewer batches than one step takes.
    """
    check_accumulation(len(sampler), accumulation_steps, sampler.max_tokens)
    return _step_batches(sampler, collator, examples, accumulation_steps, start, max_epochs)


def check_accumulation(batches_per_epoch: int, accumulation_steps: int, max_tokens: int) -> None:
    """An optimizer step takes `accumulation_steps` batches of one epoch: refuse an epoch (of this process) that has
    fewer, naming the flags."""
    if batches_per_epoch < accumulation_steps:
        raise DataError(
            f"--gradient_accumulation_steps {accumulation_steps} needs at least {accumulation_steps} batches per "
            f"epoch, and the corpus gives {batches_per_epoch} per process at --max_tokens {max_tokens}: lower "
            "--gradient_accumulation_steps or --max_tokens, use fewer processes, or add data."
        )


def _step_batches(sampler, collator, examples, accumulation_steps, start, max_epochs):
    """`optimizer_step_batches`' steps, once the accumulation is checked."""
    epoch, first_batch = start.epoch, start.batches_done_in_epoch
    while max_epochs is None or epoch < max_epochs:
        sampler.set_epoch(epoch)
        batches = sampler.rank_batches()
        usable = len(batches) - len(batches) % accumulation_steps
        for begin in range(first_batch, usable, accumulation_steps):
            step_batches = [
                collator([examples[i] for i in batch]) for batch in batches[begin : begin + accumulation_steps]
            ]
            done = begin + accumulation_steps
            yield step_batches, DataPosition(epoch + 1, 0) if done == usable else DataPosition(epoch, done)
        epoch, first_batch = epoch + 1, 0


@dataclass
class PreparedSteps:
    """The optimizer steps of a prepared (memory-mapped) corpus: from any data position, without end (the training
    loop decides when to stop); `optimizer_step_batches`."""

    sampler: TokenBatchSampler
    collator: TranslationCollator
    examples: Sequence[dict]
    accumulation_steps: int

    def from_position(self, position: DataPosition) -> Iterator[tuple[list[dict], DataPosition]]:
        return optimizer_step_batches(
            self.sampler, self.collator, self.examples, self.accumulation_steps, position, max_epochs=None
        )


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


class TrainingLog:
    """Every --logging_steps: the mean loss per target token and tokens/s since the last line, into `file` (JSON
    lines, main process), accelerate's trackers and the progress bar."""

    def __init__(self, accelerator, file: Path, progress, start_step: int, run: CheckpointSettings):
        self.accelerator, self.progress, self.file, self.run = accelerator, progress, file, run
        self.loss, self.tokens, self.start = 0.0, 0.0, time.time()
        if accelerator.is_main_process and self.file.is_file():
            self.end_the_last_line()
            self.drop_lines_after(start_step)

    def end_the_last_line(self) -> None:
        """A run killed while writing a line leaves it cut, without its newline: the next line would be glued to it
        and both lost. A cut line is dropped (it is not a whole record); a whole record that only lacks its newline
        gets one."""
        text = self.file.read_text()
        if not text or text.endswith("\n"):
            return
        complete, _, last = text.rpartition("\n")
        complete += "\n" if complete else ""
        if _logged_step(last) >= 0:
            complete += last + "\n"
        else:
            self.accelerator.print(f"[log] {self.file}: dropped its last line, cut by an interruption: {last[:80]!r}")
        replace_file(self.file, complete, staging=self.file.with_name(self.file.name + ".tmp"))

    def drop_lines_after(self, step: int) -> None:
        """Resumed from `step`: the lines of later steps belong to steps trained again now, so each step keeps one."""
        lines = self.file.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _logged_step(line) <= step]
        if len(kept) < len(lines):
            replace_file(self.file, "".join(kept), staging=self.file.with_name(self.file.name + ".tmp"))

    def add(self, step_loss: float, step_tokens: float) -> None:
        self.loss, self.tokens = self.loss + step_loss, self.tokens + step_tokens

    def write(self, step: int, lr: float, epoch: int) -> None:
        loss_per_token = (self.accelerator.reduce(self.loss, "sum") / self.tokens).item()
        tokens_per_second = self.tokens / (time.time() - self.start)
        record = {
            "step": step,
            "loss": loss_per_token,
            "lr": lr,
            "target_tokens_per_second": tokens_per_second,
            "epoch": epoch,
        }
        self.progress.set_postfix(loss=f"{loss_per_token:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:.0f}")
        self.accelerator.log({"train/" + k: v for k, v in record.items() if k != "step"}, step=step)
        if self.accelerator.is_main_process:
            with (
                on_full_disk(checkpoints.disk_full(self.run, f"the training log {self.file.name}")),
                self.file.open("a") as log,
            ):
                log.write(json.dumps(record) + "\n")
        self.loss, self.tokens, self.start = 0.0, 0.0, time.time()


def _logged_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return -1  # a damaged line stays as it is


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
