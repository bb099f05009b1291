import random

import pytest
import torch
from torch.utils.data import DataLoader

from vanilla_transformer.data.batching import TokenBatchSampler, TranslationCollator, padding_statistics

MAX_TOKENS = 64


@pytest.fixture(scope="module")
def lengths() -> tuple[list[int], list[int]]:
    rng = random.Random(0)
    source_lengths = [rng.randint(1, 30) for _ in range(500)]
    target_lengths = [max(1, length + rng.randint(-5, 8)) for length in source_lengths]
    return source_lengths, target_lengths


def padded_sizes(batch: list[int], source_lengths: list[int], target_lengths: list[int]) -> tuple[int, int]:
    source = len(batch) * max(source_lengths[index] for index in batch)
    target = len(batch) * max(target_lengths[index] for index in batch)
    return source, target


def test_every_batch_fits_in_max_tokens_on_both_sides(lengths):
    sampler = TokenBatchSampler(*lengths, max_tokens=MAX_TOKENS)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    for batch in batches:
        source, target = padded_sizes(batch, *lengths)
        assert source <= MAX_TOKENS and target <= MAX_TOKENS


def test_every_example_appears_once_per_epoch(lengths):
    sampler = TokenBatchSampler(*lengths, max_tokens=MAX_TOKENS)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        indices = [index for batch in sampler for index in batch]
        assert sorted(indices) == list(range(len(lengths[0])))


def test_same_seed_and_epoch_give_same_batches_and_epochs_differ(lengths):
    first = TokenBatchSampler(*lengths, max_tokens=MAX_TOKENS, seed=3)
    second = TokenBatchSampler(*lengths, max_tokens=MAX_TOKENS, seed=3)
    epoch_0 = list(first)
    assert list(second) == epoch_0
    first.set_epoch(1)
    epoch_1 = list(first)
    assert epoch_1 != epoch_0
    assert {tuple(sorted(batch)) for batch in epoch_1} != {tuple(sorted(batch)) for batch in epoch_0}
    assert len(epoch_1) == len(epoch_0)
    assert list(TokenBatchSampler(*lengths, max_tokens=MAX_TOKENS, seed=4)) != epoch_0


def test_without_shuffle_batches_are_sorted_by_length(lengths):
    sampler = TokenBatchSampler(*lengths, max_tokens=MAX_TOKENS, shuffle=False)
    order = [index for batch in sampler for index in batch]
    sort_keys = [(lengths[0][index], lengths[1][index]) for index in order]
    assert sort_keys == sorted(sort_keys)
    sampler.set_epoch(5)
    assert [index for batch in sampler for index in batch] == order


def test_sorting_keeps_padding_low(lengths):
    sampler = TokenBatchSampler(*lengths, max_tokens=MAX_TOKENS)
    statistics = padding_statistics(list(sampler), *lengths)
    assert statistics["real_tokens"] == sum(lengths[0]) + sum(lengths[1])
    assert statistics["padding_fraction"] < 0.15


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_ranks_get_equal_counts_and_disjoint_batches(lengths, num_replicas):
    samplers = [
        TokenBatchSampler(*lengths, max_tokens=MAX_TOKENS, seed=7, num_replicas=num_replicas, rank=rank)
        for rank in range(num_replicas)
    ]
    for sampler in samplers:
        sampler.set_epoch(2)
    per_rank = [list(sampler) for sampler in samplers]
    full_count = len(TokenBatchSampler(*lengths, max_tokens=MAX_TOKENS))

    assert len({len(batches) for batches in per_rank}) == 1
    assert all(len(batches) == len(sampler) for batches, sampler in zip(per_rank, samplers, strict=True))
    assert len(per_rank[0]) * num_replicas - full_count < num_replicas

    all_batches = samplers[0].all_batches()
    unique, repeats = all_batches[:full_count], all_batches[full_count:]
    assert all(batch in unique[: len(repeats)] for batch in repeats)
    indices = [index for batch in unique for index in batch]
    assert sorted(indices) == list(range(len(lengths[0])))

    seen_by_rank = [{index for batch in batches for index in batch} for batches in per_rank]
    repeated = {index for batch in repeats for index in batch}
    for rank in range(num_replicas):
        for other in range(rank + 1, num_replicas):
            assert not (seen_by_rank[rank] & seen_by_rank[other]) - repeated
    assert set().union(*seen_by_rank) == set(range(len(lengths[0])))


def test_more_ranks_than_batches_still_gives_every_rank_a_batch():
    samplers = [TokenBatchSampler([3, 4], [3, 4], max_tokens=10, num_replicas=4, rank=rank) for rank in range(4)]
    assert [len(list(sampler)) for sampler in samplers] == [1, 1, 1, 1]


def test_example_longer_than_max_tokens_is_named():
    with pytest.raises(ValueError, match=r"Example 2 has 5 source and 80 target tokens, more than max_tokens=64"):
        TokenBatchSampler([3, 4, 5, 6], [3, 4, 80, 90], max_tokens=64)


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="equal size"):
        TokenBatchSampler([3, 4], [3], max_tokens=64)


def test_works_as_dataloader_batch_sampler():
    examples = [{"input_ids": [5] * length + [2], "labels": [6] * (length + 1) + [2]} for length in range(1, 20)]
    source_lengths = [len(example["input_ids"]) for example in examples]
    target_lengths = [len(example["labels"]) for example in examples]
    sampler = TokenBatchSampler(source_lengths, target_lengths, max_tokens=40)
    loader = DataLoader(examples, batch_sampler=sampler, collate_fn=TranslationCollator(pad_token_id=0))

    batches = list(loader)

    assert len(batches) == len(sampler)
    assert sum(batch["input_ids"].shape[0] for batch in batches) == len(examples)
    assert all(batch["labels"].numel() <= 40 for batch in batches)


def test_collator_pads_inputs_masks_and_labels():
    collator = TranslationCollator(pad_token_id=0)
    batch = collator([{"input_ids": [7, 8, 2], "labels": [9, 2]}, {"input_ids": [7, 2], "labels": [9, 9, 9, 2]}])

    assert batch["input_ids"].tolist() == [[7, 8, 2], [7, 2, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[9, 2, -100, -100], [9, 9, 9, 2]]
    assert all(tensor.dtype == torch.long for tensor in batch.values())


def test_collator_without_labels_for_translation():
    batch = TranslationCollator(pad_token_id=0)([{"input_ids": [7, 2]}, {"input_ids": [2]}])
    assert set(batch) == {"input_ids", "attention_mask"}
    assert batch["input_ids"].tolist() == [[7, 2], [2, 0]]


def test_batches_are_cut_exactly_as_the_greedy_rule_says():
    """Walk the sorted examples one by one: a new batch starts when one more example would not fit."""
    rng = random.Random(5)
    for max_tokens in (40, 64, 300):
        sources = [rng.randint(1, 40) for _ in range(700)]
        targets = [rng.randint(1, 40) for _ in range(700)]
        sampler = TokenBatchSampler(sources, targets, max_tokens=max_tokens, shuffle=False)
        expected, size, longest = [], 0, 0
        for position, (s, t) in enumerate(sorted(zip(sources, targets, strict=True))):
            if size and (size + 1) * max(longest, s, t) > max_tokens:
                expected.append(position)
                size, longest = 0, 0
            size, longest = size + 1, max(longest, s, t)
        assert sampler._batch_ends == [*expected, 700]
