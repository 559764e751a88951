"""Fixtures shared by every test directory: a real ZooKeeper and real broker processes.

- `zookeeper`: one Debian ZooKeeper server per test process (tests/support/zookeeper.py).
- `zk_chroot` / `zk_connect`: a fresh chroot on it per test, so tests never see each other.
- `broker`, `broker_factory`: broker processes started as a user would (`python -m riverbed.cli
  broker ...`) on 127.0.0.1, killed at teardown (tests/support/broker.py).
- `cluster_factory`: N such brokers as one cluster, with fault injection (kill, terminate,
  restart, pause) and Metadata polling helpers (tests/support/cluster.py).

Tests that need such processes are marked `processes`, and the others may not start any
(tests/support/processes.py): `make test-fast` runs the others.
"""

from __future__ import annotations

import random
import threading
from typing import Final

import kazoo.protocol.connection
import kazoo.retry
import pytest
from hypothesis import HealthCheck, settings

from tests.support.broker import broker, broker_factory  # noqa: F401
from tests.support.cluster import cluster_factory  # noqa: F401
from tests.support.processes import MARK, needs_processes, processes_refused
from tests.support.xdist_scheduling import FileOrDirectoryScheduling, whole_directories_first
from tests.support.zookeeper import own_zookeeper, zk_chroot, zookeeper  # noqa: F401

# Hypothesis times each example against a 200 ms deadline by default, and fails a test whose
# data generation is slow: on a host that stops the process for 0.4-0.6 s at a time (CI, see
# docs/testing.md) both fail tests whose code is fine. Property tests assert properties, and
# the benchmarks measure time.
settings.register_profile("riverbed", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("riverbed")

# `make test-fast` loads this profile (--hypothesis-profile): a property test runs at most
# FAST_EXAMPLES examples there, however many its own @settings asks for (`make test` runs the
# numbers as written). Drawing the examples is most of the unit tests' time: 2.5 minutes of
# CPU with the tests' own numbers, 80 s with 10 examples at most, 60 s with 5: under a minute on
# two cores, which a quick check while working can wait for.
FAST_PROFILE: Final = "riverbed-fast"
FAST_EXAMPLES: Final = 5
settings.register_profile(
    FAST_PROFILE, settings.get_profile("riverbed"), max_examples=FAST_EXAMPLES
)


def _cap_examples(items: list[pytest.Item]) -> None:
    """A test's own max_examples wins over any profile, and Hypothesis has no public way to
    bound it: this lowers the settings @given attached to the test, which it reads each run."""
    for item in items:
        test = getattr(item, "obj", None)
        own: settings | None = getattr(test, "_hypothesis_internal_use_settings", None)
        if own is not None and own.max_examples > FAST_EXAMPLES:
            test._hypothesis_internal_use_settings = settings(own, max_examples=FAST_EXAMPLES)  # type: ignore[union-attr]


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


@pytest.hookimpl(tryfirst=True)  # the mark is set before `-m` selects by it
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("hypothesis_profile") == FAST_PROFILE:
        _cap_examples(items)
    for item in items:
        if needs_processes(item):
            item.add_marker(MARK)
    whole_directories_first(items)


# Setup covers the fixtures too: a session fixture is started by the first test that uses it.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> object:
    with processes_refused(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    with processes_refused(item):
        return (yield)


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
