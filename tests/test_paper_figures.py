"""The paper's figures: each one's numbers are its equation's, computed by the project's own code; the command writes
every figure and index.md offline, and with --model the attention maps and beam search of that model."""

import errno
import json
import math
import time

import pytest
import torch

from vanilla_transformer.commands import paper_figures as paper_figures_command
from vanilla_transformer.paper import figures, measurements
from vanilla_transformer.paper.output import PAPER_FIGURES_RECORD

from .helpers import run_in_this_process, snapshot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MODEL_FIGURES = ["attention_encoder_self.png", "attention_decoder_self.png", "attention_cross.png", "alignment.png"]
MODEL_FIGURES += ["beam_search.png"]
ALL_FIGURES = ["positions.png", "scaling.png", "masks.png", "learning_rate.png", "label_smoothing.png"]
ALL_FIGURES += ["complexity.png", *MODEL_FIGURES]


@pytest.mark.parametrize(("pos", "i"), [(0, 0), (1, 0), (7, 3), (50, 100), (99, 255)])
def test_the_position_table_is_equation_3_5_at_pos_and_i(pos, i):
    table = measurements.paper_position_table(100, 512)
    angle = pos / 10000 ** (2 * i / 512)
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_the_demo_model_adds_the_same_table():
    model, _ = measurements.demo_model_and_tokenizer()
    rows = measurements.model_position_rows(model, 20)
    assert torch.equal(rows, measurements.paper_position_table(20, model.config.d_model))


def test_one_matrix_per_offset_maps_every_position_to_the_one_k_later():
    errors = measurements.offset_linearity(measurements.paper_position_table(1000, 64), [1, 5, 20])
    assert max(errors.values()) < 1e-5
    noise = torch.randn(1000, 64, generator=torch.Generator().manual_seed(0))
    assert min(measurements.offset_linearity(noise, [1]).values()) > 0.5  # the check can fail


def test_the_variance_of_q_dot_k_is_d_k_and_the_scaling_keeps_the_softmax_from_saturating():
    variances = measurements.dot_product_variances([16, 256])
    assert variances[16] == pytest.approx(16, rel=0.1) and variances[256] == pytest.approx(256, rel=0.1)
    saturation = measurements.softmax_saturation([4, 512], keys=32)
    assert saturation["unscaled"][512] > 0.8 > 0.3 > saturation["scaled"][512]
    assert saturation["scaled"][512] == pytest.approx(saturation["scaled"][4], abs=0.1)


def test_the_masks_hide_padding_and_later_positions_and_their_weights_are_zero():
    model, tokenizer = measurements.demo_model_and_tokenizer()
    sources, targets = zip(*figures.MASK_BATCH, strict=True)
    built = measurements.built_masks(model, tokenizer, sources, targets)
    source_mask, target_mask = built["source_mask"].bool(), built["target_mask"].bool()
    batch, source_length = source_mask.shape
    target_length = target_mask.shape[1]
    assert built["encoder"].shape == (batch, source_length, source_length)
    assert built["decoder"].shape == (batch, target_length, target_length)
    assert not source_mask.all()  # a padded batch
    assert torch.equal(built["encoder"], source_mask[:, None, :].expand(-1, source_length, -1))
    causal = torch.ones(target_length, target_length, dtype=torch.bool).tril()
    assert torch.equal(built["decoder"], causal & target_mask[:, None, :])
    assert torch.all(built["encoder_weights"][~built["encoder"]] == 0)
    assert torch.all(built["decoder_weights"][~built["decoder"]] == 0)


@pytest.mark.parametrize(
    ("step", "expected"),
    [(1, 512**-0.5 * 4000**-1.5), (4000, 512**-0.5 * 4000**-0.5), (100_000, 512**-0.5 * 100_000**-0.5)],
)
def test_the_learning_rate_is_equation_3_at_step(step, expected):
    assert measurements.learning_rates([step], 512, 4000) == [pytest.approx(expected, rel=1e-12)]


def test_the_smoothed_target_keeps_one_minus_epsilon_on_the_correct_token_and_sums_to_one():
    target = measurements.smoothed_target(vocab_size=10, target=3, smoothing=0.1)
    assert target.sum().item() == pytest.approx(1.0, abs=1e-6)
    assert target[3].item() == pytest.approx(0.9 + 0.1 / 10, abs=1e-6)
    assert torch.allclose(target[torch.arange(10) != 3], torch.full((9,), 0.01), atol=1e-6)


def test_the_smoothed_loss_is_lowest_short_of_perplexity_one():
    probabilities = [0.5, 0.85, 0.901, 0.95, 0.999]
    curve = measurements.loss_against_perplexity(100, probabilities, 0.1)
    assert curve["cross_entropy"] == pytest.approx([-math.log(p) for p in probabilities], abs=1e-5)
    assert curve["perplexity"] == pytest.approx([1 / p for p in probabilities], rel=1e-5)
    assert min(range(5), key=lambda i: curve["smoothed_loss"][i]) == 2  # p = 1 - 0.1 + 0.1 / 100


def test_every_layer_is_timed_at_every_length():
    timings = measurements.layer_timings(16, (4, 8), batch=1, repeats=1)
    assert len(timings) == 5 and all(set(times) == {4, 8} and min(times.values()) > 0 for times in timings.values())


def test_the_beam_holds_num_beams_hypotheses_a_step_ranked_by_the_length_penalised_score():
    model, tokenizer = measurements.demo_model_and_tokenizer()
    beams = measurements.beam_steps(model, tokenizer, "the dog sleeps", steps=3, num_beams=3, length_penalty=0.6)
    assert [len(hypotheses) for hypotheses in beams] == [3, 3, 3]
    for step, hypotheses in enumerate(beams, start=1):
        scores = [h["score"] for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        for h in hypotheses:
            if len(h["tokens"]) == step:  # still running: log P / length^alpha
                assert h["score"] == pytest.approx(h["log_probability"] / step**0.6, abs=1e-4)


def _check_written(folder, names):
    for name in names:
        assert (folder / name).read_bytes()[:8] == PNG_SIGNATURE, name
    index = (folder / "index.md").read_text()
    assert all(f"]({name})" in index for name in names)
    assert set(json.loads((folder / PAPER_FIGURES_RECORD).read_text())["files"]) >= {*names, "index.md"}


@pytest.mark.slow
def test_the_command_writes_every_figure_without_a_model_within_30_seconds(tmp_path, capsys):
    start = time.perf_counter()
    assert paper_figures_command.main([str(tmp_path / "figures")]) == 0
    assert time.perf_counter() - start < 30
    _check_written(tmp_path / "figures", ALL_FIGURES)
    assert set(json.loads((tmp_path / "figures" / PAPER_FIGURES_RECORD).read_text())["files"]) == {
        *ALL_FIGURES,
        "index.md",
    }
    assert len(capsys.readouterr().out.split()) == len(ALL_FIGURES) + 1


def test_with_a_model_the_attention_and_beam_figures_are_that_models(folder, tmp_path, monkeypatch):
    for name in ("positions", "scaling", "complexity", "label_smoothing", "learning_rate"):
        monkeypatch.setattr(figures, name, lambda name=name: (_blank(), figures.Item(f"{name}.png", name, "")))
    seen = {}
    original = figures.attention_maps

    def attention_maps(model, tokenizer, *args):
        seen["model"] = model.name_or_path
        return original(model, tokenizer, *args)

    monkeypatch.setattr(figures, "attention_maps", attention_maps)
    output = tmp_path / "figures"
    argv = [str(output), "--model", str(folder), "--source", "the house is small", "--layer", "1", "--dpi", "40"]
    assert paper_figures_command.main(argv) == 0
    assert seen["model"] == str(folder)
    _check_written(output, MODEL_FIGURES)
    assert "layer 1" in (output / "index.md").read_text()


def _blank():
    from matplotlib.figure import Figure

    return Figure(figsize=(1, 1))


def test_overwrite_replaces_a_previous_output_only(tmp_path, monkeypatch, capsys):
    for name in ("positions", "scaling", "complexity", "label_smoothing", "learning_rate", "masks"):
        monkeypatch.setattr(figures, name, lambda *a, name=name: (_blank(), figures.Item(f"{name}.png", name, "")))
    monkeypatch.setattr(figures, "attention_maps", lambda *a: [])
    monkeypatch.setattr(figures, "beam_search_table", lambda *a: (_blank(), figures.Item("beam_search.png", "b", "")))
    output = tmp_path / "figures"
    assert paper_figures_command.main([str(output)]) == 0
    assert paper_figures_command.main([str(output)]) == 1
    assert "--overwrite" in capsys.readouterr().err
    assert paper_figures_command.main([str(output), "--overwrite"]) == 0
    (output / "notes.txt").write_text("mine")
    assert paper_figures_command.main([str(output), "--overwrite"]) == 1
    assert "notes.txt" in capsys.readouterr().err and (output / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("listed", ["../victim.txt", "ABSOLUTE", "link/victim.txt"])
def test_overwrite_never_deletes_a_file_its_record_names_outside_the_folder(tmp_path, monkeypatch, capsys, listed):
    from vanilla_transformer.mechanics.integrity import sha256_of

    for name in ("positions", "scaling", "complexity", "label_smoothing", "learning_rate", "masks"):
        monkeypatch.setattr(figures, name, lambda *a, name=name: (_blank(), figures.Item(f"{name}.png", name, "")))
    monkeypatch.setattr(figures, "attention_maps", lambda *a: [])
    monkeypatch.setattr(figures, "beam_search_table", lambda *a: (_blank(), figures.Item("beam_search.png", "b", "")))
    output, victim = tmp_path / "figures", tmp_path / "victim.txt"
    assert paper_figures_command.main([str(output)]) == 0
    victim.write_text("a user's file")
    (output / "link").symlink_to(tmp_path)
    record = json.loads((output / PAPER_FIGURES_RECORD).read_text())
    name = str(victim) if listed == "ABSOLUTE" else listed
    record["files"][name] = {"size": victim.stat().st_size, "sha256": sha256_of(victim)}
    if listed != "link/victim.txt":
        (output / "link").unlink()
    (output / PAPER_FIGURES_RECORD).write_text(json.dumps(record))
    assert paper_figures_command.main([str(output), "--overwrite"]) == 1
    assert name in capsys.readouterr().err
    assert victim.read_text() == "a user's file"


@pytest.mark.parametrize("flag", ["--source", "--target"])
def test_a_sentence_past_the_models_positions_is_refused_before_the_folder_is_made(folder, tmp_path, capsys, flag):
    output = tmp_path / "figures"
    argv = [str(output), "--model", str(folder), flag, "word " * 50_000]
    assert paper_figures_command.main(argv) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{flag} is over 64 tokens, the model's positions" in errors[0]
    assert not output.exists()


def test_a_layer_the_model_lacks_is_named_as_given_and_no_folder_is_made(folder, tmp_path, capsys):
    output = tmp_path / "figures"
    assert paper_figures_command.main([str(output), "--model", str(folder), "--layer", "99"]) == 1
    assert "--layer 99: the model has" in capsys.readouterr().err
    assert not output.exists()


def test_a_resolution_past_print_quality_is_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit):
        paper_figures_command.main([str(tmp_path / "figures"), "--dpi", "100000"])
    assert "--dpi: must be an integer from 1 to 600" in capsys.readouterr().err
    assert not (tmp_path / "figures").exists()


def _blank_figures(monkeypatch):
    for name in ("positions", "scaling", "complexity", "label_smoothing", "learning_rate", "masks"):
        monkeypatch.setattr(figures, name, lambda *a, name=name: (_blank(), figures.Item(f"{name}.png", name, "")))
    monkeypatch.setattr(figures, "attention_maps", lambda *a: [])
    monkeypatch.setattr(figures, "beam_search_table", lambda *a: (_blank(), figures.Item("beam_search.png", "b", "")))


def test_a_full_disk_is_one_error_naming_the_folder_and_leaves_the_previous_output_for_overwrite(
    tmp_path, monkeypatch
):
    _blank_figures(monkeypatch)
    output = tmp_path / "figures"
    assert paper_figures_command.main([str(output)]) == 0
    previous = snapshot(output)
    original = figures.write_figures

    def disk_fills(folder, *args):
        (folder / "positions.png").write_bytes(b"half a picture")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(figures, "write_figures", disk_fills)
    result = run_in_this_process(paper_figures_command.main, [str(output), "--overwrite"])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert (
        result.returncode == 1
        and "Traceback" not in result.stderr
        and len(errors) == 1
        and f"no space left on device while writing {output}" in errors[0]
    )
    assert "free space" in errors[0] and snapshot(output) == previous
    monkeypatch.setattr(figures, "write_figures", original)
    assert paper_figures_command.main([str(output), "--overwrite"]) == 0


def test_a_folder_that_may_not_be_written_is_one_error_naming_it_and_the_fix(tmp_path, monkeypatch):
    def read_only(folder, *args):  # as chmod 0o555 on the parent does, but also where the tests run as root
        raise PermissionError(errno.EACCES, "Permission denied", str(folder / "positions.png"))

    monkeypatch.setattr(figures, "write_figures", read_only)
    output = tmp_path / "figures"
    result = run_in_this_process(paper_figures_command.main, [str(output)])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert len(errors) == 1 and errors[0].startswith(f"error: {output} cannot be written (Permission denied")
    assert "give a folder you may write to" in errors[0] and not output.exists()
