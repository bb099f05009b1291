"""What every command's flags share: argument types that check numeric flags where they enter, naming the flag and
the allowed range; deprecated aliases; `--version`.

parser.add_argument("--warmup_steps", type=at_least(1))
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


def field_default(settings_class, name: str):
    """The default of the field `name` of a settings dataclass: the one statement of a default that a flag also
    offers (`default=field_default(EvaluationSettings, "batch_size")`), so the two cannot drift apart."""
    field = next((f for f in dataclasses.fields(settings_class) if f.name == name), None)
    if field is None or field.default is dataclasses.MISSING:
        raise TypeError(f"{settings_class.__name__}.{name} is not a field with a default")
    return field.default


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
