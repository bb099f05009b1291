"""One name, one thing: no two public module-level functions or classes of the package share a name, so that a name
read anywhere (a traceback, a grep, an import) says which one it is."""

import ast
from collections import defaultdict
from pathlib import Path

import vanilla_transformer

PACKAGE = Path(vanilla_transformer.__file__).parent

# The commands' protocol: commands/main.py runs each subcommand module's `main`, and the commands that others run in
# pieces (serve, sweep, translate) share `parse_args` and `run`. The same name in each module is the point.
COMMAND_PROTOCOL = {"main", "parse_args", "run"}


def public_definitions() -> dict[str, list[str]]:
    """Each public (no leading underscore) module-level function or class name -> the modules defining it."""
    found = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".")
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and not node.name.startswith(
                "_"
            ):
                exempt = node.name in COMMAND_PROTOCOL and module.startswith("vanilla_transformer.commands.")
                if not exempt:
                    found[node.name].append(module)
    return found


def test_no_two_public_definitions_share_a_name():
    shared = {name: modules for name, modules in public_definitions().items() if len(modules) > 1}
    assert not shared, "rename so that each name says what it does in its module: " + "; ".join(
        f"{name} in {', '.join(modules)}" for name, modules in sorted(shared.items())
    )
