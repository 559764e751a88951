"""The client's link to its group coordinator: found with FindCoordinator, reached over a
connection of its own.

The connection is the group's alone (the Java client does the same with a separate node id): a
broker answers a connection's requests in order, and a JoinGroup can stay parked on the
coordinator for as long as the rebalance lasts; on the connection the fetches use, it would
hold back every Fetch answer of that broker, and the cooperative protocol's promise (partitions
that don't move are consumed during a rebalance) would be void.

Looking the coordinator up is single-flight: the rebalance, the heartbeats and the commits share
one lookup. It is retried with backoff while the cluster answers COORDINATOR_NOT_AVAILABLE (no
`__consumer_offsets` leader yet) or the coordinator cannot be reached; callers bound how long
they wait. `mark_unknown()` (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, a lost connection, a
session without heartbeats) closes the connection; the next call looks the coordinator up again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final, TypeVar

from riverbed.client.connection import BrokerConnection
from riverbed.client.pool import BrokerPool
from riverbed.client.settings import ClientSettings
from riverbed.common.backoff import backoff_ms
from riverbed.errors import ClientClosedError, RetriableError, error_for
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.messages import RequestBody

logger = logging.getLogger(__name__)

COORDINATOR_KEY_TYPE_GROUP: Final = 0
COORDINATOR_KEY_TYPE_TRANSACTION: Final = 1  # a transactional producer's coordinator
# Error codes after which the coordinator must be looked up again (Java's markCoordinatorUnknown).
COORDINATOR_MOVED_CODES: Final = frozenset(
    {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE}
)

ResponseT = TypeVar("ResponseT")


class CoordinatorLink:
    """The connection to one group's coordinator (or, with COORDINATOR_KEY_TYPE_TRANSACTION,
    one transactional id's); `close()` ends the lookup and the connection."""

    def __init__(
        self,
        settings: ClientSettings,
        pool: BrokerPool,
        group_id: str,
        key_type: int = COORDINATOR_KEY_TYPE_GROUP,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._group_id = group_id  # the key looked up: a group id or a transactional id
        self._key_type = key_type
        self._connection: BrokerConnection | None = None
        self.node_id: int | None = None  # the coordinator's broker id while connected
        self._lookup: asyncio.Task[BrokerConnection] | None = None
        self._closing: set[asyncio.Task[None]] = set()  # connections dropped, being closed
        self._closed = False

    @property
    def known(self) -> bool:
        return self._connection is not None and not self._connection.closed

    async def call(
        self, request: RequestBody, response_type: type[ResponseT], *, timeout_ms: int
    ) -> ResponseT:
        """Send `request` to the coordinator (looked up first if needed). A lost connection or
        a timeout marks the coordinator unknown and is raised (OSError / TimeoutError)."""
        connection = await self.connection()
        logger.debug("group %s: %r", self._group_id, request)
        try:
            response = await connection.call(request, response_type, timeout_ms=timeout_ms)
        except (OSError, TimeoutError) as error:
            self._drop(connection, f"{type(request).__name__} failed: {error!r}")
            raise
        logger.debug("group %s: %r", self._group_id, response)
        return response

    async def connection(self) -> BrokerConnection:
        """The open connection to the coordinator, looking it up (shared, with retries)."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        connection = self._connection
        if connection is not None and not connection.closed:
            return connection
        if self._lookup is None:
            self._lookup = asyncio.get_running_loop().create_task(
                self._find(), name=f"find-coordinator-{self._group_id}"
            )
            self._lookup.add_done_callback(self._lookup_done)
        return await asyncio.shield(self._lookup)

    def mark_unknown(self, reason: str) -> None:
        """The coordinator moved or is gone: drop the connection, look it up on the next call."""
        if self._connection is not None:
            self._drop(self._connection, reason)

    async def close(self) -> None:
        self._closed = True
        lookup, self._lookup = self._lookup, None
        if lookup is not None:
            lookup.cancel()
            with contextlib.suppress(BaseException):
                await lookup
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()
        for task in list(self._closing):
            with contextlib.suppress(BaseException):
                await task

    def _drop(self, connection: BrokerConnection, reason: str) -> None:
        if self._connection is not connection:
            return  # an answer on a connection already replaced
        logger.info("group %s: coordinator %s unknown: %s", self._group_id, self.node_id, reason)
        self._connection = None
        self.node_id = None
        task = asyncio.get_running_loop().create_task(connection.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _lookup_done(self, task: asyncio.Task[BrokerConnection]) -> None:
        if self._lookup is task:
            self._lookup = None
        if not task.cancelled():
            task.exception()  # retrieved: the callers awaiting it have seen it

    async def _find(self) -> BrokerConnection:
        failures = 0
        while True:
            try:
                node_id, host, port = await self._find_once()
                connection = await BrokerConnection.open(
                    host,
                    port,
                    client_id=self._settings.client_id,
                    timeout_ms=self._settings.socket_connection_setup_timeout_ms,
                    security=self._settings.security,
                )
            except (OSError, TimeoutError, RetriableError) as error:
                failures += 1
                wait_ms = backoff_ms(
                    failures, self._settings.retry_backoff_ms, self._settings.retry_backoff_max_ms
                )
                logger.debug("group %s: no coordinator yet (%r)", self._group_id, error)
                await asyncio.sleep(wait_ms / 1000)
                continue
            if self._closed:
                await connection.close()
                raise ClientClosedError("the client is closed")
            self._connection = connection
            self.node_id = node_id
            logger.info(
                "group %s: coordinator is broker %d (%s:%d)", self._group_id, node_id, host, port
            )
            return connection

    async def _find_once(self) -> tuple[int, str, int]:
        connection = await self._pool.any_connection()
        response = await connection.call(
            m.FindCoordinatorRequest(
                key=self._group_id,
                key_type=self._key_type,
                coordinator_keys=[self._group_id],
            ),
            m.FindCoordinatorResponse,
            timeout_ms=self._settings.request_timeout_ms,
        )
        if response.coordinators:  # v4+: one entry per key asked
            found = response.coordinators[0]
            code, message = found.error_code, found.error_message
            node_id, host, port = found.node_id, found.host, found.port
        else:
            code, message = response.error_code, response.error_message
            node_id, host, port = response.node_id, response.host, response.port
        if code != ErrorCode.NONE:
            raise error_for(code, f"FindCoordinator for {self._group_id!r}: {message or ''}")
        return node_id, host, port
