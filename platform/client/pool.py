"""The client's connections and its metadata refreshes: the I/O side of ClusterMetadata.

`BrokerPool` holds one `BrokerConnection` per broker node id (plus one bootstrap connection
until the cluster's brokers are known), connects on demand, and refreshes metadata with backoff.
It owns every task it starts; `close()` cancels them and closes every connection.

Connecting and refreshing are single-flight: concurrent callers share one attempt, and a
caller's cancellation does not cancel it for the others (they await it through a shield).
A connection that closes for any reason is dropped from the pool and the metadata marked stale,
so the next `leader_connection` looks the leader up again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Iterable
from typing import Any, Final, TypeVar

from riverbed.client.cluster_metadata import ClusterMetadata
from riverbed.client.connection import BrokerConnection, ConnectionClosedError
from riverbed.client.settings import ClientSettings
from riverbed.client.types import TopicPartition
from riverbed.common.backoff import backoff_ms
from riverbed.errors import ClientClosedError, error_for
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

# The pool keeps its one connection to a bootstrap server (before any node id is known, or when
# every known broker is unreachable) under this key.
BOOTSTRAP_NODE_ID: Final = -1

T = TypeVar("T")


class BrokerPool:
    """Connections by node id and metadata refreshes for one client."""

    def __init__(
        self,
        settings: ClientSettings,
        *,
        allow_auto_topic_creation: bool = True,
        cluster: ClusterMetadata | None = None,
    ) -> None:
        self.settings = settings
        self.cluster = cluster or ClusterMetadata(settings.metadata_max_age_ms)
        self._allow_auto_topic_creation = allow_auto_topic_creation
        self._connections: dict[int, BrokerConnection] = {}
        self._connecting: dict[int, asyncio.Task[BrokerConnection]] = {}
        self._refreshing: asyncio.Task[None] | None = None
        self._refreshing_topics: frozenset[str] = frozenset()
        self._topics: set[str] = set()  # every topic any caller asked about: kept fresh together
        self._tasks: set[asyncio.Task[Any]] = set()
        self._refresh_failures = 0
        self._next_refresh_at = 0.0
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connected_node_ids(self) -> frozenset[int]:
        """Node ids with an open connection right now (for health reporting)."""
        return frozenset(node for node, c in self._connections.items() if not c.closed)

    # -- connections ----------------------------------------------------------------------
    def open_connection(self, node_id: int) -> BrokerConnection | None:
        """The open connection to broker `node_id`, without connecting."""
        connection = self._connections.get(node_id)
        return connection if connection is not None and not connection.closed else None

    async def connection_for(self, node_id: int) -> BrokerConnection:
        """The open connection to broker `node_id`, connecting (once, shared) if needed."""
        self._check_open()
        connection = self._connections.get(node_id)
        if connection is not None and not connection.closed:
            return connection
        task = self._connecting.get(node_id)
        if task is None:
            address = self.cluster.broker(node_id)
            if address is None:
                self.cluster.mark_stale(f"node {node_id} is not in the metadata")
                raise ConnectionClosedError(f"no address known for broker {node_id}")
            task = self._start(self._connect(node_id, address.host, address.port))
            self._connecting[node_id] = task
        return await asyncio.shield(task)

    async def leader_connection(self, tp: TopicPartition) -> BrokerConnection:
        """The connection to `tp`'s leader, refreshing metadata first when it is unknown or
        stale. Raises the typed error the cluster reports (e.g. UnknownTopicOrPartitionError)
        when the partition still has no leader."""
        leader = self.cluster.leader_for(tp)
        if leader is None or self.cluster.stale:
            await self.refresh({tp.topic})
            leader = self.cluster.leader_for(tp)
        if leader is None:
            raise self.partition_error(tp)
        return await self.connection_for(leader)

    def partition_error(self, tp: TopicPartition) -> Exception:
        """Why `tp` has no leader, as a typed error."""
        error = self.cluster.topic_error(tp.topic)
        if error is None or error == ErrorCode.NONE:
            partition = self.cluster.partition(tp)
            if partition is None:
                error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif partition.error != ErrorCode.NONE:
                error = partition.error
            else:
                error = ErrorCode.LEADER_NOT_AVAILABLE
        return error_for(error, f"{tp.topic}-{tp.partition}")

    async def any_connection(self) -> BrokerConnection:
        """An open connection to some broker: a node's, else a bootstrap server's."""
        self._check_open()
        for connection in self._connections.values():
            if not connection.closed:
                return connection
        if self._connecting:
            with contextlib.suppress(OSError, TimeoutError):
                return await asyncio.shield(next(iter(self._connecting.values())))
        errors = []
        addresses = [(b.host, b.port) for b in self.cluster.brokers.values()]
        for host, port in [*addresses, *self.settings.bootstrap_servers]:
            try:
                return await asyncio.shield(
                    self._start(self._connect(BOOTSTRAP_NODE_ID, host, port))
                )
            except (OSError, TimeoutError) as error:
                errors.append(f"{host}:{port}: {error or type(error).__name__}")
        raise ConnectionClosedError("no broker reachable (" + "; ".join(errors) + ")")

    async def _connect(self, node_id: int, host: str, port: int) -> BrokerConnection:
        try:
            connection = await BrokerConnection.open(
                host,
                port,
                client_id=self.settings.client_id,
                timeout_ms=self.settings.socket_connection_setup_timeout_ms,
                security=self.settings.security,
            )
        except BaseException:
            self.cluster.mark_stale(f"connecting to {host}:{port} failed")
            raise
        finally:
            if node_id != BOOTSTRAP_NODE_ID:
                self._connecting.pop(node_id, None)
        if self._closed:
            await connection.close()
            raise ConnectionClosedError("the client is closed")
        old = self._connections.get(node_id)
        if old is not None:
            await old.close()
        self._connections[node_id] = connection
        connection.add_close_callback(lambda closed: self._on_close(node_id, closed))
        return connection

    def _on_close(self, node_id: int, connection: BrokerConnection) -> None:
        if self._connections.get(node_id) is connection:
            del self._connections[node_id]
        if not self._closed:
            self.cluster.mark_stale(f"connection to {connection.address} closed")

    # -- metadata -------------------------------------------------------------------------
    async def refresh(self, topics: Iterable[str] | None = None) -> ClusterMetadata:
        """Fetch metadata for `topics` and every topic asked about before; returns the cluster.

        Refreshes are spaced by retry.backoff.ms, doubling (up to retry.backoff.max.ms) while
        they fail or leave a wanted topic without leaders. Raises the connection error when no
        broker answered; topic errors stay in the cluster state (see `partition_error`).
        """
        self._check_open()
        if topics is not None:
            self._topics.update(topics)
        while True:
            task = self._refreshing
            if task is None:
                self._refreshing_topics = frozenset(self._topics)
                task = self._refreshing = self._start(self._refresh())
            covered = self._topics <= self._refreshing_topics
            await asyncio.shield(task)
            if covered:
                return self.cluster

    async def _refresh(self) -> None:
        try:
            delay_s = self._next_refresh_at - time.monotonic()
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            ok = False
            try:
                connection = await self.any_connection()
                request = m.MetadataRequest(
                    topics=[
                        m.MetadataRequest.MetadataRequestTopic(name=t)
                        for t in sorted(self._refreshing_topics)
                    ],
                    allow_auto_topic_creation=self._allow_auto_topic_creation,
                )
                response = await connection.call(
                    request, m.MetadataResponse, timeout_ms=self.settings.request_timeout_ms
                )
                self.cluster.update(response)
                ok = self._healthy(self._refreshing_topics)
            finally:
                self._refresh_failures = 0 if ok else self._refresh_failures + 1
                wait_ms = (
                    self.settings.retry_backoff_ms
                    if ok
                    else backoff_ms(
                        self._refresh_failures,
                        self.settings.retry_backoff_ms,
                        self.settings.retry_backoff_max_ms,
                    )
                )
                self._next_refresh_at = time.monotonic() + wait_ms / 1000
        finally:
            self._refreshing = None

    def _healthy(self, topics: Iterable[str]) -> bool:
        for topic in topics:
            partitions = self.cluster.partitions_for(topic)
            if partitions is None:
                return False
            if any(self.cluster.leader_for(TopicPartition(topic, p)) is None for p in partitions):
                return False
        return True

    # -- lifecycle ------------------------------------------------------------------------
    async def close(self) -> None:
        """Cancel every task the pool started and close every connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        connections, self._connections = self._connections, {}
        for connection in connections.values():
            await connection.close()

    def _start(self, coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: whoever awaited it has seen it

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")
