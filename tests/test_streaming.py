"""--streaming: the same pairs as the prepared path, split between processes, exact replay on resume, end to end."""

import errno
import json
from itertools import islice
from pathlib import Path

import pytest

from vanilla_transformer.commands.arguments import parse_training_arguments
from vanilla_transformer.data import prepare, streaming
from vanilla_transformer.data.batching import DataPosition, TranslationCollator
from vanilla_transformer.data.readers import DataError
from vanilla_transformer.data.settings import LengthFilter
from vanilla_transformer.data.tokenization import train_shared_tokenizer

from .helpers import SOURCES, TARGETS, train

STREAM = ["--streaming", "--max_tokens", "200", "--shuffle_buffer_size", "7", "--stream_pool_batches", "3"]


def corpus_settings(corpus_dir, cache_dir, *extra: str):
    """The training script's settings for the test corpus."""
    options = "--validation_split val --vocab_size 300 --max_sentence_tokens 40".split()
    flags = ["--data_dir", str(corpus_dir), *options, "--data_cache_dir", str(cache_dir), *extra]
    return parse_training_arguments(flags)


@pytest.fixture
def stream_settings(corpus_dir, tmp_path):
    tokenizer = train_shared_tokenizer([*SOURCES, *TARGETS], vocab_size=300)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    return corpus_settings(
        corpus_dir, tmp_path / "cache", "--tokenizer_name_or_path", str(tmp_path / "tokenizer"), *STREAM
    )


def batches_of(settings, tokenizer, rank: int, world_size: int):
    """The stream's epoch -> batches function for one of `world_size` processes."""
    data = settings.data
    return streaming.epoch_batches_factory(
        data, settings.stream, tokenizer, settings.max_tokens, settings.seed, rank, world_size
    )


def rows(examples) -> list[tuple]:
    return sorted((tuple(e["input_ids"]), tuple(e["labels"])) for e in examples)


def test_one_pass_of_the_stream_over_two_processes_yields_the_prepared_pairs_once(stream_settings):
    corpus = prepare.load_or_prepare(stream_settings.data)
    prepared = rows({"input_ids": s, "labels": t} for s, t in zip(*corpus.splits["train"][:].values(), strict=True))
    tokenizer = streaming.load_or_train_tokenizer(stream_settings.data, 7)
    shares = []
    for rank in (0, 1):
        batches = list(batches_of(stream_settings, tokenizer, rank, 2)(0))
        for batch in batches:
            assert len(batch) * max(max(len(e["input_ids"]), len(e["labels"])) for e in batch) <= 200
        shares.append(rows(example for batch in batches for example in batch))
    assert 0 < len(shares[0]) < len(prepared) and len(shares[0]) + len(shares[1]) == len(prepared) == 60
    assert sorted(shares[0] + shares[1]) == prepared  # the empty and the over-long pair filtered, as when prepared


def test_streaming_resume_replays_the_epoch_to_the_same_batches(stream_settings):
    tokenizer = streaming.load_or_train_tokenizer(stream_settings.data, 7)
    epoch_batches = batches_of(stream_settings, tokenizer, 0, 1)
    collator = TranslationCollator(tokenizer.pad_token_id)
    straight = list(islice(streaming.streaming_step_batches(epoch_batches, collator, 2, DataPosition()), 12))
    assert straight[-1][1].epoch >= 2  # crosses epochs
    first_epoch = [b["input_ids"].tolist() for batches, p in straight if p.epoch == 0 for b in batches]
    second_epoch = [b["input_ids"].tolist() for batches, p in straight if p.epoch == 1 for b in batches]
    assert first_epoch != second_epoch  # reshuffled every epoch
    for cut in (1, 4):
        rest = straight[cut + 1 :]
        resumed = streaming.streaming_step_batches(epoch_batches, collator, 2, straight[cut][1])
        resumed = list(islice(resumed, len(rest)))
        assert [position for _, position in resumed] == [position for _, position in rest]  # as many, where expected
        for (expected, _), (batches, _) in zip(rest, resumed, strict=True):
            assert all(a["labels"].equal(b["labels"]) for a, b in zip(expected, batches, strict=True))


def test_streaming_tokenizer_is_trained_once_on_the_stream_and_cached(corpus_dir, tmp_path):
    settings = corpus_settings(corpus_dir, tmp_path / "cache", *STREAM, "--tokenizer_train_pairs", "30")
    tokenizer = streaming.load_or_train_tokenizer(settings.data, settings.stream.shuffle_buffer_size)
    assert len(tokenizer) == 300
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [next((tmp_path / "cache").iterdir()).name]
    assert streaming.load_or_train_tokenizer(settings.data, 7).get_vocab() == tokenizer.get_vocab()


@pytest.mark.slow
def test_two_processes_stream_for_equal_steps_across_uneven_epochs(corpus_dir, tmp_path):
    output_dir = tmp_path / "run"
    splits = ["--data_dir", str(corpus_dir), "--validation_split", "val", "--test_split", "none"]
    steps = "--max_tokens 300 --max_steps 7 --save_steps 7 --average_last 1".split()
    train(output_dir, *splits, *STREAM, *steps, "--data_cache_dir", str(tmp_path / "cache"), processes=2)
    results = json.loads((output_dir / "results.json").read_text())
    assert results["steps"] == 7 and results["processes"] == 2
    assert set(results["results"]) == {"validation"}
    steps = [json.loads(line)["step"] for line in (output_dir / "train_log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 8))


def test_hub_datasets_stream_through_their_translation_column(monkeypatch, tmp_path):
    import datasets

    rows = {
        "translation": [{"en": s, "de": t} for s, t in zip(SOURCES, TARGETS, strict=True)] + [{"en": "", "de": "x"}]
    }
    opened = []

    def load_dataset(name, config, split, streaming):
        opened.append((name, config, split, streaming))
        return datasets.Dataset.from_dict(rows).to_iterable_dataset(num_shards=2)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    corpus = parse_training_arguments(
        ["--dataset_name", "wmt14", "--dataset_config", "de-en", "--streaming"]
    ).data.corpus
    pairs = [(pair["source"], pair["target"]) for pair in streaming.raw_stream(corpus)]
    assert opened == [("wmt14", "de-en", "train", True)]
    assert sorted(pairs) == sorted(zip(SOURCES, TARGETS, strict=True))  # the empty side dropped
    shares = [list(streaming.shuffled_shard(streaming.raw_stream(corpus), 0, 10, rank, 2)) for rank in (0, 1)]
    assert sorted(p["source"] for share in shares for p in share) == sorted(SOURCES)  # one shard each


def test_a_length_filter_that_drops_every_streamed_pair_is_refused_naming_the_flags():
    tokenizer = train_shared_tokenizer(SOURCES + TARGETS, 300)
    pairs = ({"source": source, "target": target} for source, target in zip(SOURCES, TARGETS, strict=True))
    filters = LengthFilter(max_sentence_tokens=2, max_length_ratio=1.5)
    expected = (
        r"this process's share of the stream: the length filter dropped all 60 training pairs \(60 longer than "
        r"--max_sentence_tokens 2, 0 over --max_length_ratio 1.5; .*\): raise --max_sentence_tokens or --max_length_ratio"
    )
    with pytest.raises(DataError, match=expected):
        list(streaming.tokenized_examples(pairs, tokenizer, filters))


def test_a_tokenizer_save_cut_by_a_full_disk_leaves_no_cached_tokenizer(tmp_path, monkeypatch):
    tokenizer = train_shared_tokenizer([*SOURCES, *TARGETS], vocab_size=300)
    saving = type(tokenizer).save_pretrained

    def fill_the_disk(self, folder, **kwargs):
        saving(self, folder, **kwargs)
        (Path(folder) / "tokenizer.json").write_text('{"version": "1.0", "trunc')
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(type(tokenizer), "save_pretrained", fill_the_disk)
    with pytest.raises(DataError, match=r"no space left on device while writing \S*tokenizer-0123 \(.*free space"):
        streaming.save_into_place(tokenizer, tmp_path / "tokenizer-0123")
    assert list(tmp_path.iterdir()) == []  # nothing a later run would take for a trained tokenizer
