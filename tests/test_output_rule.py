"""The one output-folder rule (vanilla_transformer/mechanics/outputs.py) that every command writing a folder applies:
never an input, never through a link, new or empty, or with --overwrite a previous output of the same command only."""

import ast

import pytest

from vanilla_transformer.mechanics.outputs import OutputFolderError, check_output_folder

from .helpers import ROOT

# the modules that decide where each command may write: convert, export-ctranslate2, space, refresh-code, train
COMMAND_FOLDERS = (
    "vanilla_transformer/converters/output_folder.py",
    "vanilla_transformer/converters/export_ctranslate2.py",
    "vanilla_transformer/serving/space.py",
    "vanilla_transformer/hub/refresh_code.py",
    "vanilla_transformer/training/output_folder.py",
)


def ours(folder):
    """A previous output: a folder holding `made-by-us` and nothing else."""
    others = sorted(path.name for path in folder.iterdir() if path.name != "made-by-us")
    return f"it holds {', '.join(others)}" if others else None


def check(folder, overwrite=False, **kwargs):
    return check_output_folder(folder, overwrite=overwrite, why_not_previous=ours, previous="a previous run", **kwargs)


def test_a_new_or_empty_folder_is_written(tmp_path):
    assert check(tmp_path / "new") is False
    (tmp_path / "empty").mkdir()
    assert check(tmp_path / "empty") is False


def test_a_previous_output_is_replaced_only_with_overwrite_and_the_refusal_says_so(tmp_path):
    (tmp_path / "made-by-us").write_text("x")
    with pytest.raises(OutputFolderError, match="holds a previous run: add --overwrite to replace it"):
        check(tmp_path)
    assert check(tmp_path, overwrite=True) is True


def test_anything_else_is_refused_even_with_overwrite_naming_it(tmp_path):
    (tmp_path / "made-by-us").write_text("x")
    (tmp_path / "thesis.tex").write_text("years of work")
    for overwrite in (False, True):
        with pytest.raises(OutputFolderError, match=r"not a previous run \(it holds thesis.tex\)") as refused:
            check(tmp_path, overwrite=overwrite)
        assert "--overwrite" not in str(refused.value)  # the flag would not help: it is not offered


@pytest.mark.parametrize("where", ["is", "inside", "holds"])
def test_an_input_folder_is_never_the_output_nor_inside_it_nor_holding_it(tmp_path, where):
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    output = {"is": source, "inside": source / "sub", "holds": tmp_path}[where]
    relation = {"is": "is", "inside": "is inside", "holds": "holds"}[where]
    with pytest.raises(OutputFolderError, match=f"{relation} the source"):
        check(output, overwrite=True, inputs=[("the source", source)])


def test_a_link_or_a_file_where_the_folder_goes_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OutputFolderError, match="is a symbolic link"):
        check(tmp_path / "link", overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputFolderError, match="exists and is not a folder"):
        check(tmp_path / "file", overwrite=True)


def test_bookkeeping_does_not_make_a_folder_non_empty(tmp_path):
    (tmp_path / ".lock").write_text("")
    (tmp_path / ".record.json.tmp1").write_text("")
    assert check(tmp_path, ignore=(".lock", ".record.json.*")) is False


def test_a_command_that_always_replaces_names_what_the_folder_is_not_without_a_flag(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(OutputFolderError, match=r"is not a previous run: it holds notes.txt$"):
        check(tmp_path, overwrite=True, flag=None)


@pytest.mark.parametrize("path", COMMAND_FOLDERS)
def test_every_command_that_writes_a_folder_decides_through_the_one_rule(path):
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "vanilla_transformer.mechanics.outputs"
        for alias in node.names
    }
    assert "check_output_folder" in imported


def test_an_empty_name_is_refused_not_taken_for_the_current_folder():
    with pytest.raises(OutputFolderError, match="name is empty"):
        check("", overwrite=True)
