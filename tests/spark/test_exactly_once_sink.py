"""`df.writeStream.format("riverbed")` writes each input row exactly once, as read_committed
consumers see it, even when the query's process is SIGKILLed in the middle of a micro-batch and
restarted from its checkpoint; the write of one (micro-batch, task partition) done twice leaves
its rows once; and the sink's options are checked up front."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Final

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType
from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition
from riverbed_spark.eos_writing import (
    ExactlyOnceOptions,
    Outcome,
    TaskIdentity,
    parse_exactly_once_options,
    write_exactly_once,
)
from riverbed_spark.source import RiverbedDataSource
from riverbed_spark.writing import WriteOptions

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.transactions.txn_clients import ONE_BROKER_SETTINGS, read_confluent

REPO: Final = Path(__file__).resolve().parents[2]
PARTITIONS: Final = 2
PER_PARTITION: Final = 600  # with maxOffsetsPerTrigger=400: three micro-batches of 200 + 200
# Partition 0's offset 380 is in micro-batch 1: the task writing it stalls there, with the rows
# before it sent in its open transaction, until the test kills the query.
STALL_VALUE: Final = "in-0-380"
FIRST_OF_STALLED_TASK: Final = b"in-0-200"
QUERY_EXIT_TIMEOUT_S: Final = 300.0
STALL_TIMEOUT_S: Final = 180.0
READ_TIMEOUT_S: Final = 60.0
QUIET_S: Final = 2.0
SETTINGS: Final = {**ONE_BROKER_SETTINGS, "group.initial.rebalance.delay.ms": "0"}


@pytest.fixture
def txn_broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory(SETTINGS)


def input_values() -> list[bytes]:
    return [f"in-{p}-{i}".encode() for p in range(PARTITIONS) for i in range(PER_PARTITION)]


async def create_topics(bootstrap: str, *names: str) -> None:
    async with Admin(bootstrap_servers=bootstrap) as admin:
        for name in names:
            await admin.create_topic(name, partitions=PARTITIONS, replication_factor=1)


async def fill(bootstrap: str, topic: str) -> None:
    async with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
        futures = [
            await producer.send(topic, f"in-{p}-{i}".encode(), partition=p)
            for p in range(PARTITIONS)
            for i in range(PER_PARTITION)
        ]
        await producer.flush()
        for future in futures:
            await future


async def open_transaction_records(bootstrap: str, topic: str) -> int:
    """Records above the last stable offsets of `topic`: those of transactions still open."""
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    async with Admin(bootstrap_servers=bootstrap) as admin:
        ends = await admin.list_offsets(dict.fromkeys(tps, "latest"))
        stable = await admin.list_offsets(
            dict.fromkeys(tps, "latest"), isolation_level="read_committed"
        )
    return sum(ends[tp].offset - stable[tp].offset for tp in tps)


async def wait_until_stalled(
    bootstrap: str, sink: str, prefix: str, query: subprocess.Popen[bytes]
) -> None:
    """Until the stalled task's first row is in `sink` (read_uncommitted: its transaction is
    open), and the other task of micro-batch 1 has committed (its marker is 2)."""
    seen = False
    async with (
        Consumer(bootstrap_servers=bootstrap) as consumer,
        Admin(bootstrap_servers=bootstrap) as admin,
    ):
        consumer.assign([TopicPartition(sink, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + STALL_TIMEOUT_S
        while not (seen and await batch_committed_by_a_task(admin, sink, prefix, 1)):
            batches = await consumer.getmany(timeout_ms=200)
            seen = seen or any(
                r.value == FIRST_OF_STALLED_TASK for records in batches.values() for r in records
            )
            assert query.poll() is None, "the query ended before it stalled"
            assert time.monotonic() < deadline, f"never stalled (first row seen: {seen})"


async def batch_committed_by_a_task(admin: Admin, sink: str, prefix: str, batch_id: int) -> bool:
    marker = TopicPartition(sink, 0)
    for task_partition in range(PARTITIONS):  # a micro-batch's tasks: one per source partition
        offsets = await admin.list_group_offsets(
            f"{prefix}-{task_partition}", [marker], require_stable=True
        )
        if marker in offsets and offsets[marker].offset > batch_id:
            return True
    return False


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process under it at once. Spark's JVM is its child, and the
    Python workers are the JVM's, in a process group of their own (pyspark's daemon.py): all
    are stopped first, so that none goes on (committing a transaction) after the others died,
    and none starts another."""
    stopped: set[int] = set()
    while new := {pid, *descendants(pid)} - stopped:
        for each in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, signal.SIGSTOP)
        stopped |= new
    for each in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


async def read_riverbed(bootstrap: str, topic: str, isolation: str, expected: int) -> list[bytes]:
    """`topic`'s values read by Riverbed's consumer from the beginning at `isolation`: until
    `expected` came, then QUIET_S longer to see that no more come."""
    values: list[bytes] = []
    async with Consumer(bootstrap_servers=bootstrap, isolation_level=isolation) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + READ_TIMEOUT_S
        quiet_until = None
        while quiet_until is None or time.monotonic() < quiet_until:
            assert time.monotonic() < deadline, f"{len(values)} of {expected} read"
            for records in (await consumer.getmany(timeout_ms=200)).values():
                values += [r.value for r in records if r.value is not None]
            if quiet_until is None and len(values) >= expected:
                quiet_until = time.monotonic() + QUIET_S
    return values


def start_query(
    broker: BrokerProcess, source: str, sink: str, checkpoint: Path, prefix: str, stall: str = ""
) -> subprocess.Popen[bytes]:
    """The query in a process group of its own (with Spark's JVM and Python workers)."""
    arguments = [broker.bootstrap, source, sink, str(checkpoint), prefix, str(PER_PARTITION)]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.eos_query", *arguments, *([stall] if stall else [])],
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_a_query_killed_mid_batch_and_restarted_writes_each_row_once(
    txn_broker: BrokerProcess, tmp_path: Path
) -> None:
    bootstrap = txn_broker.bootstrap
    source, sink = f"eos-in-{uuid.uuid4().hex[:8]}", f"eos-out-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topics(bootstrap, source, sink))
    asyncio.run(fill(bootstrap, source))
    checkpoint, prefix = tmp_path / "checkpoint", f"eos-{uuid.uuid4().hex[:8]}"

    # Killed while micro-batch 1's task of partition 0 has rows in its open transaction, after
    # the batch's other task committed: when the batch runs again, that task writes nothing.
    query = start_query(txn_broker, source, sink, checkpoint, prefix, stall=STALL_VALUE)
    try:
        asyncio.run(wait_until_stalled(bootstrap, sink, prefix, query))
    finally:
        kill_tree(query.pid)
        output, _ = query.communicate(timeout=30)
        print(output.decode(errors="replace")[-5000:])  # shown if the test fails
    assert query.returncode == -signal.SIGKILL
    committed_before = asyncio.run(read_riverbed(bootstrap, sink, "read_committed", 0))
    assert 0 < len(committed_before) < PARTITIONS * PER_PARTITION
    assert FIRST_OF_STALLED_TASK not in committed_before

    # Restarted from its checkpoint: micro-batch 1 runs again, then the rest.
    query = start_query(txn_broker, source, sink, checkpoint, prefix)
    try:
        output, _ = query.communicate(timeout=QUERY_EXIT_TIMEOUT_S)
    finally:
        if query.poll() is None:
            os.killpg(query.pid, signal.SIGKILL)
            query.wait(timeout=30)
    assert query.returncode == 0, output.decode(errors="replace")[-3000:]

    everything = len(input_values())
    assert sorted(asyncio.run(read_riverbed(bootstrap, sink, "read_committed", everything))) == (
        sorted(input_values())
    )
    assert sorted(read_confluent(bootstrap, sink, "read_committed", PARTITIONS, everything)) == (
        sorted(input_values())
    )
    # The killed attempt's rows are in the log, aborted: only read_uncommitted sees them.
    uncommitted = read_confluent(bootstrap, sink, "read_uncommitted", PARTITIONS, everything)
    assert uncommitted.count(FIRST_OF_STALLED_TASK) == 2
    assert set(uncommitted) == set(input_values())


def eos_options(bootstrap: str, topic: str, prefix: str) -> ExactlyOnceOptions:
    return ExactlyOnceOptions(WriteOptions(bootstrap, topic), prefix)


def rows(*values: str) -> list[pa.RecordBatch]:
    return [pa.record_batch([pa.array([v.encode() for v in values], pa.binary())], ["value"])]


def test_a_task_written_again_for_the_same_batch_and_partition_writes_nothing(
    txn_broker: BrokerProcess,
) -> None:
    bootstrap = txn_broker.bootstrap
    sink = f"eos-task-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topics(bootstrap, sink))
    options = eos_options(bootstrap, sink, f"task-{uuid.uuid4().hex[:8]}")
    query_id = str(uuid.uuid4())

    first = write_exactly_once(rows("a", "b", "c"), options, TaskIdentity(query_id, 4, 1))
    again = write_exactly_once(rows("a", "b", "c"), options, TaskIdentity(query_id, 4, 1))
    # Another task partition of the same batch, and the same partition's next batch, write.
    other = write_exactly_once(rows("d"), options, TaskIdentity(query_id, 4, 0))
    later = write_exactly_once(rows("e"), options, TaskIdentity(query_id, 5, 1))
    # An older batch of a partition that went further is committed already too.
    older = write_exactly_once(rows("x"), options, TaskIdentity(query_id, 3, 1))
    empty = write_exactly_once([], options, TaskIdentity(query_id, 6, 1))

    assert (first.outcome, first.records) == (Outcome.COMMITTED, 3)
    assert (again.outcome, again.records) == (Outcome.ALREADY_COMMITTED, 0)
    assert (other.outcome, later.outcome) == (Outcome.COMMITTED, Outcome.COMMITTED)
    assert (older.outcome, empty.outcome) == (Outcome.ALREADY_COMMITTED, Outcome.EMPTY)
    got = asyncio.run(read_riverbed(bootstrap, sink, "read_committed", 5))
    assert sorted(got) == [b"a", b"b", b"c", b"d", b"e"]

    # The same prefix from another query (a new checkpoint) would skip what the first wrote.
    with pytest.raises(ValueError, match="used by another streaming query"):
        write_exactly_once(rows("y"), options, TaskIdentity(str(uuid.uuid4()), 9, 1))


VALUE_ONLY: Final = StructType([StructField("value", BinaryType())])


@pytest.mark.parametrize(
    ("options", "schema", "named"),
    [
        ({"topic": "out"}, VALUE_ONLY, "set transactional.id.prefix"),
        ({"transactional.id.prefix": "p"}, VALUE_ONLY, "set the topic option"),
        (
            {"topic": "out", "transactional.id.prefix": "p"},
            StructType([*VALUE_ONLY.fields, StructField("topic", StringType())]),
            "not a column",
        ),
        (
            {"topic": "out", "transactional.id.prefix": "p", "transaction.timeout.ms": "0"},
            VALUE_ONLY,
            "transaction.timeout.ms",
        ),
    ],
)
def test_a_stream_sink_without_what_it_needs_is_refused(
    options: dict[str, str], schema: StructType, named: str
) -> None:
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        parse_exactly_once_options({"bootstrap.servers": "127.0.0.1:9092", **options}, schema)


def test_the_stream_sink_options_parse() -> None:
    parsed = parse_exactly_once_options(
        {
            "bootstrap.servers": "127.0.0.1:9092",
            "topic": "out",
            "Transactional.Id.Prefix": "orders-sink",
            "kafka.transaction.timeout.ms": "30000",
        },
        VALUE_ONLY,
    )
    assert parsed.transactional_id(3) == "orders-sink-3"
    assert (parsed.topic, parsed.transaction_timeout_ms) == ("out", 30_000)


def test_a_batch_write_with_a_transactional_prefix_is_refused() -> None:
    """A batch write is at-least-once: asking it for transactions is an error, not ignored."""
    source = RiverbedDataSource(
        {"bootstrap.servers": "127.0.0.1:9092", "topic": "out", "transactional.id.prefix": "p"}
    )
    with pytest.raises(ValueError, match=r"transactional\.id\.prefix is for streams"):
        source.writer(VALUE_ONLY, overwrite=False)
    assert source.streamWriter(VALUE_ONLY, overwrite=False).options.transactional_id_prefix == "p"
