"""What `translate` reads and where it writes: an input that can be read only once, an input that changes while it is
read, the one output rule for a dataset's folder, the lock before --overwrite decides, the bounds on a line and a
dataset's cell, and the CTranslate2 export in the resume check."""

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vanilla_transformer.serving import corpus, corpus_folder

from .helpers import FAST, OFFLINE, ROOT, corpus_lines, stopped_run, translate, write_lines


def errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def reference(folder, tmp_path_factory) -> tuple[Path, bytes]:
    """40 lines and their translation by a plain run from a regular file (4 chunks of 10)."""
    root = tmp_path_factory.mktemp("reference")
    source = write_lines(root / "source.en", corpus_lines(40))
    result = translate(folder, "--input", source, "--output", root / "out.de", "--buffer_size", 10, *FAST)
    assert result.returncode == 0, result.stderr
    return source, (root / "out.de").read_bytes()


def command(folder, *argv) -> list[str]:
    return [sys.executable, "-m", "vanilla_transformer", "translate", str(folder), *map(str, argv), *FAST]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "dev-stdin"])
def test_an_input_that_can_be_read_only_once_is_read_once_and_translated_whole(folder, reference, tmp_path, kind):
    source, expected = reference
    output = tmp_path / "out.de"
    if kind == "fifo":
        fifo = tmp_path / "lines.fifo"
        os.mkfifo(fifo)
        writer = threading.Thread(target=lambda: fifo.write_bytes(source.read_bytes()), daemon=True)
        writer.start()
        argv, stdin = command(folder, "--input", fifo, "--output", output, "--buffer_size", 10), None
    else:
        argv = command(folder, "--input", "/dev/stdin", "--output", output, "--buffer_size", 10)
        stdin = source.read_bytes()
    env = {**os.environ, **OFFLINE}
    result = subprocess.run(argv, input=stdin, capture_output=True, cwd=ROOT, env=env, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert output.read_bytes() == expected


def change_the_input_after_the_first_chunk(monkeypatch, change) -> None:
    real, calls = corpus.pieces_of, []

    def changing(*args):
        if not calls:
            change()
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(corpus, "pieces_of", changing)


@pytest.mark.parametrize("change", ["truncated", "edited-in-place"])
def test_an_input_that_changes_while_it_is_read_is_an_error_naming_it_never_a_wait(
    folder, tmp_path, monkeypatch, change
):
    """A file larger than a read's buffer, changed after the first chunk was read: cut to half, or rewritten in place
    with other text of the same size (same inode, same size, same mtime granularity)."""
    lines = corpus_lines(2000)
    source, output = write_lines(tmp_path / "source.en", lines), tmp_path / "out.de"
    size = source.stat().st_size

    def cut():
        os.truncate(source, size // 2)

    def edit():
        with open(source, "r+b") as file:
            file.seek(size - 2000)
            file.write(b"x" * 1000)

    change_the_input_after_the_first_chunk(monkeypatch, cut if change == "truncated" else edit)
    result = translate(folder, "--input", source, "--output", output, "--buffer_size", 100, *FAST)
    assert result.returncode == 1
    assert f"error: the input {source} changed while this run read it" in result.stderr
    assert not output.exists()


@pytest.fixture
def dataset(tmp_path) -> Path:
    import datasets

    data = tmp_path / "data"
    data.mkdir()
    path = data / "rows.jsonl"
    datasets.Dataset.from_dict({"id": list(range(12)), "text": corpus_lines(12)}).to_json(str(path), lines=True)
    return path


def users_folder(path: Path) -> Path:
    path.mkdir()
    (path / "thesis.tex").write_text("years of work")
    (path / ".git").mkdir()
    return path


@pytest.mark.parametrize("where", ["a users folder", "the model folder", "the data files folder"])
def test_overwrite_never_replaces_a_folder_that_is_not_a_translated_dataset(folder, tmp_path, dataset, where):
    model = shutil.copytree(folder, tmp_path / "model")
    output = {"a users folder": tmp_path / "mine", "the model folder": model, "the data files folder": dataset.parent}
    output = output[where]
    if where == "a users folder":
        users_folder(output)
    before = sorted(path.relative_to(output) for path in output.rglob("*"))
    result = translate(model, "--data_files", dataset, "--column", "text", "--output", output, "--overwrite", *FAST)
    assert result.returncode == 1 and len(errors(result)) == 1, result.stderr
    assert str(output) in errors(result)[0]
    assert sorted(path.relative_to(output) for path in output.rglob("*")) == before


def test_a_translated_datasets_folder_is_replaced_with_overwrite(folder, tmp_path, dataset):
    import datasets

    output = tmp_path / "translated"
    argv = [folder, "--data_files", dataset, "--column", "text", "--output", output, *FAST]
    assert translate(*argv).returncode == 0
    refused = translate(*argv)
    assert refused.returncode == 1 and "--overwrite" in errors(refused)[0]
    again = translate(*argv, "--overwrite")
    assert again.returncode == 0, again.stderr
    assert datasets.load_from_disk(str(output))["id"] == list(range(12))


def test_an_output_inside_the_model_folder_is_refused_even_with_overwrite(folder, tmp_path, reference):
    model = shutil.copytree(folder, tmp_path / "model")
    weights = (model / "model.safetensors").read_bytes()
    source, _ = reference
    result = translate(model, "--input", source, "--output", model / "model.safetensors", "--overwrite", *FAST)
    assert result.returncode == 1 and "is inside the model folder" in errors(result)[0]
    assert (model / "model.safetensors").read_bytes() == weights


def test_overwrite_never_takes_over_an_output_that_another_run_is_writing(folder, reference, tmp_path, monkeypatch):
    source, _ = reference
    output = tmp_path / "out.de"
    stopped_run(folder, source, output, monkeypatch)
    chunks = sorted(path.name for path in Path(f"{output}.partial").iterdir())
    running = corpus_folder.PartialFolder(output)
    running.lock()  # another run, live
    try:
        result = translate(folder, "--input", source, "--output", output, "--buffer_size", 10, "--overwrite", *FAST)
    finally:
        running.unlock()
    assert result.returncode == 1 and "is being written by another command" in errors(result)[0]
    assert sorted(path.name for path in Path(f"{output}.partial").iterdir()) == chunks


def test_a_datasets_cell_over_max_line_bytes_is_refused_by_its_row(folder, tmp_path):
    import datasets

    rows = tmp_path / "rows.parquet"
    datasets.Dataset.from_dict({"text": ["a dog", "the red dog " * 1000, "a cat"]}).to_parquet(str(rows))
    argv = [folder, "--data_files", rows, "--column", "text", "--output", tmp_path / "o.jsonl", *FAST]
    result = translate(*argv, "--max_line_bytes", 5000)
    assert result.returncode == 1
    assert errors(result) == [
        f"error: row 1 of {rows}: --column text holds over 5,000 bytes: a unit is a sentence or a paragraph (split "
        "it, or raise --max_line_bytes)"
    ]


def test_max_line_bytes_is_bounded_by_what_a_line_costs_in_memory(folder):
    result = translate(folder, "--max_line_bytes", 30_000_000)
    assert result.returncode == 2
    assert "--max_line_bytes: must be at most 4,194,304 (a line takes about 200 times its size" in result.stderr


@pytest.fixture(scope="module")
def exports(folder, tmp_path_factory) -> tuple[Path, Path, Path]:
    """A copy of `folder`, its CTranslate2 export, and the export of another model with the same vocabulary."""
    pytest.importorskip("ctranslate2")
    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2

    from .helpers import CARD_VALUES, save_tiny_model_folder

    root = tmp_path_factory.mktemp("exports")
    model = shutil.copytree(folder, root / "model")
    other = save_tiny_model_folder(root / "other", CARD_VALUES, init_std=0.5)  # other weights
    return model, convert_to_ctranslate2(model, root / "ours"), convert_to_ctranslate2(other, root / "theirs")


def test_another_models_export_is_refused_on_a_fresh_run(exports, reference, tmp_path):
    model, _, theirs = exports
    source, _ = reference
    argv = [model, "--input", source, "--output", tmp_path / "o.de", "--backend", "ctranslate2", *FAST]
    result = translate(*argv, "--ctranslate2_dir", theirs)
    assert result.returncode == 1
    assert errors(result) == [
        f"error: --ctranslate2_dir {theirs} has other weights than {model}: give the export of MODEL_DIR, or leave "
        "--ctranslate2_dir out to have it made"
    ]


def test_a_run_resumed_with_another_export_is_refused(exports, reference, tmp_path, monkeypatch):
    """The export is a setting of the run: a resumed run given another one (even of the same weights, written
    again in another precision) is refused by name."""
    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2

    model, ours, _ = exports
    source, _ = reference
    output = tmp_path / "o.de"
    flags = ["--backend", "ctranslate2", "--ctranslate2_dir"]
    stopped_run(model, source, output, monkeypatch, *flags, ours)
    again = convert_to_ctranslate2(model, tmp_path / "again", quantization="int8")
    result = translate(model, "--input", source, "--output", output, "--buffer_size", 10, *FAST, *flags, again)
    assert result.returncode == 1 and "ctranslate2 was" in errors(result)[0], result.stderr


@pytest.mark.parametrize("where", ["nonexistent", "empty"])
def test_a_ctranslate2_dir_that_is_not_an_export_is_one_error_line(exports, reference, tmp_path, where):
    model, _, _ = exports
    source, _ = reference
    export = tmp_path / "export"
    if where == "empty":
        export.mkdir()
    argv = [model, "--input", source, "--backend", "ctranslate2", "--ctranslate2_dir", export, *FAST]
    result = translate(*argv)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert errors(result)[0].startswith(f"error: --ctranslate2_dir {export} is not a CTranslate2 export")


def test_an_error_before_the_first_chunk_leaves_no_partial_folder_and_the_fixed_rerun_runs(folder, tmp_path):
    source, output = tmp_path / "source.en", tmp_path / "out.de"
    source.write_bytes(b"a dog\n\xff\xfe\n")
    assert translate(folder, "--input", source, "--output", output, *FAST).returncode == 1
    assert not Path(f"{output}.partial").exists()
    write_lines(source, ["a dog", "a cat"])
    result = translate(folder, "--input", source, "--output", output, *FAST)
    assert result.returncode == 0, result.stderr


def test_a_partial_folder_holding_only_a_lock_is_ours(tmp_path):
    partial = tmp_path / "out.de.partial"
    partial.mkdir()
    (partial / "lock").write_bytes(b"")
    assert corpus_folder.PartialFolder(tmp_path / "out.de").is_ours()
    (partial / "notes.txt").write_text("mine")
    assert not corpus_folder.PartialFolder(tmp_path / "out.de").is_ours()


def test_a_file_put_at_output_after_a_run_stopped_is_replaced_only_with_overwrite(
    folder, reference, tmp_path, monkeypatch
):
    source, expected = reference
    output = tmp_path / "out.de"
    stopped_run(folder, source, output, monkeypatch)
    output.write_text("the user's file\n")
    argv = [folder, "--input", source, "--output", output, "--buffer_size", 10, *FAST]
    refused = translate(*argv)
    assert refused.returncode == 1 and f"--output {output} exists: add --overwrite" in errors(refused)[0]
    assert output.read_text() == "the user's file\n"
    assert translate(*argv, "--overwrite").returncode == 0 and output.read_bytes() == expected


def test_a_file_that_overwrite_allowed_when_the_run_began_is_replaced_when_it_resumes(
    folder, reference, tmp_path, monkeypatch
):
    source, expected = reference
    output = tmp_path / "out.de"
    output.write_text("a previous translation\n")
    stopped_run(folder, source, output, monkeypatch, "--overwrite")
    result = translate(folder, "--input", source, "--output", output, "--buffer_size", 10, *FAST)
    assert result.returncode == 0, result.stderr
    assert output.read_bytes() == expected


def test_a_dataset_with_a_translation_column_is_refused_before_it_is_replaced(folder, tmp_path):
    import datasets

    rows = tmp_path / "rows.parquet"
    datasets.Dataset.from_dict({"text": ["a dog"], "translation": ["ein Hund"]}).to_parquet(str(rows))
    result = translate(folder, "--data_files", rows, "--column", "text", "--output", tmp_path / "o.jsonl", *FAST)
    assert result.returncode == 1 and "has a column named 'translation'" in errors(result)[0]


def test_a_dataset_is_written_as_csv_by_its_suffix_and_another_suffix_is_refused(folder, tmp_path, dataset):
    import datasets

    argv = [folder, "--data_files", dataset, "--column", "text", *FAST]
    assert translate(*argv, "--output", tmp_path / "out.csv").returncode == 0
    rows = datasets.Dataset.from_csv(str(tmp_path / "out.csv"))
    assert rows["id"] == list(range(12)) and len(rows["translation"]) == 12
    refused = translate(*argv, "--output", tmp_path / "out.txt")
    assert refused.returncode == 1 and "a dataset is written as .parquet, .jsonl, .json, .csv" in errors(refused)[0]
    assert not (tmp_path / "out.txt").exists()


def test_a_broken_json_lines_row_is_named_by_its_file_and_line(folder, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a dog"}\n{"text": "a cat"}\n{"text": "a co\n', encoding="utf-8")
    result = translate(folder, "--data_files", rows, "--column", "text", "--output", tmp_path / "o.jsonl", *FAST)
    assert result.returncode == 1 and errors(result)[0].startswith(
        f"error: cannot read the dataset {rows}:3: not JSON"
    )


@pytest.mark.slow
def test_a_closed_stdout_is_one_error_line(folder, reference):
    source, _ = reference
    env = {**os.environ, **OFFLINE}
    result = subprocess.run(
        command(folder, "--input", source),
        capture_output=False,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
        preexec_fn=lambda: os.close(1),
        timeout=120,
        text=True,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "error: there is nowhere to write: stdout is closed" in result.stderr


def test_a_setting_given_with_the_folders_own_value_resumes(folder, tmp_path, monkeypatch):
    """The folder's generation_config.json has 4 beams: a run stopped without --num_beams resumes with --num_beams 4,
    as the same setting."""
    source, output = write_lines(tmp_path / "source.en", corpus_lines(20)), tmp_path / "out.de"
    flags = ["--max_new_tokens", "2", "--device", "cpu"]
    real, calls = corpus.pieces_of, []

    def stop_at_the_second_chunk(*args):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(corpus, "pieces_of", stop_at_the_second_chunk)
    argv = [folder, "--input", source, "--output", output, "--buffer_size", 10, *flags]
    assert translate(*argv).returncode == 130
    monkeypatch.setattr(corpus, "pieces_of", real)
    result = translate(*argv, "--num_beams", 4)
    assert result.returncode == 0, result.stderr
    assert "1 of 2 chunks resumed" in result.stderr


def test_both_backends_follow_the_folders_max_length(exports, tmp_path):
    """A converted OPUS-MT or FSMT folder sets max_length in generation_config.json: the CTranslate2 backend stops
    where the model backend does."""
    model, _, _ = exports
    limited = shutil.copytree(model, tmp_path / "limited")
    generation = json.loads((limited / "generation_config.json").read_text())
    (limited / "generation_config.json").write_text(json.dumps({**generation, "max_length": 4, "num_beams": 1}))
    source = write_lines(tmp_path / "source.en", corpus_lines(12))
    outputs = []
    for backend in ("model", "ctranslate2"):
        result = translate(limited, "--input", source, "--backend", backend, "--device", "cpu")
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout.splitlines())
    assert outputs[0] == outputs[1] and len(outputs[0]) == 12
