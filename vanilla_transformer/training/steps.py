"""The stream of optimizer steps' batches: epochs of token-based batches from a data position, grouped into optimizer
steps and collated ahead of the model.

`optimizer_step_batches` and `PreparedSteps` group the batches into steps, `prefetch` collates them in a background
thread, and `count_target_tokens` gives the target tokens that normalise a step's loss (section 5.4)."""

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from vanilla_transformer.data.batching import DataPosition, TokenBatchSampler, TranslationCollator
from vanilla_transformer.data.readers import DataError

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
