"""Fixtures shared by every test directory: a real ZooKeeper and real broker processes.

- `zookeeper`: one Debian ZooKeeper server per test process (tests/support/zookeeper.py).
- `zk_chroot` / `zk_connect`: a fresh chroot on it per test, so tests never see each other.
- `broker`, `broker_factory`: broker processes started as a user would (`python -m riverbed.cli
  broker ...`) on 127.0.0.1, killed at teardown (tests/support/broker.py).
- `cluster_factory`: N such brokers as one cluster, with fault injection (kill, terminate,
  restart, pause) and Metadata polling helpers (tests/support/cluster.py).
"""

from __future__ import annotations

import random
import threading

import kazoo.protocol.connection
import kazoo.retry
import pytest
from hypothesis import HealthCheck, settings

from tests.support.broker import broker, broker_factory  # noqa: F401
from tests.support.cluster import cluster_factory  # noqa: F401
from tests.support.xdist_scheduling import FileOrDirectoryScheduling, whole_directories_first
from tests.support.zookeeper import own_zookeeper, zk_chroot, zookeeper  # noqa: F401

# Hypothesis times each example against a 200 ms deadline by default, and fails a test whose
# data generation is slow: on a host that stops the process for 0.4-0.6 s at a time (CI, see
# docs/testing.md) both fail tests whose code is fine. Property tests assert properties, and
# the benchmarks measure time.
settings.register_profile("riverbed", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("riverbed")


@pytest.fixture
def zk_connect(zk_chroot: str) -> str:  # noqa: F811 - the fixture, by its name
    return zk_chroot


# kazoo's connection thread and retries draw their jitter from the global `random`. Hypothesis
# fails whatever test it is generating data for when the global random state moves under it (it
# could not replay the example): in CI a ZooKeeper client left running by an earlier test did
# that every ping, and 264 property tests failed far from it. Their own generator keeps the two
# apart; a client left running is still reported at the end of the session.
kazoo.protocol.connection.random = random.Random()
kazoo.retry.random = random.Random()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    whole_directories_first(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadfile` (what `make test` asks for) keeps tests/spark on one worker."""
    if config.getoption("dist") != "loadfile":
        return None
    return FileOrDirectoryScheduling(config, log)


def _zk_loops_running() -> list[str]:
    return [t.name for t in threading.enumerate() if "zk_loop" in t.name]


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Under pytest-xdist a worker's own summary is never shown: it hands its list to the
    # controller, which reports every worker's (pytest_testnodedown below).
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["zk_loops_running"] = _zk_loops_running()


_reported_zk_loops: list[str] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    workeroutput = getattr(node, "workeroutput", {})
    _reported_zk_loops.extend(workeroutput.get("zk_loops_running", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    running = _zk_loops_running() + _reported_zk_loops
    if running:
        terminalreporter.write_line(
            f"ZooKeeper clients still running after the tests (a test did not stop one): "
            f"{len(running)} ({', '.join(running)})"
        )
