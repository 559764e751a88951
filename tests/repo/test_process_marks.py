"""The `processes` mark (tests/support/processes.py) in the direction that matters: `make
test-fast` must never select a test that needs a ZooKeeper, a broker, moto's server, Spark or a
CLI, and a test it does select cannot start a process unnoticed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from tests.support.process_audit import PATH_VARIABLE
from tests.support.processes import PROCESS_FIXTURES

REPO: Final = Path(__file__).resolve().parents[2]
# Collecting the whole suite imports every test module (pyspark, pyarrow, the clients).
COLLECT_TIMEOUT_S: Final = 300.0
REFUSED: Final = "not marked `processes`"


def collected(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    """The suite as `pytest --collect-only *args` sees it: each test's id, fixtures, selection."""
    audit = tmp_path / "audit.json"
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    command += ["-p", "tests.support.process_audit", *args, "tests"]
    result = subprocess.run(
        command,
        cwd=REPO,
        env={**os.environ, PATH_VARIABLE: str(audit)},
        capture_output=True,
        text=True,
        timeout=COLLECT_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    tests: list[dict[str, Any]] = json.loads(audit.read_text())
    return tests


@pytest.mark.processes
def test_what_make_test_fast_selects_uses_no_process_fixture(tmp_path: Path) -> None:
    tests = collected(tmp_path, "-m", "not processes")
    selected = [t for t in tests if t["selected"]]
    assert selected
    assert len(selected) < len(tests)
    units_with_processes = [
        f"{t['id']}: {sorted(PROCESS_FIXTURES.intersection(t['fixtures']))}"
        for t in selected
        if not PROCESS_FIXTURES.isdisjoint(t["fixtures"])
    ]
    assert not units_with_processes, "\n".join(units_with_processes)
    # A fixture renamed without this list would mark nothing any more: each name is in use.
    used = {name for t in tests for name in t["fixtures"]}
    assert used >= PROCESS_FIXTURES, sorted(PROCESS_FIXTURES - used)


def test_a_test_without_the_mark_cannot_start_a_process() -> None:
    with pytest.raises(pytest.fail.Exception, match=REFUSED):
        subprocess.run(["true"], check=True)
    with pytest.raises(pytest.fail.Exception, match=REFUSED):
        asyncio.run(asyncio.create_subprocess_exec("true"))
    with pytest.raises(pytest.fail.Exception, match=REFUSED):
        os.system("true")
    with pytest.raises(pytest.fail.Exception, match=REFUSED):
        _fork_and_leave()


def _fork_and_leave() -> None:
    if os.fork() == 0:  # only if the fork was not refused: the child must not run on
        os._exit(0)


@pytest.mark.processes
def test_a_test_with_the_mark_may() -> None:
    subprocess.run(["true"], check=True)
