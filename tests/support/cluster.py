"""Multi-broker clusters for fault tests and benchmarks, and Metadata polling helpers.

`TestCluster` runs N `BrokerProcess`es (tests/support/broker.py), ids 1..N, on one ZooKeeper
connect string with shared settings (Kafka's names, e.g. `zookeeper.session.timeout.ms`,
`replica.lag.time.max.ms`). Methods that wait are coroutines, so a test's clients keep running
meanwhile (BrokerProcess's blocking waits run in worker threads); sending a signal is a plain call:

    cluster = await cluster_factory(3, {"zookeeper.session.timeout.ms": "2000"})
    before = await partition_state(cluster.bootstrap, "orders", 0)
    cluster.kill(before.leader)                       # SIGKILL: a crash

    async def new_leader() -> PartitionDescription | None:
        state = await partition_state(cluster.bootstrap, "orders", 0)
        return state if state.leader not in (-1, before.leader) else None

    after = await cluster.wait_for(new_leader, 30, what="a new leader for orders-0")
    await cluster.restart(before.leader)

`kill` is a crash (SIGKILL), `terminate` a clean stop (SIGTERM: controlled shutdown), `pause` /
`resume` freeze a broker (SIGSTOP / SIGCONT) so that its ZooKeeper session expires while the
process lives on.

Tests read the cluster through the Metadata API with Riverbed's own client. Brokers answer it from
ZooKeeper, so a leader, leader epoch, replicas and ISR show there as soon as the controller or the
leader wrote them. Tests may poll (`wait_for`); brokers may not.

Fixture (needs `zk_connect`): `cluster_factory(size, settings=None)`, awaited, returns a started
`TestCluster` whose every broker lists all `size` brokers in its Metadata (`start=False`: not
started yet, so that a test can prepare the brokers' data dirs first). Each cluster gets its
own ZooKeeper chroot under the test's. Every broker of every cluster is SIGKILLed at teardown
whatever the outcome, and its log tail printed (pytest shows it when the test failed).
`shared_cluster` does the same for a module fixture whose tests share one cluster.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar, overload

import pytest
from riverbed.cli.local_cluster import metadata_broker_ids
from riverbed.client.admin import Admin, PartitionDescription, TopicDescription
from riverbed.errors import (
    BrokerNotAvailableError,
    KafkaTimeoutError,
    RetriableError,
    UnknownTopicOrPartitionError,
)

from tests.support.broker import READY_TIMEOUT_S, STOP_TIMEOUT_S, BrokerProcess, BrokerStartError

T = TypeVar("T")

POLL_INTERVAL_S: Final = 0.1
# One poll's requests: short, so that a paused or dead broker costs one poll, not the whole wait.
POLL_REQUEST_TIMEOUT_MS: Final = 3_000
# What a poll treats as "not yet" while the cluster changes: a broker down or not yet listening,
# a partition between leaders, a request to a frozen broker.
TRANSIENT_ERRORS: Final = (
    OSError,
    TimeoutError,
    RetriableError,
    KafkaTimeoutError,
    BrokerNotAvailableError,
)


class TestCluster:
    """N broker processes, ids 1..N, sharing `zk_connect` and `settings`."""

    __test__ = False  # a helper, not a test class, whatever its name

    def __init__(
        self,
        size: int,
        *,
        zk_connect: str,
        home: Path,
        settings: Mapping[str, str] | None = None,
        broker_settings: Mapping[int, Mapping[str, str]] | None = None,
        listeners: Sequence[str] = ("PLAINTEXT",),
    ) -> None:
        """`broker_settings` adds settings of one broker (by id) over the shared `settings`
        (`broker.rack`, say); every broker listens on each of `listeners`, the first one being
        `bootstrap` and what the cluster's own Metadata polls use."""
        if size < 1:
            raise ValueError(f"a cluster needs at least one broker, got {size}")
        self.zk_connect = zk_connect
        self.settings = dict(settings or {})
        own = broker_settings or {}
        self.brokers: dict[int, BrokerProcess] = {
            broker_id: BrokerProcess(
                broker_id=broker_id,
                zk_connect=zk_connect,
                data_dir=home / f"broker-{broker_id}" / "data",
                log_dir=home / f"broker-{broker_id}",
                settings={**self.settings, **own.get(broker_id, {})},
                listeners=listeners,
            )
            for broker_id in range(1, size + 1)
        }
        self._paused: set[int] = set()

    @property
    def bootstrap(self) -> str:
        """The addresses of the brokers that can answer now (running, not paused); of every
        broker when none can."""
        answering = [b.bootstrap for b in self.brokers.values() if self._answering(b.broker_id)]
        return ",".join(answering or [b.bootstrap for b in self.brokers.values()])

    @property
    def running_ids(self) -> frozenset[int]:
        return frozenset(i for i, broker in self.brokers.items() if broker.running)

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start every broker; return once each one's Metadata lists all of them."""
        for broker in self.brokers.values():
            broker.start()
        await _gather_all(asyncio.to_thread(b.wait_ready, timeout_s) for b in self.brokers.values())
        await self.wait_registered(self.brokers, timeout_s=timeout_s)

    async def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Terminate every running broker at once (SIGTERM, each waited for)."""
        for broker_id in list(self._paused):
            self.resume(broker_id)
        running = [b for b in self.brokers.values() if b.running]
        await _gather_all(asyncio.to_thread(b.terminate, timeout_s) for b in running)

    def kill_all(self) -> None:
        """SIGKILL every broker and reap it (teardown). Idempotent."""
        for broker in self.brokers.values():
            broker.kill()
        self._paused.clear()

    # -- faults -------------------------------------------------------------------------------
    def kill(self, broker_id: int) -> None:
        """SIGKILL (a crash) and reap. Its ZooKeeper session lives on until it times out."""
        self._paused.discard(broker_id)
        self.brokers[broker_id].kill()

    async def terminate(self, broker_id: int, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (a controlled shutdown) and wait; the exit code. Resumes a paused broker."""
        if broker_id in self._paused:
            self.resume(broker_id)
        return await asyncio.to_thread(self.brokers[broker_id].terminate, timeout_s)

    async def restart(self, broker_id: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Stop the broker if running (SIGTERM), start it on the same port and data dir, and
        return once every answering broker lists it (`wait_registered()`). After a kill the
        broker first waits for its old ZooKeeper session to expire."""
        if broker_id in self._paused:
            self.resume(broker_id)
        await asyncio.to_thread(self.brokers[broker_id].restart, timeout_s)
        await self.wait_registered(timeout_s=timeout_s)

    def pause(self, broker_id: int) -> None:
        """SIGSTOP: the broker stops answering and sending heartbeats, so its ZooKeeper session
        expires after zookeeper.session.timeout.ms while its process, sockets and files stay."""
        os.kill(self._running_pid(broker_id), signal.SIGSTOP)
        self._paused.add(broker_id)

    def resume(self, broker_id: int) -> None:
        """SIGCONT a paused broker."""
        os.kill(self._running_pid(broker_id), signal.SIGCONT)
        self._paused.discard(broker_id)

    # -- observing ----------------------------------------------------------------------------
    async def registered(self, broker_id: int) -> frozenset[int]:
        """The broker ids that broker `broker_id` lists in its Metadata."""
        return await registered_brokers(self.brokers[broker_id].bootstrap)

    async def wait_registered(
        self, ids: Iterable[int] | None = None, *, timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        """Wait until every answering broker's Metadata lists exactly `ids`; by default, every
        answering broker and no broker that is not running (a paused one may be listed or not,
        depending on whether its session expired yet)."""
        expected = None if ids is None else frozenset(ids)

        def agrees(view: frozenset[int]) -> bool:
            if expected is not None:
                return view == expected
            answering = frozenset(i for i in self.brokers if self._answering(i))
            return answering <= view <= self.running_ids

        async def all_agree() -> bool:
            exited = sorted(i for i in expected or () if not self.brokers[i].running)
            if exited:  # it will never be listed: say why now, not at the timeout
                raise BrokerStartError(f"brokers {exited} exited\n{self.describe_logs()}")
            answering = [i for i in self.brokers if self._answering(i)]
            return all([agrees(await self.registered(broker_id)) for broker_id in answering])

        wanted = "the answering brokers" if expected is None else f"brokers {sorted(expected)}"
        await self.wait_for(all_agree, timeout_s, what=f"every broker to list {wanted}")

    @overload
    async def wait_for(
        self,
        predicate: Callable[[], Awaitable[T | None]],
        timeout_s: float,
        *,
        what: str = "the condition",
    ) -> T: ...

    @overload
    async def wait_for(
        self, predicate: Callable[[], T | None], timeout_s: float, *, what: str = "the condition"
    ) -> T: ...

    async def wait_for(
        self, predicate: Callable[[], Any], timeout_s: float, *, what: str = "the condition"
    ) -> Any:
        """`wait_for` with every broker's log tail in the failure message."""
        return await wait_for(predicate, timeout_s, what=what, context=self.describe_logs)

    def describe_logs(self) -> str:
        return "\n".join(broker.describe_log() for broker in self.brokers.values())

    def _running_pid(self, broker_id: int) -> int:
        """The pid of a running broker (an exited one's pid may belong to another process)."""
        broker = self.brokers[broker_id]
        if not broker.running:
            raise RuntimeError(f"broker {broker_id} is not running")
        return broker.pid

    def _answering(self, broker_id: int) -> bool:
        return self.brokers[broker_id].running and broker_id not in self._paused


async def registered_brokers(address: str) -> frozenset[int]:
    """The broker ids that the broker at `address` ("host:port") lists in its Metadata."""
    host, _, port = address.rpartition(":")
    return await metadata_broker_ids(host, int(port), POLL_REQUEST_TIMEOUT_MS)


async def _describe_known(admin: Admin, topic: str) -> TopicDescription:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + POLL_REQUEST_TIMEOUT_MS / 1000
    while True:
        try:
            return await admin.describe_topic(topic)
        except UnknownTopicOrPartitionError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(POLL_INTERVAL_S)


async def partition_state(
    bootstrap_or_admin: str | Admin, topic: str, partition: int
) -> PartitionDescription:
    """The partition's leader, leader epoch, replicas and ISR, from a Metadata request. A topic
    just created may not have reached the broker asked yet (as with Kafka, CreateTopics answers
    once the controller has it): UNKNOWN_TOPIC_OR_PARTITION is retried for a while."""
    if isinstance(bootstrap_or_admin, Admin):
        description = await _describe_known(bootstrap_or_admin, topic)
    else:
        async with Admin(
            bootstrap_servers=bootstrap_or_admin, request_timeout_ms=POLL_REQUEST_TIMEOUT_MS
        ) as admin:
            description = await _describe_known(admin, topic)
    for state in description.partitions:
        if state.partition == partition:
            return state
    raise LookupError(f"{topic} has no partition {partition}: {description.partitions}")


# A predicate's falsy answers (None, False, 0, an empty collection) mean "not yet"; what is
# returned is its first truthy one, never None.
@overload
async def wait_for(
    predicate: Callable[[], Awaitable[T | None]],
    timeout_s: float,
    *,
    what: str = "the condition",
    interval_s: float = POLL_INTERVAL_S,
    context: Callable[[], str] | None = None,
) -> T: ...


@overload
async def wait_for(
    predicate: Callable[[], T | None],
    timeout_s: float,
    *,
    what: str = "the condition",
    interval_s: float = POLL_INTERVAL_S,
    context: Callable[[], str] | None = None,
) -> T: ...


async def wait_for(
    predicate: Callable[[], Awaitable[T | None] | T | None],
    timeout_s: float,
    *,
    what: str = "the condition",
    interval_s: float = POLL_INTERVAL_S,
    context: Callable[[], str] | None = None,
) -> T:
    """Call `predicate` (plain or async) every `interval_s` until it returns something truthy,
    and return that. TRANSIENT_ERRORS count as "not yet". After `timeout_s`: AssertionError
    naming `what`, the last value or error, and `context()` (e.g. broker log tails)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: object = None
    while True:
        remaining_s = deadline - loop.time()
        try:
            async with asyncio.timeout(max(remaining_s, 0.0)):
                value = predicate()
                if inspect.isawaitable(value):
                    value = await value
        except TRANSIENT_ERRORS as error:
            last = error
        else:
            if value:
                return value
            last = value
        if loop.time() + interval_s > deadline:
            details = f"\n{context()}" if context is not None else ""
            raise AssertionError(
                f"timed out after {timeout_s:.1f} s waiting for {what}; last: {last!r}{details}"
            )
        await asyncio.sleep(interval_s)


async def _gather_all(waits: Iterable[Awaitable[object]]) -> None:
    """Await every one (none is left running), then raise the first failure."""
    results = await asyncio.gather(*waits, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


@contextmanager
def shared_cluster(
    zk_connect: str, home: Path, size: int = 3, settings: Mapping[str, str] | None = None
) -> Iterator[TestCluster]:
    """A started cluster in a chroot of its own under `zk_connect`, for the tests of a module to
    share (each with topics of its own); SIGKILLed at the end, its log tails printed."""
    chroot = f"{zk_connect}/{home.name}-{uuid.uuid4().hex[:12]}"
    cluster = TestCluster(size, zk_connect=chroot, home=home, settings=settings)
    try:
        asyncio.run(cluster.start())
        yield cluster
    finally:
        cluster.kill_all()
        print(cluster.describe_logs())


class ClusterFactory(Protocol):
    async def __call__(
        self, size: int, settings: Mapping[str, str] | None = None, *, start: bool = True
    ) -> TestCluster: ...


@pytest.fixture
def cluster_factory(zk_connect: str, tmp_path: Path) -> Iterator[ClusterFactory]:
    """Start clusters in this test's ZooKeeper chroot; every broker is SIGKILLed at teardown.
    With `start=False` the cluster is only made: the test prepares the brokers' data dirs (a
    disk fault mounted at one, say) and calls `cluster.start()` itself."""
    clusters: list[TestCluster] = []

    async def start_cluster(
        size: int, settings: Mapping[str, str] | None = None, *, start: bool = True
    ) -> TestCluster:
        index = len(clusters) + 1
        cluster = TestCluster(
            size,
            zk_connect=f"{zk_connect}/cluster-{index}",
            home=tmp_path / f"cluster-{index}",
            settings=settings,
        )
        clusters.append(cluster)
        if start:
            await cluster.start()
        return cluster

    try:
        yield start_cluster
    finally:
        for cluster in clusters:
            cluster.kill_all()
            # Shown by pytest only when the test fails ("Captured stdout teardown").
            print(cluster.describe_logs())
