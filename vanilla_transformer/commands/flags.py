"""What every command's flags share: argument types that check numeric flags where they enter, naming the flag and
the allowed range; deprecated aliases; `--version`. And the flags of settings dataclasses, generated from their fields.

A settings field declares its flag in its metadata, as transformers' HfArgumentParser and fairseq's dataclass configs
do: the flag's help (None: none), the check of its value (`check`: a name of CHECKS, or a name and its arguments),
`choices`, and `flag` where the flag is spelled otherwise than the field. The flag's default is the field's.

    warmup_steps: int = field(default=4000, metadata={"help": "warm-up steps", "check": "positive_int"})
    add_settings_flags(group, TrainingSettings, ["warmup_steps"])
    $ vanilla-transformer train --warmup_steps -5
    error: argument --warmup_steps: must be an integer >= 1, got -5
"""

import argparse
import dataclasses
import math
import sys
from importlib.metadata import PackageNotFoundError, version


def version_text() -> str:
    """The package's version and those of the two libraries its models run on."""
    try:
        ours = version("vanilla-transformer")
    except PackageNotFoundError:  # a checkout that was never installed
        ours = "(not installed)"
    return f"vanilla-transformer {ours} (transformers {version('transformers')}, torch {version('torch')})"


def command_parser(prog: str, description: str | None, **kwargs) -> argparse.ArgumentParser:
    """A command's parser: its docstring as the help text, and `--version`."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs
    )
    parser.add_argument("--version", action="version", version=version_text())
    return parser


def add_trust_remote_code(parser) -> None:
    """`--trust_remote_code`, of the commands that load a model folder: its own code rather than the installed one."""
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="run the model folder's own code (Hub models); by default the installed vanilla-transformer code runs",
    )


def field_default(settings_class, name: str):
    """The default of the field `name` of a settings dataclass (the one statement of it), e.g. for a help text."""
    field = settings_field(settings_class, name)
    if field.default is dataclasses.MISSING:
        raise TypeError(f"{settings_class.__name__}.{name} is not a field with a default")
    return field.default


def settings_field(settings_class, name: str) -> dataclasses.Field:
    field = next((f for f in dataclasses.fields(settings_class) if f.name == name), None)
    if field is None:
        raise TypeError(f"{settings_class.__name__} has no field {name}")
    return field


def declares_flag(field: dataclasses.Field) -> bool:
    return "help" in field.metadata


def flag_name(field: dataclasses.Field) -> str:
    """The flag of a field, without its dashes: also its argparse dest."""
    return field.metadata.get("flag", field.name)


def add_settings_flags(group, settings_class, names=None, **overrides) -> None:
    """Add to `group` (a parser or a group) the flags of `settings_class`'s fields `names`, in that order (default:
    every field that declares one, in the class's order), as the fields declare them. `overrides` (a field's name:
    add_argument keywords) replace what the command decides itself, e.g. a default that depends on the data (a
    default given there is the command's: the field's is what a left-out flag means there)."""
    names = names or [field.name for field in dataclasses.fields(settings_class) if declares_flag(field)]
    if stray := sorted(set(overrides) - set(names)):
        raise TypeError(f"overrides of no flag added here: {stray}")
    for name in names:
        field = settings_field(settings_class, name)
        if not declares_flag(field):
            raise TypeError(f"{settings_class.__name__}.{name} declares no flag")
        action = group.add_argument(f"--{flag_name(field)}", **(flag_keywords(field) | overrides.get(name, {})))
        action.settings_field = field  # what tests/test_flags_declared_once.py checks the flag against
        action.overridden = set(overrides.get(name, {}))


def flag_keywords(field: dataclasses.Field) -> dict:
    """add_argument's keywords for a field's flag: its default, help, check and choices (a switch for a bool)."""
    default = None if field.default is dataclasses.MISSING else field.default
    keywords = {"default": default, "help": field.metadata["help"]}
    if isinstance(default, bool):  # a switch: given, the field is True
        if default:
            raise TypeError(f"{field.name} is a switch that is on by default: no flag could turn it off")
        return keywords | {"action": "store_true"}
    if "check" in field.metadata:
        keywords["type"] = check_of(field.metadata["check"])
    if "choices" in field.metadata:
        keywords["choices"] = field.metadata["choices"]
    return keywords


def check_of(spec):
    """The argparse type a field's `check` names: "positive_int", or ("at_least", 2) for at_least(2)."""
    if isinstance(spec, str):
        return CHECKS[spec]
    name, *arguments = spec
    return CHECKS[name](*arguments)


def flag_values(settings_class, args: argparse.Namespace) -> dict:
    """The parsed values of `settings_class`'s flags (those `args` holds), by field name: its keyword arguments."""
    fields = [field for field in dataclasses.fields(settings_class) if declares_flag(field)]
    return {field.name: getattr(args, flag_name(field)) for field in fields if hasattr(args, flag_name(field))}


def recorded_flags(settings) -> dict:
    """The settings that change a run's output, by their flags (`--name`): the fields not marked `recorded: False`."""
    fields = [field for field in dataclasses.fields(settings) if declares_flag(field)]
    return {
        f"--{flag_name(field)}": getattr(settings, field.name)
        for field in fields
        if field.metadata.get("recorded", True)
    }


def up_to(limit: str):
    """An integer type for argparse: whole numbers from 1 to the Hub-facing pipeline's `limit` (MAX_BEAMS,
    MAX_OUTPUT_TOKENS: a beam or output length the machine can hold), read only when a value is given."""

    def parse(text: str) -> int:
        import pipeline_vanilla_transformer

        value, high = positive_int(text), getattr(pipeline_vanilla_transformer, limit)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be an integer from 1 to {high}, got {value}")
        return value

    parse.__name__ = f"integer from 1 to {limit}"
    return parse


beam_size = up_to("MAX_BEAMS")
output_tokens = up_to("MAX_OUTPUT_TOKENS")


def at_least(minimum: int, maximum: int | None = None):
    """An integer type for argparse: whole numbers >= `minimum` (and <= `maximum`, if given)."""
    wanted = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value}")
        return value

    parse.__name__ = wanted.removeprefix("an ")
    return parse


def number_in(low: float, high: float = math.inf, *, low_open: bool = False, high_open: bool = False):
    """A float type for argparse: finite numbers in [low, high] (an end is excluded when `*_open`)."""
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open or high == math.inf else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number in {interval}, got {text!r}") from None
        too_low = value <= low if low_open else value < low
        too_high = value >= high if high_open else value > high
        if math.isnan(value) or math.isinf(value) or too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be a number in {interval}, got {text}")
        return value

    parse.__name__ = f"number in {interval}"
    return parse


positive_int = at_least(1)
non_negative_int = at_least(0)
positive_float = number_in(0, low_open=True)
non_negative_float = number_in(0)
probability = number_in(0, 1, high_open=True)  # dropout, label smoothing: 1 would zero everything

# the checks a settings field may name (its metadata's `check`): ready types, or factories given their arguments
CHECKS = {
    "at_least": at_least,
    "number_in": number_in,
    "positive_int": positive_int,
    "non_negative_int": non_negative_int,
    "positive_float": positive_float,
    "non_negative_float": non_negative_float,
    "probability": probability,
    "any_number": number_in(-math.inf),
    "beam_size": beam_size,
    "output_tokens": output_tokens,
}


def add_deprecated_alias(group, old: str, new: str) -> None:
    """Keep `old` working as a hidden spelling of the flag `new` (already added to `group`: a parser or a group), with a
    warning that names the new flag. For a flag that stores a value or is a switch (store_true)."""
    action = next(a for a in group._actions if new in a.option_strings)
    takes_value = action.nargs != 0

    class DeprecatedAlias(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            print(f"warning: {old} is deprecated and will be removed; use {new}", file=sys.stderr)
            setattr(namespace, action.dest, values if takes_value else action.const)

    group.add_argument(
        old,
        dest=action.dest,
        type=action.type if takes_value else None,
        nargs=None if takes_value else 0,
        action=DeprecatedAlias,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )
