"""The code-quality promises of DEVELOPERS.md, enforced by the suite: mypy strict and ruff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("platform", "spark", "tests", "bench", "tools")

# mypy and ruff run as the commands a developer runs.
pytestmark = pytest.mark.processes


def test_mypy_strict_on_the_riverbed_package() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tools.typecheck"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_lint_and_format() -> None:
    ruff = [sys.executable, "-m", "ruff"]
    lint = subprocess.run([*ruff, "check", *SOURCES], cwd=REPO, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    fmt = subprocess.run(
        [*ruff, "format", "--check", *SOURCES], cwd=REPO, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout
