"""The command-line translator: stdin to stdout, file to file, line alignment, and clear messages for bad input."""

import errno
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vanilla_transformer.commands.translate import main, parse_args
from vanilla_transformer.serving import translate
from vanilla_transformer.serving.sentences import cut_to_fit
from vanilla_transformer.serving.sources import read_lines
from vanilla_transformer.serving.translate import translate_sentences

from .helpers import ENGLISH, OFFLINE, save_tiny_model_folder

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ENGLISH[2], ENGLISH[0], ENGLISH[14], ENGLISH[10]]  # lengths differ: sorting must not reorder the output


def test_batched_translation_keeps_the_input_order(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    batched = translate_sentences(model, tokenizer, SOURCES, batch_size=3, num_beams=1, max_new_tokens=6)
    one_by_one = [translate_sentences(model, tokenizer, [source], 1, 1, 6)[0] for source in SOURCES]
    assert batched == one_by_one
    assert len(set(batched)) > 1  # different inputs give different outputs, so a reordering would show
    with_empty_lines = translate_sentences(model, tokenizer, ["", SOURCES[0], "  "], num_beams=1, max_new_tokens=6)
    assert with_empty_lines == ["", one_by_one[0], ""]


@pytest.mark.slow
def test_stdin_to_stdout_in_a_fresh_process(folder, model_and_tokenizer):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vanilla_transformer",
            "translate",
            str(folder),
            "--num_beams",
            "2",
            "--device",
            "cpu",
        ],
        input="".join(source + "\n" for source in SOURCES[:2]),
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, **OFFLINE},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    expected = translate_sentences(*model_and_tokenizer, SOURCES[:2], num_beams=2)  # max length: input + 50
    assert result.stdout == "".join(line + "\n" for line in expected)
    assert "translated 2 lines (2 sentences," in result.stderr


def run_translator(folder: Path, stdin: bytes, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vanilla_transformer", "translate", str(folder), "--device", "cpu", *flags],
        input=stdin,
        capture_output=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, **OFFLINE},
        timeout=120,
    )


@pytest.mark.slow
def test_undecodable_bytes_on_stdin_are_a_clear_error_naming_the_line(folder):
    result = run_translator(
        folder, f"{SOURCES[0]}\n{SOURCES[1]}\n".encode() + b"caf\xe9 au lait\n", "--num_beams", "1"
    )
    stderr = result.stderr.decode()
    assert result.returncode == 1 and result.stdout == b""
    assert "error: cannot read the input (stdin): invalid UTF-8 on line 3" in stderr
    assert "Traceback" not in stderr


def test_undecodable_bytes_in_an_input_file_name_the_line(folder, tmp_path, capsys):
    source_file = tmp_path / "source.en"
    source_file.write_bytes(b"fine\nalso fine\n\xff broken\n")
    assert main([str(folder), "--input", str(source_file)]) == 1
    assert f"cannot read the input {source_file}: invalid UTF-8 on line 3" in capsys.readouterr().err


def test_stdin_is_read_as_utf8_bytes_without_a_byte_order_mark(monkeypatch):
    text = "\ufeffStraße\r\nÜbung\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode()), encoding="ascii"))
    assert read_lines(None) == ["Straße", "Übung"]


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--num_beams", "0"), ("--batch_size", "0"), ("--max_piece_tokens", "-1"), ("--max_new_tokens", "1.5")],
)
def test_bad_numbers_are_refused_when_the_flags_are_parsed(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), flag, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: must be an integer >= 1, got" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "limit"),
    [("--num_beams", "65", 64), ("--num_beams", "100000", 64), ("--max_new_tokens", "4097", 4096)],
)
def test_beams_and_output_lengths_over_their_bounds_are_refused_when_the_flags_are_parsed(
    tmp_path, capsys, flag, value, limit
):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), flag, value])
    assert exit_info.value.code == 2
    assert f"argument {flag}: must be an integer from 1 to {limit}, got {value}" in capsys.readouterr().err


def test_file_to_file_with_an_empty_line_keeps_the_alignment(folder, model_and_tokenizer, tmp_path, capsys):
    source_file, output_file = tmp_path / "source.en", tmp_path / "out" / "hypotheses.de"
    output_file.parent.mkdir()
    source_file.write_text(f"{SOURCES[0]}\n\n{SOURCES[1]}\r\n   \n{SOURCES[2]}\n", encoding="utf-8")
    argv = [str(folder), "--input", str(source_file), "--output", str(output_file)]
    argv += "--batch_size 2 --num_beams 1 --max_new_tokens 5".split()
    assert main(argv) == 0
    expected = translate_sentences(*model_and_tokenizer, SOURCES[:3], num_beams=1, max_new_tokens=5)
    assert output_file.read_text(encoding="utf-8").split("\n") == [expected[0], "", expected[1], "", expected[2], ""]
    assert "translated 5 lines (3 sentences," in capsys.readouterr().err


def test_a_line_over_max_piece_tokens_is_cut_into_pieces_and_counted(folder, model_and_tokenizer, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{ENGLISH[0]}\n{SOURCES[0]}, {SOURCES[2]}\n"))
    assert main([str(folder), "--max_piece_tokens", "20", "--num_beams", "1", "--max_new_tokens", "4"]) == 0
    captured = capsys.readouterr()
    model, tokenizer = model_and_tokenizer
    pieces = cut_to_fit(f"{SOURCES[0]}, {SOURCES[2]}", lambda text: len(tokenizer(text)["input_ids"]), 20)
    assert len(pieces) > 1 and all(len(tokenizer(piece)["input_ids"]) <= 20 for piece, _ in pieces)
    translations = translate_sentences(model, tokenizer, [piece for piece, _ in pieces], num_beams=1, max_new_tokens=4)
    expected = "".join(text + space for text, (_, space) in zip(translations, pieces, strict=True))
    assert captured.out.splitlines()[1] == expected  # each piece translated, joined as the source was
    assert "1 sentence(s) over the model's length cut into pieces" in captured.err


def write_bad_config(folder: Path) -> None:
    folder.mkdir()
    (folder / "config.json").write_text("{not json")


@pytest.mark.parametrize(
    "make_folder, message",
    [
        (lambda folder: None, "is not a folder"),
        (lambda folder: folder.mkdir(), "is not a model folder: it has no config.json"),
        (write_bad_config, "cannot load a model and tokenizer from"),
    ],
)
def test_a_folder_that_is_not_a_model_gets_a_clear_message(tmp_path, capsys, monkeypatch, make_folder, message):
    folder = tmp_path / "not_a_model"
    make_folder(folder)
    monkeypatch.setattr(sys, "stdin", io.StringIO("a sentence\n"))
    assert main([str(folder)]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and message in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


@pytest.mark.parametrize(
    ("file", "field", "value", "message"),
    [
        ("config.json", "max_position_embeddings", 20_000_000, "20,000,000 x d_model 32 would be a 14.3 GiB position"),
        # 0.5 GiB in float32, but 2.9 GiB at the peak of building it in float64 (the 5.4 GB to translate)
        ("config.json", "max_position_embeddings", 4_000_000, "4,000,000 x d_model 32 would be a 2.9 GiB position"),
        ("config.json", "encoder_layers", 20_000, "encoder_layers is 20,000; the limit is 128"),
        (
            "config.json",
            "encoder_ffn_dim",
            10**8,
            "make 12,800,042,368 weights, 47.7 GiB in float32; the limit is 4 GiB",
        ),
        ("config.json", "vocab_size", 10**9, "vocab_size 1,000,000,000 x d_model 32 would be a 119.2 GiB embedding"),
        ("generation_config.json", "num_beams", 1000000, "num_beams is 1,000,000; the limit is 64"),
        ("generation_config.json", "max_new_tokens", 10**9, "max_new_tokens is 1,000,000,000; the limit is 4,096"),
        ("generation_config.json", "max_length", 10**9, "max_length is 1,000,000,000; the limit is 4,096"),
        ("config.json", "d_model", "512", "d_model must be a whole number >= 1, got '512'"),
    ],
)
def test_a_folder_whose_sizes_would_allocate_without_bound_is_refused_before_a_model_is_built(
    folder, tmp_path, capsys, monkeypatch, file, field, value, message
):
    untrusted = tmp_path / "downloaded"
    shutil.copytree(folder, untrusted)
    settings = json.loads((untrusted / file).read_text())
    (untrusted / file).write_text(json.dumps({**settings, field: value}))
    built = []
    monkeypatch.setattr(AutoModelForSeq2SeqLM, "from_pretrained", lambda *a, **k: built.append(a) or 1 / 0)
    monkeypatch.setattr(sys, "stdin", io.StringIO("the house is small\n"))
    assert main([str(untrusted)]) == 1
    error = capsys.readouterr().err
    assert error.startswith(f"error: {untrusted / file}: ") and message in error and built == []


def test_the_size_limits_count_the_decoders_matrix_and_an_untied_projection(tmp_path):
    from vanilla_transformer.model.loading import MAX_MODEL_BYTES, MAX_TABLE_BYTES, ModelFolderError, check_model_sizes

    rows = MAX_TABLE_BYTES // (4 * 512)  # the most rows one float32 matrix may have at d_model 512
    sizes = dict(d_model=512, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=8, decoder_ffn_dim=8)
    separate = dict(sizes, share_encoder_decoder_embeddings=False, vocab_size=10, decoder_vocab_size=rows)
    check_model_sizes(tmp_path / "config.json", separate)
    with pytest.raises(ModelFolderError, match="decoder_vocab_size .* decoder embedding matrix"):
        check_model_sizes(tmp_path / "config.json", {**separate, "decoder_vocab_size": rows + 1})
    # each matrix within its limit, all of them and the layers over the model's; two of them and the layers not
    layers = dict(encoder_ffn_dim=(MAX_MODEL_BYTES - MAX_TABLE_BYTES * 5 // 2) // (4 * 2 * 512))
    three = dict(separate, **layers, vocab_size=rows, decoder_vocab_size=rows, tie_word_embeddings=False)
    with pytest.raises(ModelFolderError, match="weights"):
        check_model_sizes(tmp_path / "config.json", three)
    check_model_sizes(tmp_path / "config.json", dict(three, tie_word_embeddings=True))


def test_a_folder_with_separate_vocabularies_translates(tmp_path):
    folder = save_tiny_model_folder(
        tmp_path / "separate", share_encoder_decoder_embeddings=False, tie_word_embeddings=False
    )
    model, tokenizer = translate.load_model_and_tokenizer(folder)
    assert model.lm_head.weight.data_ptr() != model.model.decoder.embed_tokens.weight.data_ptr()
    assert len(translate_sentences(model, tokenizer, ["the house is small"], max_new_tokens=3)) == 1


def test_a_closed_stdin_is_a_clear_error_before_the_model_is_loaded(folder, capsys, monkeypatch):
    loaded = []
    monkeypatch.setattr(translate, "load_model_and_tokenizer", lambda *a, **k: loaded.append(a))
    monkeypatch.setattr(sys, "stdin", None)  # started with `<&-`
    assert main([str(folder)]) == 1
    captured = capsys.readouterr()
    assert captured.err == (
        "error: there is no input: stdin is closed. Pipe the sentences in (< source.txt) or give --input FILE.\n"
    )
    assert loaded == []


def test_an_empty_input_and_a_bad_device_are_errors(folder, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main([str(folder), "--device", "cpu"]) == 1
    assert "is empty: there is nothing to translate" in capsys.readouterr().err
    assert main([str(folder), "--device", "no-such-device"]) == 1
    assert "is not a device" in capsys.readouterr().err


def test_bf16_with_eager_attention_translates_with_that_model(folder, tmp_path, monkeypatch):
    loaded = {}
    real = translate.ModelBackend.__init__

    def recording(self, model, *args, **kwargs):
        loaded.update(dtype=model.dtype, attention=model.config._attn_implementation)
        real(self, model, *args, **kwargs)

    monkeypatch.setattr(translate.ModelBackend, "__init__", recording)
    source_file, output_file = tmp_path / "source.en", tmp_path / "hypotheses.de"
    source_file.write_text(f"{SOURCES[0]}\n{SOURCES[1]}\n", encoding="utf-8")
    argv = [str(folder), "--input", str(source_file), "--output", str(output_file)]
    argv += "--device cpu --dtype bfloat16 --attn_implementation eager --max_new_tokens 5".split()
    assert main(argv) == 0
    assert loaded == {"dtype": torch.bfloat16, "attention": "eager"}
    assert len(output_file.read_text(encoding="utf-8").splitlines()) == 2


def test_the_output_file_may_not_be_the_input_file(tmp_path, capsys):
    sources = tmp_path / "sources.txt"
    sources.write_text("the red dog\n")
    with pytest.raises(SystemExit):
        parse_args(["model", "--input", str(sources), "--output", str(tmp_path / "." / "sources.txt")])
    assert "would replace the sources" in capsys.readouterr().err
    assert sources.read_text() == "the red dog\n"


def test_the_folders_own_code_is_trusted_only_with_trust_remote_code(folder, tmp_path, monkeypatch):
    sources = tmp_path / "sources.txt"
    sources.write_text("the red dog\n")
    installed, _ = translate.load_model_and_tokenizer(folder)  # no remote code needed: the installed code runs
    assert type(installed).__module__ == "modeling_vanilla_transformer"
    calls = []
    loader = AutoModelForSeq2SeqLM.from_pretrained

    def recording(*args, **kwargs):
        calls.append(kwargs.get("trust_remote_code"))
        return loader(*args, **kwargs)

    monkeypatch.setattr(AutoModelForSeq2SeqLM, "from_pretrained", recording)
    for flags in ([], ["--trust_remote_code"]):
        assert main([str(folder), "--input", str(sources), "--output", str(tmp_path / "out.txt"), *flags]) == 0
        (tmp_path / "out.txt").unlink()
    assert calls == [False, True]


@pytest.mark.parametrize(
    "output, message",
    [("missing/hypotheses.de", "the folder {tmp}/missing does not exist"), (".", "is a folder: name the file")],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_model_is_loaded(
    tmp_path, capsys, monkeypatch, output, message
):
    loaded = []
    monkeypatch.setattr(translate, "load_model_and_tokenizer", lambda *a, **k: loaded.append(a))
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{SOURCES[0]}\n"))
    assert main([str(tmp_path), "--output", str(tmp_path / output)]) == 1
    assert message.format(tmp=tmp_path) in capsys.readouterr().err and loaded == []


def test_a_learned_position_model_translates_input_it_accepts_with_its_output_cut_at_its_table(tmp_path, caplog):
    from pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline
    from vanilla_transformer.serving.attention_maps import compute_attentions

    folder = save_tiny_model_folder(
        tmp_path / "learned", position_embedding_type="learned", max_position_embeddings=40
    )
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    source = " ".join(ENGLISH[:6])
    source = tokenizer.decode(tokenizer(source)["input_ids"][:36], skip_special_tokens=True)
    assert 30 < len(tokenizer(source)["input_ids"]) <= 40  # accepted by the translator (40 source positions)
    source_file = tmp_path / "source.en"
    source_file.write_text(source + "\n", encoding="utf-8")
    argv = [str(folder), "--input", str(source_file), "--output", str(tmp_path / "out.de"), "--num_beams", "1"]
    with caplog.at_level("WARNING"):  # transformers' logger: on stderr at a terminal
        assert main(argv) == 0  # input + 50 would reach position 86 of 40
    assert "learned position table has 40 positions: translations longer than 39 tokens are cut" in caplog.text
    (generated,) = VanillaTransformerTranslationPipeline(model=model, tokenizer=tokenizer)(source, num_beams=1)
    assert len(tokenizer(generated["translation_text"])["input_ids"]) <= 40
    attentions = compute_attentions(model, tokenizer, source, num_beams=1)
    assert attentions["cross_attentions"].shape[-2] <= 40


class Terminal(io.StringIO):
    """stderr as a terminal shows it."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False], ids=["a terminal", "a pipe"])
def test_progress_shows_on_stderr_only_when_it_is_a_terminal(folder, tmp_path, monkeypatch, terminal):
    source_file = tmp_path / "source.en"
    source_file.write_text("".join(f"{source}\n" for source in SOURCES), encoding="utf-8")
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    argv = [str(folder), "--input", str(source_file), "--output", str(tmp_path / "out.de"), "--num_beams", "1"]
    assert main([*argv, "--max_new_tokens", "3"]) == 0
    assert ("translating: 100%" in stderr.getvalue()) == terminal
    assert "translated 4 lines (4 sentences," in stderr.getvalue()


def test_num_return_sequences_in_generation_config_still_gives_one_line_per_input_line_and_a_note(
    folder, tmp_path, capsys
):
    several = tmp_path / "several"
    shutil.copytree(folder, several)
    generation = json.loads((several / "generation_config.json").read_text())
    (several / "generation_config.json").write_text(json.dumps({**generation, "num_return_sequences": 2}))
    source_file, output_file = tmp_path / "source.en", tmp_path / "out.de"
    source_file.write_text("".join(f"{source}\n" for source in SOURCES), encoding="utf-8")
    argv = [str(several), "--input", str(source_file), "--output", str(output_file), "--max_new_tokens", "3"]
    assert main([*argv, "--num_beams", "2"]) == 0
    assert len(output_file.read_text(encoding="utf-8").splitlines()) == len(SOURCES)
    assert (
        f"note: {several / 'generation_config.json'}: num_return_sequences is 2; one translation per line is written"
        in capsys.readouterr().err
    )


def test_a_folder_whose_code_differs_from_the_installed_code_gets_a_note_naming_the_files(folder, tmp_path, capsys):
    assert translate.folder_notes(folder) == []  # saved by this installation: the same code
    edited = tmp_path / "edited"
    shutil.copytree(folder, edited)
    with (edited / "modeling_vanilla_transformer.py").open("a") as code:
        code.write("# edited by hand\n")
    sources = tmp_path / "sources.txt"
    sources.write_text("the red dog\n")
    assert main([str(edited), "--input", str(sources), "--output", str(tmp_path / "out.txt"), "--num_beams", "1"]) == 0
    note = capsys.readouterr().err.splitlines()[0]
    assert note.startswith(f"note: {edited} holds model code that differs from the installed")
    assert "(modeling_vanilla_transformer.py)" in note and "--trust_remote_code" in note
    assert f"vanilla-transformer refresh-code {edited}" in note
    assert translate.folder_notes(edited, trust_remote_code=True) == []  # then the folder's own code runs


def test_a_config_with_more_layers_than_the_weights_is_refused_naming_the_missing_keys(
    folder_with_a_layer_too_many, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "stdin", io.StringIO("the house is small\n"))
    assert main([str(folder_with_a_layer_too_many)]) == 1
    captured = capsys.readouterr()
    assert "16 tensor(s) that its model.safetensors lacks (model.encoder.layers.2." in captured.err
    assert "which would be random" in captured.err and captured.out == ""


def test_a_full_disk_keeps_the_finished_chunks_and_says_so(folder, tmp_path, capsys, monkeypatch):
    from vanilla_transformer.serving import corpus

    source_file, output_file = tmp_path / "source.en", tmp_path / "hypotheses.de"
    source_file.write_text("".join(f"{source}\n" for source in SOURCES), encoding="utf-8")
    real, writes = corpus.replace_file, []

    def fill_the_disk(path, data):  # the second chunk finds the disk full
        writes.append("chunk-" in str(path))
        if sum(writes) == 2 and writes[-1]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(corpus, "replace_file", fill_the_disk)
    argv = [str(folder), "--input", str(source_file), "--output", str(output_file), "--num_beams", "1"]
    assert main([*argv, "--buffer_size", "2", "--max_new_tokens", "5"]) == 1
    error = capsys.readouterr().err
    assert "no space left on device while writing chunk 2 of 2" in error and "the same command continues" in error
    assert [path.name for path in (tmp_path / "hypotheses.de.partial").glob("chunk-*")] == ["chunk-00000000.jsonl"]
    assert not output_file.exists()


def test_a_second_command_writing_the_same_output_is_refused_before_loading_a_model(tmp_path, capsys, monkeypatch):
    from vanilla_transformer.serving.corpus_folder import FORMAT, PartialFolder

    output_file = tmp_path / "hypotheses.de"
    first = PartialFolder(output_file)
    first.folder.mkdir()
    (first.folder / "manifest.json").write_text(json.dumps({"format": FORMAT}))
    first.lock()
    loaded = []
    monkeypatch.setattr(translate, "load_model_and_tokenizer", lambda *a, **k: loaded.append(a))
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{SOURCES[0]}\n"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    try:
        assert main([str(tmp_path / "model"), "--output", str(output_file)]) == 1
    finally:
        first.unlock()
    assert f"--output {output_file} is being written by another command" in capsys.readouterr().err
    assert loaded == [] and not output_file.exists()


@pytest.mark.parametrize(
    ("file", "field", "value", "message"),
    [
        ("config.json", "layer_norm_eps", float("nan"), "layer_norm_eps must be a finite number > 0, got nan."),
        ("config.json", "layer_norm_eps", 0, "layer_norm_eps must be a finite number > 0, got 0."),
        ("generation_config.json", "temperature", float("nan"), "temperature must be a finite number, got nan."),
    ],
)
def test_a_setting_that_is_not_a_finite_number_is_refused_before_a_model_is_built(
    folder, tmp_path, capsys, monkeypatch, file, field, value, message
):
    untrusted = tmp_path / "downloaded"
    shutil.copytree(folder, untrusted)
    settings = json.loads((untrusted / file).read_text())
    (untrusted / file).write_text(json.dumps({**settings, field: value}))  # NaN: JSON as Python writes it
    built = []
    monkeypatch.setattr(AutoModelForSeq2SeqLM, "from_pretrained", lambda *a, **k: built.append(a) or 1 / 0)
    monkeypatch.setattr(sys, "stdin", io.StringIO("the house is small\n"))
    assert main([str(untrusted)]) == 1
    assert capsys.readouterr().err == f"error: {untrusted / file}: {message}\n" and built == []


@pytest.mark.parametrize(
    ("field", "value"), [("max_position_embeddings", 4_000_000), ("decoder_layers", 20_000), ("vocab_size", 10**9)]
)
def test_every_loader_refuses_hostile_sizes_before_building_a_model(folder, tmp_path, monkeypatch, field, value):
    """export-ctranslate2, --evaluate_only, attention-maps, the demo and refresh-code load through
    `load_model_folder` (tests/test_layering.py holds that nothing else builds a model from a folder)."""
    from vanilla_transformer.hub.refresh_code import RefreshError, refresh
    from vanilla_transformer.model.loading import ModelFolderError, load_model_folder

    untrusted = shutil.copytree(folder, tmp_path / "downloaded")
    config = json.loads((untrusted / "config.json").read_text())
    (untrusted / "config.json").write_text(json.dumps({**config, field: value}))
    built = []
    monkeypatch.setattr(AutoModelForSeq2SeqLM, "from_pretrained", lambda *a, **k: built.append(a) or 1 / 0)
    with pytest.raises(ModelFolderError, match=field):
        load_model_folder(untrusted)
    before = sorted(path.name for path in untrusted.iterdir())
    with pytest.raises(RefreshError, match=field):
        refresh(untrusted)
    assert built == [] and sorted(path.name for path in untrusted.iterdir()) == before


def test_weights_whose_header_is_over_its_bound_are_refused_before_it_is_read(folder, tmp_path, capsys, monkeypatch):
    untrusted = shutil.copytree(folder, tmp_path / "downloaded")
    weights = untrusted / "model.safetensors"
    weights.write_bytes((100 * 2**20).to_bytes(8, "little") + b'{"__metadata__": {}}')  # declares 100 MiB
    monkeypatch.setattr(sys, "stdin", io.StringIO("the house is small\n"))
    assert main([str(untrusted)]) == 1
    assert f"{weights}: its header declares 104,857,600 bytes" in capsys.readouterr().err


@pytest.mark.slow
def test_a_reader_that_stops_early_ends_the_command_quietly(folder, tmp_path):
    """`translate ... | head -1`: the closed pipe stops the command with exit 0 and no error."""
    (tmp_path / "input.txt").write_text("".join(f"{SOURCES[index % len(SOURCES)]}\n" for index in range(3000)))
    command = (
        f"set -o pipefail; {sys.executable} -m vanilla_transformer translate {folder} --device cpu --batch_size 1 "
        f"--buffer_size 1 < {tmp_path / 'input.txt'} | head -1"
    )
    result = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, **OFFLINE},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(result.stdout.splitlines()) == 1
    assert "error" not in result.stderr.lower() and "Traceback" not in result.stderr
