"""An exactly-once consume-transform-produce worker built on confluent-kafka, as its users build
one, for the fault test (test_eos_faults.py).

`EosWorker.run` (in a thread of its own) consumes a batch of `input` in a consumer group
(read_committed, no auto commit), and in one transaction produces one `output` record per input
record and sends the consumer's positions to the transaction. Errors are handled as Kafka's and
librdkafka's documentation say:

- retriable (a timeout, a coordinator moving): the same call again;
- abortable (`txn_requires_abort`): abort the transaction and rewind the consumer to the group's
  committed offsets, so the batch is read and written again in the next transaction;
- fatal (the producer fenced): a new producer with the same transactional id (its
  init_transactions fences the old epoch and ends what it left open) and a new consumer.

A share of the transactions is aborted on purpose (`abort_ratio`, a transform that failed) once
their records are on the brokers, exercising the abort-and-rewind path and leaving aborted data
for read_committed readers to skip.

The test paces the worker with `allow(records)`: once a transaction would take the input past
that many records, the worker holds it open (records written, not committed) until the test
allows more, so the faults land inside transactions and the input outlasts them.

Input records carry `key:sequence` (sequence per key); output records carry
`key:sequence:input partition:input offset`, under the same key.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, TopicPartition

T = TypeVar("T")
log = logging.getLogger(__name__)

# A batch is one transaction: small, so that there are many transactions and many commits for
# the faults to hit.
BATCH_RECORDS_MAX: Final = 10
CONSUME_TIMEOUT_S: Final = 0.5
# One client call (commit, abort, send_offsets, init_transactions): a failover takes a ZooKeeper
# session timeout and an election; a call that times out is retried (it is retriable).
CALL_TIMEOUT_S: Final = 20.0
# Retries of one retriable call, and how long a transaction is held open at most: within
# TRANSACTION_TIMEOUT_MS, so that the coordinator never aborts a held transaction.
CALL_ATTEMPTS_MAX: Final = 10
HOLD_S_MAX: Final = 25.0
TRANSACTION_TIMEOUT_MS: Final = 60_000
# The group's members are dropped this long after a crash; the worker's own consumer is closed
# properly when it is replaced, so this only bounds a lost LeaveGroup.
SESSION_TIMEOUT_MS: Final = 10_000
IDLE_CONNECTION_MS: Final = 5_000
REPLACE_PAUSE_S: Final = 2.0


# EOS_WORKER_DEBUG=eos,protocol (librdkafka's `debug` contexts) logs the producer's steps.
DEBUG: Final = (
    {"debug": os.environ["EOS_WORKER_DEBUG"]} if os.environ.get("EOS_WORKER_DEBUG") else {}
)


# The phases between begin_transaction and the end of commit_transaction.
IN_TRANSACTION_PHASES: Final = frozenset(
    {"in-transaction", "held", "sending-offsets", "committing"}
)


class FatalTransactionError(Exception):
    """The producer cannot go on (fenced, or a fatal librdkafka error): replace it."""


class AbortableTransactionError(Exception):
    """The transaction must be aborted and its batch read again."""


class Stopped(Exception):
    """The test stopped the worker."""


@dataclass
class Progress:
    """What the worker did, read by the test thread (plain counters: a torn read is harmless)."""

    committed_transactions: int = 0
    aborted_transactions: int = 0
    deliberate_aborts: int = 0
    producers_replaced: int = 0
    consumers_replaced: int = 0
    retried_calls: int = 0
    phase: str = "starting"  # starting | consuming | in-transaction | held | committing | ...
    errors: list[str] = field(default_factory=list)

    @property
    def in_transaction(self) -> bool:
        return self.phase in IN_TRANSACTION_PHASES


def classify(exception: KafkaException) -> Exception:
    """Fatal, or else abortable (librdkafka also raises non-retriable errors that it does not
    mark abortable, such as a state error: aborting, or a new producer, recovers from them)."""
    error: KafkaError = exception.args[0]
    if error.fatal():
        return FatalTransactionError(error.str())
    return AbortableTransactionError(error.str())


def input_value(key: str, sequence: int) -> bytes:
    return f"{key}:{sequence}".encode()


def output_value(key: str, sequence: int, partition: int, offset: int) -> bytes:
    return f"{key}:{sequence}:{partition}:{offset}".encode()


def parse_output(value: bytes) -> tuple[str, int, int, int]:
    key, sequence, partition, offset = value.decode().split(":")
    return key, int(sequence), int(partition), int(offset)


class EosWorker:
    def __init__(
        self,
        *,
        bootstrap: str,
        transactional_id: str,
        group_id: str,
        input_topic: str,
        output_topic: str,
        end_offsets: Mapping[int, int],
        abort_ratio: float = 0.0,
        seed: int = 0,
    ) -> None:
        """`end_offsets`: the input's end offset per partition; the worker is done once the
        group's committed offsets reached them all. `abort_ratio` of the transactions are
        aborted on purpose (a transform that failed), after their records were written and, for
        half of them, after the offsets were sent too; their batches are read again."""
        self.bootstrap = bootstrap
        self.transactional_id = transactional_id
        self.group_id = group_id
        self.input_topic = input_topic
        self.output_topic = output_topic
        self.end_offsets = dict(end_offsets)
        self.progress = Progress()
        self._abort_ratio = abort_ratio
        self._rng = random.Random(seed)
        # The committed offsets of `input` as this worker knows them (from its own commits, and
        # from the group's after a rewind).
        self.committed: dict[int, int] = dict.fromkeys(end_offsets, 0)
        self._allowed_records = 0
        self._allowed = threading.Condition()
        self._stop = threading.Event()
        self._producer: Any = None
        self._consumer: Any = None

    # -- the test's side -------------------------------------------------------------------------
    def allow(self, records: int) -> None:
        """Let the worker commit input records up to `records` in all (a running total)."""
        with self._allowed:
            self._allowed_records = max(self._allowed_records, records)
            self._allowed.notify_all()

    def stop(self) -> None:
        self._stop.set()
        self.allow(sum(self.end_offsets.values()))

    @property
    def done(self) -> bool:
        return all(self.committed[p] >= end for p, end in self.end_offsets.items())

    @property
    def committed_records(self) -> int:
        return sum(self.committed.values())

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._producer = self._new_producer()
            self._consumer = self._new_consumer()
            while not self.done and not self._stop.is_set():
                try:
                    try:
                        self._one_transaction()
                    except KafkaException as exception:  # from a call outside `_call`
                        raise classify(exception) from exception
                except AbortableTransactionError as error:
                    self._note(f"abortable: {error}")
                    self._abort()
                except FatalTransactionError as error:
                    self._note(f"fatal: {error}")
                    self._replace_clients()
            self.progress.phase = "done" if self.done else "stopped"
        except Stopped:
            self.progress.phase = "stopped"
        except BaseException as error:
            self.progress.phase = "crashed"
            self._note(f"worker crashed: {error!r}")
            raise
        finally:
            if self._consumer is not None:
                self._consumer.close()

    def _one_transaction(self) -> None:
        self.progress.phase = "consuming"
        messages = [
            message
            for message in self._consumer.consume(BATCH_RECORDS_MAX, CONSUME_TIMEOUT_S)
            if message.error() is None
        ]
        if not messages:
            return
        self.progress.phase = "in-transaction"
        self._call(self._producer.begin_transaction)
        for message in messages:
            key = message.key().decode()
            sequence = int(message.value().decode().split(":")[1])
            self._produce(key, output_value(key, sequence, message.partition(), message.offset()))
        positions = {
            tp.partition: tp.offset
            for tp in self._consumer.position(self._consumer.assignment())
            if tp.offset >= 0
        }
        abort_at = self._deliberate_abort()
        if abort_at == "after-produce":
            return self._abort_on_purpose()
        self._hold(sum({**self.committed, **positions}.values()))
        self.progress.phase = "sending-offsets"
        offsets = [TopicPartition(self.input_topic, p, o) for p, o in positions.items()]
        metadata = self._consumer.consumer_group_metadata()
        self._call(
            lambda: self._producer.send_offsets_to_transaction(offsets, metadata, CALL_TIMEOUT_S)
        )
        if abort_at == "after-offsets":
            return self._abort_on_purpose()
        self.progress.phase = "committing"
        self._call(lambda: self._producer.commit_transaction(CALL_TIMEOUT_S))
        for partition, offset in positions.items():
            self.committed[partition] = max(self.committed[partition], offset)
        self.progress.committed_transactions += 1

    def _deliberate_abort(self) -> str | None:
        if self._rng.random() >= self._abort_ratio:
            return None
        return self._rng.choice(("after-produce", "after-offsets"))

    def _abort_on_purpose(self) -> None:
        """Abort once the records are on the brokers (flushed), so that read_uncommitted
        readers see them and read_committed ones must skip them."""
        self.progress.phase = "aborting"
        if self._producer.flush(CALL_TIMEOUT_S) != 0:
            raise AbortableTransactionError("records not delivered before a deliberate abort")
        self.progress.deliberate_aborts += 1
        self._abort()

    def _produce(self, key: str, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(self.output_topic, value, key.encode())
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.1)

    def _hold(self, records_after_commit: int) -> None:
        """Keep the transaction open while committing it would pass what the test allowed."""
        deadline = time.monotonic() + HOLD_S_MAX
        with self._allowed:
            while records_after_commit > self._allowed_records and not self._stop.is_set():
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    self._note("held a transaction for HOLD_S_MAX: committing it")
                    return
                self.progress.phase = "held"
                self._allowed.wait(min(remaining_s, 0.2))

    # -- errors --------------------------------------------------------------------------------
    def _call(self, call: Callable[[], T]) -> T:
        """Run a transactional call; retriable errors retry it, the others are classified."""
        for _ in range(CALL_ATTEMPTS_MAX):
            if self._stop.is_set():
                raise Stopped
            try:
                return call()
            except KafkaException as exception:
                error: KafkaError = exception.args[0]
                if not error.retriable() or error.fatal() or error.txn_requires_abort():
                    raise classify(exception) from exception
                self.progress.retried_calls += 1
                self._note(f"retrying: {error.str()}")
        raise AbortableTransactionError(f"still failing after {CALL_ATTEMPTS_MAX} attempts")

    def _abort(self) -> None:
        self.progress.phase = "aborting"
        try:
            self._call(lambda: self._producer.abort_transaction(CALL_TIMEOUT_S))
        except FatalTransactionError as error:
            self._note(f"fatal while aborting: {error}")
            self._replace_clients()
            return
        except AbortableTransactionError as error:
            # No transaction open (begin_transaction itself failed) or the abort keeps failing:
            # a new producer's init_transactions ends whatever is left.
            self._note(f"abort failed: {error}")
            self._replace_clients()
            return
        self.progress.aborted_transactions += 1
        self._rewind()

    def _rewind(self) -> None:
        """Seek the consumer back to the group's committed offsets (the aborted batch is read
        again); a new consumer if seeking fails."""
        self.progress.phase = "rewinding"
        try:
            committed = self._group_offsets()
            for tp in self._consumer.assignment():
                offset = committed.get(tp.partition, confluent_kafka.OFFSET_BEGINNING)
                self._consumer.seek(TopicPartition(self.input_topic, tp.partition, offset))
        except KafkaException as exception:
            self._note(f"rewind failed: {exception}: a new consumer")
            self._replace_consumer()

    def _group_offsets(self) -> dict[int, int]:
        """The group's committed offsets (read_committed: OffsetFetch requires them stable, so
        an offset written by a transaction still being ended is waited for)."""
        wanted = [TopicPartition(self.input_topic, p) for p in self.end_offsets]
        for attempt in range(CALL_ATTEMPTS_MAX):
            try:
                offsets = self._consumer.committed(wanted, CALL_TIMEOUT_S)
                break
            except KafkaException as exception:
                if attempt == CALL_ATTEMPTS_MAX - 1:
                    raise
                self._note(f"committed offsets not read: {exception}")
        known = {tp.partition: tp.offset for tp in offsets if tp.offset >= 0}
        for partition, offset in known.items():
            self.committed[partition] = max(self.committed[partition], offset)
        return known

    def _replace_clients(self) -> None:
        self.progress.phase = "replacing"
        # As a restarted process would, after a pause: the instance that fenced this one is
        # still retrying its own InitProducerId (CONCURRENT_TRANSACTIONS while this one's
        # transaction is aborted); starting at once would fence it back, and the two would take
        # turns.
        self._stop.wait(REPLACE_PAUSE_S)
        self._producer = self._new_producer()
        self.progress.producers_replaced += 1
        self._replace_consumer()

    def _replace_consumer(self) -> None:
        self._consumer.close()
        self._consumer = self._new_consumer()
        self.progress.consumers_replaced += 1
        self._group_offsets()

    def _note(self, text: str) -> None:
        log.info("%s: %s", self.transactional_id, text)
        self.progress.errors.append(text)

    # -- clients -------------------------------------------------------------------------------
    def _new_producer(self) -> Any:
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "linger.ms": 5,
                # librdkafka 2.16 drops a broker that leaves the Metadata (a killed one) but
                # keeps it cached as the group coordinator, and send_offsets_to_transaction then
                # waits for that broker's state to change, past its timeout, until some other
                # connection goes up or down (confluentinc/librdkafka#5511, #5456; Kafka's
                # Metadata omits dead brokers too). Closing idle connections makes that happen.
                "connections.max.idle.ms": IDLE_CONNECTION_MS,
                **DEBUG,
            }
        )
        for attempt in range(CALL_ATTEMPTS_MAX):
            try:
                producer.init_transactions(CALL_TIMEOUT_S)
                return producer
            except KafkaException as exception:
                error: KafkaError = exception.args[0]
                if not error.retriable() or attempt == CALL_ATTEMPTS_MAX - 1:
                    raise
                self._note(f"init_transactions retried: {error.str()}")
        raise AssertionError("unreachable")

    def _new_consumer(self) -> Any:
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group_id,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": SESSION_TIMEOUT_MS,
            }
        )
        consumer.subscribe([self.input_topic])
        return consumer
