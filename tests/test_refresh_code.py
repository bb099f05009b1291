"""`vanilla-transformer refresh-code`: a saved folder's code replaced by the installed one, checked by
decoding, the old files kept."""

import json
from pathlib import Path

from safetensors.torch import load_file

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from modeling_vanilla_transformer import __file__ as MODELING_FILE
from vanilla_transformer import refresh_code
from vanilla_transformer.commands import refresh_code as refresh_code_command
from vanilla_transformer.names import CODE_FILES
from vanilla_transformer.tokenization import load_tokenizer

from .fixtures.old_checkpoints import make_old_folder
from .helpers import CARD_VALUES, save_tiny_model_folder

OLD_CODE = "# saved by an older version of this project\n"


def test_refresh_replaces_the_code_files_keeps_the_old_ones_and_checks_the_decoding(tmp_path, capsys):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    modeling = folder / "modeling_vanilla_transformer.py"
    modeling.write_text(OLD_CODE + modeling.read_text())
    (folder / "fast_paths_vanilla_transformer.py").unlink()  # folders from before the fast paths lack the file

    assert refresh_code_command.main([str(folder)]) == 0

    for name in CODE_FILES:
        assert (folder / name).read_text() == (Path(MODELING_FILE).parent / name).read_text(), name
    (backup,) = (folder / refresh_code.BACKUP_FOLDER).iterdir()
    assert (backup / "modeling_vanilla_transformer.py").read_text().startswith(OLD_CODE)
    assert "decodes as the installed code" in capsys.readouterr().out


def test_refresh_refuses_a_folder_of_another_model_and_changes_nothing(tmp_path, capsys):
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "marian"}))
    before = {path.name: path.read_bytes() for path in folder.iterdir()}

    assert refresh_code_command.main([str(folder)]) == 1

    assert "holds a 'marian' model" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


def test_a_folder_saved_before_the_projections_were_separate_layers_refreshes_and_decodes_as_before(tmp_path, capsys):
    """Saved before issue 33, a folder holds self-attention's fused `qkv_proj` and encoder-decoder attention's fused
    `kv_proj`: refreshed, its new code loads them as a Hub user loads it and decodes the tokens of the model the
    folder was made from."""
    folder = save_tiny_model_folder(tmp_path / "model", CARD_VALUES)
    expected = refresh_code.decode(
        VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval(), load_tokenizer(folder)
    )
    make_old_folder(folder)
    assert any("qkv_proj" in key for key in load_file(folder / "model.safetensors"))

    assert refresh_code_command.main([str(folder)]) == 0

    assert "decodes as the installed code" in capsys.readouterr().out
    assert refresh_code.folder_decodes(folder) == expected
