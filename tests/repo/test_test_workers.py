"""How `make test` splits the suite over pytest-xdist workers (tests/support/xdist_scheduling.py,
tests/support/ports.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support import ports
from tests.support.xdist_scheduling import (
    FileOrDirectoryScheduling,
    whole_directories_first,
)


def test_each_worker_picks_ports_from_a_slice_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    slices = []
    for index in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        slices.append(ports._worker_slice(20_000, 32_000))
        low, high = ports._worker_slice(ports.PICK_LOW, ports._pick_high())
        for _ in range(50):
            assert low <= ports.free_port() < high
    assert slices == [(20_000, 23_000), (23_000, 26_000), (26_000, 29_000), (29_000, 32_000)]
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert ports._worker_slice(20_000, 32_000) == (20_000, 32_000)


def test_spark_tests_are_one_unit_and_other_files_one_each() -> None:
    split = FileOrDirectoryScheduling._split_scope
    scheduler = object.__new__(FileOrDirectoryScheduling)
    assert split(scheduler, "tests/spark/test_jobs.py::test_a") == "tests/spark/"
    assert split(scheduler, "tests/spark/test_batch_read.py::test_b[x]") == "tests/spark/"
    assert split(scheduler, "tests/hot/test_log.py::test_c") == "tests/hot/test_log.py"
    assert split(scheduler, "tests/sparkling/test_d.py::test_e") == "tests/sparkling/test_d.py"


def test_spark_tests_go_first_and_the_rest_keep_their_order() -> None:
    ids = [
        "tests/broker/a.py::t1",
        "tests/spark/b.py::t2",
        "tests/hot/c.py::t3",
        "tests/spark/d.py::t4",
    ]
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    whole_directories_first(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [ids[1], ids[3], ids[0], ids[2]]
