"""Each setting declared once, with one meaning: a settings field declares its flag (help, check, choices) and the
commands generate the flags from the fields (commands/flags.py's `add_settings_flags`). Checked for each command with
settings dataclasses: every generated flag has its field's default and help (unless the command states its own, as for
a default that depends on the data), no flag written by hand repeats a field's default, the renamed flags' old names
still work with a warning, and a translation run's manifest records the settings (one written before the rename still
resumes)."""

import argparse
import dataclasses
import json

import pytest

from vanilla_transformer.commands.arguments import training_parser
from vanilla_transformer.commands.flags import add_settings_flags, declares_flag, field_default, flag_name
from vanilla_transformer.commands.prepare import prepare_parser
from vanilla_transformer.commands.serve import serve_parser
from vanilla_transformer.commands.sweep import sweep_parser
from vanilla_transformer.commands.translate import corpus_settings, translate_parser
from vanilla_transformer.commands.translate import parse_args as translate_args
from vanilla_transformer.data.settings import Corpus, DataSettings, LengthFilter, StreamSettings, TokenizerSettings
from vanilla_transformer.serving.settings import (
    DEFAULT_BATCH_TOKENS,
    BackendSettings,
    CorpusSettings,
    DecodingSettings,
    upgraded_record,
)
from vanilla_transformer.training.settings import (
    CheckpointSettings,
    EvaluationSettings,
    OutputSettings,
    TrainingSettings,
)
from vanilla_transformer.training.sweep import Sweep

from .helpers import FAST, corpus_lines, stopped_run, translate, write_lines

DATA = (Corpus, LengthFilter, TokenizerSettings, DataSettings)
TRAINING = (*DATA, StreamSettings, TrainingSettings, EvaluationSettings, OutputSettings, CheckpointSettings)
SERVING = (CorpusSettings, BackendSettings, DecodingSettings)
COMMANDS = {  # a command's parser, and the settings classes its flags come from
    "train": (training_parser, TRAINING),
    "prepare": (prepare_parser, DATA),
    "translate": (translate_parser, SERVING),
    "serve": (serve_parser, SERVING),
}
REQUIRED = {"train": [], "prepare": ["--output_dir", "out"], "translate": ["model"], "serve": ["model"]}
ALL_OF_THEIR_FIELDS = {"train": set(), "prepare": {"prepared_data"}, "translate": set()}  # the declared ones left out


def generated(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if hasattr(action, "settings_field")]


def by_hand(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags written out in a command: neither generated, nor a hidden alias, --help or --version."""
    return [
        action
        for action in parser._actions
        if not hasattr(action, "settings_field")
        and action.option_strings
        and action.default is not argparse.SUPPRESS
        and not isinstance(action, (argparse._HelpAction, argparse._VersionAction))
    ]


def literal_duplicates(parser: argparse.ArgumentParser, classes) -> list[str]:
    """Flags written by hand under the name (the field's or its flag's) of a settings field that has a default: a
    second statement of that setting's default."""
    fields = {
        name: f"{cls.__name__}.{field.name}"
        for cls in classes
        for field in dataclasses.fields(cls)
        if field.default is not dataclasses.MISSING
        for name in (field.name, flag_name(field))
    }
    offenders = []
    for action in by_hand(parser):
        names = {action.dest, *(option.lstrip("-") for option in action.option_strings)}
        offenders += [
            f"{action.option_strings[0]} (default {action.default!r}) repeats {fields[name]}"
            for name in names & fields.keys()
        ]
    return offenders


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_generated_flag_has_its_fields_default_and_help(command):
    build, _ = COMMANDS[command]
    parser = build()
    actions = generated(parser)
    left_out = vars(parser.parse_args(REQUIRED[command]))  # what a command line without the flags gives
    assert actions
    for action in actions:
        field = action.settings_field
        if "default" not in action.overridden:  # get_default passes over None, to a hidden alias's SUPPRESS
            assert action.default == left_out[action.dest] == field.default, action.option_strings
        if "help" not in action.overridden:
            assert action.help == field.metadata["help"], action.option_strings
        assert action.dest == flag_name(field) and action.option_strings == [f"--{flag_name(field)}"]


@pytest.mark.parametrize("command", sorted(ALL_OF_THEIR_FIELDS))
def test_every_field_that_declares_a_flag_is_one_of_the_commands_flags(command):
    build, classes = COMMANDS[command]
    flags = {action.settings_field.name for action in generated(build())}
    declared = {field.name for cls in classes for field in dataclasses.fields(cls) if declares_flag(field)}
    assert declared - flags == ALL_OF_THEIR_FIELDS[command]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_flag_written_by_hand_repeats_a_fields_default(command):
    build, classes = COMMANDS[command]
    assert literal_duplicates(build(), classes) == []


def test_the_check_finds_a_flag_written_by_hand_for_a_field():
    parser = argparse.ArgumentParser()
    add_settings_flags(parser, CorpusSettings, ["buffer_size"])
    parser.add_argument("--language", default="en")  # CorpusSettings.language, a second time
    parser.add_argument("--paragraphs", action="store_true")  # no field of these: fine
    assert literal_duplicates(parser, SERVING) == ["--language (default 'en') repeats CorpusSettings.language"]


def test_an_override_of_no_flag_added_and_a_field_that_declares_none_are_errors():
    with pytest.raises(TypeError, match="overrides of no flag added here"):
        add_settings_flags(argparse.ArgumentParser(), CorpusSettings, ["buffer_size"], batch_size={"default": 3})
    with pytest.raises(TypeError, match="TrainingSettings.preset declares no flag"):
        add_settings_flags(argparse.ArgumentParser(), TrainingSettings, ["preset"])


def test_the_sweeps_flags_have_its_settings_defaults():
    parser = sweep_parser()
    assert parser.get_default("rows") == ",".join(field_default(Sweep, "rows"))
    assert parser.get_default("scale") == field_default(Sweep, "scale")


@pytest.mark.parametrize(
    "command, old, new, value",
    [
        ("train", "--max_source_tokens", "--max_sentence_tokens", "10"),
        ("train", "--max_eval_source_tokens", "--max_eval_tokens", "10"),
        ("train", "--overwrite_output_dir", "--overwrite", None),
        ("prepare", "--max_source_tokens", "--max_sentence_tokens", "10"),
        ("translate", "--max_tokens", "--max_batch_tokens", "300"),
        ("translate", "--max_source_tokens", "--max_piece_tokens", "9"),
        ("serve", "--max_tokens", "--max_batch_tokens", "300"),
    ],
)
def test_an_old_name_sets_the_new_flags_value_and_says_it_is_deprecated(command, old, new, value, capsys):
    build, _ = COMMANDS[command]
    given = [] if value is None else [value]
    by_old, by_new, left_out = (
        build().parse_args([*REQUIRED[command], *flags]) for flags in ([old, *given], [new, *given], [])
    )
    dest = new.removeprefix("--")
    assert getattr(by_old, dest) == getattr(by_new, dest) != getattr(left_out, dest)
    assert f"warning: {old} is deprecated and will be removed; use {new}" in capsys.readouterr().err
    assert old not in build().format_help()


def test_translates_token_budget_is_decided_in_one_place():
    """CorpusSettings: 4000 source tokens x beams a batch unless --batch_size alone is given; serve's budget bounds
    its batches with --batch_size too."""
    assert CorpusSettings().max_batch_tokens == DEFAULT_BATCH_TOKENS
    assert corpus_settings(translate_args(["model"])) == CorpusSettings()
    alone = corpus_settings(translate_args(["model", "--batch_size", "8"]))
    assert (alone.max_batch_tokens, alone.batch_size) == (None, 8)
    both = corpus_settings(translate_args(["model", "--batch_size", "8", "--max_batch_tokens", "500"]))
    assert (both.max_batch_tokens, both.batch_size) == (500, 8)
    served = serve_parser().parse_args(["model", "--batch_size", "8"])
    assert (served.max_batch_tokens, served.batch_size) == (DEFAULT_BATCH_TOKENS, 8)


def test_a_record_of_an_earlier_release_is_read_under_todays_names():
    old = {"model": "abc", "--max_tokens": 4000, "--max_source_tokens": 512, "--num_beams": 1}
    assert upgraded_record(old) == {
        "model": "abc",
        "--max_batch_tokens": 4000,
        "--max_piece_tokens": 512,
        "--num_beams": 1,
    }


def manifest_of(output) -> tuple:
    path = output.with_name(output.name + ".partial") / "manifest.json"
    return path, json.loads(path.read_text(encoding="utf-8"))


def test_a_run_records_its_settings_fields_and_one_begun_before_the_rename_resumes(folder, tmp_path, monkeypatch):
    """The manifest records the settings that change the output, by their flags; a manifest written with the old
    names (--max_tokens, --max_source_tokens) resumes, and a changed setting is still refused by name."""
    source, output = write_lines(tmp_path / "source.en", corpus_lines(20)), tmp_path / "out.de"
    stopped_run(folder, source, output, monkeypatch)
    path, manifest = manifest_of(output)
    recorded = manifest["settings"]
    corpus = {f"--{field.name}" for field in dataclasses.fields(CorpusSettings)} - {"--log_every"}
    decoding = {"--num_beams": 1, "--max_new_tokens": 4}
    assert corpus <= recorded.keys() and decoding.items() <= recorded.items() and "--log_every" not in recorded
    assert recorded["--max_batch_tokens"] == DEFAULT_BATCH_TOKENS and "--device" not in recorded
    renamed = {"--max_batch_tokens": "--max_tokens", "--max_piece_tokens": "--max_source_tokens"}
    manifest["settings"] = {renamed.get(name, name): value for name, value in recorded.items()}  # as 0.1 wrote it
    path.write_text(json.dumps(manifest), encoding="utf-8")
    argv = [folder, "--input", source, "--output", output, "--buffer_size", 10, *FAST]
    changed = translate(*argv, "--max_batch_tokens", 999)
    assert changed.returncode == 1 and "--max_batch_tokens was 4000, now 999" in changed.stderr, changed.stderr
    resumed = translate(*argv)
    assert resumed.returncode == 0 and "1 of 2 chunks resumed" in resumed.stderr, resumed.stderr
