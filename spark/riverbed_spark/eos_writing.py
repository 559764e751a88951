"""`df.writeStream.format("riverbed")`: each micro-batch's rows in a topic exactly once.

Every write task of a micro-batch is one Kafka transaction, with the transactional id
`<transactional.id.prefix>-<task partition id>`: a task attempt that Spark retries, or that runs
again after the query was killed and restarted from its checkpoint, has the same id, and its
`init_transactions()` fences the earlier attempt and aborts what it left open. The transaction
also commits the task's progress: offset `batch id + 1` in partition 0 of the output topic for
the consumer group of the same name (the offset is the sink's marker, not a position in the
topic). So the rows and the marker become visible together or not at all, and a task that finds
its marker at or past its batch knows its rows are committed already and writes nothing.

The order matters: init_transactions() first (it waits until the coordinator has finished the
earlier attempt's transaction, committed or aborted), then the marker is read requiring stable
offsets (OffsetFetch waits while a transaction holds it pending). Read before the fencing, the
marker could be about to change.

The marker's metadata is the streaming query's id (kept in the checkpoint, the same across
restarts): a query started from another checkpoint with the same prefix would otherwise skip
the batches the first one wrote. It is refused instead.

What this relies on (docs/spark.md, "Exactly-once writes"): a replayed micro-batch gives each
task partition the same rows as before. Each task's rows become visible at its own commit, not
the micro-batch's.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType
from riverbed.client.admin import Admin
from riverbed.client.producer import Producer
from riverbed.client.types import OffsetAndMetadata, TopicPartition

from riverbed_spark.writing import WriteOptions, parse_write_options, send_rows

# Local properties Spark's micro-batch execution sets on every task of a batch (names from
# MicroBatchExecution.BATCH_ID_KEY and StreamExecution.QUERY_ID_KEY); the Python writer's
# write() is not told the batch id otherwise.
BATCH_ID_PROPERTY: Final = "streaming.sql.batchId"
QUERY_ID_PROPERTY: Final = "sql.streaming.queryId"
PREFIX_OPTION: Final = "transactional.id.prefix"
# Kafka's producer default: a transaction a killed task left open is aborted by the
# coordinator this long after it began, unless the task's next attempt fences it sooner.
TRANSACTION_TIMEOUT_MS_DEFAULT: Final = 60_000
# The marker lives in this partition of the output topic, which every topic has.
MARKER_PARTITION: Final = 0


@dataclass(frozen=True)
class ExactlyOnceOptions:
    write: WriteOptions
    transactional_id_prefix: str
    transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS_DEFAULT

    @property
    def topic(self) -> str:
        if self.write.topic is None:  # parse_exactly_once_options never builds one
            raise ValueError("the exactly-once sink needs the topic option")
        return self.write.topic

    def transactional_id(self, partition_id: int) -> str:
        return f"{self.transactional_id_prefix}-{partition_id}"


def parse_exactly_once_options(
    options: Mapping[str, str], schema: StructType
) -> ExactlyOnceOptions:
    write = parse_write_options(options, schema)
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    prefix = lowered.get(PREFIX_OPTION)
    if not prefix:
        raise ValueError(
            f"set {PREFIX_OPTION} to write a stream: each write task commits its rows in a "
            f"transaction with the id <{PREFIX_OPTION}>-<task partition>, unique to this query"
        )
    # The marker of a task's progress is an offset in one topic's partition 0.
    if "topic" in schema.fieldNames():
        raise ValueError("a stream is written to the one topic of the topic option, not a column")
    if write.topic is None:
        raise ValueError("set the topic option to write a stream")
    timeout = lowered.get("transaction.timeout.ms") or lowered.get("kafka.transaction.timeout.ms")
    timeout_ms = TRANSACTION_TIMEOUT_MS_DEFAULT if timeout is None else _positive(timeout)
    return ExactlyOnceOptions(write, prefix, timeout_ms)


class Outcome(enum.StrEnum):
    COMMITTED = "committed"  # the rows and the marker, in one transaction
    ALREADY_COMMITTED = "already committed"  # an earlier attempt did it: nothing written
    EMPTY = "empty"  # no rows: no transaction


@dataclass(frozen=True)
class TaskWritten(WriterCommitMessage):
    partition_id: int
    records: int
    outcome: Outcome


@dataclass(frozen=True)
class TaskIdentity:
    """Which write this is: the query (its id survives restarts), the micro-batch, and the task
    partition. Two attempts of one write have the same identity."""

    query_id: str
    batch_id: int
    partition_id: int

    @classmethod
    def of_running_task(cls) -> TaskIdentity:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("a stream is written by Spark tasks only")
        batch = context.getLocalProperty(BATCH_ID_PROPERTY)
        query = context.getLocalProperty(QUERY_ID_PROPERTY)
        if batch is None or query is None:
            raise RuntimeError(
                f"Spark did not give the task {BATCH_ID_PROPERTY} and {QUERY_ID_PROPERTY}: "
                "exactly-once writes need a micro-batch query"
            )
        return cls(query, int(batch), context.partitionId())


def write_exactly_once(
    batches: Iterable[pa.RecordBatch], options: ExactlyOnceOptions, task: TaskIdentity
) -> TaskWritten:
    rows = _unless_empty(batches)
    if rows is None:
        # Nothing to fence either: a replayed batch gives this task no rows now only if it gave
        # it none before (the replay assumption), and earlier batches' transactions all ended
        # before their micro-batch did.
        return TaskWritten(task.partition_id, 0, Outcome.EMPTY)
    return asyncio.run(_write_once(rows, options, task))


async def _write_once(
    rows: Iterator[pa.RecordBatch], options: ExactlyOnceOptions, task: TaskIdentity
) -> TaskWritten:
    transactional_id = options.transactional_id(task.partition_id)
    async with Producer(
        bootstrap_servers=options.write.bootstrap_servers,
        transactional_id=transactional_id,
        transaction_timeout_ms=options.transaction_timeout_ms,
        acks="all",
        linger_ms=options.write.linger_ms,
    ) as producer:
        await producer.init_transactions()  # fences earlier attempts: before the marker is read
        if await next_batch_id(options, transactional_id, task.query_id) > task.batch_id:
            return TaskWritten(task.partition_id, 0, Outcome.ALREADY_COMMITTED)
        marker = OffsetAndMetadata(task.batch_id + 1, metadata=task.query_id)
        async with producer.transaction():  # aborted if anything below raises
            written = await send_rows(producer, rows, options.write)
            await producer.send_offsets_to_transaction(
                {TopicPartition(options.topic, MARKER_PARTITION): marker}, transactional_id
            )
    return TaskWritten(task.partition_id, written, Outcome.COMMITTED)


async def next_batch_id(options: ExactlyOnceOptions, group_id: str, query_id: str) -> int:
    """The first micro-batch the task partition of `group_id` has not committed (0 if none),
    once no transaction holds its marker pending."""
    marker_partition = TopicPartition(options.topic, MARKER_PARTITION)
    async with Admin(bootstrap_servers=options.write.bootstrap_servers) as admin:
        offsets = await admin.list_group_offsets(group_id, [marker_partition], require_stable=True)
    marker = offsets.get(marker_partition)
    if marker is None:
        return 0
    if marker.metadata != query_id:
        raise ValueError(
            f"{PREFIX_OPTION} {options.transactional_id_prefix!r} was used by another streaming "
            f"query (id {marker.metadata!r}, this one is {query_id!r}) to write {options.topic!r}: "
            "a query started from a new checkpoint needs a new prefix"
        )
    return marker.offset


def _unless_empty(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch] | None:
    """All of `batches` from the first with a row, or None if no batch has one."""
    iterator = iter(batches)
    for batch in iterator:
        if batch.num_rows:
            return itertools.chain([batch], iterator)
    return None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"transaction.timeout.ms must be a positive integer, not {text!r}")
    return value
