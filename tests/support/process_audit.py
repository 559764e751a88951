"""A pytest plugin for tests/repo/test_process_marks.py (`-p tests.support.process_audit`): once
the suite is collected, writes each test's id, the fixtures it uses and whether it was selected
(or deselected by `-m`) as JSON to the file $PROCESS_AUDIT_PATH names."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final

import pytest

PATH_VARIABLE: Final = "PROCESS_AUDIT_PATH"

_deselected: list[pytest.Item] = []


def pytest_deselected(items: list[pytest.Item]) -> None:
    _deselected.extend(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    tests = [
        {"id": item.nodeid, "selected": selected, "fixtures": getattr(item, "fixturenames", [])}
        for selected, items in ((True, session.items), (False, _deselected))
        for item in items
    ]
    Path(os.environ[PATH_VARIABLE]).write_text(json.dumps(tests))
