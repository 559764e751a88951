"""Spark at kafka.isolation.level=read_committed over a topic whose transactions were tiered.

The partition holds a committed transaction, an aborted one, an aborted and a committed one that
span segment rolls (plain records inside the aborted one), and a transaction still open, written
by confluent-kafka's transactional producer; most of it is tiered and deleted from the broker's
disk. Batch reads with the broker and the store, or the store alone, and a readStream, give at
read_committed exactly the committed records (never a control record, never past the open
transaction: the hot tail stops at the last stable offset, the cold part at the first
transaction whose marker is not in the store), and at read_uncommitted every data record. Once
the transaction commits, the broker's reads and the stream see its records; the store alone
does when its marker is tiered too.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any, Final

import confluent_kafka
from pyspark.sql import SparkSession

from tests.support.broker import BrokerFactory
from tests.tiering.test_tiering_broker import wait_until
from tests.tiering.test_tiering_transactions import (
    ROLL_SPANNING_RECORDS,
    TRANSACTION_TIMEOUT_MS,
    History,
    create_tiered_topic,
    finished_end_offset,
    local_log_start,
    tier_everything_sealed,
    tiered_txn_broker,
    value_of,
)

FLUSH_TIMEOUT_S: Final = 30.0
STREAM_TIMEOUT_S: Final = 180
MORE_PLAIN_RECORDS: Final = 40  # enough to roll the segment holding the last marker
Row = tuple[int, bytes]  # (offset, value)


class ConfluentWriter:
    """confluent-kafka's transactional producer and a plain one, each record in a batch of its
    own (flushed before the next), so that transactions span segment rolls."""

    def __init__(self, bootstrap: str) -> None:
        self.transactional = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": f"spark-txn-{uuid.uuid4().hex[:8]}",
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "linger.ms": 0,
            }
        )
        self.plain = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self.transactional.init_transactions(FLUSH_TIMEOUT_S)

    def send(self, topic: str, value: bytes, *, transactional: bool = True) -> int:
        producer = self.transactional if transactional else self.plain
        delivered: list[Any] = []
        producer.produce(
            topic, value, partition=0, on_delivery=lambda error, message: delivered.append(message)
        )
        assert producer.flush(FLUSH_TIMEOUT_S) == 0
        (message,) = delivered
        assert message.error() is None, message.error()
        offset: int = message.offset()
        return offset


def write_history(writer: ConfluentWriter, topic: str) -> History:
    """As tests/tiering/test_tiering_transactions.py writes it, the last transaction left open."""
    history = History(topic, uuid.UUID(int=0))
    producer = writer.transactional
    for name, commit in (("c1", True), ("a1", False)):
        producer.begin_transaction()
        for i in range(5):
            value = value_of(name, i)
            history.add(writer.send(topic, value), value, "committed" if commit else "aborted")
        if commit:
            producer.commit_transaction(FLUSH_TIMEOUT_S)
        else:
            producer.abort_transaction(FLUSH_TIMEOUT_S)
    producer.begin_transaction()
    for i in range(ROLL_SPANNING_RECORDS):
        value = value_of("a2", i)
        history.add(writer.send(topic, value), value, "aborted")
        if i % 5 == 2:
            plain = value_of("p1", i)
            history.add(writer.send(topic, plain, transactional=False), plain, "committed")
    producer.abort_transaction(FLUSH_TIMEOUT_S)
    producer.begin_transaction()
    for i in range(ROLL_SPANNING_RECORDS):
        value = value_of("c2", i)
        history.add(writer.send(topic, value), value, "committed")
    producer.commit_transaction(FLUSH_TIMEOUT_S)
    producer.begin_transaction()
    for i in range(ROLL_SPANNING_RECORDS):
        value = value_of("o1", i)
        offset = writer.send(topic, value)
        if i == 0:
            history.open_first_offset = offset
        history.add(offset, value, "pending")
        if i % 10 == 5:
            plain = value_of("p2", i)
            history.add(writer.send(topic, plain, transactional=False), plain, "pending")
    return history


def rows_of(history: History, values: list[bytes]) -> list[Row]:
    return sorted((history.offset_of[v], v) for v in values)


def spark_rows(spark: SparkSession, **options: str) -> list[Row]:
    df = spark.read.format("riverbed").options(**options).load()
    return sorted((row.offset, bytes(row.value)) for row in df.select("offset", "value").collect())


def read_stream(spark: SparkSession, options: dict[str, str], out: Path, checkpoint: Path) -> None:
    """One availableNow run of a stream into Parquet files, from its checkpoint."""
    query = (
        spark.readStream.format("riverbed")
        .options(**options)
        .load()
        .select("offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(STREAM_TIMEOUT_S), "the availableNow query did not finish"
    assert query.exception() is None, query.exception()


def stream_rows(spark: SparkSession, out: Path) -> list[Row]:
    return sorted((row.offset, bytes(row.value)) for row in spark.read.parquet(str(out)).collect())


def test_read_committed_batch_and_stream_over_tiered_transactions(
    spark: SparkSession, broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    store = tmp_path / "cold"
    broker = tiered_txn_broker(broker_factory, store)
    topic = f"spark-txn-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_tiered_topic(broker.bootstrap, topic, **{"local.retention.bytes": "1"}))
    writer = ConfluentWriter(broker.bootstrap)
    history = write_history(writer, topic)
    asyncio.run(tier_everything_sealed(broker, store, topic))
    asyncio.run(
        wait_until(
            lambda: local_log_start(broker, topic) > history.open_first_offset,
            "tiered and deleted locally past the open transaction's start",
        )
    )
    url = f"file://{store}"
    both = {"bootstrap.servers": broker.bootstrap, "remote.storage.url": url, "subscribe": topic}
    store_alone = {"remote.storage.url": url, "subscribe": topic}
    committed = {"kafka.isolation.level": "read_committed"}
    uncommitted = {"kafka.isolation.level": "read_uncommitted"}

    expected = rows_of(history, history.committed)
    assert all(offset < history.open_first_offset for offset, _ in expected)
    everything = rows_of(history, history.everything)
    in_store = finished_end_offset(store, topic)
    assert history.open_first_offset < in_store < max(o for o, _ in everything)

    # With the open transaction: only committed records, from the cold part and the hot tail.
    assert spark_rows(spark, **both, **committed) == expected
    assert spark_rows(spark, **store_alone, **committed) == expected
    # Nothing at or past its first offset (the LSO), from the hot tail or the store.
    from_lso = json.dumps({topic: {"0": history.open_first_offset}})
    assert spark_rows(spark, **both, **committed, startingOffsets=from_lso) == []
    # read_uncommitted: every data record (the store: those it holds), and no marker.
    assert spark_rows(spark, **both, **uncommitted) == everything
    assert spark_rows(spark, **both) == everything  # Kafka's default isolation level
    assert spark_rows(spark, **store_alone, **uncommitted) == [
        row for row in everything if row[0] < in_store
    ]
    # A stream at read_committed stops at the open transaction too.
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    stream_options = {**both, **committed, "startingOffsets": "earliest"}
    read_stream(spark, stream_options, out, checkpoint)
    assert stream_rows(spark, out) == expected

    writer.transactional.commit_transaction(FLUSH_TIMEOUT_S)
    expected = rows_of(history, history.committed + history.pending)
    assert spark_rows(spark, **both, **committed) == expected
    # The stream goes on from its checkpoint: the now committed records, each once.
    read_stream(spark, stream_options, out, checkpoint)
    assert stream_rows(spark, out) == expected
    # The commit marker is in the hot log only: the store alone cannot decide on the
    # transaction yet, and still stops where it begins.
    assert spark_rows(spark, **store_alone, **committed) == rows_of(history, history.committed)

    # Once more records roll the marker's segment and it is tiered, the store alone decides.
    more = [value_of("p3", i) for i in range(MORE_PLAIN_RECORDS)]
    for value in more:
        history.add(writer.send(topic, value, transactional=False), value, "committed")
    marker_offset = max(history.offset_of[v] for v in history.pending) + 1
    asyncio.run(
        wait_until(lambda: finished_end_offset(store, topic) > marker_offset, "the marker tiered")
    )
    in_store = finished_end_offset(store, topic)
    expected = rows_of(history, history.committed + history.pending)
    # Tiering goes on meanwhile: the store alone reads at least what it held above, and no
    # more than a prefix of what is committed.
    got = spark_rows(spark, **store_alone, **committed)
    assert got == expected[: len(got)]
    assert len(got) >= len([row for row in expected if row[0] < in_store])
    assert spark_rows(spark, **both, **committed) == expected
    writer.transactional.flush(FLUSH_TIMEOUT_S)
