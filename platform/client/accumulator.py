"""The producer's record accumulator: records wait here, per partition, in batches.

Each partition has a queue of `ProducerBatch`es; only the newest may take records (it is "open")
until it holds batch.size bytes or the sender drains it. A batch keeps its records as plain tuples
(exactly what `encode_batch` takes) and is encoded once, when first drained: a retry resends the
same bytes with the same sequence numbers.

Per record, `send()` costs one tuple, one list append and one `DeliveryFuture` (two slots): the
asyncio future and the result live on the batch, and a record's `RecordMetadata` is only built
when someone asks for it (a frozen dataclass costs ~0.6 us, an asyncio future ~0.16 us).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Generator, Iterator
from contextvars import Context
from typing import Any, Final

from riverbed.client.types import (
    TIMESTAMP_TYPE_CREATE_TIME,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
    Headers,
    RecordMetadata,
    TopicPartition,
)
from riverbed.errors import KafkaTimeoutError
from riverbed.protocol.records import RecordInput

# A record in a v2 batch: its length, attributes (1 byte), timestamp delta, offset delta, key
# length and key, value length and value, header count and headers, every number a zigzag varint.
# send() sizes each record as it will be encoded, not by a worst case, so that a batch of
# batch.size bytes holds about as many records as the Java client puts in it.
ATTRIBUTES_BYTES: Final = 1
TIMESTAMP_DELTA_BYTES_MAX: Final = 10  # a user's timestamp may be anywhere in int64
# Below this many bytes a length (zigzag varint) takes at most SMALL_LENGTH_BYTES.
SMALL_RECORD_BYTES: Final = 8192
SMALL_LENGTH_BYTES: Final = 2
NO_OFFSET: Final = -1
NO_SEQUENCE: Final = -1


def varint_bytes(value: int) -> int:
    """The bytes of `value` as a zigzag varint."""
    zigzag = 2 * value if value >= 0 else -2 * value - 1
    return max(1, (zigzag.bit_length() + 6) // 7)


def record_overhead_bytes(batch_size: int, delivery_timeout_ms: int) -> int:
    """A record's bytes besides its key, value, headers and their lengths, at most, when the
    producer stamps it: attributes, timestamp delta, offset delta and a one-byte header count.

    Records stamped by the producer are at most delivery.timeout.ms apart within a batch (a batch
    expires after that), and a batch holds at most one record per byte of batch.size. Deltas
    are counted from the batch's first record, so two cases exceed the bound: a clock stepped by
    more than delivery.timeout.ms, and a batch that starts with a record the user stamped far
    from now, followed by records the producer stamps. Each such record takes up to 7 bytes
    more than counted: the batch overshoots batch.size (and buffer.memory) by as much, which
    the broker accepts unless batch.size is set within those bytes of its message.max.bytes.
    Counting 10 bytes for every delta instead would cost every batch ~6% of its records.
    """
    return ATTRIBUTES_BYTES + varint_bytes(delivery_timeout_ms) + varint_bytes(batch_size) + 1


def record_size_bytes(
    key: bytes | None, value: bytes | None, headers: Headers, overhead_bytes: int
) -> int:
    """The record's bytes inside an uncompressed batch, at most (for batch.size and
    buffer.memory accounting); `overhead_bytes` from record_overhead_bytes()."""
    size = overhead_bytes - 1 + varint_bytes(len(headers))
    for data in (key, value):
        size += 1 if data is None else len(data) + varint_bytes(len(data))
    for header_key, header_value in headers:
        encoded_key = len(header_key.encode())
        size += encoded_key + varint_bytes(encoded_key)
        size += 1 if header_value is None else len(header_value) + varint_bytes(len(header_value))
    return size + varint_bytes(size)


class ProducerBatch:
    """Records for one partition that travel (and succeed or fail) together."""

    __slots__ = (
        "attempts",
        "base_sequence",
        "created_at",
        "deadline",
        "encoded",
        "future",
        "in_flight",
        "last_error",
        "number",
        "records",
        "retry_at",
        "size_bytes",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        number: int,
        created_at: float,
        deadline: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.tp = tp
        self.number = number  # creation order in the producer: a partition's batches go in order
        self.records: list[RecordInput] = []
        self.size_bytes = 0
        self.created_at = created_at
        self.deadline = deadline  # delivery.timeout.ms from the batch's creation
        self.in_flight = False
        self.attempts = 0
        self.retry_at = 0.0
        self.base_sequence = NO_SEQUENCE
        self.encoded: bytes | None = None
        self.last_error: BaseException | None = None
        # Resolves to (base offset, log append time ms or -1), or fails with the batch's error.
        self.future: asyncio.Future[tuple[int, int]] = loop.create_future()

    @property
    def done(self) -> bool:
        return self.future.done()

    def complete(self, base_offset: int, log_append_time_ms: int) -> None:
        if not self.future.done():
            self.future.set_result((base_offset, log_append_time_ms))

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)
            # Marked retrieved: the error reaches users through their DeliveryFutures, and a
            # user who never looks at them must not get "exception was never retrieved" logs.
            self.future.exception()

    def metadata(self, index: int) -> RecordMetadata:
        base_offset, log_append_time_ms = self.future.result()
        if log_append_time_ms >= 0:
            timestamp_ms, timestamp_type = log_append_time_ms, TIMESTAMP_TYPE_LOG_APPEND_TIME
        else:
            timestamp_ms, timestamp_type = self.records[index][3], TIMESTAMP_TYPE_CREATE_TIME
        offset = base_offset + index if base_offset >= 0 else NO_OFFSET
        return RecordMetadata(
            self.tp.topic, self.tp.partition, offset, timestamp_ms, timestamp_type
        )


class DeliveryFuture:
    """The future of one sent record's `RecordMetadata`.

    Behaves as an `asyncio.Future` for its users: await it, or use done(), result(),
    exception(), add_done_callback(), and pass it to asyncio.gather / wait / wait_for. It cannot
    be cancelled (a record handed to the producer is sent; cancel() returns False) and only the
    producer resolves it.
    """

    __slots__ = ("_batch", "_index")

    # asyncio.isfuture() recognizes future-likes by this class attribute (duck typing).
    _asyncio_future_blocking = False

    def __init__(self, batch: ProducerBatch, index: int) -> None:
        self._batch = batch
        self._index = index

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        future = self._batch.future
        if not future.done():
            yield from future
        return self._batch.metadata(self._index)

    __iter__ = __await__

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "done"
        return f"<DeliveryFuture {self._batch.tp.topic}-{self._batch.tp.partition} {state}>"

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._batch.future.get_loop()

    def done(self) -> bool:
        return self._batch.future.done()

    def cancelled(self) -> bool:
        return False

    def cancel(self, msg: Any = None) -> bool:
        return False

    def result(self) -> RecordMetadata:
        return self._batch.metadata(self._index)

    def exception(self) -> BaseException | None:
        return self._batch.future.exception()

    def add_done_callback(
        self, fn: Callable[[DeliveryFuture], object], *, context: Context | None = None
    ) -> None:
        self._batch.future.add_done_callback(_Callback(fn, self), context=context)

    def remove_done_callback(self, fn: Callable[[DeliveryFuture], object]) -> int:
        return self._batch.future.remove_done_callback(_Callback(fn, self))


class _Callback:
    """`fn(delivery_future)` as a batch future callback; equal for the same fn and record, so
    remove_done_callback finds it."""

    __slots__ = ("_fn", "_record")

    def __init__(self, fn: Callable[[DeliveryFuture], object], record: DeliveryFuture) -> None:
        self._fn = fn
        self._record = record

    def __call__(self, _future: object) -> None:
        self._fn(self._record)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Callback) and other._fn == self._fn and other._record is self._record
        )

    def __hash__(self) -> int:
        return hash((self._fn, id(self._record)))


class PartitionQueue:
    """The batches of one partition, oldest first; the last one may be open."""

    __slots__ = ("batches", "in_flight", "next_sequence", "open", "tp")

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.batches: deque[ProducerBatch] = deque()  # waiting to be sent (or re-sent), in order
        self.open: ProducerBatch | None = None  # the last of `batches`, while it takes records
        self.in_flight: set[ProducerBatch] = set()  # sent and not yet answered
        self.next_sequence = 0  # idempotence: the base sequence of the next new batch

    def outstanding_before(self, batch: ProducerBatch) -> bool:
        """Whether an older batch of this partition is still waiting or in flight."""
        return any(b.number < batch.number for b in self.batches) or any(
            b.number < batch.number for b in self.in_flight
        )

    def requeue(self, batch: ProducerBatch) -> None:
        """Put a failed batch back for a retry at its place in creation order, so that a
        partition's batches (and their sequence numbers) always go out in order."""
        batch.in_flight = False
        position = len(self.batches)
        for index, queued in enumerate(self.batches):
            if queued.number > batch.number:
                position = index
                break
        self.batches.insert(position, batch)


class RecordAccumulator:
    """Open and waiting batches of every partition, plus the bytes they hold."""

    def __init__(self, batch_size: int, linger_ms: int, delivery_timeout_ms: int) -> None:
        self.batch_size = batch_size
        self.linger_s = linger_ms / 1000
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.queues: dict[str, list[PartitionQueue]] = {}
        self.buffered_bytes = 0
        self.incomplete: set[ProducerBatch] = set()
        self._batches_created = 0
        # Pulsed (set, then cleared) at each release: it wakes whoever waits at that moment.
        self._space_freed = asyncio.Event()

    def queues_for(self, topic: str, partition_count: int) -> list[PartitionQueue]:
        """The topic's queues, one per partition; grown in place when partitions were added."""
        queues = self.queues.setdefault(topic, [])
        queues.extend(
            PartitionQueue(TopicPartition(topic, p)) for p in range(len(queues), partition_count)
        )
        return queues

    def new_batch(self, queue: PartitionQueue, now: float) -> ProducerBatch:
        """Close the queue's open batch (if any) and open a new one."""
        self._batches_created += 1
        batch = ProducerBatch(
            queue.tp,
            self._batches_created,
            now,
            now + self.delivery_timeout_s,
            asyncio.get_running_loop(),
        )
        queue.batches.append(batch)
        queue.open = batch
        self.incomplete.add(batch)
        return batch

    def release(self, batch: ProducerBatch) -> None:
        """The batch is done (acknowledged or failed): its bytes are free again."""
        if batch in self.incomplete:
            self.incomplete.discard(batch)
            self.buffered_bytes -= batch.size_bytes
            self._space_freed.set()
            self._space_freed.clear()

    async def wait_for_space(self, size_bytes: int, buffer_memory: int, deadline: float) -> None:
        """Return once `size_bytes` more fit in `buffer_memory` (loop time `deadline` at the
        latest: then KafkaTimeoutError). Reserves nothing: the caller appends right after,
        without awaiting in between."""
        if self.buffered_bytes + size_bytes <= buffer_memory:
            return
        loop = asyncio.get_running_loop()
        space_freed = self._space_freed
        # One timer for the whole wait (not one per release waited for): at the deadline it
        # pulses the event so that the loop below sees the time is up.
        timer = loop.call_at(deadline, _pulse, space_freed)
        try:
            while self.buffered_bytes + size_bytes > buffer_memory:
                if loop.time() >= deadline:
                    raise KafkaTimeoutError(
                        f"buffer_memory ({buffer_memory} bytes) stayed full for max_block_ms"
                    )
                await space_freed.wait()
        finally:
            timer.cancel()

    def all_queues(self) -> Iterator[PartitionQueue]:
        for queues in self.queues.values():
            yield from queues


def _pulse(event: asyncio.Event) -> None:
    event.set()
    event.clear()
