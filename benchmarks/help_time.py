"""How long `vanilla-transformer --help` and each `vanilla-transformer SUBCOMMAND --help` take, as a user starts them:
a fresh process through the installed console script, wall clock, the median of interleaved repetitions after a warm-up
(`timing.median_seconds`). Also whether each imported torch or transformers (`python -X importtime`).

    python benchmarks/help_time.py [--repetitions 5]

The figures go into docs/BENCHMARKS.md with the machine and the date.
"""

import argparse
import platform
import shutil
import subprocess
import sys
from datetime import date

from timing import median_seconds

from vanilla_transformer.commands.main import SUBCOMMANDS as COMMANDS

SUBCOMMANDS = (None, *COMMANDS)  # `vanilla-transformer --help`, then each subcommand's
HEAVY = ("torch", "transformers")


def argv(subcommand: str | None) -> list[str]:
    return [*([] if subcommand is None else [subcommand]), "--help"]


def heavy_imports(subcommand: str | None) -> list[str]:
    """The heavy packages a `--help` imports, from `python -X importtime -m vanilla_transformer ...`."""
    command = [sys.executable, "-X", "importtime", "-m", "vanilla_transformer", *argv(subcommand)]
    report = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    imported = {line.split("|")[-1].strip() for line in report.splitlines() if line.startswith("import time:")}
    return [name for name in HEAVY if name in imported]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5)
    repetitions = parser.parse_args().repetitions
    script = shutil.which("vanilla-transformer")
    if script is None:
        sys.exit("vanilla-transformer is not on the PATH: pip install -e . first")
    runs = {
        " ".join(argv(name)): lambda name=name: subprocess.run([script, *argv(name)], capture_output=True, check=True)
        for name in SUBCOMMANDS
    }
    seconds = median_seconds(runs, repetitions)
    print(f"{date.today()}, {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"| command | median of {repetitions} (s) | imports torch or transformers |")
    print("| --- | --- | --- |")
    for name in SUBCOMMANDS:
        heavy = ", ".join(heavy_imports(name)) or "neither"
        print(f"| `vanilla-transformer {' '.join(argv(name))}` | {seconds[' '.join(argv(name))]:.2f} | {heavy} |")


if __name__ == "__main__":
    main()
