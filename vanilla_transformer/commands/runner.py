"""The one wrapper of every command's `main`: a refusal ends the command with `error: MESSAGE`, a bug with
its traceback.

A refusal (`VanillaTransformerError`, the root of the project's errors) is printed as `error: MESSAGE` on stderr and
the command exits 1, without a traceback; anything else is a bug and keeps its traceback. A command's extra that is
not installed is a refusal too (`need`)."""

import functools
import importlib.util
import sys
from collections.abc import Callable, Sequence

from vanilla_transformer.mechanics.errors import VanillaTransformerError


class UsageError(VanillaTransformerError):
    """A flag's value that this machine or this input cannot use (argparse's own errors exit 2 before this)."""


class MissingExtra(VanillaTransformerError):
    """A package that an optional part of the project needs is not installed."""


def command(main: Callable[[Sequence[str] | None], int | None]) -> Callable[[Sequence[str] | None], int]:
    """`main(argv)` that returns 0 (or its own exit code), or 1 after printing a refusal's message."""

    @functools.wraps(main)
    def run(argv: Sequence[str] | None = None) -> int:
        try:
            return main(argv) or 0
        except VanillaTransformerError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1

    return run


def need(module: str, extra: str, why: str) -> None:
    """Refuse, naming the pip command, when `module` is not installed (`why`: what needs it)."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(f"{why} needs {module}: pip install 'vanilla-transformer[{extra}]'")
