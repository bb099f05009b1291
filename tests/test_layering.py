"""How the code depends on itself: the package's layers and the absence of import cycles (import-linter's contracts in
pyproject.toml), the Hub-facing files that stand alone, the library that takes typed settings (never the argparse
Namespace), and scripts, benchmarks and tests that stand on the library, not on each other."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

LIBRARY = ROOT / "vanilla_transformer"
HUB_FACING = sorted(ROOT.glob("*_vanilla_transformer.py"))  # copied into model folders: they stand alone


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def library_modules():
    """The library's modules: the commands (vanilla_transformer/commands/) turn flags into settings."""
    return sorted(path for path in LIBRARY.rglob("*.py") if "commands" not in path.relative_to(LIBRARY).parts)


def takes_a_namespace(function: ast.FunctionDef) -> bool:
    parameters = [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
    for parameter in parameters:
        annotation = ast.unparse(parameter.annotation) if parameter.annotation else ""
        if parameter.arg == "args" or "Namespace" in annotation:
            return True
    return False


def imported_modules(tree: ast.Module) -> set[str]:
    """Every module a module imports, wherever the import statement is (in functions, under TYPE_CHECKING)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


@pytest.mark.slow
def test_the_import_contracts_hold():
    """pyproject.toml's [tool.importlinter]: commands above the library's layers, every import counted, no cycle."""
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("path", HUB_FACING, ids=lambda path: path.name)
def test_a_hub_facing_file_imports_nothing_of_the_project_but_its_siblings(path):
    """A model folder holds these four files and nothing else of the project (import-linter takes packages only)."""
    siblings = {hub_file.stem for hub_file in HUB_FACING}
    project = {"vanilla_transformer", "train_accelerate", *siblings}
    imported = imported_modules(parsed(path))
    offenders = sorted(name for name in imported if name.lstrip(".").split(".")[0] in project - siblings)
    assert not offenders, f"{path.name} imports {offenders}"


def test_the_check_sees_imports_inside_functions_and_under_type_checking():
    code = (
        "if TYPE_CHECKING:\n    from vanilla_transformer.hub.upload import x\ndef f():\n    import train_accelerate\n"
    )
    assert imported_modules(ast.parse(code)) == {"vanilla_transformer.hub.upload", "train_accelerate"}


@pytest.mark.parametrize("path", library_modules(), ids=lambda path: path.name)
def test_no_library_function_takes_the_argparse_namespace(path):
    offenders = [
        f"{path.name}:{node.lineno} {node.name}"
        for node in ast.walk(parsed(path))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and takes_a_namespace(node)
    ]
    assert not offenders, f"take a settings dataclass or explicit parameters instead: {offenders}"


def test_the_check_finds_a_function_that_takes_args():
    tree = ast.parse("def prepare(args, accelerator=None): ...\ndef fine(settings: 'DataSettings'): ...")
    assert [takes_a_namespace(node) for node in tree.body] == [True, False]


def test_benchmarks_import_no_script_or_benchmark_and_tests_no_other_test():
    """Shared benchmark helpers live in benchmarks/common.py (and timing.py), shared test helpers in helpers.py (and
    the fixtures in conftest.py)."""
    shared = {"common", "timing"}
    benchmarks = {path.stem for path in (ROOT / "benchmarks").glob("*.py")} - shared
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
                script = last == "train_accelerate" or last in benchmarks
                if (not in_tests and script) or (in_tests and last.startswith("test_")):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {module}")
    assert not offenders, offenders


def test_the_library_builds_a_model_from_a_folder_only_through_load_model_folder():
    """`loading.load_model_folder` refuses weights that do not cover the config (a layer too many): every loader
    (translate, the demo, attention-maps, export-ctranslate2, --evaluate_only) must go through it. Tokenizers and
    configs are read with their own from_pretrained."""
    allowed = {LIBRARY / "model" / "loading.py"}
    readers = ("Tokenizer", "Config")
    direct = []
    for path in sorted(set(LIBRARY.rglob("*.py")) - allowed):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Attribute) and node.attr == "from_pretrained":
                receiver = ast.unparse(node.value)
                if not any(reader.lower() in receiver.lower() for reader in readers):
                    direct.append(f"{path.relative_to(ROOT)}:{node.lineno}: {receiver}.from_pretrained")
    assert direct == []


def test_the_training_loop_runs_the_step_that_the_loss_tests_check():
    """tests/test_loss.py checks `train_accelerate.train_step`'s gradients: the loop must run that function."""
    loop = next(
        node for node in ast.walk(parsed(ROOT / "train_accelerate.py")) if getattr(node, "name", None) == "train_loop"
    )
    assert "train_step" in {ast.unparse(node.func) for node in ast.walk(loop) if isinstance(node, ast.Call)}


def renames(tree: ast.Module) -> list[ast.Call]:
    """`os.replace`/`os.rename` calls, and `path.replace(target)`/`path.rename(target)` (one argument: not str's)."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("replace", "rename")
        and (ast.unparse(node.func.value) == "os" or len(node.args) + len(node.keywords) == 1)
    ]


def test_one_staged_rename_and_one_disk_full_guard():
    """`mechanics/files.py` holds both: no other module renames a staged write into place on its own, and no other
    module turns a full disk into an error but through `on_full_disk` (one ignores a full disk while closing)."""
    files = LIBRARY / "mechanics" / "files.py"
    # prepare.discard_damaged renames a damaged cache aside to delete it: a deletion, not a write
    own_renames = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in LIBRARY.rglob("*.py")
        if path != files
        for node in renames(parsed(path))
        if not (path.name == "prepare.py" and "aside" in ast.unparse(node))
    ]
    assert own_renames == []
    checks = {
        path.relative_to(LIBRARY).as_posix() for path in LIBRARY.rglob("*.py") if "is_disk_full(" in path.read_text()
    }
    assert checks == {"mechanics/files.py", "training/output_folder.py"}


def test_the_training_script_stands_above_the_library_and_below_the_command_that_runs_it():
    """import-linter does not scan a top-level module: train_accelerate.py imports the library and its own flags and
    wrapper, never the command that runs it (commands/train.py) or another command."""
    imports = imported_modules(parsed(ROOT / "train_accelerate.py"))
    commands = {name for name in imports if name.startswith("vanilla_transformer.commands")}
    assert commands <= {"vanilla_transformer.commands.arguments", "vanilla_transformer.commands.runner"}
    assert "train_accelerate" in imported_modules(parsed(LIBRARY / "commands" / "train.py"))


def test_no_module_of_the_project_imports_another_by_name():
    """`importlib.import_module` hides an import from import-linter: the project's modules import each other by
    statements only."""
    for path in [*sorted(LIBRARY.rglob("*.py")), ROOT / "train_accelerate.py"]:
        calls = [ast.unparse(node.func) for node in ast.walk(parsed(path)) if isinstance(node, ast.Call)]
        assert not [call for call in calls if call.endswith("import_module") or call == "__import__"], path


def test_no_code_cites_an_issue_number():
    """A comment says why, in words that stay true; a number of this project's tracker means nothing to a reader of
    the code (the history has it). Another project's issue, named with its project, is a reference."""
    import re

    ours = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    theirs = re.compile(
        r"(accelerate|transformers|fairseq|torch|pytorch|datasets|ctranslate2|opus-mt)\S* issues? #?\d", re.I
    )
    files = [
        *LIBRARY.rglob("*.py"),
        *ROOT.glob("*.py"),
        *(ROOT / "tests").rglob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
    ]
    cited = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        if path != Path(__file__)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ours.search(line) and not theirs.search(line)
    ]
    assert cited == []
