"""The producer's single sender task: drain ready batches into Produce requests per leader.

One loop, woken by `wake()` (a new or full batch, a flush, a response, a metadata update) or by
its own timer (the next linger or retry deadline). Each pass, synchronously:

1. fails batches whose delivery.timeout.ms ran out while waiting;
2. picks, per partition, the head batch if it is ready: closed or full, lingered long enough, or
   a flush/close is under way; and it has a known leader;
3. groups those per leader and writes one Produce request per leader (at most
   max.in.flight.requests.per.connection unanswered per leader and per partition) at once,
   with `BrokerConnection.send_nowait`; the response's callback hands every partition's
   outcome to `_on_partition_result`. No task per request: on a producer that outruns its
   broker every batch costs a request, and a task, a semaphore and a timeout context per request
   cost ~20% of the throughput at Kafka's default 16 KiB batches.

Batches are only handed to a connection that is already open (as the Java client's
`NetworkClient.ready`): a missing one is opened by a task of its own, and the pass after it
opens sends. Writing synchronously in the pass keeps requests in the order they were made, so
the broker sees a partition's sequence numbers in order.

Ordering: a partition's batches leave in creation order. A batch that comes back with a
retriable error goes back to its place in its queue (`PartitionQueue.requeue`), and a retried
batch is only sent when none of its partition's batches is in flight, so with idempotence the
broker sees the sequence numbers in order again (the batches in flight behind a failed one come
back OUT_OF_ORDER_SEQUENCE_NUMBER and are retried in turn).

Transactions (a `transactional_id`, KIP-98): a partition's batches go out only once the
partition is in the open transaction. Each pass collects the partitions that have batches but
are not in it yet and sends them in one AddPartitionsToTxn (one in flight at a time, as Kafka's
TransactionManager; the partitions found meanwhile go in the next), while their batches linger.
Once the transaction is to be aborted (an abortable or fatal error, or abort_transaction()), the
pass drops the batches not sent yet instead of sending them; a batch that fails for good makes
the transaction abortable (`TransactionManager.batch_failed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import defaultdict
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final

from riverbed.client.accumulator import PartitionQueue, ProducerBatch, RecordAccumulator
from riverbed.client.connection import BrokerConnection
from riverbed.client.pool import BrokerPool
from riverbed.client.settings import ProducerSettings
from riverbed.client.transactions import TransactionManager, TxnAction
from riverbed.client.txn_coordinator import TxnCoordinatorClient
from riverbed.client.types import TopicPartition
from riverbed.common.backoff import backoff_ms
from riverbed.errors import (
    DuplicateSequenceError,
    KafkaTimeoutError,
    OutOfOrderSequenceError,
    RetriableError,
    TransactionAbortableError,
    TransactionAbortedError,
    UnsupportedVersionError,
    error_for,
)
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records import encode_batch

log = logging.getLogger(__name__)

INIT_PRODUCER_ID_KEY: Final = 22
SEQUENCE_MODULUS: Final = 2**31  # sequence numbers are int32 and wrap to 0
# Kafka's default transaction.timeout.ms; an idempotent-only producer sends it unused.
TRANSACTION_TIMEOUT_MS: Final = 60_000
# Errors after which the partition's leader may have moved: look it up again.
METADATA_ERRORS: Final = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.KAFKA_STORAGE_ERROR,
    }
)
NO_PRODUCER_ID: Final = -1


@dataclass(slots=True)
class ProducerIdentity:
    """The idempotent producer's id and epoch (InitProducerId), or -1s when not idempotent."""

    producer_id: int = NO_PRODUCER_ID
    epoch: int = -1

    @property
    def idempotent(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID


class Sender:
    """Owns the sender loop and every request task; `close()` stops them."""

    def __init__(
        self, settings: ProducerSettings, pool: BrokerPool, accumulator: RecordAccumulator
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._accumulator = accumulator
        self.identity = ProducerIdentity()
        # Idempotence was asked for (maybe by default); InitProducerId decides if it happens.
        self.idempotence_wanted = settings.enable_idempotence
        self.fatal_error: BaseException | None = None
        self.flushing = 0
        self._closing = False
        self._wakeup = asyncio.Event()
        self._node_in_flight: dict[int, int] = defaultdict(int)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._refreshing = False
        # Brokers being connected to, and when to try again after failed attempts.
        self._connecting: set[int] = set()
        self._connect_failures: dict[int, int] = {}
        self._connect_retry_at: dict[int, float] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()  # set once the identity question is settled
        # A transactional producer's state and its coordinator's requests (None: not one).
        self.transaction: TransactionManager | None = None
        self.coordinator: TxnCoordinatorClient | None = None
        self._adding: asyncio.Task[None] | None = None  # the AddPartitionsToTxn in flight

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(
                self._run(), name="riverbed-producer-sender"
            )

    @property
    def running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    def wake(self) -> None:
        self._wakeup.set()

    async def close(self) -> None:
        """Stop after the accumulator is empty (callers flush first); cancel what is left."""
        self._closing = True
        self.wake()
        task = self._loop_task
        if task is not None:
            with contextlib.suppress(BaseException):
                await task
        tasks, self._tasks = self._tasks, set()
        for pending in tasks:
            pending.cancel()
        for pending in tasks:
            with contextlib.suppress(BaseException):
                await pending

    def make_transactional(
        self, transaction: TransactionManager, coordinator: TxnCoordinatorClient
    ) -> None:
        """From now on batches go out only inside the transaction (set before start())."""
        self.transaction = transaction
        self.coordinator = coordinator
        self.idempotence_wanted = False  # the identity comes from init_transactions()

    def reset_sequences(self) -> None:
        """A new producer id or epoch: every partition's sequence starts at 0 again."""
        for queue in self._accumulator.all_queues():
            queue.next_sequence = 0

    async def adds_settled(self) -> None:
        """Return once no AddPartitionsToTxn is in flight (its outcome is recorded)."""
        while (adding := self._adding) is not None:
            await asyncio.wait([adding])

    async def stop_now(self) -> None:
        """Cancel the loop at once (the caller fails whatever is still incomplete)."""
        self._closing = True
        if self._loop_task is not None:
            self._loop_task.cancel()
        await self.close()

    # -- the loop -------------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # One timer, moved only when the next deadline comes earlier than it or it went off:
        # deadlines mostly move later, and a timer that fires early only costs an idle pass.
        timer: asyncio.TimerHandle | None = None
        try:
            await self._init_identity()
            while True:
                self._wakeup.clear()
                now = loop.time()
                next_at = self._send_ready(now)
                if self._closing and not self._accumulator.incomplete:
                    return
                if next_at is not None and (
                    timer is None or timer.when() <= now or timer.when() > next_at
                ):
                    if timer is not None:
                        timer.cancel()
                    timer = loop.call_at(next_at, self._wakeup.set)
                await self._wakeup.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            # A bug or a fatal broker answer: fail every record rather than leave them hanging.
            log.exception("producer sender stopped")
            self.fatal_error = error
            for batch in list(self._accumulator.incomplete):
                self._finish(batch, error)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    async def _init_identity(self) -> None:
        """InitProducerId, retried with backoff; without broker support idempotence is off
        (an error if the user set enable_idempotence=True explicitly)."""
        attempts = 0
        while self.idempotence_wanted and not self._closing_without_work():
            try:
                connection = await self._pool.any_connection()
                if not connection.supports(INIT_PRODUCER_ID_KEY):
                    if "enable_idempotence" in self._settings.explicit:
                        raise UnsupportedVersionError(
                            ErrorCode.UNSUPPORTED_VERSION,
                            "enable_idempotence=True but the broker has no InitProducerId",
                        )
                    self.idempotence_wanted = False
                    break
                response = await connection.call(
                    m.InitProducerIdRequest(
                        transactional_id=None, transaction_timeout_ms=TRANSACTION_TIMEOUT_MS
                    ),
                    m.InitProducerIdResponse,
                    timeout_ms=self._settings.request_timeout_ms,
                )
                if response.error_code != ErrorCode.NONE:
                    error = error_for(response.error_code, "InitProducerId")
                    if not isinstance(error, RetriableError):
                        raise error
                    raise ConnectionError(str(error))
                self.identity = ProducerIdentity(response.producer_id, response.producer_epoch)
                break
            except (OSError, TimeoutError) as error:
                attempts += 1
                log.debug("InitProducerId failed (%s), retrying", error)
                await asyncio.sleep(
                    backoff_ms(
                        attempts,
                        self._settings.retry_backoff_ms,
                        self._settings.retry_backoff_max_ms,
                    )
                    / 1000
                )
        self._ready.set()

    def _closing_without_work(self) -> bool:
        return self._closing and not self._accumulator.incomplete

    def _send_ready(self, now: float) -> float | None:
        """Send every ready batch; return the loop time of the next deadline (None: none)."""
        settings = self._settings
        cluster = self._pool.cluster
        in_flight_max = settings.max_in_flight_requests_per_connection
        hurry = self.flushing > 0 or self._closing
        next_at: float | None = None
        by_leader: dict[int, list[PartitionQueue]] = defaultdict(list)
        unknown_leaders: set[str] = set()
        transaction = self.transaction
        not_in_transaction: list[TopicPartition] = []
        for queue in self._accumulator.all_queues():
            batches = queue.batches
            if transaction is not None and batches and transaction.dropping:
                self._drop_unsent(queue, transaction)
            while batches and batches[0].deadline <= now:
                self._expire(queue, batches.popleft())
            if not batches:
                continue
            if transaction is not None and queue.tp not in transaction.partitions:
                # Not sendable before AddPartitionsToTxn; its expiry still wakes us.
                not_in_transaction.append(queue.tp)
                next_at = _earliest(next_at, batches[0].deadline)
                continue
            # Expiry of the queue's oldest batch wakes us even if nothing else does.
            next_at = _earliest(next_at, batches[0].deadline)
            ready, wake_at = self._head_ready(queue, now, hurry)
            if wake_at is not None:
                next_at = _earliest(next_at, wake_at)
            if not ready:
                continue
            leader = cluster.leader_for(queue.tp)
            if leader is None:
                unknown_leaders.add(queue.tp.topic)
                continue
            by_leader[leader].append(queue)
        for node_id, queues in by_leader.items():
            connection = self._ready_connection(node_id, now)
            if connection is None:
                retry_at = self._connect_retry_at.get(node_id, 0.0)
                if retry_at > now:
                    next_at = _earliest(next_at, retry_at)
                continue
            # Pipeline: one request after another while the leader has room for more.
            while queues and self._node_in_flight[node_id] < in_flight_max:
                self._send_to(node_id, connection, queues)
                queues = [q for q in queues if self._head_ready(q, now, hurry)[0]]
        if not_in_transaction and transaction is not None:
            self._add_partitions(transaction, not_in_transaction)
        if unknown_leaders or (cluster.stale and self._accumulator.incomplete):
            self._refresh_metadata(unknown_leaders)
            if unknown_leaders:
                # Retry leader lookups at the refresh backoff even if the refresh stalls.
                next_at = _earliest(next_at, now + settings.retry_backoff_ms / 1000)
        return next_at

    def _drop_unsent(self, queue: PartitionQueue, transaction: TransactionManager) -> None:
        """The transaction will be aborted: fail its batches not sent yet (Kafka's
        abortUndrainedBatches). A dropped batch that had been sent before left a gap in its
        partition's sequence: the next transaction needs a new epoch."""
        error = transaction.last_error
        if error is None:
            error = TransactionAbortedError(
                f"transactional_id {transaction.transactional_id!r}: the transaction was "
                "aborted before the record was sent",
            )
        queue.open = None
        while queue.batches:
            batch = queue.batches.popleft()
            if batch.encoded is not None:
                transaction.epoch_bump_required = True
            batch.fail(error)
            self._accumulator.release(batch)

    def _add_partitions(self, transaction: TransactionManager, tps: list[TopicPartition]) -> None:
        """Start the AddPartitionsToTxn of `tps` unless one is in flight (the next pass after
        it sends the rest)."""
        if self._adding is not None or not transaction.sending_allowed:
            return
        new = transaction.to_add(tps)
        if not new:
            return
        task = asyncio.get_running_loop().create_task(
            self._add_partitions_now(transaction, new), name="riverbed-add-partitions-to-txn"
        )
        self._adding = task
        self._tasks.add(task)
        task.add_done_callback(self._adding_done)

    async def _add_partitions_now(
        self, transaction: TransactionManager, tps: list[TopicPartition]
    ) -> None:
        coordinator = self.coordinator
        if coordinator is None:
            raise RuntimeError("a transactional sender without a coordinator client")
        identity = self.identity
        deadline = asyncio.get_running_loop().time() + self._settings.delivery_timeout_ms / 1000
        try:
            await coordinator.add_partitions(identity.producer_id, identity.epoch, tps, deadline)
        except TransactionAbortableError as error:
            transaction.add_failed(tps)
            transaction.fail(TxnAction.ABORTABLE, error)
        except KafkaTimeoutError as error:
            transaction.add_failed(tps)
            abortable = TransactionAbortableError(error.code, str(error))
            abortable.__cause__ = error
            transaction.fail(TxnAction.ABORTABLE, abortable)
        except KafkaError as error:  # fenced or fatal
            transaction.add_failed(tps)
            transaction.fail(TxnAction.FATAL, error)
            self._fail_unsent(error)
        else:
            transaction.added(tps)

    def _adding_done(self, task: asyncio.Task[None]) -> None:
        if self._adding is task:
            self._adding = None
        self._task_done(task)
        self.wake()

    def _fail_unsent(self, error: BaseException) -> None:
        for queue in self._accumulator.all_queues():
            queue.open = None
            while queue.batches:
                batch = queue.batches.popleft()
                batch.fail(error)
                self._accumulator.release(batch)

    def _head_ready(
        self, queue: PartitionQueue, now: float, hurry: bool
    ) -> tuple[bool, float | None]:
        """Whether the queue's first batch may be sent now, and else when to look again (None:
        when something else happens, e.g. a response)."""
        if not queue.batches:
            return False, None
        head = queue.batches[0]
        if head.attempts > 0:
            if queue.in_flight:
                return False, None  # a retry goes alone, once the earlier sends are back
            if head.retry_at > now:
                return False, head.retry_at
        elif (
            head is queue.open
            and not hurry
            and head.size_bytes < self._accumulator.batch_size
            and now < head.created_at + self._accumulator.linger_s
        ):
            return False, head.created_at + self._accumulator.linger_s
        if len(queue.in_flight) >= self._settings.max_in_flight_requests_per_connection:
            return False, None
        return True, None

    def _ready_connection(self, node_id: int, now: float) -> BrokerConnection | None:
        """The open connection to `node_id`; else None, once a connection attempt is under way
        (one at a time, spaced by retry.backoff.ms doubling after failures)."""
        connection = self._pool.open_connection(node_id)
        if connection is not None:
            return connection
        if node_id not in self._connecting and now >= self._connect_retry_at.get(node_id, 0.0):
            self._connecting.add(node_id)
            self._spawn(self._connect(node_id))
        return None

    async def _connect(self, node_id: int) -> None:
        settings = self._settings
        try:
            await self._pool.connection_for(node_id)
            self._connect_failures.pop(node_id, None)
            self._connect_retry_at.pop(node_id, None)
        except (OSError, TimeoutError, KafkaError) as error:
            failures = self._connect_failures[node_id] = self._connect_failures.get(node_id, 0) + 1
            wait_ms = backoff_ms(failures, settings.retry_backoff_ms, settings.retry_backoff_max_ms)
            self._connect_retry_at[node_id] = asyncio.get_running_loop().time() + wait_ms / 1000
            self._pool.cluster.mark_stale(f"connecting to broker {node_id} failed: {error}")
            for batch in self._accumulator.incomplete:
                if not batch.in_flight and self._pool.cluster.leader_for(batch.tp) == node_id:
                    batch.last_error = error  # what a batch that expires now reports
        finally:
            self._connecting.discard(node_id)
            self.wake()

    def _send_to(
        self, node_id: int, connection: BrokerConnection, queues: list[PartitionQueue]
    ) -> None:
        settings = self._settings
        identity = self.identity
        compression = settings.compression
        batches: list[ProducerBatch] = []
        request_bytes = 0
        for queue in queues:
            batch = queue.batches[0]
            if batch.encoded is None:
                if identity.idempotent:
                    batch.base_sequence = queue.next_sequence
                    queue.next_sequence = (
                        queue.next_sequence + len(batch.records)
                    ) % SEQUENCE_MODULUS
                batch.encoded = encode_batch(
                    batch.records,
                    compression=compression,
                    producer_id=identity.producer_id,
                    producer_epoch=identity.epoch,
                    base_sequence=batch.base_sequence,
                    is_transactional=self.transaction is not None,
                )
            if batches and request_bytes + len(batch.encoded) > settings.max_request_size:
                break
            queue.batches.popleft()
            if queue.open is batch:
                queue.open = None
            queue.in_flight.add(batch)
            batch.in_flight = True
            batch.attempts += 1
            request_bytes += len(batch.encoded)
            batches.append(batch)
        self._produce(node_id, connection, batches)

    def _produce(
        self, node_id: int, connection: BrokerConnection, batches: list[ProducerBatch]
    ) -> None:
        """Write the request now; `_on_produced` takes its answer (no task per request)."""
        settings = self._settings
        by_topic: dict[str, list[m.ProduceRequest.PartitionProduceData]] = defaultdict(list)
        for batch in batches:
            by_topic[batch.tp.topic].append(
                m.ProduceRequest.PartitionProduceData(
                    index=batch.tp.partition, records=batch.encoded
                )
            )
        request = m.ProduceRequest(
            transactional_id=settings.transactional_id,
            acks=settings.acks,
            timeout_ms=settings.request_timeout_ms,
            topic_data=[
                m.ProduceRequest.TopicProduceData(name=topic, partition_data=data)
                for topic, data in by_topic.items()
            ],
        )
        self._node_in_flight[node_id] += 1
        try:
            answer = connection.send_nowait(request, timeout_ms=settings.request_timeout_ms)
        except (OSError, KafkaError) as error:  # closed meanwhile, or no common version
            answer = asyncio.get_running_loop().create_future()
            answer.set_exception(error)
        answer.add_done_callback(functools.partial(self._on_produced, node_id, batches))

    def _on_produced(
        self, node_id: int, batches: list[ProducerBatch], answer: asyncio.Future[Any]
    ) -> None:
        # Woken first, the sender runs before the send()s that the released batches unblock:
        # it has full batches waiting, and the broker gets the next one before the producer
        # refills the buffer (the callback runs to its end before either of them).
        self.wake()
        # The connection resolves `answer` and never cancels it.
        try:
            error = answer.exception()
            if error is not None:
                self._pool.cluster.mark_stale(f"produce to broker {node_id} failed: {error}")
                for batch in batches:
                    self._retry_or_fail(batch, error)
            elif (response := answer.result()) is None:  # acks=0: written, nobody says more
                for batch in batches:
                    self._succeed(batch, -1, -1)
            else:
                self._on_response(response, batches)
            self._node_in_flight[node_id] -= 1
            for batch in batches:
                self._queue_of(batch).in_flight.discard(batch)
        except Exception as bug:
            # A bug in response handling: stop the producer loudly rather than lose records.
            self.fatal_error = bug
            log.exception("producer response handling failed")

    def _on_response(self, response: m.ProduceResponse, batches: list[ProducerBatch]) -> None:
        sent = {(b.tp.topic, b.tp.partition): b for b in batches}
        for topic in response.responses:
            for result in topic.partition_responses:
                batch = sent.pop((topic.name, result.index), None)
                if batch is not None:
                    self._on_partition_result(batch, result)
        for batch in sent.values():  # the broker skipped a partition: treat as a lost answer
            self._retry_or_fail(batch, ConnectionError("no response for the partition"))

    def _on_partition_result(
        self, batch: ProducerBatch, result: m.ProduceResponse.PartitionProduceResponse
    ) -> None:
        code = result.error_code
        if code == ErrorCode.NONE:
            self._succeed(batch, result.base_offset, result.log_append_time_ms)
            return
        error = error_for(code, result.error_message or f"{batch.tp.topic}-{batch.tp.partition}")
        if isinstance(error, DuplicateSequenceError):
            self._succeed(batch, -1, -1)  # written before; the broker no longer knows where
            return
        if code in METADATA_ERRORS:
            self._pool.cluster.mark_stale(f"{error.code.name} from the leader of {batch.tp}")
        self._retry_or_fail(batch, error)

    def _retry_or_fail(self, batch: ProducerBatch, error: BaseException) -> None:
        if batch.done:
            return
        batch.last_error = error
        queue = self._queue_of(batch)
        queue.in_flight.discard(batch)
        now = asyncio.get_running_loop().time()
        if not self._retriable(batch, queue, error) or batch.attempts > self._settings.retries:
            self._finish(batch, error)
        elif now >= batch.deadline:
            self._expire(queue, batch)
        else:
            batch.retry_at = now + (
                backoff_ms(
                    batch.attempts,
                    self._settings.retry_backoff_ms,
                    self._settings.retry_backoff_max_ms,
                )
                / 1000
            )
            queue.requeue(batch)

    def _retriable(self, batch: ProducerBatch, queue: PartitionQueue, error: BaseException) -> bool:
        if isinstance(error, RetriableError | OSError | TimeoutError):
            return True
        # Behind a failed batch of the same partition the broker sees a gap: not this batch's
        # fault, it goes again after the one before it.
        return isinstance(error, OutOfOrderSequenceError) and queue.outstanding_before(batch)

    def _expire(self, queue: PartitionQueue, batch: ProducerBatch) -> None:
        if queue.open is batch:
            queue.open = None
        waited_ms = self._settings.delivery_timeout_ms
        last = batch.last_error
        error: BaseException
        if isinstance(last, KafkaError):
            error = error_for(
                last.code,
                f"{last.message} (delivery_timeout_ms {waited_ms} expired after "
                f"{batch.attempts} attempts)",
            )
        elif last is None and (topic_error := self._topic_error(batch.tp.topic)) is not None:
            error = error_for(
                topic_error,
                f"{batch.tp.topic}-{batch.tp.partition} not available within "
                f"delivery_timeout_ms {waited_ms}",
            )
        else:
            error = KafkaTimeoutError(
                f"{len(batch.records)} records for {batch.tp.topic}-{batch.tp.partition} "
                f"expired: delivery_timeout_ms {waited_ms} ran out after {batch.attempts} attempts"
            )
            error.__cause__ = last
        self._finish(batch, error)

    def _topic_error(self, topic: str) -> ErrorCode | None:
        error = self._pool.cluster.topic_error(topic)
        return None if error is None or error == ErrorCode.NONE else error

    def _succeed(self, batch: ProducerBatch, base_offset: int, log_append_time_ms: int) -> None:
        batch.complete(base_offset, log_append_time_ms)
        self._accumulator.release(batch)

    def _finish(self, batch: ProducerBatch, error: BaseException) -> None:
        if self.transaction is not None and not batch.done:
            self.transaction.batch_failed(error, had_sequence=batch.encoded is not None)
        queue = self._queue_of(batch)
        if queue.open is batch:
            queue.open = None
        with contextlib.suppress(ValueError):
            queue.batches.remove(batch)
        batch.fail(error)
        self._accumulator.release(batch)

    def _queue_of(self, batch: ProducerBatch) -> PartitionQueue:
        return self._accumulator.queues[batch.tp.topic][batch.tp.partition]

    def _refresh_metadata(self, topics: set[str]) -> None:
        if self._refreshing:
            return
        self._refreshing = True
        self._spawn(self._refresh(topics))

    async def _refresh(self, topics: set[str]) -> None:
        try:
            await self._pool.refresh(topics)
        except (OSError, TimeoutError, KafkaError) as error:
            log.debug("metadata refresh failed: %s", error)
        finally:
            self._refreshing = False
            self.wake()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A bug in connecting or refreshing: stop the producer loudly rather than hang.
            self.fatal_error = task.exception()
            log.error("producer task failed", exc_info=task.exception())
            self.wake()


def _earliest(current: float | None, candidate: float) -> float:
    return candidate if current is None or candidate < current else current
