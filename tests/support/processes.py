"""Which tests need processes of their own, and keeping every other test free of them.

A test *needs processes* when it runs ZooKeeper, broker processes, moto's S3 server, Spark's JVM
or a command-line tool (kcat, strace, riverbed's CLI, mount, ruff...). tests/conftest.py marks
it `processes` at collection: from the fixtures it uses (PROCESS_FIXTURES, directly or through
other fixtures), or from an explicit `@pytest.mark.processes` on a test, a module (`pytestmark`)
or a parameter (`pytest.param(..., marks=...)`) that starts one itself. `make test-fast` runs
the others (`-m "not processes"`), `make test` runs both.

The direction that matters is also enforced as the tests run: a test without the mark that
starts a process, while its fixtures are set up or while it runs, fails right there, naming the
mark it lacks. A fixture or test that starts one cannot slip into the fast run unnoticed, even
if this list is not told about it; tests/repo/test_process_marks.py checks the marking itself.
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final, NoReturn

import pytest

MARK: Final = "processes"

# Fixtures that start a process themselves; a fixture built on one (`broker`, `zk_chroot`,
# `tiered_broker`...) has it among the fixtures it uses, so its tests are marked too.
PROCESS_FIXTURES: Final = frozenset(
    {
        "zookeeper",  # Debian's ZooKeeper server, one per test process (tests/support/zookeeper.py)
        "own_zookeeper",  # a ZooKeeper server of the test's own, to stop and restart
        "own_server",  # the same, as tests/coordination and tests/security name it
        "broker_factory",  # broker processes (tests/support/broker.py)
        "cluster_factory",  # several of them (tests/support/cluster.py)
        "moto_server",  # moto's standalone S3 server (tests/support/moto_server.py)
        "moto_server_factory",
        "spark",  # Spark's JVM (tests/spark/conftest.py)
        "group_members",  # consumer processes (tests/groups/group_support.py)
        "tiny_tmpfs",  # mount(8) and umount(8) (tests/hot/test_log.py)
    }
)

# Every way Python code starts a process: subprocess (and asyncio's subprocesses and os.popen,
# built on it), fork (multiprocessing's default), posix_spawn, system(3), and the fork-exec
# multiprocessing's spawn start method calls.
_STARTERS: Final = (
    (subprocess.Popen, "_execute_child"),
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (_posixsubprocess, "fork_exec"),
)


def needs_processes(item: pytest.Item) -> bool:
    fixtures: list[str] = getattr(item, "fixturenames", [])
    return item.get_closest_marker(MARK) is not None or not PROCESS_FIXTURES.isdisjoint(fixtures)


@contextmanager
def processes_refused(item: pytest.Item) -> Iterator[None]:
    """While in the block, starting a process fails `item`, unless it is marked `processes`."""
    if item.get_closest_marker(MARK) is not None:
        yield
        return

    def refuse(*args: Any, **kwargs: Any) -> NoReturn:
        pytest.fail(
            f"{item.nodeid} started a process but is not marked `{MARK}`: mark the test, its "
            f"module or its parameter @pytest.mark.{MARK}, or add the fixture that starts it to "
            "PROCESS_FIXTURES (tests/support/processes.py)"
        )

    with pytest.MonkeyPatch.context() as patch:
        for owner, name in _STARTERS:
            patch.setattr(owner, name, refuse)
        yield
