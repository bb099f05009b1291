import gzip
import json
from pathlib import Path

import datasets
import pytest

from vanilla_transformer.data.readers import (
    DataError,
    load_hub_dataset,
    read_jsonl,
    read_parallel_text,
    read_tsv,
    split_pairs,
)


def write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


# Parallel text


def test_read_parallel_text_strips_and_drops_empty_pairs(tmp_path):
    source = write(tmp_path / "train.en", "Hello world.\n  \nGood morning!  \r\nOnly source\n")
    target = write(tmp_path / "train.de", "Hallo Welt.\nLeer\nGuten Morgen!\n\n")

    pairs, report = read_parallel_text(source, target)

    assert pairs == [("Hello world.", "Hallo Welt."), ("Good morning!", "Guten Morgen!")]
    assert (report.kept, report.empty_dropped) == (2, 2)
    assert "train.en" in report.summary() and "kept 2" in report.summary()


def test_a_report_without_a_length_filter_says_nothing_about_lengths(tmp_path):
    pairs, report = read_parallel_text(write(tmp_path / "s.txt", "a\n\nb\n"), write(tmp_path / "t.txt", "x\ny\nz\n"))

    assert (report.too_long_dropped, report.ratio_dropped) == (None, None)  # no reader filters by length
    assert report.summary().endswith("kept 2 pairs; dropped 1 with an empty side")


def test_read_parallel_text_reads_gzip(tmp_path):
    source, target = tmp_path / "a.en.gz", tmp_path / "a.de.gz"
    source.write_bytes(gzip.compress("Straße\nÜbung\n".encode()))
    target.write_bytes(gzip.compress(b"street\nexercise\n"))

    pairs, _ = read_parallel_text(source, target)

    assert pairs == [("Straße", "street"), ("Übung", "exercise")]


def test_only_newline_ends_a_line(tmp_path):
    source = write(tmp_path / "s.txt", "one\u2028still one\x0cand one\nTwo\n")
    target = write(tmp_path / "t.txt", "eins\nzwei\n")

    pairs, _ = read_parallel_text(source, target)

    assert pairs == [("one\u2028still one\x0cand one", "eins"), ("Two", "zwei")]


def test_different_line_counts_name_both_files_and_counts(tmp_path):
    source = write(tmp_path / "s.txt", "a\nb\nc\nd\n")
    target = write(tmp_path / "t.txt", "a\nb\n")

    with pytest.raises(DataError, match=r"s\.txt has 4 lines but .*t\.txt has 2"):
        read_parallel_text(source, target)
    with pytest.raises(DataError, match=r"t\.txt has 2 lines but .*s\.txt has 4"):
        read_parallel_text(target, source)


def test_missing_file_is_named(tmp_path):
    source = write(tmp_path / "s.txt", "a\n")
    with pytest.raises(DataError, match=r"missing\.txt: file not found"):
        read_parallel_text(source, tmp_path / "missing.txt")


def test_invalid_utf8_names_file_and_line(tmp_path):
    source = write(tmp_path / "s.txt", "a\nb\nc\n")
    target = tmp_path / "t.txt"
    target.write_bytes(b"a\nb\n\xff\xfe broken\n")
    with pytest.raises(DataError, match=r"t\.txt:3: invalid UTF-8"):
        read_parallel_text(source, target)


def test_no_pairs_at_all_is_an_error(tmp_path):
    source = write(tmp_path / "s.txt", "\n\n")
    target = write(tmp_path / "t.txt", "x\n\n")
    with pytest.raises(DataError, match="no translation pairs"):
        read_parallel_text(source, target)


# TSV and JSON lines


def test_read_tsv_takes_source_and_target_from_the_first_two_columns(tmp_path):
    path = write(tmp_path / "data.tsv", "Hello\tHallo\tid1\n\n \tJa\tid2\nNo\tNein\tid3\n")

    pairs, report = read_tsv(path)

    assert pairs == [("Hello", "Hallo"), ("No", "Nein")]
    assert report.empty_dropped == 2


def test_read_tsv_too_few_columns_names_line(tmp_path):
    path = write(tmp_path / "data.tsv", "a\tb\nonly one column\n")
    with pytest.raises(DataError, match=r"data\.tsv:2: found 1 tab-separated columns, need at least 2"):
        read_tsv(path)


def test_read_jsonl_accepts_both_layouts(tmp_path):
    lines = [
        {"translation": {"en": "Hello", "de": "Hallo"}},
        {"en": "Yes", "de": "Ja"},
        {"en": "", "de": "Leer"},
    ]
    path = write(tmp_path / "data.jsonl", "\n".join(json.dumps(line, ensure_ascii=False) for line in lines) + "\n\n")

    pairs, report = read_jsonl(path, source_lang="en", target_lang="de")

    assert pairs == [("Hello", "Hallo"), ("Yes", "Ja")]
    assert report.empty_dropped == 2


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"en": "Hello", "de": ', r"data\.jsonl:2: invalid JSON"),
        ('{"en": "Hello", "fr": "Bonjour"}', r"data\.jsonl:2: no 'de' key"),
        ('{"translation": {"de": "Hallo"}}', r"data\.jsonl:2: no 'en' key"),
        ('["Hello", "Hallo"]', r"data\.jsonl:2: expected a JSON object"),
        ('{"en": "Hello", "de": 3}', r"data\.jsonl:2: 'de' is not a string"),
        ('{"en": null, "de": "Hallo"}', r"data\.jsonl:2: 'en' is not a string"),
        ('{"en": ["Hello"], "de": "Hallo"}', r"data\.jsonl:2: 'en' is not a string"),
        ('{"translation": "Hello"}', r"data\.jsonl:2: no 'en' key"),
        ("3", r"data\.jsonl:2: expected a JSON object, got int"),
        ('"Hello"', r"data\.jsonl:2: expected a JSON object, got str"),
        ("null", r"data\.jsonl:2: expected a JSON object, got NoneType"),
    ],
)
def test_read_jsonl_errors_name_line(tmp_path, line, message):
    path = write(tmp_path / "data.jsonl", '{"en": "a", "de": "b"}\n' + line + "\n")
    with pytest.raises(DataError, match=message):
        read_jsonl(path, source_lang="en", target_lang="de")


# Malformed lines, in every format: an error naming file:line, or a repair counted in the report

PAIRS = [("Hello", "Hallo"), ("Good morning", "Guten Morgen"), ("Yes", "Ja")]
KINDS = ["parallel", "parallel.gz", "tsv", "tsv.gz", "jsonl", "jsonl.gz"]


def data_line(kind: str, source: str, target: str) -> str:
    """One line of a `kind` file holding the pair; for parallel text, the source side (line i of data.parallel)."""
    if kind.startswith("tsv"):
        return f"{source}\t{target}"
    if kind.startswith("jsonl"):
        return json.dumps({"en": source, "de": target}, ensure_ascii=False)
    return source


def lines_of(kind: str, pairs=PAIRS, ending: str = "\n") -> bytes:
    return "".join(data_line(kind, source, target) + ending for source, target in pairs).encode("utf-8")


def read_kind(tmp_path: Path, kind: str, content: bytes, targets=PAIRS):
    """Read `content` as a data.<kind> file (gzipped for .gz kinds); parallel text gets a clean target file."""
    path = tmp_path / f"data.{kind}"
    path.write_bytes(gzip.compress(content) if kind.endswith(".gz") else content)
    if kind.startswith("tsv"):
        return read_tsv(path)
    if kind.startswith("jsonl"):
        return read_jsonl(path, source_lang="en", target_lang="de")
    return read_parallel_text(path, write(tmp_path / "target.de", "".join(target + "\n" for _, target in targets)))


@pytest.mark.parametrize("kind", KINDS)
def test_crlf_line_endings_are_stripped_and_counted(tmp_path, kind):
    pairs, report = read_kind(tmp_path, kind, lines_of(kind, ending="\r\n"))
    assert pairs == PAIRS
    assert report.crlf_line_endings == len(PAIRS)
    assert f"stripped {len(PAIRS)} CRLF line endings" in report.summary()


@pytest.mark.parametrize("kind", KINDS)
def test_a_missing_final_newline_loses_no_line(tmp_path, kind):
    pairs, _ = read_kind(tmp_path, kind, lines_of(kind).removesuffix(b"\n"))
    assert pairs == PAIRS


@pytest.mark.parametrize("kind", KINDS)
def test_a_utf8_byte_order_mark_is_stripped_and_counted(tmp_path, kind):
    pairs, report = read_kind(tmp_path, kind, "\ufeff".encode() + lines_of(kind))
    assert pairs == PAIRS
    assert report.byte_order_marks == 1
    assert "stripped 1 byte-order mark" in report.summary()


@pytest.mark.parametrize("kind", ["tsv", "jsonl.gz"])
def test_a_final_empty_line_is_an_empty_pair_dropped_and_counted(tmp_path, kind):
    pairs, report = read_kind(tmp_path, kind, lines_of(kind) + b"\n")
    assert pairs == PAIRS
    assert report.empty_dropped == 1


def test_a_final_empty_line_in_one_parallel_file_only_is_a_line_count_error(tmp_path):
    with pytest.raises(DataError, match=r"data\.parallel has 4 lines but .*target\.de has 3"):
        read_kind(tmp_path, "parallel", lines_of("parallel") + b"\n")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("content", "line"),
    [
        (lambda kind: lines_of(kind).replace(b"morning", b"mor\rning"), 2),  # a lone CR inside a line
        (lambda kind: lines_of(kind, ending="\r"), 1),  # old Mac line endings: the whole file is one line
    ],
    ids=["lone CR", "CR line endings"],
)
def test_a_carriage_return_inside_a_line_is_an_error_naming_the_line(tmp_path, kind, content, line):
    with pytest.raises(DataError, match=rf"data\.{kind}:{line}: a carriage return \(\\r\) inside the line"):
        read_kind(tmp_path, kind, content(kind))


@pytest.mark.parametrize("kind", KINDS)
def test_invalid_utf8_is_an_error_naming_file_and_line(tmp_path, kind):
    with pytest.raises(DataError, match=rf"data\.{kind}:3: invalid UTF-8"):
        read_kind(tmp_path, kind, lines_of(kind).replace(b"Yes", b"Y\xe9s"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("encoding", "line", "problem"),
    [("utf-16", 1, "a UTF-16 byte-order mark"), ("utf-16-le", 1, "a NUL byte"), ("utf-16-be", 1, "a NUL byte")],
)
def test_a_utf16_file_is_an_error_that_says_so(tmp_path, kind, encoding, line, problem):
    content = lines_of(kind).decode("utf-8").encode(encoding)
    with pytest.raises(DataError, match=rf"data\.{kind}:{line}: {problem}.*UTF-16"):
        read_kind(tmp_path, kind, content)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a\tb\nc\td\te\n", r"data\.tsv:2: found 3 tab-separated columns but line 1 has 2: a tab inside a field"),
        ("\nx\ty\tz\nc\td\n", r"data\.tsv:3: found 2 tab-separated columns but line 2 has 3"),
        ("a\tb\nonly one column\n", r"data\.tsv:2: found 1 tab-separated columns, need at least 2"),
    ],
    ids=["tab inside a field", "a missing column", "one column"],
)
def test_every_tsv_line_has_the_column_count_of_the_first(tmp_path, text, message):
    with pytest.raises(DataError, match=message):
        read_tsv(write(tmp_path / "data.tsv", text))


def test_json_strings_keep_their_escaped_tabs_and_newlines(tmp_path):
    path = write(tmp_path / "data.jsonl", json.dumps({"en": "a\tb\nc", "de": "x\\ty"}) + "\n")
    assert read_jsonl(path, source_lang="en", target_lang="de")[0] == [("a\tb\nc", "x\\ty")]


@pytest.mark.parametrize(
    "content",
    [b"plain text in a .gz file\n", gzip.compress(lines_of("tsv"))[:-12], gzip.compress(lines_of("tsv"))[:30]],
    ids=["not gzip", "no end marker", "truncated"],
)
def test_a_broken_gzip_file_is_an_error_naming_it(tmp_path, content):
    path = tmp_path / "data.tsv.gz"
    path.write_bytes(content)
    with pytest.raises(DataError, match=r"data\.tsv\.gz:\d+: cannot decompress"):
        read_tsv(path)


# Hub


def test_load_hub_dataset_failure_suggests_local_files(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"could not load the dataset wmt14/de-en \[train\].*no network.*local files"):
        load_hub_dataset("wmt14", "de-en", "train", source_lang="en", target_lang="de")


def test_load_hub_dataset_reads_translation_column(monkeypatch):
    rows = {"translation": [{"de": "Hallo", "en": "Hello"}, {"de": "", "en": "Empty"}, {"de": "Ja", "en": "Yes"}]}
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: datasets.Dataset.from_dict(rows))

    pairs, report = load_hub_dataset("wmt14", "de-en", "train", source_lang="en", target_lang="de")

    assert pairs == [("Hello", "Hallo"), ("Yes", "Ja")]
    assert (report.kept, report.empty_dropped) == (2, 1)


# Splitting


def test_split_pairs_is_deterministic_and_complete():
    pairs = [(str(i), str(i)) for i in range(20)]

    train, valid, test = split_pairs(pairs, valid_size=3, test_size=2, seed=1)

    assert (len(train), len(valid), len(test)) == (15, 3, 2)
    assert sorted(train + valid + test) == sorted(pairs)
    assert split_pairs(pairs, valid_size=3, test_size=2, seed=1) == (train, valid, test)
    assert split_pairs(pairs, valid_size=3, test_size=2, seed=2) != (train, valid, test)
    with pytest.raises(ValueError, match="Cannot take 15 validation and 5 test pairs from 20 pairs and keep training"):
        split_pairs(pairs, valid_size=15, test_size=5)
