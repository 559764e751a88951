"""The asyncio producer: `send()` appends to the accumulator; the sender task does the I/O.

    async with Producer(bootstrap_servers="127.0.0.1:9092", linger_ms=5) as producer:
        future = await producer.send("orders", b"value", key=b"k")  # enqueued
        metadata = await future  # RecordMetadata(topic, partition, offset, timestamp_ms, ...)

`send()` does no I/O in the common case: it picks the partition (murmur2 of the key, or sticky),
appends the record to that partition's open batch and returns a `DeliveryFuture`. It awaits only
when it must: for buffer space (buffer.memory, backpressure) or for the first metadata of a
topic, each for at most max.block.ms. Cancelling a task while it waits there leaves nothing
behind: the record is appended only after the last await, in one synchronous step.

With a `transactional_id` the producer is transactional (KIP-98):

    async with Producer(bootstrap_servers=..., transactional_id="orders-enricher-1") as producer:
        await producer.init_transactions()  # fences older producers with the same id
        async with producer.transaction():  # commits at the end, aborts on an exception
            await producer.send("orders", b"value")
            await producer.send_offsets_to_transaction(offsets, consumer.group_metadata())

The state machine is `transactions.TransactionManager`; the coordinators' requests are
`txn_coordinator.TxnCoordinatorClient`; the sender adds partitions to the transaction before
their first batch goes out. send() outside a transaction raises; so does every call after a
fatal error (`ProducerFencedError`, `TransactionFatalError`); after an abortable one
(`TransactionAbortableError`) only abort_transaction() goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

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
from riverbed.client.sender import NO_PRODUCER_ID, ProducerIdentity, Sender
from riverbed.client.settings import ProducerSettings
from riverbed.client.transactions import (
    TransactionManager,
    TransactionStateError,
    TxnAction,
    TxnState,
)
from riverbed.client.txn_coordinator import TxnCoordinatorClient
from riverbed.client.types import (
    ConsumerGroupMetadata,
    Headers,
    OffsetAndMetadata,
    RecordMetadata,
    TopicPartition,
)
from riverbed.errors import (
    ClientClosedError,
    KafkaTimeoutError,
    MessageTooLargeError,
    RetriableError,
    TransactionAbortableError,
    TransactionFatalError,
    error_for,
)
from riverbed.protocol.errors import ErrorCode, KafkaError

__all__ = ["DeliveryFuture", "Producer", "ProducerStatus", "TxnState"]

log = logging.getLogger(__name__)
T = TypeVar("T")
NO_EPOCH = -1

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
    transaction_state: TxnState | None = None  # None: not transactional


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
        # Transactions: send() stays on its slow path (`_blocked`) outside IN_TRANSACTION.
        self._transaction: TransactionManager | None = None
        self._coordinator: TxnCoordinatorClient | None = None
        transactional_id = self.settings.transactional_id
        if transactional_id is not None:
            self._transaction = TransactionManager(
                transactional_id, self.settings.transaction_timeout_ms
            )
            self._coordinator = TxnCoordinatorClient(self.settings, self._pool, transactional_id)
            self._sender.make_transactional(self._transaction, self._coordinator)

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
            if self._transaction is not None:
                # The transaction may have ended (or failed) while send() waited.
                self._transaction.require("send()", TxnState.IN_TRANSACTION)
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
        if self._transaction is not None:
            self._transaction.require("send()", TxnState.IN_TRANSACTION)
        if not self._sender.running:
            self._sender.start()
        self._blocked = False

    def _new_batch(self, queue: PartitionQueue) -> ProducerBatch:
        # Once per batch, not per record: stop on a dead sender, and follow the topic's
        # partition count if it grew.
        if self._sender.fatal_error is not None:
            self._blocked = True
            raise self._sender.fatal_error
        transaction = self._transaction
        if transaction is not None and transaction.state is not TxnState.IN_TRANSACTION:
            self._blocked = True  # an abortable or fatal error since the last check
            transaction.require("send()", TxnState.IN_TRANSACTION)
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
            transaction_state=None if self._transaction is None else self._transaction.state,
        )

    async def close(self) -> None:
        """Send what is buffered (within delivery_timeout_ms), then stop. Idempotent.

        A transaction still open is aborted first (as Kafka's producer does), so that its
        partitions' last stable offset does not wait for transaction_timeout_ms.
        If the closing task is cancelled, the sender stops at once and every record not yet
        acknowledged fails with ClientClosedError.
        """
        if self._closed:
            return
        try:
            await self._abort_on_close()
        finally:
            await self._close()

    async def _abort_on_close(self) -> None:
        transaction = self._transaction
        if transaction is None or transaction.state not in (
            TxnState.IN_TRANSACTION,
            TxnState.ABORTABLE_ERROR,
            TxnState.ABORTING_TRANSACTION,
        ):
            return
        try:
            await self.abort_transaction()
        except (KafkaError, OSError, TransactionStateError) as error:
            log.warning(
                "transactional_id %s: the open transaction could not be aborted at close (%s); "
                "the coordinator aborts it after transaction_timeout_ms",
                transaction.transactional_id,
                error,
            )

    async def _close(self) -> None:
        self._closed = True
        self._blocked = True
        try:
            await self._sender.close()
        finally:
            await self._sender.stop_now()
            for batch in list(self._accumulator.incomplete):
                batch.fail(ClientClosedError("the producer closed before the record was sent"))
                self._accumulator.release(batch)
            if self._coordinator is not None:
                await self._coordinator.close()
            await self._pool.close()

    # -- transactions ---------------------------------------------------------------------
    @property
    def transaction_state(self) -> TxnState | None:
        """The transactional state (None without a transactional_id)."""
        return None if self._transaction is None else self._transaction.state

    async def init_transactions(self) -> None:
        """Get the transactional id's producer id and epoch (InitProducerId through its
        coordinator). This fences every older producer with the same id, and the coordinator
        first finishes (commits or aborts) the transaction such a producer left open.

        Raises KafkaTimeoutError after max_block_ms (call it again), ProducerFencedError or
        TransactionFatalError when the producer cannot be used."""
        transaction = self._transactional("init_transactions()")
        transaction.require("init_transactions()", TxnState.UNINITIALIZED, TxnState.INITIALIZING)
        if self._closed:
            raise ClientClosedError("the producer is closed")
        self._sender.start()
        transaction.transition(TxnState.INITIALIZING)
        await self._init_producer_id(transaction, NO_PRODUCER_ID, NO_EPOCH)
        transaction.completed()

    def begin_transaction(self) -> None:
        """Open a transaction: the records sent and the offsets given to
        send_offsets_to_transaction() from now on commit or abort together."""
        self._transactional("begin_transaction()").begin()

    async def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata],
        group_metadata: ConsumerGroupMetadata | str,
    ) -> None:
        """Commit a consumer group's `offsets` (the next offset to read, per partition) as part
        of the transaction: they count only if it commits. `group_metadata` is the consuming
        `Consumer.group_metadata()` (KIP-447: the coordinator refuses the commit of a member
        that lost its partitions), or a bare group id (no generation check).

        AddOffsetsToTxn to the transaction coordinator, then TxnOffsetCommit to the group's."""
        transaction = self._transactional("send_offsets_to_transaction()")
        transaction.require("send_offsets_to_transaction()", TxnState.IN_TRANSACTION)
        group = (
            group_metadata
            if isinstance(group_metadata, ConsumerGroupMetadata)
            else ConsumerGroupMetadata(group_metadata)
        )
        wanted = {
            TopicPartition(tp[0], tp[1]): (
                value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
            )
            for tp, value in offsets.items()
        }
        if not wanted:
            return
        coordinator = self._txn_coordinator()
        identity = self._sender.identity
        deadline = self._deadline()
        await self._txn_call(
            transaction,
            coordinator.add_offsets(identity.producer_id, identity.epoch, group.group_id, deadline),
        )
        transaction.offsets_added = True
        await self._txn_call(
            transaction,
            coordinator.txn_offset_commit(
                identity.producer_id, identity.epoch, group, wanted, deadline
            ),
        )

    async def commit_transaction(self) -> None:
        """Send every record of the transaction, then commit it (EndTxn). Records and offsets
        become visible to read_committed consumers together.

        Raises TransactionAbortableError if a record or an offset commit of the transaction
        failed (call abort_transaction()), KafkaTimeoutError after max_block_ms (call
        commit_transaction() again), ProducerFencedError / TransactionFatalError when the
        producer cannot go on."""
        transaction = self._transactional("commit_transaction()")
        transaction.require(
            "commit_transaction()", TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION
        )
        self._blocked = True  # no send() joins a transaction that is committing
        if transaction.state is TxnState.IN_TRANSACTION:
            await self.flush()
            await self._sender.adds_settled()
            # A record failed (abortable) or the producer was fenced while flushing.
            transaction.require("commit_transaction()", TxnState.IN_TRANSACTION)
            transaction.transition(TxnState.COMMITTING_TRANSACTION)
        await self._end_transaction(transaction, commit=True)
        transaction.completed()

    async def abort_transaction(self) -> None:
        """Abort the transaction: drop its records not sent yet (their futures fail with
        TransactionAbortedError or the error that made the transaction abortable), wait for
        those in flight, and abort it (EndTxn); read_committed consumers never see it. After
        an abortable error this is the way on; then begin_transaction() again."""
        transaction = self._transactional("abort_transaction()")
        transaction.require(
            "abort_transaction()",
            TxnState.IN_TRANSACTION,
            TxnState.ABORTABLE_ERROR,
            TxnState.ABORTING_TRANSACTION,
        )
        self._blocked = True
        if transaction.state is not TxnState.ABORTING_TRANSACTION:
            transaction.transition(TxnState.ABORTING_TRANSACTION)
        await self.flush()  # the sender drops what is unsent; what is in flight is answered
        await self._sender.adds_settled()
        transaction.require("abort_transaction()", TxnState.ABORTING_TRANSACTION)
        await self._end_transaction(transaction, commit=False)
        if transaction.epoch_bump_required:
            # A partition's sequence has a gap (a batch failed or was dropped after it was
            # sent): a new epoch restarts every sequence at 0 (KIP-360).
            identity = self._sender.identity
            transaction.transition(TxnState.INITIALIZING)
            await self._init_producer_id(transaction, identity.producer_id, identity.epoch)
            transaction.epoch_bump_required = False
        transaction.completed()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Producer]:
        """`async with producer.transaction():` begins a transaction, commits it when the block
        ends, and aborts it when the block raises (the exception is raised again). A commit
        that fails with an abortable error is aborted too before the error is raised."""
        transaction = self._transactional("transaction()")
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            if transaction.state is not TxnState.FATAL_ERROR:
                try:
                    await self.abort_transaction()
                except (KafkaError, OSError, TransactionStateError) as abort_error:
                    log.warning(
                        "transactional_id %s: abort after an exception failed: %s",
                        transaction.transactional_id,
                        abort_error,
                    )
            raise
        try:
            await self.commit_transaction()
        except TransactionAbortableError:
            await self.abort_transaction()
            raise

    def _transactional(self, operation: str) -> TransactionManager:
        if self._transaction is None:
            raise TransactionStateError(f"{operation} needs a producer with a transactional_id")
        return self._transaction

    def _txn_coordinator(self) -> TxnCoordinatorClient:
        if self._coordinator is None:
            raise TransactionStateError("the producer has no transactional_id")
        return self._coordinator

    def _deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.settings.max_block_ms / 1000

    async def _init_producer_id(
        self, transaction: TransactionManager, producer_id: int, epoch: int
    ) -> None:
        coordinator = self._txn_coordinator()
        new_id, new_epoch = await self._txn_call(
            transaction, coordinator.init_producer_id(producer_id, epoch, self._deadline())
        )
        self._sender.identity = ProducerIdentity(new_id, new_epoch)
        self._sender.reset_sequences()

    async def _end_transaction(self, transaction: TransactionManager, *, commit: bool) -> None:
        """EndTxn, unless the coordinator never heard of the transaction (no partition or
        offset added: Kafka's producer skips it too)."""
        if not transaction.started:
            return
        identity = self._sender.identity
        await self._txn_call(
            transaction,
            self._txn_coordinator().end_txn(
                identity.producer_id, identity.epoch, commit, self._deadline()
            ),
        )

    async def _txn_call(self, transaction: TransactionManager, call: Coroutine[Any, Any, T]) -> T:
        """Await a coordinator request; a failure moves the transaction to ABORTABLE_ERROR or
        FATAL_ERROR before it is raised. A timeout changes nothing (the call may be repeated)."""
        try:
            return await call
        except TransactionAbortableError as error:
            transaction.fail(TxnAction.ABORTABLE, error)
            raise
        except KafkaTimeoutError:
            raise
        except TransactionFatalError as error:  # ProducerFencedError among them
            transaction.fail(TxnAction.FATAL, error)
            self._blocked = True
            raise
        except KafkaError as error:
            # Refused before any transactional answer, e.g. FindCoordinator answered
            # TRANSACTIONAL_ID_AUTHORIZATION_FAILED: no retry mends it.
            fatal = TransactionFatalError(
                error.code, f"transactional_id {transaction.transactional_id!r}: {error}"
            )
            transaction.fail(TxnAction.FATAL, fatal)
            self._blocked = True
            raise fatal from error

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
