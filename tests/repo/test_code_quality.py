"""The code-quality promises of docs/testing.md, enforced by the suite: mypy on everything that
ships and everything that tests it, and ruff's lint and format on the same files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.typecheck import PACKAGES

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("platform", "spark", "tests", "bench", "tools")

# mypy and ruff run as the commands a developer runs.
pytestmark = pytest.mark.processes


def test_mypy_on_every_package() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tools.typecheck"], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_python_file_ruff_checks_is_type_checked() -> None:
    """A Python file outside the packages tools/typecheck checks (say, in a new folder under
    spark/) would be linted but never type-checked."""
    checked = [REPO / folder for folder in PACKAGES.values()]
    unchecked = [
        path.relative_to(REPO)
        for source in SOURCES
        for path in (REPO / source).rglob("*.py")
        if not any(path.is_relative_to(folder) for folder in checked)
    ]
    assert unchecked == []


def test_ruff_lint_and_format() -> None:
    ruff = [sys.executable, "-m", "ruff"]
    lint = subprocess.run([*ruff, "check", *SOURCES], cwd=REPO, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    fmt = subprocess.run(
        [*ruff, "format", "--check", *SOURCES], cwd=REPO, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout
