"""The `convert` command and function: its command line and error lines, where it may write (a new or empty folder, a
previous conversion with --overwrite, never the source's), and the complete model folder it writes."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, MarianMTModel, MarianTokenizer

from vanilla_transformer.commands.convert import main
from vanilla_transformer.converters import convert as conversion
from vanilla_transformer.converters.convert import convert
from vanilla_transformer.converters.core import ConversionError
from vanilla_transformer.data.tokenization import load_tokenizer
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.serving.translate import load_model_and_tokenizer, translate_sentences

from .sources import MULTI30K_LIKE, NEW_TOKENS, generated


def meanwhile(monkeypatch, change):
    """Run `change()` while a conversion runs: after its output folder was checked, before it is written."""
    checked = conversion.check_against_reference

    def check_then_change(*args):
        difference = checked(*args)
        change()
        return difference

    monkeypatch.setattr(conversion, "check_against_reference", check_then_change)


def dead_pid() -> int:
    """The id of a process that ran here and ended."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(ended.stdout)


def converted_folder(source: str, request, tmp_path) -> Path:
    if source == "marian":
        return convert(request.getfixturevalue("marian_source"), tmp_path / "converted")
    return request.getfixturevalue("fsmt")[4]


def test_the_command_writes_a_folder_that_loads_with_trust_remote_code_and_translates(marian_source, tmp_path, capsys):
    assert main([str(marian_source), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    source, tokenizer = (
        MarianMTModel.from_pretrained(marian_source).eval(),
        MarianTokenizer.from_pretrained(marian_source),
    )
    batch = tokenizer(MULTI30K_LIKE[:3], return_tensors="pt", padding=True)
    expected = generated(source, batch, 1)
    assert torch.equal(generated(model, batch, 1), expected)
    model, tokenizer = load_model_and_tokenizer(tmp_path / "out")
    texts = translate_sentences(model, tokenizer, MULTI30K_LIKE[:3], num_beams=1, max_new_tokens=NEW_TOKENS)
    assert texts == tokenizer.batch_decode(expected, skip_special_tokens=True)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("encoder_attention_heads", 3, "must be divisible by num_heads"),
        ("eos_token_id", 10**6, "`eos_token_id` (1000000) must be a token id"),
    ],
)
def test_a_source_config_the_model_cannot_take_is_one_error_line(marian_source, tmp_path, field, value, named, capsys):
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    config = {**json.loads((source / "config.json").read_text()), field: value}
    (source / "config.json").write_text(json.dumps(config))
    assert main([str(source), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert error.strip().splitlines()[-1].startswith("error: ") and named in error and "Traceback" not in error, error
    assert not (tmp_path / "out").exists()


def test_a_conversion_refusal_is_one_of_the_projects_refusals_and_still_a_value_error(marian_source):
    with pytest.raises(VanillaTransformerError, match="(is|holds|is inside) the source's folder"):
        convert(marian_source, marian_source, overwrite=True)
    assert issubclass(ConversionError, VanillaTransformerError) and issubclass(ConversionError, ValueError)


def test_a_converted_model_that_computes_otherwise_than_the_source_is_refused_before_writing(
    marian_copy, tmp_path, monkeypatch
):
    build = conversion.build_model

    def build_wrong(source):  # a mapping error: one attention's W^K and W^V swapped
        model = build(source)
        attention = model.model.decoder.layers[0].encoder_attn
        with torch.no_grad():
            key = attention.k_proj.weight.clone()
            attention.k_proj.weight.copy_(attention.v_proj.weight)
            attention.v_proj.weight.copy_(key)
        return model

    monkeypatch.setattr(conversion, "build_model", build_wrong)
    with pytest.raises(ConversionError, match="logits differ from the source's"):
        convert(marian_copy, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["marian", "fsmt"])
def test_a_converted_folder_is_a_complete_hub_folder_whose_upload_holds_its_tokenizer(source, request, tmp_path):
    from vanilla_transformer.hub.model_folder import files_to_upload, hub_folder_problems

    folder = converted_folder(source, request, tmp_path)
    assert hub_folder_problems(folder) == []
    tokenizer_files = {"marian": {"source.spm", "target.spm", "vocab.json"}, "fsmt": {"vocab-src.json", "merges.txt"}}
    assert tokenizer_files[source] <= set(files_to_upload(folder))


@pytest.mark.parametrize("source", ["marian", "fsmt"])
def test_a_converted_folders_stock_tokenizer_has_a_fingerprint_of_its_vocabulary(source, request, tmp_path):
    """What --evaluate_only and a prepared corpus compare: the stock tokenizers have no `tokenizers` backend."""
    import shutil

    from vanilla_transformer.data.prepare import tokenizer_fingerprint

    folder = converted_folder(source, request, tmp_path)
    fingerprint = tokenizer_fingerprint(load_tokenizer(folder))
    assert fingerprint == tokenizer_fingerprint(load_tokenizer(folder))
    changed = shutil.copytree(folder, tmp_path / "changed")
    vocabulary = changed / ("vocab.json" if source == "marian" else "vocab-src.json")
    entries = json.loads(vocabulary.read_text())
    first, second = list(entries)[-2:]
    entries[first], entries[second] = entries[second], entries[first]
    vocabulary.write_text(json.dumps(entries))
    if source == "fsmt":
        (changed / "vocab-tgt.json").write_text(json.dumps(entries))
    assert tokenizer_fingerprint(load_tokenizer(changed)) != fingerprint


def test_the_command_refuses_a_non_empty_output_folder_and_writes_nothing(fsmt_folder, tmp_path, capsys):
    output = tmp_path / "out"
    output.mkdir()
    (output / "notes.txt").write_text("my work")
    assert main([str(fsmt_folder), str(output)]) == 1
    assert "is not empty" in capsys.readouterr().err
    assert sorted(path.name for path in output.iterdir()) == ["notes.txt"]
    assert main([str(fsmt_folder), str(output), "--overwrite"]) == 1
    assert "not a previous conversion (it holds notes.txt)" in capsys.readouterr().err


def test_an_output_folder_that_is_holds_or_is_inside_the_source_folder_is_refused(marian_source, tmp_path):
    for output in (marian_source, marian_source / "converted", marian_source.parent):
        with pytest.raises(ConversionError, match="(is|holds|is inside) the source's folder"):
            convert(marian_source, output, overwrite=True)
    assert not (marian_source / "converted").exists()


def test_a_checkpoint_converts_into_a_new_folder_beside_it_but_never_over_its_folder(fairseq_checkpoint, tmp_path):
    folder = Path(shutil.copytree(fairseq_checkpoint.parent, tmp_path / "wmt"))
    assert convert(folder / "model.pt", folder / "converted").is_dir()
    with pytest.raises(ConversionError, match=r"not a previous conversion \(it holds bpecodes"):
        convert(folder / "model.pt", folder, overwrite=True)


def test_overwrite_replaces_a_previous_conversion(fsmt, fsmt_folder, tmp_path):
    output = Path(shutil.copytree(fsmt[4], tmp_path / "out"))  # a conversion, unchanged: its record still holds
    (output / "model.safetensors").unlink()
    (output / "model.safetensors").write_bytes((fsmt[4] / "model.safetensors").read_bytes())  # replaced by the same
    before = (output / "model.safetensors").stat().st_ino
    assert main([str(fsmt_folder), str(output), "--overwrite"]) == 0
    assert (output / "model.safetensors").stat().st_ino != before  # written again
    assert (output / ".vanilla_transformer_conversion.json").is_file()


def test_overwrite_never_replaces_a_trained_models_folder_of_the_same_file_names(fsmt, fsmt_folder, tmp_path, capsys):
    """A folder of the names a conversion writes, with a vanilla-transformer config.json (a trained model's Hub
    files), but no record of a conversion: --overwrite refuses it and leaves every file as it was."""
    output = Path(shutil.copytree(fsmt[4], tmp_path / "trained"))
    (output / ".vanilla_transformer_conversion.json").unlink()
    before = {path: path.read_bytes() for path in output.rglob("*") if path.is_file()}
    assert main([str(fsmt_folder), str(output), "--overwrite"]) == 1
    assert (
        "no readable record (.vanilla_transformer_conversion.json) of a `vanilla-transformer convert`"
        in capsys.readouterr().err
    )
    assert {path: path.read_bytes() for path in output.rglob("*") if path.is_file()} == before


def test_overwrite_never_replaces_a_conversion_edited_since(fsmt, fsmt_folder, tmp_path, capsys):
    output = Path(shutil.copytree(fsmt[4], tmp_path / "out"))
    config = {**json.loads((output / "config.json").read_text()), "dropout": 0.5}
    (output / "config.json").write_text(json.dumps(config))
    assert main([str(fsmt_folder), str(output), "--overwrite"]) == 1
    assert "config.json has " in capsys.readouterr().err  # another size than the conversion wrote
    assert json.loads((output / "config.json").read_text())["dropout"] == 0.5


def test_a_folder_another_writer_filled_meanwhile_is_left_as_it_is(fsmt_folder, tmp_path, monkeypatch, capsys):
    """Two converts (or a convert and a training run) into one new folder: the second to finish replaces nothing."""
    output = tmp_path / "out"
    meanwhile(monkeypatch, lambda: (output.mkdir(), (output / "model.safetensors").write_bytes(b"theirs")))
    assert main([str(fsmt_folder), str(output)]) == 1
    assert "was written by someone else meanwhile" in capsys.readouterr().err
    assert [path.name for path in output.iterdir()] == ["model.safetensors"]
    assert (output / "model.safetensors").read_bytes() == b"theirs"
    assert not list(tmp_path.glob(".out.incomplete-*"))  # our staging folder is gone


def test_a_file_put_into_a_previous_conversion_meanwhile_stops_overwrite(
    fsmt, fsmt_folder, tmp_path, monkeypatch, capsys
):
    output = Path(shutil.copytree(fsmt[4], tmp_path / "out"))  # a previous conversion: --overwrite may replace it
    before = (output / "model.safetensors").stat().st_ino
    meanwhile(monkeypatch, lambda: (output / "notes.txt").write_text("mine"))
    assert main([str(fsmt_folder), str(output), "--overwrite"]) == 1
    assert "changed while it was written (it holds notes.txt)" in capsys.readouterr().err
    assert (output / "notes.txt").read_text() == "mine"
    assert (output / "model.safetensors").stat().st_ino == before


def test_what_a_killed_conversion_left_is_removed_and_a_live_ones_kept(fsmt_folder, tmp_path, monkeypatch):
    """kill -9 leaves the staging folder beside the output, what it renamed aside and its scratch folder: the next
    convert on this machine removes them, and leaves a running conversion's alone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    host, dead, alive = socket.gethostname(), dead_pid(), os.getpid()
    left = [
        tmp_path / f".out.incomplete-{host}-{dead}-0123456789ab",
        tmp_path / f".out.incomplete-{host}-{dead}-0123456789ab.replaced",
        tmp_path / "tmp" / f"vanilla-transformer-convert-{host}-{dead}-x1y2z3",
    ]
    running = [
        tmp_path / f".out.incomplete-{host}-{alive}-ba9876543210",
        tmp_path / "tmp" / f"vanilla-transformer-convert-{host}-{alive}-a1b2c3",
        tmp_path / f".out.incomplete-elsewhere-{dead}-0123456789ab",
    ]
    for path in left + running:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"partial")
    assert main([str(fsmt_folder), str(tmp_path / "out")]) == 0
    assert not any(path.exists() for path in left)
    assert all(path.exists() for path in running)
