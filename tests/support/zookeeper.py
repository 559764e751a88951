"""Real-ZooKeeper fixtures: one server per test process, one chroot per test.

Re-export from a conftest.py:

    from tests.support.zookeeper import zk_chroot, zookeeper  # noqa: F401

The server is cached at module level, so importing these fixtures into several conftest files
still starts a single server. Tests that stop ZooKeeper use a server of their own: the
`own_zookeeper` fixture (import it into the test module).
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from riverbed.coordination.embedded_zk import EmbeddedZooKeeper, require_available
from riverbed.coordination.zk import AsyncZooKeeper

from tests.support.ports import free_port

# Short ticks make session expiry tests fast (the minimum session timeout is two ticks).
TEST_TICK_TIME_MS = 100

_server: EmbeddedZooKeeper | None = None


def new_test_server(data_dir: Path) -> EmbeddedZooKeeper:
    """A server configured for tests (short ticks, no fsync), on a port of the test run's own
    (tests/support/ports.py); not yet started."""
    return EmbeddedZooKeeper(data_dir, free_port(), tick_time_ms=TEST_TICK_TIME_MS, fsync=False)


class DedicatedZooKeeper:
    """A ZooKeeper server of one test, stopped and started from one long-lived thread: the
    server is killed when the thread that started it ends (PR_SET_PDEATHSIG)."""

    def __init__(self, data_dir: Path) -> None:
        self.server: EmbeddedZooKeeper = new_test_server(data_dir)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zookeeper")

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self.server.start)

    async def stop(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self.server.stop)

    def start_blocking(self) -> None:
        self._thread.submit(self.server.start).result()

    def close(self) -> None:
        self._thread.submit(self.server.stop).result()
        self._thread.shutdown()


@pytest.fixture
def own_zookeeper(tmp_path: Path) -> Iterator[DedicatedZooKeeper]:
    """A started ZooKeeper server for this test alone, which it may stop and start."""
    zookeeper = DedicatedZooKeeper(tmp_path / "zookeeper")
    zookeeper.start_blocking()
    try:
        yield zookeeper
    finally:
        zookeeper.close()


def restart_proof_connect(server: EmbeddedZooKeeper, chroot: str) -> str:
    """A connect string for clients that must keep their sessions across a restart of `server`.

    A ZooKeeper client waits for a handshake answer up to its session timeout divided by the
    number of hosts listed (kazoo and Java's client alike). In CI, under load, a restarted server
    once never answered the first handshake after its restart, so a client with one host waited
    a whole session timeout and its session expired. Listed twice, the wait is half a session:
    the next attempt (to the same server) comes while the session still lives.
    """
    return f"{server.connect_string},{server.connect_string}{chroot}"


def shared_server() -> EmbeddedZooKeeper:
    global _server
    if _server is None or not _server.running:
        require_available()  # a clear "run make setup" rather than a Java stack trace
        _server = new_test_server(Path(tempfile.mkdtemp(prefix="riverbed-zk-")))
        _server.start()  # stopped by embedded_zk's atexit hook
    return _server


@pytest.fixture(scope="session")
def zookeeper() -> EmbeddedZooKeeper:
    """The test process's ZooKeeper server (started on first use)."""
    return shared_server()


@pytest.fixture
def zk_chroot(zookeeper: EmbeddedZooKeeper) -> str:
    """A connect string with a fresh chroot, so tests sharing the server never see each other."""
    return f"{zookeeper.connect_string}/test-{uuid.uuid4().hex[:12]}"


async def expire_session(zk: AsyncZooKeeper) -> None:
    """End `zk`'s session from outside, as ZooKeeper's own tests do: a second client joins the
    session with its id and password and closes it. `zk` then sees LOST and a new session."""
    client_id = zk._client.client_id if zk._client is not None else None  # test-only access
    if client_id is None:
        raise RuntimeError("the client has no session to expire")

    def close_twin() -> None:
        twin = KazooClient(hosts=zk.servers, client_id=client_id)
        twin.start(timeout=10)
        twin.stop()
        twin.close()

    await asyncio.to_thread(close_twin)
