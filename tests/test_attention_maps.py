"""Attention maps: valid PNG files with one heat map per layer (rows) and head (columns), tokens on the axes."""

import json
import shutil

import matplotlib.image
import pytest
import torch
from transformers import AutoTokenizer

from vanilla_transformer.commands import attention_maps as attention_maps_command
from vanilla_transformer.serving import attention_maps

from .helpers import ENGLISH, GERMAN, TINY

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LAYERS, HEADS = TINY["decoder_layers"], TINY["decoder_attention_heads"]  # `folder`'s: a transposed grid would show


def test_attentions_have_one_map_per_layer_and_head_over_the_tokens(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    attentions = attention_maps.compute_attentions(model, tokenizer, ENGLISH[0], GERMAN[0])
    source, target = attentions["source"], attentions["target"]
    assert source[-1] == "</s>" and target[0] == "<s>" and target[-1] == "</s>"
    assert "".join(source[:-1]).replace("▁", " ") == ENGLISH[0]  # readable pieces, word starts marked
    shapes = {
        "encoder_attentions": (len(source), len(source)),
        "decoder_attentions": (len(target), len(target)),
        "cross_attentions": (len(target), len(source)),
    }
    for kind, (queries, keys) in shapes.items():
        weights = attentions[kind]
        assert weights.shape == (LAYERS, HEADS, queries, keys), kind
        assert torch.allclose(weights.sum(dim=-1), torch.ones(LAYERS, HEADS, queries))
    decoder = attentions["decoder_attentions"]
    assert torch.all(decoder.triu(diagonal=1) == 0)  # the decoder sees no future positions (3.2.3)


def test_the_grid_is_layers_by_heads_with_tokens_on_the_axes(model_and_tokenizer):
    attentions = attention_maps.compute_attentions(*model_and_tokenizer, ENGLISH[0], GERMAN[0])
    figure = attention_maps.plot_attention_grid(
        attentions["cross_attentions"], attentions["target"], attentions["source"], "Encoder-decoder attention"
    )
    grid = [ax for ax in figure.axes if ax.get_subplotspec() is not None]  # the colour bar has no grid cell
    assert len(grid) == LAYERS * HEADS
    assert {ax.get_subplotspec().get_geometry()[:2] for ax in grid} == {(LAYERS, HEADS)}
    assert grid[HEADS].get_title() == "layer 2, head 1"
    bottom_left = grid[(LAYERS - 1) * HEADS]  # the axes are shared: the outer heat maps carry the labels
    assert [label.get_text() for label in bottom_left.get_xticklabels()] == attentions["source"]
    assert [label.get_text() for label in bottom_left.get_yticklabels()] == attentions["target"]


def test_command_writes_three_valid_pngs_of_the_figure_size(folder, tmp_path, capsys):
    output_dir = tmp_path / "maps"
    argv = [str(folder), "--source", ENGLISH[10], "--output_dir", str(output_dir)]
    argv += "--num_beams 1 --max_new_tokens 4 --dpi 50".split()
    assert attention_maps_command.main(argv) == 0
    paths = [output_dir / file_name for file_name, *_ in attention_maps.ATTENTION_KINDS.values()]
    assert capsys.readouterr().out.split() == [str(path) for path in paths]
    for path in paths:
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        height, width, _ = matplotlib.image.imread(path).shape
        assert height > 100 and width > 100

    # the decoder map of the model's own translation: <s> and at most 4 new tokens per side
    source_tokens = len(AutoTokenizer.from_pretrained(folder)(ENGLISH[10])["input_ids"])
    encoder_height, encoder_width, _ = matplotlib.image.imread(paths[0]).shape
    decoder_height, decoder_width, _ = matplotlib.image.imread(paths[1]).shape
    assert source_tokens > 5 and decoder_width < encoder_width and decoder_height < encoder_height


def test_a_picture_over_the_pixel_limit_is_refused_before_any_attention_is_computed(
    folder, tmp_path, capsys, monkeypatch
):
    computed = []
    monkeypatch.setattr(attention_maps, "compute_attentions", lambda *a, **k: computed.append(a))
    source = " ".join(ENGLISH * 8)  # about 2100 tokens: the grid would need about 25 GB
    argv = [str(folder), "--source", source, "--target", GERMAN[0], "--output_dir", str(tmp_path / "maps")]
    assert attention_maps_command.main(argv) == 1
    error = capsys.readouterr().err
    (refusal,) = [line for line in error.splitlines() if line.startswith("error: ")]  # after the tokenizer's warning
    assert refusal.startswith("error: The encoder self-attention picture would be ") and "Traceback" not in error
    assert "the limit is 268,435,456 pixels (1 GiB)" in error
    assert computed == [] and not (tmp_path / "maps").exists()


def test_command_rejects_a_folder_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "not_a_model").mkdir()
    argv = [str(tmp_path / "not_a_model"), "--source", "a sentence", "--output_dir", str(tmp_path / "maps")]
    assert attention_maps_command.main(argv) == 1
    assert "is not a model folder" in capsys.readouterr().err
    assert not (tmp_path / "maps").exists()


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--num_beams", "0", "must be an integer >= 1, got 0"),
        ("--max_new_tokens", "-3", "must be an integer >= 1, got -3"),
        ("--dpi", "0", "must be an integer >= 1, got 0"),
        ("--dpi", "1e3", "must be an integer >= 1, got '1e3'"),
        ("--num_beams", "65", "must be an integer from 1 to 64, got 65"),
        ("--max_new_tokens", "4097", "must be an integer from 1 to 4096, got 4097"),
    ],
)
def test_bad_numbers_are_refused_when_the_flags_are_parsed(tmp_path, capsys, flag, value, message):
    argv = [str(tmp_path), "--source", "a sentence", "--output_dir", str(tmp_path / "maps"), flag, value]
    with pytest.raises(SystemExit) as exit_info:
        attention_maps_command.main(argv)
    assert exit_info.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err
    assert not (tmp_path / "maps").exists()


def test_an_output_dir_that_is_a_file_is_refused_when_parsed(tmp_path, capsys):
    (tmp_path / "maps.png").write_bytes(b"a user's file")
    for output_dir in (tmp_path / "maps.png", tmp_path / "maps.png" / "sub"):
        with pytest.raises(SystemExit) as refused:
            attention_maps_command.main([str(tmp_path), "--source", "a sentence", "--output_dir", str(output_dir)])
        assert refused.value.code == 2
        assert f"{tmp_path / 'maps.png'} is a file, not a folder" in capsys.readouterr().err
    assert (tmp_path / "maps.png").read_bytes() == b"a user's file"


def test_weights_that_do_not_fit_config_json_are_named_in_the_message_itself(folder, tmp_path, capsys):
    edited = tmp_path / "edited"
    shutil.copytree(folder, edited)
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 7}))
    argv = [str(edited), "--source", ENGLISH[0], "--output_dir", str(tmp_path / "maps")]
    assert attention_maps_command.main(argv) == 1
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(f"error: cannot load a model and tokenizer from {edited}: its model.safetensors does not")
    saved, made = [config["vocab_size"], config["d_model"]], [config["vocab_size"] + 7, config["d_model"]]
    assert f"model.shared.weight is {saved} in model.safetensors, {made} by config.json" in error
    assert "above report" not in error


def test_a_folder_whose_code_differs_from_the_installed_code_gets_a_note(folder, tmp_path, capsys):
    edited = tmp_path / "edited"
    shutil.copytree(folder, edited)
    with (edited / "pipeline_vanilla_transformer.py").open("a") as code:
        code.write("# edited by hand\n")
    argv = [str(edited), "--source", ENGLISH[0], "--target", GERMAN[0], "--output_dir", str(tmp_path / "maps")]
    assert attention_maps_command.main(argv) == 0
    assert (
        f"note: {edited} holds model code that differs from the installed vanilla-transformer's "
        "(pipeline_vanilla_transformer.py)" in capsys.readouterr().err
    )


def test_a_previous_output_is_replaced_only_with_overwrite(folder, tmp_path, capsys):
    output_dir = tmp_path / "maps"
    argv = [str(folder), "--source", ENGLISH[0], "--target", GERMAN[0], "--output_dir", str(output_dir), "--dpi", "20"]
    assert attention_maps_command.main(argv) == 0
    assert attention_maps_command.main(argv) == 1
    assert f"error: {output_dir} holds a previous `vanilla-transformer attention-maps` output: add --overwrite" in (
        capsys.readouterr().err
    )
    assert attention_maps_command.main([*argv, "--overwrite"]) == 0
