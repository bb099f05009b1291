"""How the code depends on itself: the library takes typed settings (never the argparse Namespace), each layer
imports only the layers below it, and scripts, benchmarks and tests stand on the library, not on each other."""

import ast
import dataclasses
from pathlib import Path

import pytest

from vanilla_transformer.arguments import parse_training_arguments

from .conftest import ROOT

LIBRARY = ROOT / "vanilla_transformer"
FLAG_MODULES = {"arguments.py"}  # turns flags into settings: the one place that reads a Namespace
# the data layer: reading, preparing, batching, streaming a corpus, and the process coordination they use
DATA_LAYER = {"data", "batching", "prepare", "streaming", "tokenization", "integrity", "coordination", "cli"}


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def library_modules():
    return sorted(LIBRARY.glob("*.py"))


def takes_a_namespace(function: ast.FunctionDef) -> bool:
    parameters = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    for parameter in parameters:
        annotation = ast.unparse(parameter.annotation) if parameter.annotation else ""
        if parameter.arg == "args" or "Namespace" in annotation:
            return True
    return False


def top_level_imports(tree: ast.Module) -> set[str]:
    """The project modules a module imports when it is imported (imports inside functions are left out)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # from . import x / from .x import y
                names |= {alias.name for alias in node.names} if not module else {module}
            elif module.startswith("vanilla_transformer"):
                names.add(module.removeprefix("vanilla_transformer").lstrip(".") or node.names[0].name)
            else:
                names.add(module)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


@pytest.mark.parametrize("path", library_modules(), ids=lambda path: path.name)
def test_no_library_function_takes_the_argparse_namespace(path):
    if path.name in FLAG_MODULES:
        return
    offenders = [
        f"{path.name}:{node.lineno} {node.name}"
        for node in ast.walk(parsed(path))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and takes_a_namespace(node)
    ]
    assert not offenders, f"take a settings dataclass or explicit parameters instead: {offenders}"


def test_the_check_finds_a_function_that_takes_args():
    tree = ast.parse("def prepare(args, accelerator=None): ...\ndef fine(settings: 'DataSettings'): ...")
    assert [takes_a_namespace(node) for node in tree.body] == [True, False]


@pytest.mark.parametrize("name", sorted(DATA_LAYER), ids=str)
def test_the_data_layer_imports_nothing_above_it(name):
    imported = top_level_imports(parsed(LIBRARY / f"{name}.py"))
    project = {path.stem for path in library_modules()}
    above = sorted(module for module in imported if module in project and module not in DATA_LAYER)
    assert not above, f"{name}.py imports {above}"


def test_benchmarks_import_no_script_or_benchmark_and_tests_no_other_test():
    """Shared benchmark helpers live in benchmarks/common.py (and timing.py), shared test helpers in conftest.py."""
    offenders = []
    for path in [*sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "tests").glob("*.py"))]:
        for node in ast.walk(parsed(path)):
            modules = []
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            for module in modules:
                last = module.split(".")[-1]
                in_tests = path.parent.name == "tests"
                if (not in_tests and last in ("train_accelerate", "speed")) or (in_tests and last.startswith("test_")):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {module}")
    assert not offenders, offenders


def test_the_parsed_settings_cannot_be_changed_afterwards():
    settings = parse_training_arguments(["--max_steps", "3"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_steps = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.data.corpus.source_lang = "fr"
    assert (settings.max_steps, settings.preset, settings.warmup_steps) == (3, "tiny", 200)  # the embedded task's
