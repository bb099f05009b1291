"""Token-based batching as in the paper (section 5.1): a batch holds as many sentence pairs of similar length as fit in
a token budget, instead of a fixed number of sentences.
"""

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DataPosition:
    """Where a stream of batches stands: exactly enough to continue the same data order after a resume."""

    epoch: int = 0
    batches_done_in_epoch: int = 0


class TokenBatchSampler:
    """Yield lists of example indices whose padded source and padded target both fit in `max_tokens`.

    A batch of n examples is padded to its longest source and its longest target, so it is kept when
    `n * max(source lengths) <= max_tokens` and `n * max(target lengths) <= max_tokens`. Lengths are in tokens,
    including `</s>`.

    Examples are sorted by (source length, target length) so that batches need little padding. Examples of equal
    lengths are shuffled each epoch, so batches differ between epochs while their number stays the same, and the
    batch order is shuffled too; everything is determined by `(seed, epoch)`: call `set_epoch` before each epoch.

    With `num_replicas > 1`, every rank builds the same list of batches and takes every `num_replicas`-th one.
    If the count does not divide evenly, batches from the start are repeated so that all ranks get the same number
    of batches (a rank with fewer steps would make the others wait forever in distributed training).

    Use it as `DataLoader(dataset, batch_sampler=sampler, collate_fn=...)`.
    """

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        self.source_lengths = np.asarray(source_lengths, dtype=np.int32)
        self.target_lengths = np.asarray(target_lengths, dtype=np.int32)
        if self.source_lengths.ndim != 1 or self.source_lengths.shape != self.target_lengths.shape:
            raise ValueError(
                f"source_lengths and target_lengths must be flat and of equal size, got {len(source_lengths)} and "
                f"{len(target_lengths)}."
            )
        if len(self.source_lengths) == 0:
            raise ValueError("There are no examples to batch.")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank}.")
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._check_lengths()
        self._batch_ends = self._cut_batches()

    def _check_lengths(self) -> None:
        longest = np.maximum(self.source_lengths, self.target_lengths)
        if longest.min() < 1:
            index = int(longest.argmin())
            raise ValueError(f"Example {index} has no tokens; lengths must include </s> and be at least 1.")
        too_long = np.flatnonzero(longest > self.max_tokens)
        if len(too_long):
            index = int(too_long[0])
            raise ValueError(
                f"Example {index} has {self.source_lengths[index]} source and {self.target_lengths[index]} target "
                f"tokens, more than max_tokens={self.max_tokens} ({len(too_long)} examples are too long in all). "
                "Increase max_tokens or filter out long examples first."
            )

    def _sorted_order(self, rng: np.random.Generator | None) -> np.ndarray:
        """Example indices sorted by (source length, target length); ties in random order when `rng` is given."""
        count = len(self.source_lengths)
        order = rng.permutation(count) if rng is not None else np.arange(count)
        order = order.astype(np.int32) if count < 2**31 else order  # half the memory at WMT sizes
        by_length = np.lexsort((self.target_lengths[order], self.source_lengths[order]))  # stable: keeps tie order
        return order[by_length]

    def _cut_batches(self) -> list[int]:
        """End positions of the batches in the sorted order.

        Shuffling ties never changes the sequence of lengths in sorted order, so these positions hold for every
        epoch.
        """
        order = self._sorted_order(rng=None)
        longest = np.maximum(self.source_lengths[order], self.target_lengths[order])
        del order
        # Greedy, one batch at a time: a batch of n examples from `start` is padded to the running maximum of
        # `longest`; it ends before the first n with n * running_max > max_tokens. No batch holds more than
        # max_tokens examples (each has a token), so a window of max_tokens positions decides it.
        counts = np.arange(1, self.max_tokens + 1)
        batch_ends, start = [], 0
        while start < len(longest):
            window = np.maximum.accumulate(longest[start : start + self.max_tokens])
            too_many = np.flatnonzero(counts[: len(window)] * window > self.max_tokens)
            start += int(too_many[0]) if len(too_many) else len(window)
            batch_ends.append(start)
        return batch_ends

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose batches the next iteration yields."""
        self.epoch = epoch

    def epoch_batches(self) -> list[np.ndarray]:
        """All batches of the current epoch for all ranks, in order, with repeats so that the count divides evenly;
        each batch an array of example indices (views of one array: a few bytes per example at any corpus size)."""
        rng = np.random.default_rng([self.seed, self.epoch]) if self.shuffle else None
        batches = np.split(self._sorted_order(rng), self._batch_ends[:-1])
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        missing = -len(batches) % self.num_replicas
        return batches + [batches[i % len(batches)] for i in range(missing)]

    def rank_batches(self) -> list[np.ndarray]:
        """This rank's batches of the current epoch."""
        return self.epoch_batches()[self.rank :: self.num_replicas]

    def all_batches(self) -> list[list[int]]:
        """`epoch_batches` as lists."""
        return [batch.tolist() for batch in self.epoch_batches()]

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.rank_batches():
            yield batch.tolist()

    def __len__(self) -> int:
        return -(-len(self._batch_ends) // self.num_replicas)


def padding_statistics(
    batches: Sequence[Sequence[int]], source_lengths: Sequence[int], target_lengths: Sequence[int]
) -> dict[str, float]:
    """Count real and padded tokens (source and target together) over `batches` and the fraction wasted on padding."""
    if not len(batches):
        return {"batches": 0, "real_tokens": 0, "padded_tokens": 0, "padding_fraction": 0.0}
    sizes = np.array([len(batch) for batch in batches])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    indices = np.concatenate([np.asarray(batch, dtype=np.int64) for batch in batches])
    sources, targets = np.asarray(source_lengths)[indices], np.asarray(target_lengths)[indices]
    real_tokens = int(sources.sum() + targets.sum())
    padded_tokens = int((sizes * (np.maximum.reduceat(sources, starts) + np.maximum.reduceat(targets, starts))).sum())
    return {
        "batches": len(batches),
        "real_tokens": real_tokens,
        "padded_tokens": padded_tokens,
        "padding_fraction": 1 - real_tokens / padded_tokens if padded_tokens else 0.0,
    }


class TranslationCollator:
    """Pad a list of `{"input_ids": [...], "labels": [...]}` examples into a batch of tensors.

    Returns `input_ids` padded with `pad_token_id`, `attention_mask` (1 for real tokens, 0 for padding) and `labels`
    padded with -100 (ignored by the loss). The model builds `decoder_input_ids` by shifting `labels` right.
    Examples without `labels` (for translation only) give a batch without `labels`.
    """

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    @staticmethod
    def _pad(sequences: list[Sequence[int]], value: int) -> torch.Tensor:
        padded = np.full((len(sequences), max(len(sequence) for sequence in sequences)), value, dtype=np.int64)
        for row, sequence in enumerate(sequences):
            padded[row, : len(sequence)] = sequence
        return torch.from_numpy(padded)

    def __call__(self, examples: list[dict[str, Sequence[int]]]) -> dict[str, torch.Tensor]:
        input_ids = self._pad([example["input_ids"] for example in examples], self.pad_token_id)
        lengths = torch.tensor([len(example["input_ids"]) for example in examples])
        batch = {
            "input_ids": input_ids,
            "attention_mask": (torch.arange(input_ids.shape[1]) < lengths[:, None]).long(),
        }
        if "labels" in examples[0]:
            batch["labels"] = self._pad([example["labels"] for example in examples], -100)
        return batch


class TokenizedPairs(Sequence):
    """The token ids of a prepared split (`vanilla_transformer.data.prepare`), read straight from its memory-mapped Arrow
    list columns: `pairs[i]` is `{"input_ids": array, "labels": array}` (int32 views, no copy), and the lengths are
    numpy arrays computed from the Arrow offsets. Nothing per example is held in Python objects, so a process's
    memory does not grow with the corpus.
    """

    def __init__(self, dataset):
        if getattr(dataset, "_indices", None) is not None:  # a filtered or selected view: write it out once
            dataset = dataset.flatten_indices()
        self.dataset = dataset
        self._columns = {}
        for name in ("input_ids", "labels"):
            chunks = dataset.data.table.column(name).chunks
            values = [chunk.values.to_numpy() for chunk in chunks]
            self._columns[name] = (values, [chunk.offsets.to_numpy() for chunk in chunks])
        chunk_sizes = [len(chunk) for chunk in dataset.data.table.column("input_ids").chunks]
        self._chunk_of = np.repeat(np.arange(len(chunk_sizes), dtype=np.int32), chunk_sizes)
        self._chunk_starts = np.concatenate([[0], np.cumsum(chunk_sizes)[:-1]]).astype(np.int64)
        self.source_lengths = self._lengths("input_ids")
        self.target_lengths = self._lengths("labels")

    def content_sha256(self) -> str:
        """sha256 of every pair's token ids, in order, whatever the Arrow file's chunks (a corpus prepared again with
        other workers has other files but the same content); reads each token once, about a second per GB."""
        digests = {name: hashlib.sha256() for name in ("lengths", *self._columns)}
        digests["lengths"].update(np.ascontiguousarray(self.source_lengths, dtype="<i8"))
        digests["lengths"].update(np.ascontiguousarray(self.target_lengths, dtype="<i8"))
        for name, (values, offsets) in self._columns.items():
            for chunk_values, chunk_offsets in zip(values, offsets, strict=True):
                if len(chunk_offsets):
                    used = chunk_values[chunk_offsets[0] : chunk_offsets[-1]]
                    digests[name].update(np.ascontiguousarray(used, dtype="<i4"))
        return hashlib.sha256("".join(digest.hexdigest() for digest in digests.values()).encode()).hexdigest()

    def _lengths(self, name: str) -> np.ndarray:
        offsets = self._columns[name][1]
        return np.concatenate([np.diff(o) for o in offsets]) if offsets else np.zeros(0, dtype=np.int32)

    def __len__(self) -> int:
        return len(self._chunk_of)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        index = index + len(self) if index < 0 else index
        chunk = self._chunk_of[index]
        row = index - self._chunk_starts[chunk]
        example = {}
        for name, (values, offsets) in self._columns.items():
            example[name] = values[chunk][offsets[chunk][row] : offsets[chunk][row + 1]]
        return example
