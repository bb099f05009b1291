"""`vanilla-transformer refresh-code`: a saved folder's code replaced by the installed one, its weights and config
in the current format, checked by decoding with the installed code (never the folder's), the old files kept."""

import json
from pathlib import Path

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from modeling_vanilla_transformer import __file__ as MODELING_FILE
from vanilla_transformer.commands import refresh_code as refresh_code_command
from vanilla_transformer.data.tokenization import load_tokenizer
from vanilla_transformer.hub import refresh_code
from vanilla_transformer.mechanics.names import CODE_FILES, CUSTOM_GENERATE

from .fixtures.old_checkpoints import make_old_folder
from .helpers import CARD_VALUES, save_tiny_model_folder

OLD_CODE = "# saved by an older version of this project\n"


def files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def test_refresh_replaces_the_code_files_keeps_the_old_ones_and_checks_the_decoding(tmp_path, capsys):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    modeling = folder / "modeling_vanilla_transformer.py"
    modeling.write_text(OLD_CODE + modeling.read_text())
    (folder / CUSTOM_GENERATE).unlink()  # folders from before custom_generate lack it
    (folder / "fast_paths_vanilla_transformer.py").write_text(OLD_CODE)  # earlier releases wrote the fast paths

    assert refresh_code_command.main([str(folder)]) == 0

    for name in CODE_FILES:
        assert (folder / name).read_text() == (Path(MODELING_FILE).parent / name).read_text(), name
    assert (folder / CUSTOM_GENERATE).is_file()
    assert not (folder / "fast_paths_vanilla_transformer.py").exists()
    (backup,) = (folder / refresh_code.BACKUP_FOLDER).iterdir()
    assert (backup / "modeling_vanilla_transformer.py").read_text().startswith(OLD_CODE)
    assert (backup / "fast_paths_vanilla_transformer.py").read_text() == OLD_CODE
    assert "loads and decodes with the installed code" in capsys.readouterr().out


def test_refresh_refuses_a_folder_of_another_model_and_changes_nothing(tmp_path, capsys):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "marian"}))
    before = files(folder)

    assert refresh_code_command.main([str(folder)]) == 1

    assert "holds a 'marian' model" in capsys.readouterr().err
    assert files(folder) == before


def test_a_folder_saved_before_the_projections_were_separate_layers_refreshes_and_decodes_as_before(
    tmp_path, capsys, umask
):
    """Saved with fused projections, a folder holds self-attention's fused `qkv_proj` and encoder-decoder attention's fused
    `kv_proj`: refreshed, it holds the separate layers and decodes the tokens of the model it was made from."""
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    tokenizer = load_tokenizer(folder)
    expected = refresh_code.decode(
        VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval(), tokenizer
    )
    make_old_folder(folder)

    assert refresh_code_command.main([str(folder)]) == 0

    assert "fused qkv_proj/kv_proj attention weights" in capsys.readouterr().out
    refreshed = VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()
    assert refresh_code.decode(refreshed, tokenizer) == expected
    for path in (folder / "model.safetensors", folder / "config.json", folder / CUSTOM_GENERATE):
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path  # the user's umask, as every file they write


def test_refresh_never_runs_code_the_folder_points_at_and_rewrites_the_pointer(tmp_path, capsys):
    """A folder whose auto_map names a file of its own: the check loads the installed code, so that file never runs,
    and config.json then names the project's classes (the file itself is the user's and stays)."""
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    marker = tmp_path / "ran"
    (folder / "evil_modeling.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"]["AutoModelForSeq2SeqLM"] = "evil_modeling.Model"
    (folder / "config.json").write_text(json.dumps(config))

    assert refresh_code_command.main([str(folder)]) == 0

    assert not marker.exists()
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    assert auto_map == refresh_code.PROJECT_CODE["auto_map"]
    assert "auto_map rewritten to name the project's classes" in capsys.readouterr().out
    assert (folder / "evil_modeling.py").is_file()


def test_two_refreshes_in_the_same_second_keep_both_backups(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    assert refresh_code_command.main([str(folder)]) == 0
    assert refresh_code_command.main([str(folder)]) == 0
    assert len(list((folder / refresh_code.BACKUP_FOLDER).iterdir())) == 2


def test_refresh_refuses_a_backup_folder_that_is_a_link_out_of_the_folder(tmp_path, capsys):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    outside = tmp_path / "outside"
    outside.mkdir()
    (folder / refresh_code.BACKUP_FOLDER).symlink_to(outside)
    before = files(folder)

    assert refresh_code_command.main([str(folder)]) == 1

    assert "never through a link" in capsys.readouterr().err
    assert not any(outside.iterdir())
    assert files(folder) == before
