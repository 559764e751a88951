"""The marker channel: WriteTxnMarkers to partition leaders, batched per destination broker.

The coordinator hands a transaction's marker for the partitions one broker leads to `send()`
and awaits the error code of each partition. Each destination broker has a bounded queue and one
sender task, which takes every marker queued for that broker (up to MARKERS_PER_REQUEST_MAX) into
one WriteTxnMarkers request on one connection, with one request in flight per broker, so many
transactions ending at once cost one round trip per broker rather than one per transaction. A
connection that fails (refused, closed, no answer in time) answers NETWORK_EXCEPTION for every
partition of the markers it carried; the coordinator decides what to retry
(riverbed.broker.transactions.coordinator).

Leaders are always dialled over the wire, this broker included, as Kafka's channel manager
does: a marker goes through the partition's WriteTxnMarkers handler whoever leads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from riverbed.hot.replication.inter_broker import InterBrokerDialer
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError, ProtocolDecodeError
from riverbed.protocol.record_types import TopicPartition

log = logging.getLogger(__name__)

# Markers one WriteTxnMarkers request carries at most (a request stays well under any size
# limit: a marker is ~30 bytes plus its partitions).
MARKERS_PER_REQUEST_MAX: Final = 500
# Markers waiting for one destination before `send()` waits for room (backpressure on the
# transactions that end; each waiter is one transaction's completion task).
QUEUED_MARKERS_MAX: Final = 10_000
# Kafka's request.timeout.ms of the channel manager: connecting plus waiting for the answer.
MARKER_REQUEST_TIMEOUT_MS: Final = 30_000

WritableTxnMarker = m.WriteTxnMarkersRequest.WritableTxnMarker
WritableTxnMarkerTopic = m.WriteTxnMarkersRequest.WritableTxnMarkerTopic
MarkerCodes = dict[TopicPartition, ErrorCode]


@dataclass(frozen=True, slots=True)
class Marker:
    """One transaction's marker for some partitions led by one broker."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]

    def request_entry(self) -> WritableTxnMarker:
        by_topic: dict[str, list[int]] = {}
        for tp in self.partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return WritableTxnMarker(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            transaction_result=self.commit,
            topics=[
                WritableTxnMarkerTopic(name=t, partition_indexes=p) for t, p in by_topic.items()
            ],
            coordinator_epoch=self.coordinator_epoch,
        )


_Queued = tuple[Marker, "asyncio.Future[MarkerCodes]"]


class _Connection(Protocol):
    """What the channel uses of the inter-broker dialer's connections."""

    @property
    def closed(self) -> bool: ...

    async def call(
        self,
        body: m.WriteTxnMarkersRequest,
        response_type: type[m.WriteTxnMarkersResponse],
        *,
        timeout_ms: int,
    ) -> m.WriteTxnMarkersResponse: ...

    async def close(self) -> None: ...


class _Destination:
    """One broker's queue, sender task and connection."""

    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        self.queue: asyncio.Queue[_Queued] = asyncio.Queue(maxsize=QUEUED_MARKERS_MAX)
        self.connection: _Connection | None = None
        self.task: asyncio.Task[None] | None = None


class MarkerChannel:
    """Sends markers to partition leaders; owned (and closed) by the transaction coordinator."""

    def __init__(
        self,
        dialer: InterBrokerDialer,
        broker_id: int,
        *,
        request_timeout_ms: int = MARKER_REQUEST_TIMEOUT_MS,
    ) -> None:
        self._dialer = dialer
        self._client_id = f"broker-{broker_id}-txn-markers"
        self._request_timeout_ms = request_timeout_ms
        self._destinations: dict[int, _Destination] = {}
        self._closed = False

    async def send(self, destination: int, marker: Marker) -> MarkerCodes:
        """Write `marker` on broker `destination`: the error code of each of its partitions."""
        if self._closed:
            raise KafkaError(ErrorCode.NOT_COORDINATOR, "the marker channel is closed")
        target = self._destinations.get(destination)
        if target is None:
            target = self._destinations[destination] = _Destination(destination)
            target.task = asyncio.create_task(
                self._sender(target), name=f"txn-markers-to-{destination}"
            )
        future: asyncio.Future[MarkerCodes] = asyncio.get_running_loop().create_future()
        await target.queue.put((marker, future))
        return await future

    async def close(self) -> None:
        """Stop every sender; markers still queued are never sent (their waiters, the
        coordinator's completion tasks, are cancelled by the coordinator first). Idempotent."""
        self._closed = True
        destinations, self._destinations = list(self._destinations.values()), {}
        tasks = [d.task for d in destinations if d.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for destination in destinations:
            await self._disconnect(destination)
            while not destination.queue.empty():
                _marker, future = destination.queue.get_nowait()
                future.cancel()

    async def _sender(self, destination: _Destination) -> None:
        while True:
            batch = [await destination.queue.get()]
            while len(batch) < MARKERS_PER_REQUEST_MAX and not destination.queue.empty():
                batch.append(destination.queue.get_nowait())
            markers = [marker for marker, _future in batch]
            try:
                results = await self._call(destination, markers)
            except (OSError, KafkaError, TimeoutError, ProtocolDecodeError) as error:
                log.info(
                    "WriteTxnMarkers to broker %d failed (%s); retried",
                    destination.broker_id,
                    error,
                )
                await self._disconnect(destination)
                results = [
                    dict.fromkeys(marker.partitions, ErrorCode.NETWORK_EXCEPTION)
                    for marker in markers
                ]
            for (_marker, future), codes in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(codes)

    async def _call(
        self, destination: _Destination, markers: Sequence[Marker]
    ) -> list[MarkerCodes]:
        timeout_ms = self._request_timeout_ms
        if destination.connection is None or destination.connection.closed:
            destination.connection = await self._dialer.open(
                destination.broker_id, client_id=self._client_id, timeout_ms=timeout_ms
            )
        request = m.WriteTxnMarkersRequest(markers=[marker.request_entry() for marker in markers])
        response = await destination.connection.call(
            request, m.WriteTxnMarkersResponse, timeout_ms=timeout_ms
        )
        return [_codes(marker, response, index) for index, marker in enumerate(markers)]

    async def _disconnect(self, destination: _Destination) -> None:
        connection, destination.connection = destination.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()


def _codes(marker: Marker, response: m.WriteTxnMarkersResponse, index: int) -> MarkerCodes:
    """The codes of `marker`'s partitions: from the response's entry at the same position (Kafka
    answers the markers in order); a partition the answer leaves out is retried."""
    entries = response.markers
    entry = entries[index] if index < len(entries) else None
    if entry is None or entry.producer_id != marker.producer_id:
        entry = next((e for e in entries if e.producer_id == marker.producer_id), None)
    codes = dict.fromkeys(marker.partitions, ErrorCode.NETWORK_EXCEPTION)
    if entry is None:
        return codes
    for topic in entry.topics:
        for result in topic.partitions:
            tp = TopicPartition(topic.name, result.partition_index)
            if tp in codes:
                codes[tp] = _error_code(result.error_code)
    return codes


def _error_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:  # a code newer than ours: not retried blindly
        return ErrorCode.UNKNOWN_SERVER_ERROR
