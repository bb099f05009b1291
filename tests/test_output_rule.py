"""The one output-folder rule (vanilla_transformer/mechanics/outputs.py) that every command writing a folder applies:
never an input, never through a link, new or empty, or with --overwrite a previous output of the same command only.
Which commands write is read from their parsers (the argument that names the output), at collection; each one found is
run on a folder holding a user's file (refused), and (slow) twice into its own output: the second run is refused
unchanged, then with --overwrite replaces it (`sweep` continues its own folder instead, by its rule)."""

import argparse
from pathlib import Path

import pytest

from vanilla_transformer.commands.main import SUBCOMMANDS, subcommand_main
from vanilla_transformer.mechanics.integrity import sha256_of
from vanilla_transformer.mechanics.outputs import (
    OutputFolderError,
    check_output_folder,
    why_not_recorded,
    write_record,
)

from .helpers import FAST, TINY_RUN, corpus_lines, run_in_this_process

OUTPUT_NAMES = ("output", "output_dir")  # the dest of an argument that names what a command writes
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


def discovered() -> tuple[dict[str, str], set[str]]:
    """Every subcommand that writes a file or folder, read from its parser: {name: the argument naming the output},
    and the names of those whose parser has --overwrite. Run at collection, so that a new command is tested at once."""
    with pytest.MonkeyPatch.context() as patched:
        parsers = {name: command_parser(name, patched) for name in SUBCOMMANDS}
    writers = {name: argument for name, parser in parsers.items() if (argument := output_argument(parser))}
    flag = {name for name in writers if "overwrite" in {action.dest for action in parsers[name]._actions}}
    return writers, flag


WRITERS, HAS_OVERWRITE = discovered()


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


def test_a_record_names_what_its_command_wrote_and_anything_changed_or_added_makes_the_folder_not_its(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "sub" / "b.txt").write_text("b")
    write_record(tmp_path, ".record.json", "vanilla-transformer x")
    assert why_not_recorded(tmp_path, ".record.json", "vanilla-transformer x") is None
    assert "is not a record of `vanilla-transformer y`" in why_not_recorded(
        tmp_path, ".record.json", "vanilla-transformer y"
    )
    (tmp_path / "c.txt").write_text("c")
    assert "it holds c.txt, which" in why_not_recorded(tmp_path, ".record.json", "vanilla-transformer x")
    (tmp_path / "c.txt").unlink()
    (tmp_path / "sub" / "b.txt").write_text("B")
    assert "sub/b.txt does not match the sha256" in why_not_recorded(tmp_path, ".record.json", "vanilla-transformer x")


def test_a_record_that_is_a_link_is_no_record(tmp_path):
    folder, elsewhere = tmp_path / "folder", tmp_path / "elsewhere"
    for place in (folder, elsewhere):
        place.mkdir()
        (place / "a.txt").write_text("a")
    write_record(elsewhere, ".record.json", "vanilla-transformer x")
    (folder / ".record.json").symlink_to(elsewhere / ".record.json")
    assert "is a symbolic link" in why_not_recorded(folder, ".record.json", "vanilla-transformer x")


@pytest.mark.parametrize(
    "earlier",
    [
        {"written_by": "vanilla-transformer translate, chunks 1", "files": "sized"},  # a translated dataset's
        {"written_by": "vanilla-transformer translate", "files": "sha256"},  # a Space export's: sha256 alone
    ],
)
def test_an_earlier_releases_record_is_read_as_todays(tmp_path, earlier):
    import json

    (tmp_path / "a.txt").write_text("a")
    entry = (
        {"size": 1, "sha256": sha256_of(tmp_path / "a.txt")}
        if earlier["files"] == "sized"
        else sha256_of(tmp_path / "a.txt")
    )
    (tmp_path / ".record.json").write_text(json.dumps({**earlier, "files": {"a.txt": entry}}))
    assert why_not_recorded(tmp_path, ".record.json", "vanilla-transformer translate") is None
    (tmp_path / "a.txt").write_text("b")
    assert "does not match the sha256" in why_not_recorded(tmp_path, ".record.json", "vanilla-transformer translate")


def test_the_commands_that_write_are_found_and_each_has_its_cheapest_arguments(monkeypatch):
    """A command whose parser names an output is tested below; one without an entry in `arguments` fails there."""
    assert {"train", "prepare", "translate", "convert", "export-onnx"} <= set(WRITERS)  # the discovery still works
    assert set(WRITERS) == set(CHEAPEST) - set(IN_PLACE), "add the cheapest arguments of a new writer to CHEAPEST"
    for name, dest in IN_PLACE.items():
        assert dest in {action.dest for action in command_parser(name, monkeypatch)._actions}


# The cheapest arguments with which each command writes into OUTPUT (MODEL: a saved model folder, SOURCE: a folder
# `convert` reads, DATA: a JSON Lines file of a `text` column), without --overwrite; `translate` names a folder (no
# suffix), which it writes as a dataset's save_to_disk folder under the rule (serving/corpus_output.py, check_output).
CHEAPEST = {
    "train": ["--output_dir", "OUTPUT", *TINY_RUN, "--max_steps", "1", "--save_steps", "1000"],
    "prepare": ["--data_dir", "CORPUS", "--output_dir", "OUTPUT", "--validation_split", "val", "--vocab_size", "300"],
    "translate": ["MODEL", "--data_files", "DATA", "--column", "text", "--output", "OUTPUT", *FAST],
    "attention-maps": ["MODEL", "--source", "a sentence", "--output_dir", "OUTPUT"],
    "paper-figures": ["OUTPUT"],
    "sweep": "--rows base --scale tiny --steps 1 --synthetic_pairs 400 --vocab_size 300 --output_dir OUTPUT".split(),
    "export-ctranslate2": ["MODEL", "OUTPUT"],
    "export-onnx": ["MODEL", "OUTPUT"],
    "convert": ["SOURCE", "OUTPUT"],
    "space": ["your-name/vanilla-en-de", "--output_dir", "OUTPUT"],
    "refresh-code": ["OUTPUT"],
}


def arguments(name: str, **paths) -> list[str]:
    """CHEAPEST[name] with its placeholders filled from `paths` (output=..., model=..., ...)."""
    if name not in CHEAPEST:
        pytest.fail(f"the command {name!r} writes a folder but has no cheapest arguments in CHEAPEST: add them")
    return [str(paths[word.lower()]) if word.isupper() and word.lower() in paths else word for word in CHEAPEST[name]]


@pytest.fixture
def places(folder, tmp_path) -> dict:
    """What the cheapest arguments read: the model folder, a dataset's file (the source `convert` and the corpus
    `prepare` read are fixtures of their own, made only for them)."""
    import datasets

    (tmp_path / "data").mkdir()
    data = tmp_path / "data" / "rows.jsonl"
    datasets.Dataset.from_dict({"text": corpus_lines(6)}).to_json(str(data), lines=True)
    return {"model": folder, "source": folder, "data": data, "corpus": tmp_path / "data"}


def refusals(name: str, result) -> list[str]:
    assert result.returncode != 0 and "Traceback" not in result.stderr, (name, result.stderr[-2000:])
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def snapshot(output: Path) -> dict[str, bytes]:
    return {str(path.relative_to(output)): path.read_bytes() if path.is_file() else b"" for path in output.rglob("*")}


@pytest.mark.parametrize("name", sorted({*WRITERS, *IN_PLACE}))
def test_a_folder_holding_a_users_file_is_refused_by_every_command_in_one_error_line(name, places, tmp_path):
    output = tmp_path / "output"
    output.mkdir()
    (output / "thesis.txt").write_text("years of work")
    # with --overwrite where the command has it, which never makes a user's folder an output; but train's --overwrite
    # deletes only what runs of ours wrote and keeps a user's other files beside the new run
    # (tests/test_output_folder.py): without it, a folder holding anything but a run to continue is refused
    overwrite = ["--overwrite"] if name in HAS_OVERWRITE and name != "train" else []
    result = run_in_this_process(subcommand_main(name), [*arguments(name, output=output, **places), *overwrite])
    errors = refusals(name, result)
    assert len(errors) == 1 and str(output) in errors[0], (name, result.stderr[-2000:])
    assert [path.name for path in output.iterdir()] == ["thesis.txt"]
    assert (output / "thesis.txt").read_text() == "years of work"


@pytest.fixture
def cheap(request, places, monkeypatch) -> dict:
    """`places`, and what makes a command's real run cheap: the figures drawn blank, a real source for `convert` and a
    real corpus for `prepare` (fixtures made only for the command that needs them)."""
    name = request.node.callspec.params["name"]
    if name == "export-ctranslate2":
        pytest.importorskip("ctranslate2")
    if name == "export-onnx":  # the onnx extra: CI runs this file again where it is installed
        for module in ("onnx", "onnxruntime", "onnxscript"):
            pytest.importorskip(module)
    if name == "convert":
        places = {**places, "source": request.getfixturevalue("marian_source")}
    if name == "prepare":
        places = {**places, "corpus": request.getfixturevalue("corpus_dir")}
    if name == "paper-figures":
        from matplotlib.figure import Figure

        from vanilla_transformer.paper import figures

        def blank(file):
            return lambda *_: (Figure(figsize=(1, 1)), figures.Item(file, file, ""))

        for figure in ("positions", "scaling", "complexity", "label_smoothing", "learning_rate", "masks"):
            monkeypatch.setattr(figures, figure, blank(f"{figure}.png"))
        monkeypatch.setattr(figures, "attention_maps", lambda *_: [])
        monkeypatch.setattr(figures, "beam_search_table", blank("beam_search.png"))
    return places


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_commands_own_previous_output_is_refused_unchanged_and_replaced_only_with_overwrite(name, cheap, tmp_path):
    output = tmp_path / "output"
    argv = arguments(name, output=output, **cheap)
    first = run_in_this_process(subcommand_main(name), argv)
    assert first.returncode == 0 and output.is_dir(), (name, first.stderr[-3000:])
    before = snapshot(output)

    again = run_in_this_process(subcommand_main(name), argv)
    if name == "sweep":
        # a sweep's own folder is continued in place, never replaced, with no flag (training/sweep.py,
        # claim_sweep_dir): a finished row is read, not trained again; the table and plots are written anew
        assert again.returncode == 0 and "finished earlier" in again.stdout, (name, again.stderr[-3000:])
        assert {path: data for path, data in snapshot(output).items() if path.startswith("runs")} == {
            path: data for path, data in before.items() if path.startswith("runs")
        }
        assert name not in HAS_OVERWRITE
        return
    # train: a finished run's folder is refused like any other command's output (a stopped run is continued instead,
    # with --resume_from_checkpoint, tests/test_checkpoints.py); its --overwrite then deletes only what runs of ours
    # wrote (tests/test_output_folder.py)
    errors = refusals(name, again)
    assert len(errors) == 1 and str(output) in errors[0], (name, again.stderr[-2000:])
    if name in HAS_OVERWRITE:
        assert "--overwrite" in errors[0], (name, errors)
    assert snapshot(output) == before, name

    if name in HAS_OVERWRITE:
        replaced = run_in_this_process(subcommand_main(name), [*argv, "--overwrite"])
        assert replaced.returncode == 0, (name, replaced.stderr[-3000:])
