"""The package as users install it: a wheel in a fresh virtual environment, its commands run from a folder outside the
repository, the model folder they write loaded by transformers in a clean process.

The fresh environment gets this environment's dependencies through a .pth line (a .pth file in a folder added that
way is not run, so this environment's editable install of the project does not come along): the wheel is all of the
project it can import, which each test checks before using it.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from vanilla_transformer.mechanics.names import REQUIRED_FILES, WEIGHTS_NAME

from .helpers import ENGLISH, OFFLINE, ROOT, TINY_RUN, run_without_the_project

NOT_SOURCE = (
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    "outputs",
    "runs",
    "data-bin",
)


def run(command: list, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment |= OFFLINE
    result = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ folder of a fresh virtual environment holding the project's wheel (built with `pip wheel`)."""
    work = tmp_path_factory.mktemp("package")
    # a copy of the working tree without build outputs: a stale build/ folder would hide what the package misses
    source = shutil.copytree(ROOT, work / "source", symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    # --no-build-isolation: the build uses this environment's setuptools instead of downloading one
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", work, source], cwd=work)
    (wheel,) = work.glob("vanilla_transformer-*.whl")
    fresh = work / "venv"
    venv.create(fresh, with_pip=False)
    site_packages = Path(
        run([fresh / "bin" / "python", "-c", "import site; print(site.getsitepackages()[0])"], work).stdout.strip()
    )
    (site_packages / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", fresh / "bin" / "python", "install", "--no-deps", wheel], cwd=work)
    where = run(
        [fresh / "bin" / "python", "-c", "import vanilla_transformer, train_accelerate as t; print(t.__file__)"],
        cwd=work,
    ).stdout
    assert Path(where.strip()).is_relative_to(fresh), f"the fresh environment imports the project from {where}"
    return fresh / "bin"


@pytest.fixture(scope="module")
def trained(installed, tmp_path_factory) -> Path:
    """A folder outside the repository where the installed command trained a tiny model into `model/`."""
    outside = tmp_path_factory.mktemp("outside")
    assert not outside.resolve().is_relative_to(ROOT)
    run([installed / "vanilla-transformer", "train", "--output_dir", "model", *TINY_RUN, "--max_steps", "3"], outside)
    return outside


@pytest.mark.slow
def test_the_installed_train_command_writes_a_complete_model_folder_with_its_card(trained):
    folder = trained / "model"
    assert [name for name in (*REQUIRED_FILES, WEIGHTS_NAME) if not (folder / name).is_file()] == []
    card = (folder / "README.md").read_text()
    assert card.startswith("---\n") and "Attention Is All You Need" in card and "$" not in card.split("---")[1]


@pytest.mark.slow
def test_the_installed_translate_command_translates_line_by_line(installed, trained):
    result = run(
        [installed / "vanilla-transformer", "translate", "model"], trained, input="\n".join(ENGLISH[:3]) + "\n"
    )
    assert len(result.stdout.splitlines()) == 3 and "translated 3 lines (3 sentences," in result.stderr


@pytest.mark.slow
def test_the_folder_loads_with_transformers_alone_in_a_clean_process(trained):
    printed = run_without_the_project(
        """
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        model = AutoModelForSeq2SeqLM.from_pretrained("model", trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained("model", trust_remote_code=True)
        output = model.generate(**tokenizer(["the house is small"], return_tensors="pt"), max_new_tokens=5)
        print(type(model).__name__, output.shape[0])
        """,
        trained,
    )
    assert printed.split() == ["VanillaTransformerForConditionalGeneration", "1"]


HELP_OF_EACH_SUBCOMMAND = """
import contextlib, io, json
from vanilla_transformer.commands.main import SUBCOMMANDS, subcommand_main
helps = {}
for name in SUBCOMMANDS:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit):
        subcommand_main(name)(["--help"])
    helps[name] = printed.getvalue()
print(json.dumps(helps))
"""


@pytest.mark.slow
def test_every_command_answers_help_and_version_from_the_installed_package(installed, tmp_path):
    main_help = run([installed / "vanilla-transformer", "--help"], tmp_path).stdout
    listed = [line.split()[1] for line in main_help.splitlines() if line.startswith("    vanilla-transformer ")]
    helps = json.loads(run([installed / "python", "-c", HELP_OF_EACH_SUBCOMMAND], tmp_path).stdout)
    assert sorted(listed) == sorted(helps)
    assert all(f"usage: vanilla-transformer {name}" in text and "--version" in text for name, text in helps.items())
    assert "--max_tokens" in helps["train"] and "--num_beams" in helps["translate"]
    version = run([installed / "vanilla-transformer", "translate", "--version"], tmp_path).stdout
    assert version.startswith("vanilla-transformer 0.") and "transformers 5." in version and "torch 2." in version
    assert (
        run([installed / "python", "-m", "vanilla_transformer", "translate", "--version"], tmp_path).stdout == version
    )


@pytest.mark.slow
def test_accelerate_launch_starts_the_installed_training_module(installed, tmp_path):
    launch = [installed / "python", "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1"]
    launch += ["--mixed_precision", "no", "--dynamo_backend", "no", "-m", "train_accelerate"]
    run([*launch, "--output_dir", "run", *TINY_RUN, "--max_steps", "2"], tmp_path)
    assert (tmp_path / "run" / WEIGHTS_NAME).is_file() and (tmp_path / "run" / "README.md").is_file()
