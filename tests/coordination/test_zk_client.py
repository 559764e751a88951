"""AsyncZooKeeper against a real ZooKeeper: calls, transactions, watches and reconnects."""

from __future__ import annotations

import asyncio
import os
import selectors
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable

import pytest
from riverbed.coordination import zk as zk_module
from riverbed.coordination.embedded_zk import EmbeddedZooKeeper
from riverbed.coordination.zk import (
    AsyncZooKeeper,
    BadVersionError,
    CheckOp,
    ConnectionState,
    CreateOp,
    DeleteOp,
    NodeExistsError,
    NodeStat,
    NoNodeError,
    NotEmptyError,
    SetOp,
    ZkConnectionError,
)

from tests.support.stalls import StallMeter
from tests.support.waiting import eventually
from tests.support.zookeeper import expire_session, restart_proof_connect

RESTART_SESSION_TIMEOUT_MS = 30_000
# What a blocking call on the loop would cost is a connect or session timeout (seconds). A loop
# thread waiting for a core on a loaded machine is late too, and the stall meter (which measures
# stops of the whole process) does not see that: 0.56 s was seen, so the bound is above it.
BLOCKED_S_MAX = 2.0
# How long a call made while ZooKeeper is down must stay waiting: one that failed instead would
# have failed at once. Nothing to wait for, the wait is what is tested.
OUTAGE_CALL_WAIT_S = 1.0


@pytest.fixture
async def zk(zk_chroot: str) -> AsyncIterator[AsyncZooKeeper]:
    async with AsyncZooKeeper(zk_chroot, session_timeout_ms=4000) as client:
        yield client


class LoopLagProbe:
    """Ticks every 10 ms on the loop; a blocking call anywhere on the loop shows as lag. A stall
    of the whole process shows as lag too, so `stalls` measures those beside it, and only the
    part of a late tick that no stall overlapped counts as the loop being blocked."""

    TICK_S = 0.01

    def __init__(self) -> None:
        self.stalls = StallMeter()
        self._late_ticks: list[tuple[float, float]] = []  # (start, end) of ticks that ran late
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LoopLagProbe:
        self.stalls.__enter__()
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.stalls.__exit__(*exc_info)

    def blocked_s_max(self) -> float:
        return max(
            (
                end - start - self.TICK_S - self.stalls.stalled_s_within(start, end)
                for start, end in self._late_ticks
            ),
            default=0.0,
        )

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.TICK_S)
            after = time.monotonic()
            if after - before > 2 * self.TICK_S:
                self._late_ticks.append((before, after))


async def test_calls_and_errors(zk: AsyncZooKeeper, zk_chroot: str) -> None:
    assert await zk.create("/a/b/c", b"1", makepath=True) == "/a/b/c"
    data, stat = await zk.get("/a/b/c")
    assert (data, stat.version) == (b"1", 0)
    assert (await zk.set("/a/b/c", b"2", version=0)).version == 1
    with pytest.raises(BadVersionError) as bad_version:
        await zk.set("/a/b/c", b"3", version=0)
    assert bad_version.value.path == "/a/b/c"
    with pytest.raises(NodeExistsError):
        await zk.create("/a/b/c")
    with pytest.raises(NoNodeError):
        await zk.get("/missing")
    with pytest.raises(NotEmptyError):
        await zk.delete("/a")
    sequential = await zk.create("/a/seq-", sequence=True)
    assert sequential.startswith("/a/seq-")
    assert len(sequential) == len("/a/seq-") + 10
    assert sorted(await zk.get_children("/a")) == ["b", sequential.rsplit("/", 1)[1]]
    await zk.ensure_path("/a/b/c")  # exists already: fine
    await zk.delete("/a", recursive=True)
    assert await zk.exists("/a") is None

    # The chroot was created, and everything above lives under it.
    async with AsyncZooKeeper(zk_chroot.split("/", 1)[0]) as root:
        assert await root.exists("/" + zk_chroot.split("/", 1)[1]) is not None


async def test_transaction_is_atomic(zk: AsyncZooKeeper) -> None:
    await zk.create("/x", b"0")
    results = await zk.transaction(
        [CheckOp("/x", 0), CreateOp("/y", b"y"), SetOp("/x", b"1"), DeleteOp("/y")]
    )
    assert results[0] is True
    assert results[1] == "/y"
    assert results[3] is True
    assert isinstance(results[2], NodeStat)
    assert results[2].version == 1
    with pytest.raises(NodeExistsError) as caught:
        await zk.transaction([CreateOp("/z"), SetOp("/x", b"2"), CreateOp("/x")])
    assert caught.value.path == "/x"
    assert await zk.exists("/z") is None  # rolled back
    assert (await zk.get("/x"))[0] == b"1"


async def test_watches_run_on_the_loop_thread(zk: AsyncZooKeeper) -> None:
    loop_thread = threading.get_ident()
    await zk.ensure_path("/w")
    children_seen: list[tuple[list[str], int]] = []
    data_seen: list[tuple[bytes | None, int]] = []
    children = await zk.watch_children(
        "/w", lambda c: children_seen.append((c, threading.get_ident()))
    )
    await zk.watch_data("/w/d", lambda d, _s: data_seen.append((d, threading.get_ident())))
    # The initial callback has run by the time the watch call returns.
    assert children_seen == [([], loop_thread)]
    assert data_seen == [(None, loop_thread)]

    async with LoopLagProbe() as probe:
        await zk.create("/w/d", b"1")
        await zk.set("/w/d", b"2")
        await zk.create("/w/e", ephemeral=True)
        await eventually(lambda: children_seen[-1][0] == ["d", "e"] and data_seen[-1][0] == b"2")
    # Watches are one-shot and re-armed by a read, so quick successive changes may coalesce:
    # only the first and the latest values are certain.
    assert children_seen[-1][0] == ["d", "e"]
    assert data_seen[-1][0] == b"2"
    assert {thread for _, thread in children_seen + data_seen} == {loop_thread}
    assert probe.blocked_s_max() < BLOCKED_S_MAX

    children.cancel()
    seen_before = len(children_seen)
    # A watch set after the cancel sees the deletion and then one change more: ZooKeeper's events
    # reach the session's watches in order, so a watch not cancelled had the deletion by then.
    witness: list[list[str]] = []
    await zk.watch_children("/w", witness.append)
    await zk.delete("/w/e")
    await eventually(lambda: witness[-1] == ["d"])
    await zk.create("/w/f", ephemeral=True)
    await eventually(lambda: witness[-1] == ["d", "f"])
    assert len(children_seen) == seen_before
    with pytest.raises(NoNodeError):
        await zk.watch_children("/nowhere", lambda c: None)


async def test_connect_timeout_is_clear() -> None:
    client = AsyncZooKeeper("127.0.0.1:1", connect_timeout_ms=300)
    with pytest.raises(ZkConnectionError, match=r"127.0.0.1:1 within 300 ms"):
        await client.start()
    # With a chroot, the chroot is created first, by a client of its own.
    client = AsyncZooKeeper("127.0.0.1:1/chroot", connect_timeout_ms=300)
    with pytest.raises(ZkConnectionError, match=r"127.0.0.1:1 within 300 ms"):
        await client.start()


async def test_reconnects_after_restart_without_blocking_the_loop(
    own_server: EmbeddedZooKeeper,
) -> None:
    states: list[ConnectionState] = []
    connect = restart_proof_connect(own_server, "/r")
    # The session outlives the server's restart, which took several seconds on a loaded machine.
    async with AsyncZooKeeper(connect, session_timeout_ms=RESTART_SESSION_TIMEOUT_MS) as zk:
        zk.add_state_listener(states.append)
        await zk.ensure_path("/topics")
        seen: list[list[str]] = []
        await zk.watch_children("/topics", seen.append)
        await zk.create("/config", b"before")
        data_seen: list[bytes | None] = []
        await zk.watch_data("/config", lambda data, _stat: data_seen.append(data))

        async with LoopLagProbe() as probe:
            await asyncio.to_thread(own_server.stop)
            await eventually(lambda: zk.state is ConnectionState.SUSPENDED)
            # A call made while ZooKeeper is down waits without blocking the loop...
            pending = asyncio.create_task(zk.create("/topics/during-outage"))
            await asyncio.sleep(OUTAGE_CALL_WAIT_S)
            assert not pending.done()
            await asyncio.to_thread(own_server.start)
            # ...and completes once the client is back (same session: it is resumed).
            assert await asyncio.wait_for(pending, RESTART_SESSION_TIMEOUT_MS / 1000) == (
                "/topics/during-outage"
            )
        assert probe.blocked_s_max() < BLOCKED_S_MAX

        await zk.create("/topics/after")
        await eventually(lambda: bool(seen) and seen[-1] == ["after", "during-outage"])
        assert states[:2] == [ConnectionState.SUSPENDED, ConnectionState.RECONNECTED]
        # The data watch armed before the outage still fires in the resumed session.
        await zk.set("/config", b"after")
        await eventually(lambda: data_seen[-1] == b"after")


async def test_new_session_after_expiry_rearms_watches(zk_chroot: str) -> None:
    states: list[ConnectionState] = []
    async with AsyncZooKeeper(zk_chroot, session_timeout_ms=4000) as zk:
        zk.add_state_listener(states.append)
        await zk.ensure_path("/s")
        await zk.create("/s/mine", ephemeral=True)
        seen: list[list[str]] = []
        await zk.watch_children("/s", seen.append)
        await zk.create("/s-data", b"1")
        data_seen: list[bytes | None] = []
        await zk.watch_data("/s-data", lambda data, _stat: data_seen.append(data))
        first_session = zk.session_id

        await expire_session(zk)
        await eventually(lambda: ConnectionState.LOST in states)
        await eventually(lambda: zk.state is ConnectionState.CONNECTED)
        assert zk.session_id != first_session
        assert states[-2:] == [ConnectionState.LOST, ConnectionState.CONNECTED]
        await eventually(lambda: bool(seen) and seen[-1] == [])  # our ephemeral went
        await zk.create("/s/again", ephemeral=True)
        await eventually(lambda: seen[-1] == ["again"])
        # The new session has no server-side watches: the data watch was armed again in it.
        await zk.set("/s-data", b"2")
        await eventually(lambda: data_seen[-1] == b"2")


async def test_data_watch_follows_create_delete_and_cancel(zk: AsyncZooKeeper) -> None:
    seen: list[tuple[bytes | None, int | None]] = []
    handle = await zk.watch_data(
        "/cycle", lambda data, stat: seen.append((data, None if stat is None else stat.version))
    )
    assert seen == [(None, None)]  # missing: an existence watch waits for its creation
    await zk.create("/cycle", b"a")
    await eventually(lambda: seen[-1] == (b"a", 0))
    await zk.set("/cycle", b"b")
    await eventually(lambda: seen[-1] == (b"b", 1))
    await zk.delete("/cycle")
    await eventually(lambda: seen[-1] == (None, None))
    await zk.create("/cycle", b"c")
    await eventually(lambda: seen[-1] == (b"c", 0))

    handle.cancel()
    seen_before = len(seen)
    witness: list[bytes | None] = []
    await zk.watch_data("/cycle", lambda data, _stat: witness.append(data))
    await zk.set("/cycle", b"d")
    await eventually(lambda: witness[-1] == b"d")
    assert len(seen) == seen_before


async def test_many_data_watches_are_set_up_and_fire_in_parallel(zk: AsyncZooKeeper) -> None:
    """Data watches pipeline their reads: a thousand of them are set up, and see a thousand
    changes, without a blocking round trip each (which took seconds at this count)."""
    count = 1000
    await zk.ensure_path("/many")
    await zk.transaction([CreateOp(f"/many/{i}", b"0") for i in range(count)])
    latest: dict[int, bytes | None] = {}

    def recorder(index: int) -> Callable[[bytes | None, NodeStat | None], None]:
        return lambda data, _stat: latest.__setitem__(index, data)

    await asyncio.gather(*(zk.watch_data(f"/many/{i}", recorder(i)) for i in range(count)))
    assert latest == dict.fromkeys(range(count), b"0")
    await zk.transaction([SetOp(f"/many/{i}", b"1", 0) for i in range(count)])
    await eventually(lambda: all(value == b"1" for value in latest.values()))


async def test_kazoo_waits_on_its_sockets_with_poll(
    zk: AsyncZooKeeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kazoo's connection thread waits on its sockets before every read and write. Ours waits
    with poll(2): no epoll instance is made per wait (three system calls each), so calls,
    watches and their events all work with the default selector unusable."""

    def no_default_selector() -> None:
        raise AssertionError("kazoo built a DefaultSelector (epoll) to wait on a socket")

    monkeypatch.setattr(selectors, "DefaultSelector", no_default_selector)
    seen: list[bytes | None] = []
    await zk.create("/polled", b"0")
    await zk.watch_data("/polled", lambda data, _stat: seen.append(data))
    await zk.set("/polled", b"1")
    await eventually(lambda: seen == [b"0", b"1"])


def test_the_poll_wait_takes_descriptors_past_select_s_limit() -> None:
    """select(2) cannot wait on a descriptor numbered 1024 or more, and a broker holds that many
    files and sockets; the poll wait answers for such descriptors as kazoo expects: the ready
    ones, as the objects it passed."""
    reader, writer = socket.socketpair()
    high_fd = os.dup2(reader.fileno(), 1500)
    high = socket.socket(fileno=high_fd)
    try:
        handler = zk_module._PollingHandler()
        assert handler.select([high], [], [], 0) == ([], [], [])
        writer.send(b"x")
        assert handler.select([high], [writer], [], 1.0) == ([high], [writer], [])
    finally:
        high.close()
        reader.close()
        writer.close()


async def test_calls_posted_from_threads_run_in_order_past_a_failing_one(
    zk: AsyncZooKeeper, caplog: pytest.LogCaptureFixture
) -> None:
    """kazoo's threads hand calls to the loop through one inbox, woken once per burst: they run
    on the loop, in the order posted, and one that raises is logged without dropping the rest."""
    ran: list[tuple[int, int]] = []
    loop_thread = threading.get_ident()

    def record(sender: int, index: int) -> None:
        assert threading.get_ident() == loop_thread
        if (sender, index) == (0, 500):
            raise RuntimeError("a failing callback")
        ran.append((sender, index))

    def post_many(sender: int) -> None:
        for index in range(1000):
            zk._post(record, sender, index)

    threads = [threading.Thread(target=post_many, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join)
    await eventually(lambda: len(ran) == 1999)
    for sender in range(2):
        assert [i for s, i in ran if s == sender] == [
            i for i in range(1000) if (sender, i) != (0, 500)
        ]
    assert "a ZooKeeper callback failed" in caplog.text


async def test_get_many_reads_thousands_in_a_few_requests(zk: AsyncZooKeeper) -> None:
    """get_many reads through multiRead (several requests past MULTI_READ_PATHS_MAX), inside
    the chroot: each znode's data and stat in order, None for one that does not exist."""
    count = zk_module.MULTI_READ_PATHS_MAX * 2 + 500
    await zk.ensure_path("/bulk")
    for start in range(0, count, 500):
        await zk.transaction(
            [CreateOp(f"/bulk/{i}", str(i).encode()) for i in range(start, start + 500)]
        )
    await zk.set("/bulk/7", b"seven")
    paths = [f"/bulk/{i}" for i in range(count)] + ["/bulk/missing"]
    found = await zk.get_many(paths)
    assert found[-1] is None
    assert [data for data, _ in found[:-1]] == [  # type: ignore[misc]
        b"seven" if i == 7 else str(i).encode() for i in range(count)
    ]
    versions = {i: stat.version for i, (_, stat) in enumerate(found[:-1])}  # type: ignore[misc]
    assert (versions[7], versions[8]) == (1, 0)
    assert await zk.get_many([]) == []


async def test_a_tree_watch_sees_every_change_below_it_and_survives_reconnects(
    own_server: EmbeddedZooKeeper,
) -> None:
    """One persistent recursive watch reports each znode created, changed and deleted below
    its path (not the path itself, nor beside it), without being set again. After the server's
    restart it is set again and says None (read again) before reporting further changes."""
    connect = restart_proof_connect(own_server, "/tree-test")
    async with AsyncZooKeeper(connect, session_timeout_ms=RESTART_SESSION_TIMEOUT_MS) as zk:
        await zk.ensure_path("/t")
        await zk.ensure_path("/beside")
        seen: list[str | None] = []
        handle = await zk.watch_tree("/t", seen.append)
        await zk.create("/t/a/b", b"1", makepath=True)
        await zk.set("/t/a/b", b"2")
        await zk.set("/t/a/b", b"3")
        await zk.set("/t", b"the root itself")
        await zk.create("/beside/x")
        await zk.delete("/t/a/b")
        await eventually(lambda: seen[-1:] == ["/t/a/b"] and len(seen) == 5)
        assert seen == ["/t/a", "/t/a/b", "/t/a/b", "/t/a/b", "/t/a/b"]

        await asyncio.to_thread(own_server.stop)
        await eventually(lambda: zk.state is ConnectionState.SUSPENDED)
        await asyncio.to_thread(own_server.start)
        # Reconnecting may take a whole handshake timeout (see restart_proof_connect), longer
        # than eventually's wait; what is tested is what follows the reconnect.
        await zk.wait_connected(RESTART_SESSION_TIMEOUT_MS)
        await eventually(lambda: None in seen)
        await zk.create("/t/after")
        await eventually(lambda: seen[-1] == "/t/after")
        assert seen[5:] == [None, "/t/after"]

        handle.cancel()
        await zk.create("/t/cancelled")
        await zk.create("/beside/y")  # a later event to wait for: the cancelled one came first
        await asyncio.sleep(0.2)
        assert seen[-1] == "/t/after"
