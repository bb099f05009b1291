"""What every command shares: `--help` without torch or transformers, one wrapper that turns a refusal into `error:`
and exit 1, and one root of every refusal the library makes."""

import importlib
import inspect
import subprocess
import sys

import pytest

from vanilla_transformer.commands.main import SUBCOMMANDS
from vanilla_transformer.commands.runner import MissingExtra, command, need
from vanilla_transformer.mechanics.errors import VanillaTransformerError

from .helpers import ROOT

HEAVY = ("torch", "transformers")


def modules_loaded_by(code: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after running `code` (output silenced)."""
    probe = (
        f"{code}\nimport sys\nprint(' '.join(sorted({{name.split('.')[0] for name in sys.modules}})), file=sys.stderr)"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return set(result.stderr.strip().splitlines()[-1].split())


def test_importing_the_library_imports_neither_torch_nor_transformers():
    loaded = modules_loaded_by("import vanilla_transformer, vanilla_transformer.commands.main")
    assert "vanilla_transformer" in loaded
    assert not loaded & set(HEAVY)


@pytest.mark.parametrize("subcommand", [None, *SUBCOMMANDS])
def test_help_imports_neither_torch_nor_transformers(subcommand):
    argv = ["--help"] if subcommand is None else [subcommand, "--help"]
    code = (
        f"from vanilla_transformer.commands.main import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
    )
    loaded = modules_loaded_by(code)
    assert "vanilla_transformer" in loaded
    assert not loaded & set(HEAVY), f"{' '.join(argv)} imported {loaded & set(HEAVY)}"


def test_register_makes_the_auto_classes_load_a_folder_without_remote_code(tmp_path, tiny_model):
    tiny_model.save_pretrained(tmp_path)
    code = (
        "import vanilla_transformer\nvanilla_transformer.register()\nfrom transformers import AutoModelForSeq2SeqLM\n"
        f"print(type(AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path)!r})).__name__)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.stdout.strip() == "VanillaTransformerForConditionalGeneration", result.stderr[-2000:]


def test_a_refusal_is_printed_as_one_error_line_and_exits_1(capsys):
    @command
    def main(argv):
        raise VanillaTransformerError("--input x.txt: no such file")

    assert main([]) == 1
    assert capsys.readouterr().err == "error: --input x.txt: no such file\n"


def test_a_bug_keeps_its_traceback():
    @command
    def main(argv):
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        main([])


def test_a_missing_extra_names_the_pip_command():
    with pytest.raises(MissingExtra, match=r"pip install 'vanilla-transformer\[demo\]'"):
        need("no_such_module_anywhere", "demo", "the demo")


def library_exceptions() -> list[type]:
    found = set()
    for path in sorted((ROOT / "vanilla_transformer").rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if "metrics" in name or name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, Exception) and value.__module__ == name:
                found.add(value)
    return sorted(found, key=lambda error: f"{error.__module__}.{error.__qualname__}")


def test_every_refusal_of_the_library_derives_from_the_one_root():
    errors = library_exceptions()
    assert len(errors) >= 15
    control_flow = {"StdoutClosed"}  # a reader that went away: the command stops quietly, it refuses nothing
    refusals = [error for error in errors if error.__qualname__ not in control_flow]
    assert [error.__qualname__ for error in refusals if not issubclass(error, VanillaTransformerError)] == []


def test_the_evaluations_paper_decoding_is_the_pipelines():
    """The settings state the paper's beam and length penalty without importing the pipeline file (and torch)."""
    from pipeline_vanilla_transformer import PAPER_DECODING
    from vanilla_transformer.training.settings import EvaluationSettings

    assert EvaluationSettings().final_decoding == {
        name: PAPER_DECODING[name] for name in ("num_beams", "length_penalty")
    }


def test_a_preset_is_checked_against_the_config_files_presets():
    """--preset's names are read from the config file only when a value is given (so --help needs no transformers)."""
    import argparse

    from configuration_vanilla_transformer import PRESETS
    from vanilla_transformer.commands.arguments import preset_name

    assert [preset_name(name) for name in PRESETS] == list(PRESETS)
    with pytest.raises(argparse.ArgumentTypeError, match="must be one of"):
        preset_name("huge")


@pytest.mark.parametrize(
    "module, argv, old, dest",
    [
        ("vanilla_transformer.commands.export_ctranslate2", ["MODEL", "OUT", "--force"], "--force", None),
        ("vanilla_transformer.commands.arguments", ["--overwrite_output_dir"], "--overwrite_output_dir", "output"),
    ],
)
def test_an_old_overwrite_flag_still_works_with_a_warning(monkeypatch, capsys, module, argv, old, dest):
    if dest is None:  # the export: its settings reach convert_to_ctranslate2
        import vanilla_transformer.converters.export_ctranslate2 as export

        seen = {}
        monkeypatch.setattr(export, "convert_to_ctranslate2", lambda *args: seen.setdefault("args", args))
        assert importlib.import_module(module).main(argv) == 0
        assert seen["args"][-1] is True
    else:  # the training flags: their settings
        from vanilla_transformer.commands.arguments import parse_training_arguments

        assert parse_training_arguments(argv).output.overwrite is True
    assert f"warning: {old} is deprecated and will be removed; use --overwrite" in capsys.readouterr().err
