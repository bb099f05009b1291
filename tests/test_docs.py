"""The docs' structure, checked: their sizes, no tracker numbers, every command they name runs with flags that exist,
and docs/ARCHITECTURE.md's code map, one row a module, each row its module docstring's first sentence.

A module added, removed, or its docstring's first sentence changed: `python -m tests.test_docs` prints the map's
section as it should read (`code_map()`), `python -m tests.test_docs --write` puts it into docs/ARCHITECTURE.md.

The commands are those of the fenced shell blocks (bash, sh, console, or none named) of README.md and docs/*.md. A
command that runs the project (`vanilla-transformer SUB`, `python -m vanilla_transformer SUB`, the training script,
each also under `accelerate launch`) is checked against the parser its subcommand builds, taken in this process
without parsing anything; a script (`python benchmarks/X.py`, `bash X.sh`) must exist, and its flags are checked with
its own `--help` (slow: a process each). Other tools (pip, git, curl, sacrebleu, ...) are not ours to check."""

import argparse
import ast
import functools
import itertools
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "vanilla_transformer"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
DOCS_PAGES = sorted((ROOT / "docs").glob("*.md"))
PAGE_LIMITS = {"README.md": 250, "BENCHMARKS.md": 400}  # lines; any other docs page: 300
ROW_LIMIT = 200  # characters of a row of ARCHITECTURE.md's tables
MAP_HEADING = "## Module by module"


# --- the commands of the docs' code blocks ------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    where: str  # "docs/TRAINING.md:17", the line it starts on
    words: tuple[str, ...]  # as the shell splits them: quotes removed, no redirection, no leading VAR=value


FENCE = re.compile(r"\s*(`{3,}|~{3,})\s*([^\s`]*)")
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console", "zsh"}
SEPARATORS = {"&&", "||", ";", "|", "&", "|&"}


def shell_blocks(text: str) -> list[list[tuple[int, str]]]:
    """The lines of a markdown text's shell code blocks, with their line numbers."""
    blocks, block, fence, shell = [], [], None, False
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None:
            if match:
                fence, shell, block = match.group(1), match.group(2).lower() in SHELL_LANGUAGES, []
        elif match and not match.group(2) and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
            if shell:
                blocks.append(block)
            fence = None
        else:
            block.append((number, line))
    return blocks


def command_lines(block: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """A block's command lines, backslash continuations joined; in a block with prompts (`$ `), only those lines."""
    prompted = any(line.lstrip().startswith("$ ") for _, line in block)
    lines, start, pending = [], 0, None
    for number, line in block:
        if pending is None:
            if prompted and not line.lstrip().startswith("$ "):
                continue  # the output of the command above
            start, pending = number, line.lstrip()[2:] if prompted else line
        else:
            pending += " " + line.strip()
        if pending.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1]
            continue
        lines.append((start, pending))
        pending = None
    return lines


def split_commands(line: str) -> list[list[str]]:
    """A command line's simple commands (`a && b; c | d`), each as the shell's words: comments, redirections
    (`< in > out`) and leading environment assignments (`OMP_NUM_THREADS=1 ...`) left out."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: not a shell command
        return []
    commands, words, redirected = [], [], False
    for token in tokens:
        if redirected:
            redirected = False
        elif token in SEPARATORS:
            commands.append(words)
            words = []
        elif set(token) <= set("<>&"):
            redirected = True
        elif token not in ("(", ")") and not (not words and re.fullmatch(r"[A-Za-z_]\w*=.*", token)):
            words.append(token)
    return [words for words in [*commands, words] if words]


def docs_commands(path: Path) -> list[Command]:
    name = path.relative_to(ROOT).as_posix()
    return [
        Command(f"{name}:{number}", tuple(words))
        for block in shell_blocks(path.read_text(encoding="utf-8"))
        for number, line in command_lines(block)
        for words in split_commands(line)
    ]


def is_python(word: str) -> bool:
    return re.fullmatch(r"(.*/)?python(3(\.\d+)?)?", word) is not None


def is_flag(word: str) -> bool:
    """`--flag`, `--flag=value` or `-f`; not `-` (stdin) or a negative number."""
    return word.startswith("-") and word != "-" and not re.fullmatch(r"-[\d.]+(e-?\d+)?", word)


def unlaunched(words: tuple[str, ...]) -> tuple[str, ...]:
    """`accelerate launch [ITS FLAGS] train_accelerate.py ...` or `... -m MODULE ...` as `python ...`."""
    if words[:2] != ("accelerate", "launch"):
        return words
    rest = words[2:]
    start = next((i for i, word in enumerate(rest) if word == "-m" or word.endswith(".py")), None)
    return words if start is None else ("python", *rest[start:])


def project_call(words: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | None:
    """(subcommand, its arguments) of a command that runs the project: `vanilla-transformer SUB ...`,
    `python -m vanilla_transformer SUB ...`, or the training script as `train`, each also under `accelerate launch`."""
    words = unlaunched(words)
    if words[0] == "vanilla-transformer":
        return (words[1] if len(words) > 1 else ""), words[2:]
    if not is_python(words[0]) or len(words) < 2:
        return None
    if words[1:3] == ("-m", "vanilla_transformer"):
        return (words[3] if len(words) > 3 else ""), words[4:]
    if words[1:3] == ("-m", "train_accelerate") or Path(words[1]).name == "train_accelerate.py":
        return "train", words[3:] if words[1] == "-m" else words[2:]
    return None


def script_call(words: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | None:
    """(script, its arguments) of `python SCRIPT.py ...`, `bash SCRIPT.sh ...` or `./SCRIPT.sh ...`."""
    words = unlaunched(words)
    if (is_python(words[0]) and len(words) > 1 and words[1].endswith(".py")) or (
        words[0] in ("bash", "sh") and len(words) > 1 and words[1].endswith(".sh")
    ):
        return words[1], words[2:]
    if "/" in words[0] and words[0].endswith((".py", ".sh")):
        return words[0], words[1:]
    return None


COMMANDS = [command for path in [ROOT / "README.md", *DOCS_PAGES] for command in docs_commands(path)]
PROJECT_COMMANDS = [command for command in COMMANDS if project_call(command.words)]
SCRIPT_COMMANDS = [command for command in COMMANDS if script_call(command.words)]
# scripts other than the training script, given flags: those flags are checked by the script's own --help
SCRIPT_FLAG_COMMANDS = [
    command
    for command in SCRIPT_COMMANDS
    if not project_call(command.words)
    and script_call(command.words)[0].endswith(".py")
    and any(is_flag(word) for word in script_call(command.words)[1])
]


def command_id(command: Command) -> str:
    return f"{command.where} {' '.join(command.words[:3])}"


# --- the parsers of the project's commands ------------------------------------------------------------------------


class BuiltParser(BaseException):
    """Raised where a command would parse its arguments, with the parser it built (past `command`'s wrapper)."""


@functools.cache
def parser_of(subcommand: str) -> argparse.ArgumentParser:
    """The parser `vanilla-transformer SUBCOMMAND` builds: its `main` run until it parses, which raises instead."""
    from vanilla_transformer.commands.main import subcommand_main

    main = subcommand_main(subcommand)

    def built(parser, *args, **kwargs):
        raise BuiltParser(parser)

    with pytest.MonkeyPatch.context() as patch:
        for method in ("parse_args", "parse_known_args", "parse_intermixed_args", "parse_known_intermixed_args"):
            patch.setattr(argparse.ArgumentParser, method, built)
        try:
            main([])
        except BuiltParser as caught:
            return caught.args[0]
    raise AssertionError(f"`vanilla-transformer {subcommand}` returned without parsing its arguments")


def values_of(action: argparse.Action, following: tuple[str, ...]) -> list[str]:
    """The words after a flag that it takes as values (up to the next flag)."""
    words = list(itertools.takewhile(lambda word: not is_flag(word), following))
    if action.nargs == 0:
        return []
    if action.nargs in (None, "?"):
        return words[:1]
    return words[: action.nargs] if isinstance(action.nargs, int) else words


def refused_flags(parsers: list[argparse.ArgumentParser], arguments: tuple[str, ...], forbidden=frozenset()):
    """The flags among `arguments` that none of `parsers` has (the first that has a flag takes it), a value that the
    flag's type or choices refuse, and the flags in `forbidden` that the first parser lacks (passed on to another)."""
    refused = []
    for index, word in enumerate(arguments):
        if word == "--":
            break
        if not is_flag(word):
            continue
        flag, equals, value = word.partition("=")
        owner = next((parser for parser in parsers if flag in parser._option_string_actions), None)
        action = owner._option_string_actions[flag] if owner else None
        if action is None:
            refused.append(f"{flag} (no such flag)")
        elif flag in forbidden and owner is not parsers[0]:
            refused.append(f"{flag} (set by the command itself)")
        else:
            values = [value] if equals else values_of(action, arguments[index + 1 :])
            refused += [f"{flag} {value} ({why})" for value in values if (why := refused_value(action, value))]
    return refused


def refused_value(action: argparse.Action, value: str) -> str | None:
    """Why a flag's parser refuses a value (its type, which checks a range, or its choices); a placeholder in capitals
    (`MODEL_DIR`, `N`) stands for any value."""
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", value):
        return None
    try:
        typed = action.type(value) if callable(action.type) else value
    except (argparse.ArgumentTypeError, TypeError, ValueError) as error:
        return str(error) or "refused by its type"
    if action.choices is not None and typed not in action.choices:
        return f"not among {sorted(map(str, action.choices))}"
    return None


def refused_by_project(subcommand: str, arguments: tuple[str, ...]) -> list[str]:
    """What the subcommand refuses of `arguments`. `sweep` passes the flags it lacks on to `train`, but those that
    each row of the table sets itself (its ROW_FLAGS)."""
    from vanilla_transformer.commands.main import SUBCOMMANDS

    if subcommand in ("--help", "-h", "--version"):
        return []
    if subcommand not in SUBCOMMANDS:
        return [f"no subcommand {subcommand!r}"]
    if subcommand == "sweep":
        from vanilla_transformer.commands.sweep import ROW_FLAGS

        return refused_flags([parser_of("sweep"), parser_of("train")], arguments, forbidden=frozenset(ROW_FLAGS))
    return refused_flags([parser_of(subcommand)], arguments)


# --- the code map -------------------------------------------------------------------------------------------------


SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)(?<!\.)\.(?=\s|$)")


def first_sentence(docstring: str | None) -> str:
    """The first sentence of a docstring's first paragraph, on one line (the paragraph, where it has no period)."""
    paragraph = " ".join((docstring or "").strip().split("\n\n")[0].split())
    end = SENTENCE_END.search(paragraph)
    return paragraph[: end.end()] if end else paragraph


def module_sentence(path: Path) -> str:
    return first_sentence(ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))))


def mapped_modules() -> list[Path]:
    """The modules the map names: the Hub-facing files and the training script at the root, then the package's."""
    root = [*sorted(ROOT.glob("*_vanilla_transformer.py")), ROOT / "train_accelerate.py"]
    return root + sorted(LIBRARY.rglob("*.py"))


def layers() -> list[list[str]]:
    """pyproject.toml's import-linter layers, top first, each a list of siblings (`hub | training`)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^layers = \[(.*?)^\]", text, re.S | re.M).group(1)
    return [re.split(r"\s*[:|]\s*", entry) for entry in re.findall(r'"([^"]+)"', block)]


def folder_heading(folder: Path) -> str:
    if folder == ROOT:
        return "### The repository's root: the Hub-facing files, copied into every model folder, and the main job"
    name = folder.relative_to(ROOT).as_posix()
    if folder == LIBRARY:
        return f"### `{name}/`: the package (`__main__.py` stands in the top layer, with `commands/`)"
    top = folder.relative_to(LIBRARY).parts[0]
    number, siblings = next((n, layer) for n, layer in enumerate(layers(), 1) if top in layer)
    place = {1: " (the top)", len(layers()): " (the bottom)"}.get(number, "")
    beside = [f"`{sibling}/`" for sibling in siblings if sibling != top and not sibling.startswith("__")]
    if beside and len(folder.relative_to(LIBRARY).parts) == 1:
        place += f", beside {', '.join(beside)}"
    return f"### `{name}/`: layer {number} of {len(layers())}{place}"


def folder_order(folder: Path) -> tuple:
    if folder in (ROOT, LIBRARY):
        return (folder != ROOT, 0, "")
    top = folder.relative_to(LIBRARY).parts[0]
    order = [name for layer in layers() for name in layer]
    return (True, 1 + (order.index(top) if top in order else len(order)), folder.as_posix())


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def code_map() -> str:
    """docs/ARCHITECTURE.md's section of the map, as it should read: a table a folder, a row a module."""
    folders: dict[Path, list[Path]] = {}
    for module in mapped_modules():
        folders.setdefault(module.parent, []).append(module)
    lines = [
        MAP_HEADING,
        "",
        "A row a module: the first sentence of its docstring (`tests/test_docs.py` keeps the two equal;",
        "`python -m tests.test_docs` prints this section anew). Layer 1 is the top.",
        "",
    ]
    for folder in sorted(folders, key=folder_order):
        lines += [folder_heading(folder), "", "| module | what |", "| --- | --- |"]
        lines += [
            f"| `{module.relative_to(folder).as_posix()}` | {cell(module_sentence(module))} |"
            for module in folders[folder]
        ]
        lines.append("")
    return "\n".join(lines)


def map_section(text: str) -> tuple[int, int]:
    """The line range of the map's section in ARCHITECTURE.md: its heading to the next `## ` heading."""
    lines = text.splitlines()
    start = lines.index(MAP_HEADING)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return start, end


def split_row(line: str) -> list[str]:
    return [part.strip().replace("\\|", "|") for part in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def map_rows(text: str) -> list[tuple[Path, str]]:
    """(module, its text) of every row of the map's tables, the module's folder from the heading above its table."""
    start, end = map_section(text)
    rows, folder = [], ROOT
    for line in text.splitlines()[start:end]:
        if line.startswith("### "):
            named = re.search(r"`([^`]+)/`", line)
            folder = ROOT / named.group(1) if named else ROOT
        elif line.startswith("|"):
            cells = split_row(line)
            module = re.fullmatch(r"`([^`]+\.py)`", cells[0]) if cells else None
            if module:
                rows.append((folder / module.group(1), cells[1] if len(cells) > 1 else ""))
    return rows


def architecture() -> str:
    return ARCHITECTURE.read_text(encoding="utf-8")


# --- sizes --------------------------------------------------------------------------------------------------------


def test_the_readme_is_250_lines_at_most():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= PAGE_LIMITS["README.md"]


@pytest.mark.parametrize("page", DOCS_PAGES, ids=lambda page: page.name)
def test_a_docs_page_is_300_lines_at_most_and_the_benchmarks_400(page):
    assert len(page.read_text(encoding="utf-8").splitlines()) <= PAGE_LIMITS.get(page.name, 300)


def test_no_row_of_the_architecture_tables_is_over_200_characters():
    long = [
        f"docs/ARCHITECTURE.md:{number} ({len(line)})"
        for number, line in enumerate(architecture().splitlines(), 1)
        if line.startswith("|") and len(line) > ROW_LIMIT
    ]
    assert long == []


# --- tracker numbers ----------------------------------------------------------------------------------------------


TRACKER_NUMBER = re.compile("issue" + r" [0-9]+", re.IGNORECASE)  # two pieces: this file does not match itself


def test_no_tracked_python_or_markdown_file_names_a_tracker_number():
    """A number of this project's tracker means nothing to a reader (the history has it)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = [ROOT / name for name in listed.split("\0") if name]
    cited = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in paths
        if path.is_file() and path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if TRACKER_NUMBER.search(line)
    ]
    assert cited == []


# --- the docs' commands -------------------------------------------------------------------------------------------


def test_the_command_reader_joins_lines_splits_chains_and_keeps_only_shell_blocks():
    text = (
        "```bash\n"
        "# a comment\n"
        "pip install x && vanilla-transformer train --preset small \\\n"
        "    --max_minutes 5  # the budget\n"
        "OMP_NUM_THREADS=1 vanilla-transformer translate M < in.txt > out.txt\n"
        "```\n"
        "```python\nvanilla-transformer push M --no_such_flag\n```\n"
        "```console\n$ vanilla-transformer demo M\nRunning on http://127.0.0.1:7860\n```\n"
    )
    lines = [line for block in shell_blocks(text) for line in command_lines(block)]
    assert [(number, words) for number, line in lines for words in split_commands(line)] == [
        (3, ["pip", "install", "x"]),
        (3, ["vanilla-transformer", "train", "--preset", "small", "--max_minutes", "5"]),
        (5, ["vanilla-transformer", "translate", "M"]),
        (11, ["vanilla-transformer", "demo", "M"]),
    ]


def test_the_training_script_and_accelerate_launch_are_read_as_the_project_commands_they_run():
    launch = ("accelerate", "launch", "--config_file", "c.yaml", "train_accelerate.py", "--preset", "base")
    assert project_call(launch) == ("train", ("--preset", "base"))
    module = ("accelerate", "launch", "-m", "vanilla_transformer", "translate", "M", "--input", "x")
    assert project_call(module) == ("translate", ("M", "--input", "x"))
    assert project_call(("python3", "-m", "pytest", "-q")) is None
    assert script_call(("bash", "benchmarks/train_multi30k.sh", "DIR")) == ("benchmarks/train_multi30k.sh", ("DIR",))


def test_the_flag_check_finds_a_flag_the_parser_lacks_and_a_value_its_type_or_choices_refuse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--known")
    parser.add_argument("--mode", choices=["a", "b"])
    parser.add_argument("--steps", type=int)
    arguments = (
        "PLACEHOLDER",
        "--known",
        "-5",
        "--unknown",
        "--mode",
        "c",
        "--mode=a",
        "--steps",
        "N",
        "--steps",
        "x",
    )
    assert refused_flags([parser], arguments) == [
        "--unknown (no such flag)",
        "--mode c (not among ['a', 'b'])",
        "--steps x (invalid literal for int() with base 10: 'x')",
    ]


def test_sweep_passes_on_the_flags_of_train_but_not_those_each_row_sets():
    assert refused_by_project("sweep", ("--minutes", "5", "--output_dir", "o", "--vocab_size", "8000")) == []
    assert refused_by_project("sweep", ("--minutes", "5", "--output_dir", "o", "--preset", "base")) == [
        "--preset (set by the command itself)"
    ]


@pytest.mark.parametrize("command", PROJECT_COMMANDS, ids=command_id)
def test_a_docs_command_names_a_subcommand_that_exists_with_flags_it_accepts(command):
    subcommand, arguments = project_call(command.words)
    try:
        refused = refused_by_project(subcommand, arguments)
    except ModuleNotFoundError as missing:  # an extra this environment lacks (serve's starlette, ...)
        pytest.skip(f"`{subcommand}` needs {missing.name}")
    assert refused == [], f"{command.where}: {' '.join(command.words)}"


@pytest.mark.parametrize("command", SCRIPT_COMMANDS, ids=command_id)
def test_a_script_a_docs_command_runs_exists(command):
    script, _ = script_call(command.words)
    assert (ROOT / script).is_file(), f"{command.where}: no {script}"


LAUNCH_CONFIGS = [
    (command, words[index + 1])
    for command in COMMANDS
    if (words := command.words)[:2] == ("accelerate", "launch")
    for index, word in enumerate(words[:-1])
    if word == "--config_file"
]


@pytest.mark.parametrize(("command", "config"), LAUNCH_CONFIGS, ids=[command_id(c) for c, _ in LAUNCH_CONFIGS])
def test_an_accelerate_config_a_docs_command_names_exists(command, config):
    assert (ROOT / config).is_file(), f"{command.where}: no {config}"


@pytest.mark.slow
@pytest.mark.parametrize("command", SCRIPT_FLAG_COMMANDS, ids=command_id)
def test_a_script_a_docs_command_runs_offers_the_flags_it_is_given(command):
    """The script's own --help (a process, which imports torch): each flag the docs give it, listed."""
    script, arguments = script_call(command.words)
    result = subprocess.run(
        [sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    offered = set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", result.stdout))
    flags = [word.partition("=")[0] for word in arguments if is_flag(word)]
    assert [flag for flag in flags if flag not in offered] == [], f"{command.where}: {' '.join(command.words)}"


# --- the code map -------------------------------------------------------------------------------------------------


def test_a_first_sentence_ends_at_a_period_before_a_space_not_inside_e_g_or_an_ellipsis():
    assert first_sentence("Train it, e.g. on 8 GPUs (`accelerate launch ...`).\n  More.") == (
        "Train it, e.g. on 8 GPUs (`accelerate launch ...`)."
    )
    assert first_sentence("The rule for a folder:\n\nnew or empty.") == "The rule for a folder:"
    assert first_sentence(None) == ""


def test_the_code_map_has_one_row_per_module_and_none_for_a_module_that_is_gone():
    named = [module for module, _ in map_rows(architecture())]
    doubled = sorted({str(module.relative_to(ROOT)) for module in named if named.count(module) > 1})
    missing = sorted(str(module.relative_to(ROOT)) for module in set(mapped_modules()) - set(named))
    stale = sorted(str(module.relative_to(ROOT)) for module in set(named) - set(mapped_modules()))
    assert (missing, stale, doubled) == ([], [], []), "python -m tests.test_docs --write regenerates the map"


def test_each_row_of_the_code_map_is_its_modules_first_docstring_sentence():
    differ = [
        f"{module.relative_to(ROOT)}: the map says {text!r}, the docstring {sentence!r}"
        for module, text in map_rows(architecture())
        if module.is_file() and text != (sentence := module_sentence(module))
    ]
    assert differ == [], "python -m tests.test_docs --write regenerates the map"


def test_every_module_has_a_docstring_with_a_first_sentence():
    assert [str(module.relative_to(ROOT)) for module in mapped_modules() if not module_sentence(module)] == []


def test_the_code_map_headings_state_the_layers_pyproject_toml_gives():
    start, end = map_section(architecture())
    headings = [line for line in architecture().splitlines()[start:end] if line.startswith("### ")]
    assert headings == [line for line in code_map().splitlines() if line.startswith("### ")]


def test_every_file_the_architecture_page_names_exists():
    """The prose too: a `name.py` it mentions is a module or a file of tests/ or benchmarks/."""
    existing = {
        path.name for folder in (LIBRARY, ROOT / "tests", ROOT / "benchmarks") for path in folder.rglob("*.py")
    }
    existing |= {path.name for path in ROOT.glob("*.py")}
    named = {Path(name).name for name in re.findall(r"`([\w/.]+\.py)`", architecture())}
    assert sorted(named - existing) == []


def write_code_map() -> None:
    """Replace ARCHITECTURE.md's map section with `code_map()`."""
    lines = architecture().splitlines()
    start, end = map_section(architecture())
    new = [*lines[:start], *code_map().splitlines(), *lines[end:]]
    ARCHITECTURE.write_text("\n".join(new).rstrip("\n") + "\n", encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_code_map()
    else:
        print(code_map())
