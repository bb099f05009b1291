"""Every package a module imports (library, commands, tests, benchmarks) is declared in pyproject.toml itself, not
only brought by another package: deptry, configured in pyproject.toml's [tool.deptry]."""

import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT


@pytest.mark.slow
def test_every_imported_package_is_declared_directly():
    deptry = Path(sys.executable).with_name("deptry")
    result = subprocess.run([str(deptry), "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
