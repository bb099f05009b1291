"""The prepared-corpus data path: Arrow files, the shared tokenizer's sample, the cache key, token views."""

import argparse
import errno
import os
import socket
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
from transformers import AutoTokenizer

from vanilla_transformer.commands import prepare as prepare_command
from vanilla_transformer.commands.arguments import add_data_arguments, data_settings
from vanilla_transformer.data import prepare
from vanilla_transformer.data.batching import DataPosition, TokenBatchSampler, TokenizedPairs, TranslationCollator
from vanilla_transformer.data.readers import DataError
from vanilla_transformer.data.settings import DataSettings
from vanilla_transformer.data.tokenization import train_shared_tokenizer
from vanilla_transformer.training.steps import optimizer_step_batches

from .helpers import SOURCES, TARGETS, prepared_folder


def parse(*argv: str) -> DataSettings:
    """The data settings the prepare command's flags describe."""
    parser = argparse.ArgumentParser()
    add_data_arguments(parser)
    return data_settings(parser, parser.parse_args(list(argv)))


def corpus_settings(corpus_dir, cache_dir, *extra: str) -> DataSettings:
    options = "--validation_split val --vocab_size 300 --max_sentence_tokens 40".split()
    return parse("--data_dir", str(corpus_dir), *options, "--data_cache_dir", str(cache_dir), *extra)


def test_prepared_corpus_equals_the_tokenizer_applied_to_the_files(corpus_dir, tmp_path):
    corpus = prepare.load_or_prepare(corpus_settings(corpus_dir, tmp_path / "cache"))

    tokenizer = corpus.tokenizer
    pairs = list(zip(SOURCES, TARGETS, strict=True))
    pairs.insert(30, (" ".join(["word"] * 80), "kurz"))  # the tokenizer is trained before the length filter
    expected = train_shared_tokenizer([text for pair in pairs for text in pair], 300)
    assert tokenizer.get_vocab() == expected.get_vocab()  # all pairs, in order: the sample is the whole corpus
    train = corpus.splits["train"]
    assert train.column_names == ["input_ids", "labels"]
    assert train["input_ids"] == tokenizer(SOURCES)["input_ids"]  # the empty and the over-long pair are dropped
    assert train["labels"] == tokenizer(TARGETS)["input_ids"]
    report = corpus.manifest["reports"]["train"]
    assert (report["kept"], report["empty_dropped"], report["too_long_dropped"]) == (60, 1, 1)
    assert "dropped 1 with an empty side, 1 too long" in corpus.summary()[0]
    validation_report = corpus.manifest["reports"]["validation"]
    assert validation_report["too_long_dropped"] is None  # evaluation splits are never filtered by length
    assert corpus.summary()[1].endswith("kept 2 pairs; dropped 0 with an empty side")
    # evaluation splits keep every pair (the references), with their text
    validation = corpus.splits["validation"]
    assert validation["target"] == ["kurz", "ter roder hunt slafet"]
    assert validation["input_ids"][1] == tokenizer("the red dog sleeps")["input_ids"]
    assert "test" not in corpus.splits


def test_length_ratio_filter_counts_what_it_drops():
    settings = parse("--max_sentence_tokens", "10", "--max_length_ratio", "2")
    report = prepare.DataReport()
    keep = settings.filters.keep(np.array([3, 11, 2, 4, 1]), np.array([3, 2, 5, 8, 2]), report)
    assert keep.tolist() == [True, False, False, True, True]
    assert (report.kept, report.too_long_dropped, report.ratio_dropped) == (3, 1, 1)


def test_cache_is_reused_and_any_change_of_data_tokenizer_or_filters_prepares_anew(corpus_dir, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    prepared = []
    original = prepare.prepare_corpus
    monkeypatch.setattr(prepare, "prepare_corpus", lambda *a, **k: prepared.append(a[2]) or original(*a, **k))

    first = prepare.load_or_prepare(corpus_settings(corpus_dir, cache))
    again = prepare.load_or_prepare(corpus_settings(corpus_dir, cache))
    assert len(prepared) == 1 and again.folder == first.folder  # the second launch tokenizes nothing
    assert again.splits["train"]["input_ids"] == first.splits["train"]["input_ids"]

    folders = {first.folder}
    for extra in (
        ["--vocab_size", "320"],
        ["--max_sentence_tokens", "30"],
        ["--max_length_ratio", "3"],
        ["--tokenizer_train_pairs", "20"],
        ["--data_seed", "1"],
    ):
        folders.add(prepare.load_or_prepare(corpus_settings(corpus_dir, cache, *extra)).folder)
    with (corpus_dir / "val.de").open("a") as file:  # same name, new content
        file.write("")
    os.utime(corpus_dir / "val.de", ns=(1, 1))
    folders.add(prepare.load_or_prepare(corpus_settings(corpus_dir, cache)).folder)
    assert len(folders) == len(prepared) == 7
    # a given tokenizer is part of the key too: another experiment with the same tokenizer reuses the corpus
    first.tokenizer.save_pretrained(tmp_path / "tokenizer")
    given = corpus_settings(corpus_dir, cache, "--tokenizer_name_or_path", str(tmp_path / "tokenizer"))
    assert prepare.load_or_prepare(given).folder == prepare.load_or_prepare(given).folder not in folders
    assert len(prepared) == 8
    assert not [path for path in cache.iterdir() if path.name.startswith(".incomplete")]


def test_tokenizer_sample_is_seeded_bounded_and_whole_when_small(tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "WRITE_CHUNK_PAIRS", 7)  # several record batches
    path = tmp_path / "pairs.arrow"
    assert prepare.write_pairs_arrow(zip(SOURCES, TARGETS, strict=True), path) == 60
    sample = list(prepare.sample_texts(path, 60, 10, seed=0))
    assert len(sample) == 20 and len(set(sample)) == 20
    pairs = set(zip(sample[::2], sample[1::2], strict=True))
    assert pairs <= set(zip(SOURCES, TARGETS, strict=True))
    assert sample == list(prepare.sample_texts(path, 60, 10, seed=0))
    assert sample != list(prepare.sample_texts(path, 60, 10, seed=1))
    whole = list(prepare.sample_texts(path, 60, 1000, seed=0))
    assert whole == [text for pair in zip(SOURCES, TARGETS, strict=True) for text in pair]


def test_bad_data_is_named_when_preparing(tmp_path):
    (tmp_path / "train.en").write_text("a\nb\n")
    (tmp_path / "train.de").write_text("x\n")
    with pytest.raises(DataError, match=r"train\.en has 2 lines but .*train\.de has 1"):
        prepare.load_or_prepare(parse("--data_dir", str(tmp_path), "--data_cache_dir", str(tmp_path / "cache")))
    (tmp_path / "train.de").write_text("\n\n")
    with pytest.raises(DataError, match="no translation pairs"):
        prepare.load_or_prepare(parse("--data_dir", str(tmp_path), "--data_cache_dir", str(tmp_path / "cache")))
    with pytest.raises(DataError, match=r"No file train\.fr"):
        prepare.load_or_prepare(parse("--data_dir", str(tmp_path), "--target_lang", "fr"))
    assert [path.name for path in (tmp_path / "cache").iterdir()] == []  # nothing half-written is left


def test_prepare_command_writes_a_folder_once_and_never_over_an_existing_one(corpus_dir, tmp_path, capsys):
    output = tmp_path / "prepared"
    folders = ["--data_dir", str(corpus_dir), "--output_dir", str(output)]
    argv = [*folders, "--validation_split", "val", "--vocab_size", "300"]
    prepare_command.main(argv)
    corpus = prepare.load_prepared(output)
    assert set(corpus.splits) == {"train", "validation"} and len(corpus.splits["train"]) == 61
    assert prepare_command.main(argv) == 1
    assert f"error: {output} is not new or empty: it holds manifest.json" in capsys.readouterr().err
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(SystemExit) as refused:
        prepare_command.main([*argv, "--output_dir", str(tmp_path / "file.txt" / "sub")])
    assert refused.value.code == 2
    assert f"{tmp_path / 'file.txt'} is a file, not a folder" in capsys.readouterr().err
    assert prepare.load_prepared(output).splits["train"]["labels"] == corpus.splits["train"]["labels"]


def damage(folder: Path, how: str) -> str:
    """Damage a prepared folder as disks and people do; returns what the error must name."""
    shard = next((folder / "train").glob("*.arrow"))
    if how == "manifest lost":
        (folder / prepare.MANIFEST).unlink()
        return "no manifest.json"
    if how == "manifest invalid":
        (folder / prepare.MANIFEST).write_text('{"key": ')
        return "manifest.json cannot be read (JSONDecodeError"
    if how == "shard truncated":
        shard.write_bytes(shard.read_bytes()[:1000])
        return f"{shard} has 1000 bytes"
    content = bytearray(shard.read_bytes())  # "shard edited": one byte of the token ids, at the same size
    content[-200] ^= 0xFF
    shard.write_bytes(bytes(content))
    return f"{shard} does not match the sha256"


DAMAGES = ["manifest lost", "manifest invalid", "shard truncated", "shard edited"]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_cached_corpus_is_named_and_prepared_again(corpus_dir, tmp_path, how, capsys):
    settings = corpus_settings(corpus_dir, tmp_path / "cache")
    first = prepare.load_or_prepare(settings)
    expected = [list(ids) for ids in first.splits["train"]["input_ids"]]  # read now: the files get damaged
    says = damage(first.folder, how)
    del first
    again = prepare.load_or_prepare(settings)
    printed = capsys.readouterr().out
    assert f"the cached corpus {again.folder} is damaged" in printed and says in printed
    assert [list(ids) for ids in again.splits["train"]["input_ids"]] == expected
    assert prepare.prepared_problem(again.folder) is None
    assert [path.name for path in (tmp_path / "cache").iterdir()] == [again.folder.name]  # nothing left aside


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_prepared_folder_is_a_named_error(corpus_dir, tmp_path, how, capsys):
    output = prepared_folder(corpus_dir, tmp_path / "prepared")
    says = damage(output, how)
    with pytest.raises(DataError) as refused:
        prepare.load_or_prepare(DataSettings(prepared_data=str(output)))
    assert says in str(refused.value) and str(output) in str(refused.value)
    assert output.is_dir()  # a user's folder is named, never deleted


def test_a_second_preparation_into_a_folder_finished_meanwhile_uses_it_only_if_it_is_the_same_corpus(
    corpus_dir, tmp_path
):
    folder = tmp_path / "prepared"
    settings = corpus_settings(corpus_dir, tmp_path / "cache")
    sources = prepare.split_sources(settings.corpus)
    prepare.prepare_corpus(settings, sources, folder, prepare.corpus_key(settings, sources))
    before = digests(folder)
    # another command started before the folder existed, and finishes after: the same corpus is fine
    messages = []
    prepare.prepare_corpus(settings, sources, folder, prepare.corpus_key(settings, sources), log=messages.append)
    assert any("prepared meanwhile by another process, from the same data and settings" in m for m in messages)
    other = corpus_settings(corpus_dir, tmp_path / "cache", "--vocab_size", "320")
    with pytest.raises(
        DataError, match="filled by another preparation while this one ran, with another corpus .*tokenizer"
    ):
        prepare.prepare_corpus(other, sources, folder, prepare.corpus_key(other, sources))
    assert digests(folder) == before  # the first one's corpus, untouched
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(".incomplete")]


def digests(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.slow
def test_staging_folders_of_killed_preparations_are_removed_and_live_ones_kept(corpus_dir, tmp_path):
    folder = tmp_path / "prepared"
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = tmp_path / f".incomplete-prepared-{host}-{dead.pid}-0123abcd"
    live = tmp_path / f".incomplete-prepared-{host}-{os.getpid()}-4567ef01"
    elsewhere = tmp_path / ".incomplete-prepared-another-host-12345-89abcdef"
    for path in (killed, live, elsewhere):
        (path / "raw").mkdir(parents=True)
    messages = []
    settings = corpus_settings(corpus_dir, tmp_path / "cache")
    sources = prepare.split_sources(settings.corpus)
    prepare.prepare_corpus(settings, sources, folder, prepare.corpus_key(settings, sources), log=messages.append)
    assert not killed.exists() and live.exists() and elsewhere.exists()
    assert any(f"removed {killed}" in message for message in messages)


def test_tokenized_pairs_reads_rows_and_lengths_across_arrow_chunks():
    parts = [
        datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4]], "labels": [[5], [6, 7]]}),
        datasets.Dataset.from_dict({"input_ids": [[8, 9], [10, 11, 12, 13]], "labels": [[14, 15, 16], [2]]}),
    ]
    dataset = datasets.concatenate_datasets(parts)
    assert dataset.data.table.column("input_ids").num_chunks == 2
    for view in (dataset, dataset.select([3, 0, 2])):  # a selection (an indices mapping) is flattened
        pairs = TokenizedPairs(view)
        assert len(pairs) == len(view)
        assert [pairs[i]["input_ids"].tolist() for i in range(len(pairs))] == view["input_ids"]
        assert [pairs[i]["labels"].tolist() for i in range(len(pairs))] == view["labels"]
        assert pairs.source_lengths.tolist() == [len(ids) for ids in view["input_ids"]]
        assert pairs.target_lengths.tolist() == [len(ids) for ids in view["labels"]]
    assert pairs[-1]["input_ids"].tolist() == [8, 9]


def test_the_content_fingerprint_of_tokenized_pairs_ignores_arrow_chunks_and_sees_their_order_and_ids():
    rows = {"input_ids": [[1, 2, 3], [4], [8, 9], [10, 11, 12, 13]], "labels": [[5], [6, 7], [14, 15, 16], [2]]}
    halves = [datasets.Dataset.from_dict({name: ids[a:b] for name, ids in rows.items()}) for a, b in ((0, 2), (2, 4))]
    chunked = TokenizedPairs(datasets.concatenate_datasets(halves))  # as a preparation with two workers writes it
    whole = TokenizedPairs(datasets.Dataset.from_dict(rows))
    assert chunked.content_sha256() == whole.content_sha256()
    others = [
        {name: ids[::-1] for name, ids in rows.items()},  # the same pairs in another order
        {**rows, "labels": [[5], [6, 7], [14, 15, 16], [3]]},  # one token id changed
        {**rows, "input_ids": [[1, 2], [3, 4], [8, 9], [10, 11, 12, 13]]},  # the same ids, cut otherwise
    ]
    for other in others:
        assert TokenizedPairs(datasets.Dataset.from_dict(other)).content_sha256() != whole.content_sha256()


def test_training_batches_from_a_prepared_split_equal_those_from_python_lists(corpus_dir, tmp_path):
    train = prepare.load_or_prepare(corpus_settings(corpus_dir, tmp_path / "cache")).splits["train"]
    as_lists = [{"input_ids": s, "labels": t} for s, t in zip(train["input_ids"], train["labels"], strict=True)]
    pairs = TokenizedPairs(train)
    sampler = TokenBatchSampler(pairs.source_lengths, pairs.target_lengths, max_tokens=120, seed=1)
    collator = TranslationCollator(pad_token_id=0)
    mapped = list(optimizer_step_batches(sampler, collator, pairs, 2, DataPosition(), max_epochs=2))
    listed = list(optimizer_step_batches(sampler, collator, as_lists, 2, DataPosition(), max_epochs=2))
    assert len(mapped) == len(listed) > 2
    for (a, position_a), (b, position_b) in zip(mapped, listed, strict=True):
        assert position_a == position_b
        for batch_a, batch_b in zip(a, b, strict=True):
            assert batch_a.keys() == batch_b.keys()
            assert all(batch_a[name].equal(batch_b[name]) for name in batch_a)


def test_the_readers_repairs_are_counted_in_the_prepared_manifest(tmp_path):
    folder = tmp_path / "crlf"
    folder.mkdir()
    (folder / "train.en").write_bytes(b"\xef\xbb\xbf" + "".join(f"{s}\r\n" for s in SOURCES).encode())
    (folder / "train.de").write_bytes("".join(f"{t}\r\n" for t in TARGETS).encode())
    prepare_command.main(
        ["--data_dir", str(folder), "--vocab_size", "300", "--output_dir", str(tmp_path / "prepared")]
    )
    report = prepare.load_prepared(tmp_path / "prepared").manifest["reports"]["train"]
    assert report["crlf_line_endings"] == 2 * len(SOURCES) and report["byte_order_marks"] == 1


def test_the_tokenizer_fingerprint_ignores_padding_settings_but_not_the_vocabulary(tmp_path):
    # Calling a tokenizer with padding=True switches padding on in its backend, and save_pretrained writes that into
    # tokenizer.json: a model folder re-saved after use must still match the corpus its tokenizer prepared.
    lines = ["a small house by the river", "ein kleines haus am fluss", "the dog runs", "der hund rennt"] * 5
    tokenizer = train_shared_tokenizer(lines, vocab_size=280)
    fingerprint = prepare.tokenizer_fingerprint(tokenizer)
    tokenizer(["a small house", "the dog"], padding=True, truncation=True, max_length=3)
    tokenizer.save_pretrained(tmp_path)
    assert '"padding": {' in (tmp_path / "tokenizer.json").read_text()
    assert prepare.tokenizer_fingerprint(AutoTokenizer.from_pretrained(tmp_path)) == fingerprint
    assert prepare.tokenizer_fingerprint(train_shared_tokenizer(lines, vocab_size=270)) != fingerprint


def test_a_full_disk_while_preparing_is_one_data_error_and_leaves_nothing_half_prepared(
    corpus_dir, tmp_path, monkeypatch
):
    def fill_the_disk(self, path, **kwargs):
        Path(path).mkdir(parents=True)
        (Path(path) / "data-00000-of-00001.arrow").write_bytes(b"cut")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", fill_the_disk)
    settings = corpus_settings(corpus_dir, tmp_path / "cache")
    with pytest.raises(DataError, match=r"no space left on device while writing .*free space on that disk"):
        prepare.load_or_prepare(settings)
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_length_filter_that_drops_every_training_pair_is_refused_when_preparing_naming_the_flag(
    corpus_dir, tmp_path
):
    settings = corpus_settings(corpus_dir, tmp_path / "cache", "--max_sentence_tokens", "2")
    expected = (
        r"dropped all 61 training pairs \(61 longer than --max_sentence_tokens 2; .*\): raise --max_sentence_tokens"
    )
    with pytest.raises(DataError, match=expected):
        prepare.load_or_prepare(settings)
    assert list((tmp_path / "cache").iterdir()) == []  # nothing prepared, nothing half-prepared


def test_an_output_dir_inside_the_data_dir_is_refused_and_nothing_is_written(corpus_dir, capsys):
    before = sorted(path.name for path in corpus_dir.iterdir())
    argv = ["--data_dir", str(corpus_dir), "--validation_split", "val", "--output_dir", str(corpus_dir / "prepared")]
    assert prepare_command.main(argv) == 1
    assert f"is inside --data_dir {corpus_dir}: write to a folder of its own" in capsys.readouterr().err
    assert sorted(path.name for path in corpus_dir.iterdir()) == before
