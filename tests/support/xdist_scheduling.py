"""How `make test` spreads tests over pytest-xdist workers: a test file at a time (its module
fixtures are built once), except directories whose tests share an expensive session fixture,
which go to one worker whole and first.

tests/spark shares one Spark JVM per worker process (tests/spark/conftest.py): spread over the
workers, its files started a JVM on each (three ran at once here, each ~20 CPU-seconds in its
first minute) and, with xdist's default order (most tests first), ran at the end of the run.
"""

from __future__ import annotations

from typing import Final

import pytest
from xdist.scheduler import LoadFileScheduling

WHOLE_DIRECTORIES: Final = ("tests/spark/",)


def whole_directory(nodeid: str) -> str | None:
    """The directory that `nodeid` is scheduled with, if it is one of WHOLE_DIRECTORIES."""
    return next((d for d in WHOLE_DIRECTORIES if nodeid.startswith(d)), None)


class FileOrDirectoryScheduling(LoadFileScheduling):  # type: ignore[misc]  # xdist has no types
    def _split_scope(self, nodeid: str) -> str:
        return whole_directory(nodeid) or super()._split_scope(nodeid)


def whole_directories_first(items: list[pytest.Item]) -> None:
    """Reorders `items` in place, tests of WHOLE_DIRECTORIES first, the rest as collected (a
    worker then starts on the longest unit while the others take the files)."""
    items.sort(key=lambda item: whole_directory(item.nodeid) is None)
