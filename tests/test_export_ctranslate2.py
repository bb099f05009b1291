"""CTranslate2 export: the converted model decodes exactly the tokens of our `generate()` (float32)."""

import contextlib
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.commands.export_ctranslate2 import main
from vanilla_transformer.converters.export_ctranslate2 import ExportError, convert_to_ctranslate2, vocabulary
from vanilla_transformer.mechanics.errors import VanillaTransformerError

from .fixtures.old_checkpoints import make_old_folder
from .helpers import OFFLINE, TINY

try:
    import ctranslate2
except ImportError:  # the checks of the output folder run without it
    ctranslate2 = None
needs_ctranslate2 = pytest.mark.skipif(ctranslate2 is None, reason="the export needs ctranslate2")
PROJECT_ROOT = Path(__file__).resolve().parent.parent

NEW_TOKENS = 12


def train_to_reverse(steps: int = 150, **overrides) -> VanillaTransformerForConditionalGeneration:
    """A tiny model trained briefly to reverse its source: its outputs depend on every position, unlike the
    repeated token a random model emits, so a wrong position table or attention layout changes them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model; more threads only add overhead on a busy machine
    try:
        torch.manual_seed(0)
        config = VanillaTransformerConfig(**{**TINY, "dropout": 0.0, **overrides})
        model = VanillaTransformerForConditionalGeneration(config)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(0)
        for _ in range(steps):
            source = torch.randint(4, config.vocab_size, (32, 8), generator=generator)
            labels = torch.cat([source.flip(1), torch.full((32, 1), config.eos_token_id)], dim=1)
            loss = model(input_ids=source, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


@pytest.fixture(scope="module")
def reversal_model() -> VanillaTransformerForConditionalGeneration:
    return train_to_reverse()


@pytest.fixture(scope="module")
def converted(reversal_model, tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("export")
    reversal_model.save_pretrained(folder / "model")
    return convert_to_ctranslate2(folder / "model", folder / "ct2")


@pytest.fixture(scope="module")
def padded_sources(reversal_model):
    """Six sources of 5 to 9 tokens ending with </s>, right-padded into one batch."""
    config = reversal_model.config
    input_ids = torch.randint(4, config.vocab_size, (6, 9), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    lengths = [9, 5, 8, 6, 9, 7]
    for row, length in enumerate(lengths):
        input_ids[row, length - 1] = config.eos_token_id
        input_ids[row, length:] = config.pad_token_id
        attention_mask[row, length:] = 0
    tokens = [[f"id_{index}" for index in input_ids[row, :length].tolist()] for row, length in enumerate(lengths)]
    return input_ids, attention_mask, tokens


def ctranslate2_ids(results) -> list[list[int]]:
    return [[int(token.removeprefix("id_")) for token in result.hypotheses[0]] for result in results]


def generate_and_translate(model, converted_dir, sources, num_beams: int) -> tuple[list, list]:
    """(CTranslate2's token ids, generate()'s token ids), both forced to NEW_TOKENS tokens; also checks that
    both score each output the same: the mean log-probability of its tokens.

    CTranslate2 bans </s> before its softmax (min_decoding_length); renormalize_logits makes generate() score
    beams the same way after its min_new_tokens ban."""
    input_ids, attention_mask, tokens = sources
    with torch.no_grad():
        generated = model.generate(
            input_ids,
            attention_mask=attention_mask,
            num_beams=num_beams,
            do_sample=False,
            min_new_tokens=NEW_TOKENS,
            max_new_tokens=NEW_TOKENS,
            renormalize_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
        )
    if num_beams == 1:  # the log-probabilities of the chosen tokens (renormalize_logits: the scores are those);
        # not compute_transition_scores, which reshapes by the source vocabulary's size (transformers' get_text_config)
        chosen = torch.stack(generated.scores, dim=1).gather(2, generated.sequences[:, 1:, None]).squeeze(2)
        scores = chosen.sum(-1) / NEW_TOKENS
    else:
        scores = generated.sequences_scores  # length_penalty=1: also the mean
    assert (generated.sequences[:, 0] == model.config.decoder_start_token_id).all()
    translator = ctranslate2.Translator(str(converted_dir), compute_type="float32", intra_threads=1)
    results = translator.translate_batch(
        tokens,
        beam_size=num_beams,
        min_decoding_length=NEW_TOKENS,
        max_decoding_length=NEW_TOKENS,
        return_scores=True,
    )
    assert torch.allclose(torch.tensor([result.scores[0] for result in results]), scores, atol=1e-5)
    return ctranslate2_ids(results), generated.sequences[:, 1:].tolist()


@needs_ctranslate2
@pytest.mark.parametrize("num_beams", [1, 4])
def test_ctranslate2_decodes_the_same_tokens_as_generate(reversal_model, converted, padded_sources, num_beams):
    translated, generated = generate_and_translate(reversal_model, converted, padded_sources, num_beams)
    assert translated == generated
    assert len({tuple(row) for row in generated}) == len(generated)  # the outputs are not trivial


@needs_ctranslate2
@pytest.mark.parametrize("tie_word_embeddings", [True, False])
def test_separate_vocabularies_export_to_ctranslate2s_and_decode_the_same_tokens(
    padded_sources, tmp_path, tie_word_embeddings
):
    """A target vocabulary of another size (larger: the reversed sources are its tokens), the decoder's matrix the
    projection or not: CTranslate2 writes a source and a target vocabulary, and decodes as generate()."""
    separate = dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=TINY["vocab_size"] + 9)
    model = train_to_reverse(steps=100, tie_word_embeddings=tie_word_embeddings, **separate)
    model.save_pretrained(tmp_path / "model")
    convert_to_ctranslate2(tmp_path / "model", tmp_path / "ct2")
    target = json.loads((tmp_path / "ct2" / "target_vocabulary.json").read_text())
    assert len(json.loads((tmp_path / "ct2" / "source_vocabulary.json").read_text())) == TINY["vocab_size"]
    assert len(target) == TINY["vocab_size"] + 9
    for num_beams in (1, 4):
        translated, generated = generate_and_translate(model, tmp_path / "ct2", padded_sources, num_beams)
        assert translated == generated
        assert len({tuple(row) for row in generated}) == len(generated)


@needs_ctranslate2
def test_other_architecture_options_convert_exactly(padded_sources, tmp_path):
    """Learned positions, GELU, unscaled embeddings, a larger LayerNorm epsilon."""
    options = dict(position_embedding_type="learned", activation_function="gelu")
    model = train_to_reverse(steps=100, scale_embedding=False, layer_norm_eps=1e-3, **options)
    model.save_pretrained(tmp_path / "model")
    convert_to_ctranslate2(tmp_path / "model", tmp_path / "ct2")
    for num_beams in (1, 4):
        translated, generated = generate_and_translate(model, tmp_path / "ct2", padded_sources, num_beams)
        assert translated == generated


@needs_ctranslate2
def test_a_folder_saved_before_the_projections_were_separate_layers_is_refused_naming_refresh_code(
    reversal_model, tmp_path
):
    """Its fused `qkv_proj` and `kv_proj` are an earlier release's format, which refresh-code upgrades."""
    reversal_model.save_pretrained(tmp_path / "model")
    make_old_folder(tmp_path / "model")
    with pytest.raises(ExportError, match="vanilla-transformer refresh-code"):
        convert_to_ctranslate2(tmp_path / "model", tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_beam_search_finds_other_outputs_than_greedy(reversal_model, padded_sources):
    """Guards the beam test above: it only proves something if beam search differs from greedy here."""
    input_ids, attention_mask, _ = padded_sources
    common = dict(attention_mask=attention_mask, min_new_tokens=NEW_TOKENS, max_new_tokens=NEW_TOKENS)
    with torch.no_grad():
        greedy = reversal_model.generate(input_ids, num_beams=1, **common)
        beam = reversal_model.generate(input_ids, num_beams=4, renormalize_logits=True, **common)
    assert not torch.equal(greedy, beam)


@needs_ctranslate2
def test_command_line_writes_an_int8_model_that_translates(reversal_model, converted, padded_sources, tmp_path):
    model_dir = str(converted).replace("ct2", "model")
    main([model_dir, str(tmp_path / "int8"), "--quantization", "int8"])
    translator = ctranslate2.Translator(str(tmp_path / "int8"), compute_type="int8", intra_threads=1)
    _, _, tokens = padded_sources
    results = translator.translate_batch(tokens, beam_size=2, max_decoding_length=NEW_TOKENS)
    assert all(1 <= len(result.hypotheses[0]) <= NEW_TOKENS for result in results)
    assert "int8 holds a previous CTranslate2 export: add --overwrite to replace it" in refusal(
        [model_dir, str(tmp_path / "int8")]
    )
    int8_size = (tmp_path / "int8" / "model.bin").stat().st_size
    main(
        [model_dir, str(tmp_path / "int8"), "--overwrite"]
    )  # --overwrite replaces a previous export, here with float32
    assert (tmp_path / "int8" / "model.bin").stat().st_size > 2 * int8_size
    ctranslate2.Translator(str(tmp_path / "int8"), intra_threads=1).translate_batch(tokens[:1], max_decoding_length=2)


def tiny_tokenizer():
    from vanilla_transformer.data.tokenization import MIN_VOCAB_SIZE, train_shared_tokenizer

    return train_shared_tokenizer(["ein kleiner Satz", "a small sentence"] * 4, vocab_size=MIN_VOCAB_SIZE + 4)


def test_vocabulary_comes_from_the_saved_tokenizer_else_placeholders(tmp_path):
    with pytest.warns(UserWarning, match="has no tokenizer .*placeholders id_0 ... id_4"):
        assert vocabulary(tmp_path, 5) == ["id_0", "id_1", "id_2", "id_3", "id_4"]
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    tokens = vocabulary(tmp_path, len(tokenizer) + 2)  # a model may have more rows than the tokenizer has tokens
    assert tokens[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert tokens[4:-2] == tokenizer.convert_ids_to_tokens(list(range(4, len(tokenizer))))
    assert tokens[-2:] == [f"id_{len(tokenizer)}", f"id_{len(tokenizer) + 1}"]


@needs_ctranslate2
def test_a_tokenizer_in_the_model_folder_names_the_tokens(reversal_model, converted, padded_sources, tmp_path):
    tokenizer = tiny_tokenizer()  # larger than the tiny model's vocabulary: its first 61 tokens are used
    reversal_model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    convert_to_ctranslate2(tmp_path / "model", tmp_path / "ct2")
    config = json.loads((tmp_path / "ct2" / "config.json").read_text())
    assert (config["decoder_start_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")

    _, _, placeholder_tokens = padded_sources
    names = tokenizer.convert_ids_to_tokens(list(range(reversal_model.config.vocab_size)))
    sources = [[names[int(token.removeprefix("id_"))] for token in source] for source in placeholder_tokens]
    options = dict(beam_size=2, min_decoding_length=NEW_TOKENS, max_decoding_length=NEW_TOKENS)
    named = ctranslate2.Translator(str(tmp_path / "ct2"), intra_threads=1).translate_batch(sources, **options)
    placeholders = ctranslate2.Translator(converted, intra_threads=1).translate_batch(placeholder_tokens, **options)
    assert [[names.index(token) for token in result.hypotheses[0]] for result in named] == ctranslate2_ids(
        placeholders
    )


# The output folder: never the model's own, and --overwrite replaces nothing but a previous export


def saved_model(folder: Path) -> dict[str, bytes]:
    """Save a tiny untrained model into `folder`; returns its files' contents."""
    VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**TINY)).save_pretrained(folder)
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def fake_export(folder: Path) -> None:
    """What the converter writes: model.bin, a config.json of CTranslate2 fields, the vocabulary."""
    folder.mkdir()
    (folder / "model.bin").write_bytes(b"weights")
    (folder / "config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    (folder / "shared_vocabulary.json").write_text("[]")


def refusal(argv: list[str]) -> str:
    """What the command prints when it refuses `argv` (exit status 1, one message starting with "error: ")."""
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        assert main(argv) == 1
    assert printed.getvalue().startswith("error: ")
    return printed.getvalue()


@pytest.mark.parametrize(
    ("output", "relation"),
    [("model", "is"), ("./model/../model", "is"), ("link", "is"), ("model/ct2", "is inside"), (".", "holds")],
)
def test_an_output_folder_that_is_inside_or_holds_the_model_is_refused(tmp_path, monkeypatch, output, relation):
    monkeypatch.chdir(tmp_path)
    files = saved_model(tmp_path / "model")
    (tmp_path / "link").symlink_to(tmp_path / "model", target_is_directory=True)
    message = refusal(["model", output, "--overwrite"])
    assert f"the output folder {output} {relation} the model folder model" in message
    assert {path.name: path.read_bytes() for path in (tmp_path / "model").iterdir()} == files


def test_an_output_folder_filled_while_exporting_is_left_as_it_is(tmp_path, monkeypatch):
    """Two exports (or an export and anything else) into one new folder: the second to finish replaces nothing."""
    from vanilla_transformer.converters import export_ctranslate2

    saved_model(tmp_path / "model")
    output = tmp_path / "out"
    converting = export_ctranslate2.VanillaTransformerConverter.convert

    def convert_then_another_writer(self, *args, **kwargs):
        written = converting(self, *args, **kwargs)
        write_notes(output)  # another writer's result, between the check and the rename
        return written

    monkeypatch.setattr(export_ctranslate2.VanillaTransformerConverter, "convert", convert_then_another_writer)
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        assert main([str(tmp_path / "model"), str(output)]) == 1
    message = printed.getvalue().strip().splitlines()[-1]
    assert message.startswith("error: ") and "was written by someone else meanwhile" in message, message
    assert "the export was not written" in message
    assert [path.name for path in output.iterdir()] == ["notes.txt"]
    assert not list(tmp_path.glob(".out.incomplete-*"))


def write_notes(folder: Path) -> None:
    folder.mkdir()
    (folder / "notes.txt").write_text("precious")


def export_with_notes(folder: Path) -> None:
    fake_export(folder)
    (folder / "notes.txt").write_text("precious")


def export_with_a_model_config(folder: Path) -> None:
    fake_export(folder)
    (folder / "config.json").write_text(VanillaTransformerConfig(**TINY).to_json_string())


@pytest.mark.parametrize(
    ("make_output", "why"),
    [
        (write_notes, "it holds notes.txt"),
        (export_with_notes, "it holds notes.txt"),
        (saved_model, "it holds configuration_vanilla_transformer.py, generation_config.json"),
        (export_with_a_model_config, "its config.json is not CTranslate2's"),
        (lambda folder: folder.write_text("precious"), None),
    ],
    ids=["a folder of notes", "an export and notes", "another model", "a model config", "a file"],
)
def test_overwrite_refuses_to_replace_what_is_not_a_previous_export(tmp_path, make_output, why):
    saved_model(tmp_path / "model")
    output = tmp_path / "out"
    make_output(output)
    before = output.read_bytes() if output.is_file() else {path.name: path.read_bytes() for path in output.iterdir()}
    message = refusal([str(tmp_path / "model"), str(output), "--overwrite"])
    if why is None:
        assert f"{output} exists and is not a folder" in message
    else:
        assert f"{output} is not empty, and not a previous CTranslate2 export ({why}" in message
    assert before == (output.read_bytes() if output.is_file() else {p.name: p.read_bytes() for p in output.iterdir()})


def test_a_folder_that_is_not_a_model_is_a_clean_error(tmp_path):
    assert "is not a model folder: it has no config.json" in refusal([str(tmp_path), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_an_export_refusal_is_one_of_the_projects_refusals_and_still_a_runtime_error(tmp_path):
    with pytest.raises(VanillaTransformerError, match="is not a model folder"):
        convert_to_ctranslate2(tmp_path, tmp_path / "out")
    assert issubclass(ExportError, VanillaTransformerError) and issubclass(ExportError, RuntimeError)


def test_a_model_with_d_k_other_than_d_v_is_refused_before_anything_is_written(tmp_path):
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**TINY, qk_head_dim=4))
    model.save_pretrained(tmp_path / "model")
    message = refusal([str(tmp_path / "model"), str(tmp_path / "out")])
    assert "has qk_head_dim=4 (d_k) while d_v = d_model / heads = 8" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_exporting_a_model_over_itself_leaves_it_whole(tmp_path):
    """`export_ctranslate2 model model --overwrite` in a fresh process: a message, no traceback, the model still there."""
    files = saved_model(tmp_path / "model")
    result = subprocess.run(
        [sys.executable, "-m", "vanilla_transformer", "export-ctranslate2", "model", "model", "--overwrite"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **OFFLINE},
    )
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]  # not the libraries' notes
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("error: the output folder model is the model folder model"), result.stderr
    assert "Traceback" not in result.stderr
    assert {path.name: path.read_bytes() for path in (tmp_path / "model").iterdir()} == files


@pytest.mark.parametrize("value", ["int4", "fp16", ""])
def test_unknown_quantizations_are_refused_when_the_flags_are_parsed(tmp_path, capsys, value):
    saved_model(tmp_path / "model")
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "model"), str(tmp_path / "out"), "--quantization", value])
    assert exit_info.value.code == 2
    assert f"argument --quantization: invalid choice: '{value}'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@needs_ctranslate2
def test_a_full_disk_during_an_export_leaves_the_previous_export_whole_and_no_half_written_folder(
    tmp_path, monkeypatch
):
    from ctranslate2.specs import model_spec

    saved_model(tmp_path / "model")
    fake_export(tmp_path / "out")
    before = {path.name: path.read_bytes() for path in (tmp_path / "out").iterdir()}

    def fill_the_disk(spec, path: str) -> None:  # model.bin: the first file the converter writes
        Path(path).write_bytes(b"the first bytes of the weights")
        raise OSError(errno.ENOSPC, "No space left on device")

    printed = io.StringIO()
    with monkeypatch.context() as full_disk, contextlib.redirect_stderr(printed):
        full_disk.setattr(model_spec.ModelSpec, "_serialize", fill_the_disk)
        assert main([str(tmp_path / "model"), str(tmp_path / "out"), "--overwrite"]) == 1
    # a line of its own (a warning logged once per process may come before it)
    assert f"\nerror: no space left on device while exporting into {tmp_path / 'out'} (" in "\n" + printed.getvalue()
    assert {path.name: path.read_bytes() for path in (tmp_path / "out").iterdir()} == before
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model", "out"]
    assert (
        main([str(tmp_path / "model"), str(tmp_path / "out"), "--overwrite"]) == 0
    )  # space again: --overwrite replaces it
    assert (tmp_path / "out" / "model.bin").stat().st_size > len(before["model.bin"])


@needs_ctranslate2
def test_a_config_with_more_layers_than_the_weights_is_refused_naming_the_missing_keys(
    folder_with_a_layer_too_many, tmp_path, capsys
):
    assert main([str(folder_with_a_layer_too_many), str(tmp_path / "ct2")]) == 1
    error = capsys.readouterr().err
    assert f"error: cannot load the model of {folder_with_a_layer_too_many}: " in error
    assert "16 tensor(s) that its model.safetensors lacks (model.encoder.layers.2." in error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # no export, not even a partial one
