"""`python -m tools.codegen` keeps the protocol's generated modules in the source tree current
with their spec files, whatever copy of the package is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROTOCOL = REPO / "platform" / "protocol"
GENERATED = ("messages.py", "data_messages.py")

# Each test runs tools.codegen in a process of its own (it must not import the installed package).
pytestmark = pytest.mark.processes


def _codegen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.codegen", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_generated_modules_of_the_source_tree_match_their_specs() -> None:
    result = _codegen("--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_codegen_rewrites_the_stale_files_of_the_tree_it_is_given(tmp_path: Path) -> None:
    protocol = tmp_path / "protocol"
    shutil.copytree(PROTOCOL, protocol, ignore=shutil.ignore_patterns("__pycache__"))
    (protocol / "messages.py").unlink()
    (protocol / "data_messages.py").write_text("stale\n", encoding="utf-8")

    check = _codegen("--check", "--protocol-dir", str(protocol))
    assert check.returncode == 1
    assert check.stdout.splitlines() == [
        f"{protocol / name} is stale: run python -m tools.codegen" for name in GENERATED
    ]
    assert _codegen("--protocol-dir", str(protocol)).returncode == 0
    for name in GENERATED:
        assert (protocol / name).read_text() == (PROTOCOL / name).read_text()
    assert _codegen("--check", "--protocol-dir", str(protocol)).returncode == 0
