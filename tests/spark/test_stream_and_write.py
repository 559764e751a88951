"""Structured Streaming from a topic (per-partition offsets in Spark's checkpoint,
maxOffsetsPerTrigger) into a file sink, stopped mid-way and restarted from its checkpoint: every
record once, no gap. And `df.write.format("riverbed")` producing a DataFrame's rows."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery
from riverbed.client.admin import Admin
from riverbed.client.producer import Producer

from tests.spark.test_batch_read import PARTITIONS, RECORDS, consumed, options_for, tiered_topic
from tests.support.broker import BrokerProcess

MAX_OFFSETS_PER_TRIGGER = 500
MORE_RECORDS = 1_000
QUERY_TIMEOUT_S = 180.0


def start_query(
    spark: SparkSession, options: dict[str, str], out: Path, checkpoint: Path, **trigger: Any
) -> StreamingQuery:
    return (
        spark.readStream.format("riverbed")
        .options(**options)
        .load()
        .select("partition", "offset", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def run_until(query: StreamingQuery, done: Callable[[dict[str, Any]], bool]) -> None:
    """Wait until a micro-batch's progress satisfies `done`."""
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    while not any(done(progress) for progress in query.recentProgress):
        assert time.monotonic() < deadline, f"not done: {query.recentProgress[-1:]}"
        assert query.exception() is None, query.exception()
        time.sleep(0.2)


async def produce_more(broker: BrokerProcess, topic: str) -> None:
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all") as producer:
        for i in range(MORE_RECORDS):
            await producer.send(topic, f"more-{i}".encode(), partition=i % PARTITIONS)
        await producer.flush()


def test_a_stream_stopped_and_restarted_from_its_checkpoint_reads_every_record_once(
    spark: SparkSession, tiered_broker: tuple[BrokerProcess, Path], tmp_path: Path
) -> None:
    broker, store = tiered_broker
    topic = tiered_topic(broker)  # most of it in the cold tier
    options = options_for(
        broker,
        f"file://{store}",
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger=str(MAX_OFFSETS_PER_TRIGGER),
    )
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    # Stopped after two micro-batches, with most of the topic still unread.
    query = start_query(spark, options, out, checkpoint, processingTime="100 milliseconds")
    run_until(query, lambda p: p["batchId"] >= 1 and p["numInputRows"] > 0)
    query.stop()
    first = [p["numInputRows"] for p in query.recentProgress]
    assert all(rows <= MAX_OFFSETS_PER_TRIGGER for rows in first)
    assert sum(first) < RECORDS

    asyncio.run(produce_more(broker, topic))
    query = start_query(spark, options, out, checkpoint, processingTime="100 milliseconds")
    end = {str(p): (RECORDS + MORE_RECORDS) // PARTITIONS for p in range(PARTITIONS)}
    run_until(query, lambda p: json.loads(p["sources"][0]["endOffset"]) == {topic: end})
    query.stop()
    # reportLatestOffset: the progress shows where each partition ends.
    assert json.loads(query.recentProgress[-1]["sources"][0]["latestOffset"]) == {topic: end}
    again = [p["numInputRows"] for p in query.recentProgress]
    assert all(rows <= MAX_OFFSETS_PER_TRIGGER for rows in again)
    assert sum(first) + sum(again) == RECORDS + MORE_RECORDS

    everything = asyncio.run(consumed(broker, topic, RECORDS + MORE_RECORDS))
    expected = sorted((row[3], row[4], row[1]) for row in everything)
    written = sorted(
        (r.partition, r.offset, r.value) for r in spark.read.parquet(str(out)).collect()
    )
    assert len(expected) == RECORDS + MORE_RECORDS
    assert written == expected  # each record once: nothing lost, nothing twice


def test_a_dataframe_is_written_to_a_topic(
    spark: SparkSession, tiered_broker: tuple[BrokerProcess, Path]
) -> None:
    broker, _ = tiered_broker
    topic = f"written-{uuid.uuid4().hex[:8]}"

    async def create() -> None:
        async with Admin(bootstrap_servers=broker.bootstrap) as admin:
            await admin.create_topic(topic, partitions=PARTITIONS, replication_factor=1)

    asyncio.run(create())
    rows = [
        (f"k{i}", f"value {i}".encode(), i % PARTITIONS, [("n", str(i).encode())])
        for i in range(500)
    ]
    schema = (
        "key string, value binary, partition int, headers array<struct<key:string,value:binary>>"
    )
    df = spark.createDataFrame(rows, schema).repartition(3)
    df.write.format("riverbed").option("bootstrap.servers", broker.bootstrap).option(
        "topic", topic
    ).mode("append").save()

    got = asyncio.run(consumed(broker, topic, len(rows)))
    assert sorted((r[0], r[1], r[3], r[7]) for r in got) == sorted(
        (key.encode(), value, partition, headers) for key, value, partition, headers in rows
    )
