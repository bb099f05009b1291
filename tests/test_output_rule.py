"""The one output-folder rule (vanilla_transformer/mechanics/outputs.py) that every command writing a folder applies:
never an input, never through a link, new or empty, or with --overwrite a previous output of the same command only.
Which commands write is read from their parsers (the argument that names the output), and each is run on a folder
holding a user's file."""

import argparse

import pytest

from vanilla_transformer.commands.main import SUBCOMMANDS, subcommand_main
from vanilla_transformer.mechanics.outputs import OutputFolderError, check_output_folder

from .helpers import run_in_this_process

OUTPUT_NAMES = ("output", "output_dir")  # the dest of an argument that names what a command writes

# every command that writes a file or folder, and the argument that names it: a new command with an output is added
# here (test_the_commands_that_write_are_the_declared_ones), and its folder is then checked by the rule (below)
WRITERS = {
    "train": "--output_dir",
    "prepare": "--output_dir",
    "translate": "--output",  # a file; checked by tests/test_translate_output.py, not here (its rule is in the works)
    "attention-maps": "--output_dir",
    "paper-figures": "output_dir",
    "sweep": "--output_dir",
    "export-ctranslate2": "output_dir",
    "export-onnx": "output_dir",
    "convert": "output_dir",
    "space": "--output_dir",
}
IN_PLACE = {"refresh-code": "folders"}  # replaces files inside the folders it is given, by the rule without a flag


class Parsed(BaseException):
    """Raised where a command parses its arguments: the parser, before the command does anything."""

    def __init__(self, parser):
        super().__init__()
        self.parser = parser


def command_parser(name, monkeypatch) -> argparse.ArgumentParser:
    """The argparse parser that the subcommand `name` builds, caught as it parses (nothing of the command runs)."""

    def caught(parser, *args, **kwargs):
        raise Parsed(parser)

    with monkeypatch.context() as patched:
        patched.setattr(argparse.ArgumentParser, "parse_known_args", caught)
        patched.setattr(argparse.ArgumentParser, "parse_args", caught)
        with pytest.raises(Parsed) as parsed:
            subcommand_main(name)([])
    return parsed.value.parser


def output_argument(parser: argparse.ArgumentParser) -> str | None:
    """How the argument naming the parser's output is written (`--output_dir`, or the positional `output_dir`)."""
    found = [action for action in parser._actions if action.dest in OUTPUT_NAMES]
    assert len(found) <= 1, [action.dest for action in found]
    return next((action.option_strings[0] if action.option_strings else action.dest for action in found), None)


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


def test_an_empty_name_is_refused_not_taken_for_the_current_folder():
    with pytest.raises(OutputFolderError, match="name is empty"):
        check("", overwrite=True)


def test_the_commands_that_write_are_the_declared_ones(monkeypatch):
    found = {name: output_argument(command_parser(name, monkeypatch)) for name in SUBCOMMANDS}
    assert {name: argument for name, argument in found.items() if argument} == WRITERS
    for name, dest in IN_PLACE.items():
        assert dest in {action.dest for action in command_parser(name, monkeypatch)._actions}


def arguments(name: str, output: str, model: str) -> list[str]:
    """The cheapest arguments with which `name` would write into `output` (with --overwrite where it has it)."""
    return {
        # train's --overwrite deletes only what runs of ours wrote and keeps a user's other files beside the new run
        # (tests/test_output_folder.py): without it, a folder holding anything but a run to continue is refused
        "train": ["--output_dir", output],
        "prepare": ["--output_dir", output],
        "attention-maps": [model, "--source", "a sentence", "--output_dir", output, "--overwrite"],
        "paper-figures": [output, "--overwrite"],
        "sweep": ["--rows", "base", "--steps", "1", "--output_dir", output],
        "export-ctranslate2": [model, output, "--overwrite"],
        "export-onnx": [model, output, "--overwrite"],
        "convert": [model, output, "--overwrite"],
        "space": ["your-name/vanilla-en-de", "--output_dir", output, "--overwrite"],
        "refresh-code": [output],
    }[name]


@pytest.mark.parametrize("name", sorted({*WRITERS, *IN_PLACE} - {"translate"}))
def test_a_folder_holding_a_users_file_is_refused_by_every_command_in_one_error_line(name, folder, tmp_path):
    output = tmp_path / "output"
    output.mkdir()
    (output / "thesis.txt").write_text("years of work")
    result = run_in_this_process(subcommand_main(name), arguments(name, str(output), str(folder)))
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert len(errors) == 1 and str(output) in errors[0], result.stderr[-2000:]
    assert [path.name for path in output.iterdir()] == ["thesis.txt"]
    assert (output / "thesis.txt").read_text() == "years of work"
