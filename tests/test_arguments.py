"""The flags of the training script and of `vanilla-transformer prepare` (vanilla_transformer/commands/arguments.py):
each flag checked where it enters and each combination that cannot work refused, with a message naming them (exit
code 2), the deprecated spellings of renamed flags, the defaults that depend on the data, and the settings they
become."""

import argparse
import dataclasses

import pytest
from huggingface_hub import constants as hub_constants

from vanilla_transformer.commands import prepare as prepare_command
from vanilla_transformer.commands.arguments import (
    EMBEDDED_TASK_DEFAULTS,
    add_data_arguments,
    data_settings,
    parse_training_arguments,
)
from vanilla_transformer.data import prepare
from vanilla_transformer.data.settings import DataSettings
from vanilla_transformer.training.run_setup import config_for_tokenizer

from .helpers import prepared_folder


def refusal(capsys, parse, argv: list[str]) -> str:
    """The error line of a refused command line: parser.error prints the usage (which names every flag), then this
    line, and exits with code 2."""
    with pytest.raises(SystemExit) as stopped:
        parse(argv)
    assert stopped.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--warmup_steps", "-5"], "argument --warmup_steps: must be an integer >= 1, got -5"),
        (["--warmup_steps", "0"], "argument --warmup_steps: must be an integer >= 1, got 0"),
        (["--save_steps", "0"], "argument --save_steps: must be an integer >= 1, got 0"),
        (["--logging_steps", "0"], "argument --logging_steps: must be an integer >= 1, got 0"),
        (
            ["--gradient_accumulation_steps", "0"],
            "argument --gradient_accumulation_steps: must be an integer >= 1, got 0",
        ),
        (["--average_last", "0"], "argument --average_last: must be an integer >= 1, got 0"),
        (["--max_tokens", "many"], "argument --max_tokens: must be an integer >= 2, got 'many'"),
        (["--dropout", "1.5"], "argument --dropout: must be a number in [0, 1), got 1.5"),
        (["--label_smoothing", "nan"], "argument --label_smoothing: must be a number in [0, 1), got nan"),
        (["--learning_rate_scale", "0"], "argument --learning_rate_scale: must be a number in (0, inf), got 0"),
        (["--max_minutes", "-1"], "argument --max_minutes: must be a number in (0, inf), got -1"),
        (["--vocab_size", "100"], "argument --vocab_size: must be an integer >= 260, got 100"),
        (["--max_length_ratio", "0.5"], "argument --max_length_ratio: must be a number in [1, inf), got 0.5"),
        (
            ["--source_lang", "de", "--target_lang", "de"],
            "--source_lang and --target_lang are both 'de': the model would learn to copy its input",
        ),
        (
            ["--d_model", "30", "--heads", "4"],
            "--preset tiny with the model flags given: `d_model` (30) must be divisible by "
            "`encoder_attention_heads` (4)",
        ),
        (
            ["--resume_from_checkpoint", "latest", "--overwrite"],
            "--resume_from_checkpoint continues the run in --output_dir; --overwrite deletes it",
        ),
        (
            ["--streaming", "--max_epochs", "1"],
            "--streaming reads raw data and ends at --max_steps/--max_minutes: it takes neither --prepared_data nor "
            "--max_epochs",
        ),
        (["--evaluate_only"], "--evaluate_only needs --model_name_or_path"),
        (["--push_to_hub"], "--push_to_hub needs --hub_model_id"),
        (["--average_last", "6"], "--average_last cannot exceed --save_total_limit"),
        (
            ["--max_sentence_tokens", "700", "--max_tokens", "600"],
            "--max_sentence_tokens 700 exceeds --max_tokens 600: a kept pair would not fit in a batch",
        ),
    ],
)
def test_bad_flags_and_combinations_are_refused_when_parsed_naming_them(flags, message, capsys):
    error = refusal(capsys, parse_training_arguments, flags)
    assert error.startswith("vanilla-transformer train: error: ") and message in error, error


def test_push_to_hub_is_refused_before_training_when_the_hub_is_offline(monkeypatch, capsys):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(SystemExit) as stopped:
        parse_training_arguments(["--push_to_hub", "--hub_model_id", "someone/x"])
    assert stopped.value.code == 2
    assert "--push_to_hub with HF_HUB_OFFLINE set" in capsys.readouterr().err
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    assert parse_training_arguments(["--push_to_hub", "--hub_model_id", "someone/x"]).push_to_hub


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--source_lang", "en", "--target_lang", "en"],
            "--source_lang and --target_lang are both 'en': the model would learn to copy its input",
        ),
        (["--preprocessing_num_workers", "0"], "argument --preprocessing_num_workers: must be an integer >= 1, got 0"),
    ],
)
def test_the_prepare_command_checks_its_flags_too(flags, message, capsys, tmp_path):
    error = refusal(capsys, prepare_command.main, [*flags, "--output_dir", str(tmp_path / "prepared")])
    assert error.startswith("vanilla-transformer prepare: error: ") and message in error, error
    assert not (tmp_path / "prepared").exists()


@pytest.mark.parametrize(
    "old, new, settings_of",
    [
        ("--max_source_tokens", "--max_sentence_tokens", lambda settings: settings.data.filters),
        ("--max_eval_source_tokens", "--max_eval_tokens", lambda settings: settings.evaluation),
    ],
)
def test_an_old_flag_name_still_sets_its_value_and_says_it_is_deprecated(old, new, settings_of, capsys):
    by_old_name, by_new_name, default = (
        settings_of(parse_training_arguments(argv)) for argv in ([old, "10"], [new, "10"], [])
    )
    assert by_old_name == by_new_name != default
    assert f"warning: {old} is deprecated and will be removed; use {new}" in capsys.readouterr().err


def test_the_prepare_command_takes_the_old_filter_flag_too(capsys):
    def data_flags(*argv: str) -> DataSettings:
        parser = argparse.ArgumentParser()
        add_data_arguments(parser)
        return data_settings(parser, parser.parse_args(list(argv)))

    by_old_name = data_flags("--max_source_tokens", "10").filters
    assert by_old_name == data_flags("--max_sentence_tokens", "10").filters != data_flags().filters
    warning = "--max_source_tokens is deprecated and will be removed; use --max_sentence_tokens"
    assert warning in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], ("tiny", 400, 200, 80, 200)),  # the embedded task: a few minutes on a laptop CPU
        (["--data_dir", "corpus"], ("small", 100_000, 4000, 1000, 1000)),  # real data: the paper's warm-up
        (["--max_steps", "3"], ("tiny", 3, 200, 80, 200)),  # a flag given wins over the data's default
        (["--max_epochs", "2"], ("tiny", None, 200, 80, 200)),  # another limit given: no default step limit
        (["--data_dir", "corpus", "--max_minutes", "5"], ("small", None, 4000, 1000, 1000)),
    ],
)
def test_the_defaults_that_depend_on_the_data(flags, expected):
    settings = parse_training_arguments(flags)
    defaults = (settings.preset, settings.max_steps, settings.warmup_steps)
    assert (*defaults, settings.checkpoints.save_steps, settings.evaluation.every_steps) == expected


def test_every_settings_object_the_parser_returns_is_declared_frozen():
    """arguments.py hands the library one frozen TrainingSettings: no settings class inside it may be mutable."""
    mutable = []

    def visit(value, name: str) -> None:
        if dataclasses.is_dataclass(value):
            if not type(value).__dataclass_params__.frozen:
                mutable.append(f"{name}: {type(value).__name__}")
            for field in dataclasses.fields(value):
                visit(getattr(value, field.name), f"{name}.{field.name}")

    visit(parse_training_arguments(["--streaming"]), "settings")
    assert not mutable


def test_model_flags_reach_the_config_over_the_preset():
    settings = parse_training_arguments(
        ["--preset", "small", "--dropout", "0.3", "--attention_dropout", "0.1", "--activation_dropout", "0.05"]
    )

    class Tokenizer:
        pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

        def __len__(self):
            return 300

    config = config_for_tokenizer(settings.preset, Tokenizer(), **settings.model_overrides)
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.3, 0.1, 0.05)
    assert config.d_model == 256 and config.vocab_size == 300


def test_flags_may_repeat_a_prepared_corpus_languages_but_never_contradict_or_replace_its_data(
    corpus_dir, tmp_path, capsys
):
    output = prepared_folder(corpus_dir, tmp_path / "prepared")
    corpus = parse_training_arguments(["--prepared_data", str(output)]).data.corpus
    assert (corpus.source_lang, corpus.target_lang) == ("en", "de")
    repeated = parse_training_arguments(["--prepared_data", str(output), "--source_lang", "en"])
    assert repeated.data.corpus.target_lang == "de"
    contradicting = ["--prepared_data", str(output), "--source_lang", "fr", "--target_lang", "es"]
    error = refusal(capsys, parse_training_arguments, contradicting)
    assert f"--source_lang fr, but --prepared_data {output} holds en-de pairs" in error
    error = refusal(capsys, parse_training_arguments, ["--prepared_data", str(output), "--data_dir", str(corpus_dir)])
    assert "--prepared_data replaces --data_dir/--train_file/--dataset_name: give one or the other" in error
    (output / prepare.MANIFEST).write_text("[]")
    error = refusal(capsys, parse_training_arguments, ["--prepared_data", str(output)])
    assert "manifest.json is not a prepared corpus's manifest" in error


# --- each default stated once: a flag left unset gives the field it fills that field's own default ---------------

# Fields that no flag fills with the field's default: the defaults that depend on the data (EMBEDDED_TASK_DEFAULTS,
# REAL_DATA_DEFAULTS), what the flags record as given, and the values that are given, never defaulted.
NOT_FROM_A_DEFAULT = {"max_steps", "hyperparameters", "model_overrides", "preset", "output_dir"}
EMBEDDED_TASK_FIELDS = {
    "warmup_steps",
    "save_steps",
    "every_steps",
}  # the embedded task's own (EMBEDDED_TASK_DEFAULTS)


def defaults_not_taken(settings, exempt: set[str]) -> list[str]:
    """`Class.field = value (default ...)` for each field, in `settings` and the settings it holds, whose value is not
    its own default."""
    differences = []
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if dataclasses.is_dataclass(value):
            differences += defaults_not_taken(value, exempt)
            continue
        if field.default is dataclasses.MISSING or field.name in exempt:
            continue
        if value != field.default:
            differences.append(f"{type(settings).__name__}.{field.name} = {value!r} (default {field.default!r})")
    return differences


@pytest.mark.parametrize(
    "flags",
    [["--data_dir", "corpus"], ["--data_dir", "corpus", "--streaming"]],
    ids=["real data", "real data, streamed"],
)
def test_every_flag_left_unset_gives_its_fields_own_default(flags):
    settings = parse_training_arguments(flags)
    assert defaults_not_taken(settings, NOT_FROM_A_DEFAULT | {"data_dir"}) == []


def test_the_embedded_task_differs_from_the_defaults_only_where_it_says():
    settings = parse_training_arguments([])
    assert defaults_not_taken(settings, NOT_FROM_A_DEFAULT | EMBEDDED_TASK_FIELDS) == []
    taken = (settings.warmup_steps, settings.checkpoints.save_steps, settings.evaluation.every_steps)
    assert taken == tuple(EMBEDDED_TASK_DEFAULTS[name] for name in ("warmup_steps", "save_steps", "eval_steps"))


def test_the_check_names_each_field_a_flag_gave_another_value():
    settings = parse_training_arguments(["--data_dir", "corpus", "--max_tokens", "2048", "--num_beams", "5"])
    assert defaults_not_taken(settings, NOT_FROM_A_DEFAULT | {"data_dir"}) == [
        "EvaluationSettings.num_beams = 5 (default 4)",
        "TrainingSettings.max_tokens = 2048 (default 4096)",
    ]
