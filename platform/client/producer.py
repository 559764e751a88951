"""The asyncio producer: `send()` appends to the accumulator; the sender task does the I/O.

    async with Producer(bootstrap_servers="127.0.0.1:9092", linger_ms=5) as producer:
        future = await producer.send("orders", b"value", key=b"k")  # enqueued
        metadata = await future  # RecordMetadata(topic, partition, offset, timestamp_ms, ...)

`send()` does no I/O in the common case: it picks the partition (murmur2 of the key, or sticky),
appends the record to that partition's open batch and returns a `DeliveryFuture`. It awaits only
when it must: for buffer space (buffer.memory, backpressure) or for the first metadata of a
topic, each for at most max.block.ms. Cancelling a task while it waits there leaves nothing
behind: the record is appended only after the last await, in one synchronous step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

from riverbed.client.accumulator import (
    SMALL_LENGTH_BYTES,
    SMALL_RECORD_BYTES,
    TIMESTAMP_DELTA_BYTES_MAX,
    DeliveryFuture,
    PartitionQueue,
    ProducerBatch,
    RecordAccumulator,
    record_overhead_bytes,
    record_size_bytes,
)
from riverbed.client.lifecycle import AsyncClient
from riverbed.client.partitioner import StickyPartitioner, partition_for_key
from riverbed.client.pool import BrokerPool
from riverbed.client.sender import Sender
from riverbed.client.settings import ProducerSettings
from riverbed.client.types import Headers, RecordMetadata
from riverbed.errors import (
    ClientClosedError,
    KafkaTimeoutError,
    MessageTooLargeError,
    RetriableError,
    error_for,
)
from riverbed.protocol.errors import ErrorCode, KafkaError

__all__ = ["DeliveryFuture", "Producer", "ProducerStatus"]

_time_ns = time.time_ns  # one lookup less per record


@dataclass(frozen=True, slots=True)
class ProducerStatus:
    """What the producer is doing right now (health without private attributes)."""

    buffered_bytes: int
    incomplete_batches: int
    idempotent: bool
    producer_id: int
    producer_epoch: int
    connected_brokers: frozenset[int]
    closed: bool


class Producer(AsyncClient):
    """Sends records to Kafka-compatible brokers; settings are Kafka's producer settings with
    dots as underscores (see riverbed.client.settings), e.g. `acks="all"`, `linger_ms=5`."""

    def __init__(self, **settings: object) -> None:
        self.settings: ProducerSettings = ProducerSettings.from_kwargs(settings)
        self._pool = BrokerPool(self.settings, allow_auto_topic_creation=True)
        self._cluster = self._pool.cluster
        self._accumulator = RecordAccumulator(
            self.settings.batch_size, self.settings.linger_ms, self.settings.delivery_timeout_ms
        )
        self._sender = Sender(self.settings, self._pool, self._accumulator)
        self._partitioner = StickyPartitioner()
        self._sticky: dict[str, PartitionQueue] = {}  # topic -> partition for unkeyed records
        self._closed = False
        # send()'s hot path reads these plain attributes instead of settings and properties.
        self._blocked = True  # closed, failed or not started: send() takes the slow path
        self._batch_size = self.settings.batch_size
        self._buffer_memory = self.settings.buffer_memory
        self._record_bytes_max = min(self.settings.max_request_size, self.settings.buffer_memory)
        self._record_overhead_bytes = record_overhead_bytes(
            self.settings.batch_size, self.settings.delivery_timeout_ms
        )
        self._small_record_overhead_bytes = self._record_overhead_bytes + SMALL_LENGTH_BYTES
        # Records from this size on take send()'s slow path: sized exactly and checked.
        self._small_record_bytes = min(SMALL_RECORD_BYTES, self._record_bytes_max + 1)

    async def start(self) -> None:
        """Start the sender (send() also does, lazily)."""
        if self._closed:
            raise ClientClosedError("the producer is closed")
        self._sender.start()
        self._blocked = False

    # -- sending --------------------------------------------------------------------------
    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Iterable[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> DeliveryFuture:
        """Enqueue one record; returns the future of its RecordMetadata.

        Awaits only for buffer space or the topic's first metadata (max_block_ms at most, then
        KafkaTimeoutError, or the topic's error such as UnknownTopicOrPartitionError).
        """
        if self._blocked:
            self._check_can_send()
        if value is not None and value.__class__ is not bytes:
            value = _as_bytes("value", value)
        if key is not None and key.__class__ is not bytes:
            key = _as_bytes("key", key)
        if headers is None:
            # record_size_bytes() made cheap, as this runs for every record: while a record
            # stays under 8 KiB each of its length varints takes at most two bytes.
            header_tuple: Headers = ()
            size = self._small_record_overhead_bytes
            size += 1 if key is None else len(key) + SMALL_LENGTH_BYTES
            size += 1 if value is None else len(value) + SMALL_LENGTH_BYTES
            if timestamp_ms is not None:
                size += TIMESTAMP_DELTA_BYTES_MAX  # any distance from the batch's first record
            if size >= self._small_record_bytes:
                size = self._checked_size(key, value, header_tuple, timestamp_ms)
        else:
            header_tuple = _headers(headers)
            size = self._checked_size(key, value, header_tuple, timestamp_ms)
        accumulator = self._accumulator
        queues = accumulator.queues.get(topic)
        buffered_bytes = accumulator.buffered_bytes + size
        if queues is None or buffered_bytes > self._buffer_memory:
            queues = await self._wait_to_append(topic, size)
            buffered_bytes = accumulator.buffered_bytes + size
        # From here to the return nothing awaits: the record is appended in one step.
        batch_size = self._batch_size
        if partition is None:
            if key is None:
                queue = self._sticky.get(topic)
                if queue is None or queue.open is None or queue.open.size_bytes + size > batch_size:
                    # Stick to a partition until its batch is closed (KIP-480), then move on.
                    queue = queues[self._partitioner.next_partition(topic, len(queues))]
                    self._sticky[topic] = queue
            else:
                queue = queues[partition_for_key(key, len(queues))]
        elif 0 <= partition < len(queues):
            queue = queues[partition]
        else:
            raise error_for(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"{topic} has partitions 0..{len(queues) - 1}, not {partition}",
            )
        batch = queue.open
        if batch is None or batch.size_bytes + size > batch_size:
            batch = self._new_batch(queue)
        records = batch.records
        records.append(
            (
                key,
                value,
                header_tuple,
                _time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms,
            )
        )
        accumulator.buffered_bytes = buffered_bytes
        batch_bytes = batch.size_bytes = batch.size_bytes + size
        if batch_bytes >= batch_size:
            queue.open = None  # full: the sender takes it now
            self._sender.wake()
        return DeliveryFuture(batch, len(records) - 1)

    def _checked_size(
        self, key: bytes | None, value: bytes | None, headers: Headers, timestamp_ms: int | None
    ) -> int:
        """send()'s slow path for a record's size: exact, and checked against the limits."""
        size = record_size_bytes(key, value, headers, self._record_overhead_bytes)
        if timestamp_ms is not None:
            size += TIMESTAMP_DELTA_BYTES_MAX  # any distance from the batch's first record
        if size > self._record_bytes_max:
            raise MessageTooLargeError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"a record of ~{size} bytes exceeds max_request_size or buffer_memory",
            )
        return size

    def _check_can_send(self) -> None:
        """The slow path of send()'s first check: closed, failed, or not started yet."""
        if self._closed:
            raise ClientClosedError("the producer is closed")
        if self._sender.fatal_error is not None:
            raise self._sender.fatal_error
        if not self._sender.running:
            self._sender.start()
        self._blocked = False

    def _new_batch(self, queue: PartitionQueue) -> ProducerBatch:
        # Once per batch, not per record: stop on a dead sender, and follow the topic's
        # partition count if it grew.
        if self._sender.fatal_error is not None:
            self._blocked = True
            raise self._sender.fatal_error
        count = self._cluster.partition_count(queue.tp.topic)
        if count:
            self._accumulator.queues_for(queue.tp.topic, count)
        self._sender.wake()
        return self._accumulator.new_batch(queue, asyncio.get_running_loop().time())

    async def send_and_wait(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Iterable[tuple[str, bytes | None]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        """send() and wait for the record to be acknowledged (one batch per call: slow)."""
        future = await self.send(topic, value, key, headers, partition, timestamp_ms)
        await self.flush()
        return await future

    async def flush(self) -> None:
        """Send every buffered record now and wait until each is acknowledged or failed."""
        pending = {batch.future for batch in self._accumulator.incomplete}
        if not pending:
            return
        self._sender.flushing += 1
        self._sender.wake()
        try:
            await asyncio.wait(pending)
        finally:
            self._sender.flushing -= 1

    async def partitions_for(self, topic: str) -> tuple[int, ...]:
        """The topic's partitions (fetching its metadata if needed)."""
        await self._wait_to_append(topic, 0)
        partitions = self._cluster.partitions_for(topic)
        return () if partitions is None else partitions

    def status(self) -> ProducerStatus:
        """A snapshot of the producer's health: buffered bytes, open batches, producer id."""
        identity = self._sender.identity
        return ProducerStatus(
            buffered_bytes=self._accumulator.buffered_bytes,
            incomplete_batches=len(self._accumulator.incomplete),
            idempotent=identity.idempotent,
            producer_id=identity.producer_id,
            producer_epoch=identity.epoch,
            connected_brokers=self._pool.connected_node_ids,
            closed=self._closed,
        )

    async def close(self) -> None:
        """Send what is buffered (within delivery_timeout_ms), then stop. Idempotent.

        If the closing task is cancelled, the sender stops at once and every record not yet
        acknowledged fails with ClientClosedError.
        """
        if self._closed:
            return
        self._closed = True
        self._blocked = True
        try:
            await self._sender.close()
        finally:
            await self._sender.stop_now()
            for batch in list(self._accumulator.incomplete):
                batch.fail(ClientClosedError("the producer closed before the record was sent"))
                self._accumulator.release(batch)
            await self._pool.close()

    # -- waiting --------------------------------------------------------------------------
    async def _wait_to_append(self, topic: str, size: int) -> list[PartitionQueue]:
        """Wait (max_block_ms at most) until `topic`'s partitions are known and `size` bytes
        fit in the buffer; returns the topic's partition queues."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.max_block_ms / 1000
        count = self._cluster.partition_count(topic)
        last_error: BaseException | None = None
        while count == 0:
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                raise self._no_partitions_error(topic, last_error)
            try:
                async with asyncio.timeout(remaining_s):
                    await self._pool.refresh({topic})
            except (OSError, TimeoutError, RetriableError) as error:
                last_error = error
            count = self._cluster.partition_count(topic)
            topic_error = self._cluster.topic_error(topic)
            if count == 0 and topic_error is not None and topic_error != ErrorCode.NONE:
                refused = error_for(topic_error, topic)
                if not isinstance(refused, RetriableError):
                    raise refused
        await self._accumulator.wait_for_space(size, self.settings.buffer_memory, deadline)
        if self._closed:
            raise ClientClosedError("the producer closed while send() waited")
        return self._accumulator.queues_for(topic, count)

    def _no_partitions_error(self, topic: str, last_error: BaseException | None) -> KafkaError:
        topic_error = self._cluster.topic_error(topic)
        waited = f"after max_block_ms {self.settings.max_block_ms}"
        if topic_error is not None and topic_error != ErrorCode.NONE:
            return error_for(topic_error, f"topic {topic!r} not available {waited}")
        error = KafkaTimeoutError(f"no metadata for topic {topic!r} {waited}")
        error.__cause__ = last_error
        return error


def _as_bytes(name: str, data: object) -> bytes:
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"record {name} must be bytes or None, got {type(data).__name__}")


def _headers(headers: Iterable[tuple[str, bytes | None]]) -> Headers:
    result = tuple(headers)
    for entry in result:
        if (
            len(entry) != 2
            or not isinstance(entry[0], str)
            or not (entry[1] is None or isinstance(entry[1], bytes))
        ):
            raise TypeError(f"a header must be (str, bytes | None), got {entry!r}")
    return result
