"""Streaming (`--streaming`): train on a corpus larger than the disk or memory, read, shuffled and tokenized as it goes.

    accelerate launch ... train_accelerate.py --dataset_name wmt14 --dataset_config fr-en --streaming \
        --source_lang en --target_lang fr --tokenizer_name_or_path TOKENIZER --max_steps 300000 ...

Per process: the training pairs (a Hub dataset opened with `streaming=True`, or local files read lazily) go through a
seeded shuffle buffer (`--shuffle_buffer_size`, reshuffled every epoch), are split between processes
(`datasets.distributed.split_dataset_by_node`: whole shards when they divide evenly, else every n-th pair), tokenized,
filtered like the prepared path (`--max_sentence_tokens`, `--max_length_ratio`), and gathered into pools of about
`--stream_pool_batches` batches' worth of tokens; each pool is sorted by length, cut into `--max_tokens` batches and
shuffled with `TokenBatchSampler`, as the prepared path does for a whole epoch.

Processes see different numbers of pairs, so an epoch is a per-process notion here: each process starts its next epoch
when its share runs out, every process takes the same number of optimizer steps, and training ends at `--max_steps`
or `--max_minutes` (`--max_epochs` is refused).

Resume (`--resume_from_checkpoint`) restores the model, optimizer, schedule, RNG states and the data position (epoch,
batches done in it), and continues with exactly the batches an uninterrupted run would have taken: the stream is
deterministic given the seed and the epoch, so the epoch is read again from its start and the batches already trained
on are skipped (they are read and tokenized, not trained on: resuming late in a long epoch costs that reading time).

The tokenizer is `--tokenizer_name_or_path`, or a BPE trained on the first `--tokenizer_train_pairs` pairs of the
shuffled stream, cached like a prepared corpus. The validation and test splits are small: they are prepared as usual.
"""

import itertools
import json
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np

from vanilla_transformer.data import prepare, readers
from vanilla_transformer.data.batching import DataPosition, TokenBatchSampler, TranslationCollator
from vanilla_transformer.data.prepare import Corpus, DataSettings, LengthFilter
from vanilla_transformer.data.readers import DataError
from vanilla_transformer.data.settings import StreamSettings
from vanilla_transformer.mechanics.barrier import run_while_others_wait
from vanilla_transformer.mechanics.files import move_into_place, on_full_disk, staging_path


def _local_pairs(source: str, source_lang: str, target_lang: str) -> Iterator[dict]:
    for pair in prepare.iter_source_pairs("train", json.loads(source), source_lang, target_lang):
        yield {"source": pair[0], "target": pair[1]}


def raw_stream(corpus: Corpus):
    """The training pairs as an `IterableDataset` of `{"source", "target"}`, empty sides dropped."""
    import datasets

    source = prepare.split_sources(corpus, ["train"]).get("train")
    if source is None:
        raise DataError("no training data: give --data_dir, --train_file or --dataset_name")
    if source["kind"] == "hub":
        label = readers.hub_dataset_label(source["name"], source["config"], source["split"])
        stream = readers.open_hub_dataset(source["name"], source["config"], source["split"], streaming=True)

        def to_pairs(batch):
            pairs = list(
                readers.translation_pairs(batch["translation"], label, corpus.source_lang, corpus.target_lang)
            )
            return {"source": [s for s, _ in pairs], "target": [t for _, t in pairs]}

        stream = stream.map(to_pairs, batched=True, remove_columns=stream.column_names)
    else:  # local files (or the embedded task), read lazily; one shard
        stream = datasets.IterableDataset.from_generator(
            _local_pairs,
            gen_kwargs={
                "source": json.dumps(source),
                "source_lang": corpus.source_lang,
                "target_lang": corpus.target_lang,
            },
        )
    return stream.filter(lambda pair: bool(pair["source"]) and bool(pair["target"]))


def shuffled_shard(stream, seed: int, buffer_size: int, rank: int, world_size: int):
    """The same seeded shuffle on every process, then this process's share of it."""
    from datasets.distributed import split_dataset_by_node

    return split_dataset_by_node(stream.shuffle(seed=seed, buffer_size=buffer_size), rank, world_size)


def load_or_train_tokenizer(settings: DataSettings, shuffle_buffer_size: int, accelerator=None):
    """The given tokenizer, or a BPE trained on the first `sample_pairs` pairs of the shuffled stream, cached under
    the data cache folder by the stream and tokenizer settings (the local main process trains)."""
    from vanilla_transformer.data.tokenization import load_tokenizer, train_shared_tokenizer

    if (given := settings.tokenizer.load_given()) is not None:
        return given
    corpus_key = prepare.corpus_key(settings, prepare.split_sources(settings.corpus, ["train"]))
    key = {name: corpus_key[name] for name in ("format", "source_lang", "target_lang", "sources", "tokenizer")}
    key["shuffle_buffer_size"] = shuffle_buffer_size  # the sample is the stream's first pairs
    folder = Path(settings.cache_dir or prepare.default_cache_dir()) / f"tokenizer-{prepare.key_hash(key)}"
    trained = settings.tokenizer

    def train_if_missing():
        if (folder / "tokenizer.json").is_file():
            return
        stream = raw_stream(settings.corpus).shuffle(seed=trained.seed, buffer_size=shuffle_buffer_size)
        texts = (text for pair in islice(iter(stream), trained.sample_pairs) for text in pair.values())
        save_into_place(train_shared_tokenizer(texts, vocab_size=trained.vocab_size), folder)

    run_while_others_wait(accelerator, train_if_missing, "training the stream's tokenizer")
    return load_tokenizer(folder)


def save_into_place(tokenizer, folder: Path) -> None:
    """Save `tokenizer` into a new folder beside `folder`, renamed to `folder` once complete: an interrupted save (a
    kill, a full disk) never leaves a cached tokenizer that is half written."""
    staging = staging_path(folder)
    try:
        with on_full_disk(prepare.out_of_space(folder)):
            tokenizer.save_pretrained(staging)
        try:
            move_into_place(staging, folder, replace=False)
        except OSError:
            if not (folder / "tokenizer.json").is_file():  # else another process saved the same tokenizer first
                raise DataError(
                    f"{folder} holds an incomplete tokenizer (no tokenizer.json), left by an earlier interrupted "
                    "run: delete it, and it is trained again"
                ) from None
    finally:
        if staging.is_dir() and not staging.is_symlink():
            shutil.rmtree(staging, ignore_errors=True)


def tokenized_examples(pairs: Iterable[dict], tokenizer, filters: LengthFilter, batch_size: int = 1000):
    """`{"input_ids", "labels"}` of each pair, filtered by the prepared path's rules (`LengthFilter`); DataError, as
    when preparing, once the pairs are read if the filter dropped every one."""
    read, totals = 0, prepare.DataReport(["this process's share of the stream"], too_long_dropped=0, ratio_dropped=0)
    while chunk := list(islice(pairs, batch_size)):
        texts = {"source": [pair["source"] for pair in chunk], "target": [pair["target"] for pair in chunk]}
        encoded = prepare.encode_pairs_batch(texts, tokenizer)
        source_lengths = np.array([len(ids) for ids in encoded["input_ids"]])
        target_lengths = np.array([len(ids) for ids in encoded["labels"]])
        report = prepare.DataReport()
        keep = filters.keep(source_lengths, target_lengths, report)
        read, totals.kept = read + len(chunk), totals.kept + report.kept
        totals.too_long_dropped += report.too_long_dropped
        totals.ratio_dropped += report.ratio_dropped
        for index in np.flatnonzero(keep):
            yield {"input_ids": encoded["input_ids"][index], "labels": encoded["labels"][index]}
    filters.refuse_if_none_kept(read, totals)


def pooled_token_batches(examples: Iterable[dict], max_tokens: int, pool_batches: int, seed: int) -> Iterator[list]:
    """Lists of examples: each pool of about `pool_batches * max_tokens` tokens sorted by length, cut into batches
    that fit `max_tokens` and shuffled (`TokenBatchSampler`, seeded by `seed` and the pool's number)."""
    examples = iter(examples)
    for pool_number in itertools.count():
        pool, tokens = [], 0
        for example in examples:
            pool.append(example)
            tokens += max(len(example["input_ids"]), len(example["labels"]))
            if tokens >= pool_batches * max_tokens:
                break
        if not pool:
            return
        sampler = TokenBatchSampler(
            [len(e["input_ids"]) for e in pool], [len(e["labels"]) for e in pool], max_tokens=max_tokens, seed=seed
        )
        sampler.set_epoch(pool_number)
        for batch in sampler.epoch_batches():
            yield [pool[index] for index in batch]


def streamed_data_fingerprint(settings: DataSettings) -> dict:
    """What a run resumed from a checkpoint must stream to continue it (compared on resume): where the training pairs
    come from (file names and sizes, the Hub dataset, or the embedded task) and the filters. The pairs themselves are
    not read: a file edited to the same size goes unnoticed."""
    source = dict(prepare.split_sources(settings.corpus, ["train"])["train"])
    if "files" in source:
        source["files"] = [{"name": Path(entry["path"]).name, "size": entry["size"]} for entry in source["files"]]
    return {
        "streamed": source,
        "max_sentence_tokens": settings.filters.max_sentence_tokens,
        "max_length_ratio": settings.filters.max_length_ratio,
    }


def epoch_batches_factory(
    data: DataSettings, settings: StreamSettings, tokenizer, max_tokens: int, seed: int, rank: int, world_size: int
) -> Callable[[int], Iterator[list]]:
    """epoch -> this process's token batches (lists of examples, `max_tokens` source and target tokens each) of that
    epoch of the stream, shuffled with the training's `seed`."""
    stream = shuffled_shard(raw_stream(data.corpus), seed, settings.shuffle_buffer_size, rank, world_size)

    def epoch_batches(epoch: int) -> Iterator[list]:
        stream.set_epoch(epoch)
        examples = tokenized_examples(iter(stream), tokenizer, data.filters)
        yield from pooled_token_batches(examples, max_tokens, settings.pool_batches, seed=seed + epoch)

    return epoch_batches


@dataclass
class StreamedSteps:
    """The optimizer steps of a stream: from any data position, without end; `streaming_step_batches`."""

    epoch_batches: Callable[[int], Iterable[list]]  # `epoch_batches_factory`'s
    collator: TranslationCollator
    accumulation_steps: int

    def from_position(self, position: DataPosition) -> Iterator[tuple[list[dict], DataPosition]]:
        return streaming_step_batches(self.epoch_batches, self.collator, self.accumulation_steps, position)


def streaming_step_batches(
    epoch_batches: Callable[[int], Iterable[list]], collator, accumulation_steps: int, start: DataPosition
) -> Iterator[tuple[list[dict], DataPosition]]:
    """Like `training.optimizer_step_batches`, for a stream: per optimizer step, `accumulation_steps` collated
    batches and the position after them; epochs without end. From `start`, the epoch is replayed and its first
    `start.batches_done_in_epoch` batches skipped, so a resumed run takes the batches an uninterrupted one would."""
    epoch, skip = start.epoch, start.batches_done_in_epoch
    while True:
        done = 0
        batches = iter(epoch_batches(epoch))
        while len(group := list(islice(batches, accumulation_steps))) == accumulation_steps:
            done += accumulation_steps
            if done > skip:
                yield [collator(batch) for batch in group], DataPosition(epoch, done)
        if done == 0:
            raise DataError(
                f"--gradient_accumulation_steps {accumulation_steps} needs at least {accumulation_steps} batches per "
                f"epoch, and this process's share of the stream gives {len(group)}: lower --gradient_accumulation_steps "
                "or --max_tokens, use fewer processes, or add data."
            )
        epoch, skip = epoch + 1, 0
