"""Spark reading a topic whose history is spread over the cold tier (several Parquet objects,
read by the executors straight from the store) and the hot tail (read through the broker): the
DataFrame equals what a consumer reading from offset 0 sees, every column byte-exact."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition

from tests.support.broker import BrokerProcess
from tests.tiering.test_tiering_broker import TIERED_TOPIC, wait_until

RECORDS = 3_000
PARTITIONS = 2
BASE_TIMESTAMP_MS = int(time.time() * 1000)
COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]


def record_of(i: int) -> dict[str, Any]:
    return {
        "key": None if i % 97 == 0 else f"k{i % 50}".encode(),
        "value": None if i % 101 == 0 else f'{{"n": {i}, "pad": "{"x" * (i % 40)}"}}'.encode(),
        "headers": [("n", str(i).encode()), ("empty", None)] if i % 3 == 0 else [],
        "timestamp_ms": BASE_TIMESTAMP_MS + i,
    }


async def create_and_fill(broker: BrokerProcess, topic: str) -> None:
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(
            topic, partitions=PARTITIONS, replication_factor=1, configs=TIERED_TOPIC
        )
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5) as producer:
        futures = []
        for i in range(RECORDS):
            r = record_of(i)
            futures.append(
                await producer.send(
                    topic,
                    r["value"],
                    key=r["key"],
                    headers=r["headers"],
                    partition=i % PARTITIONS,
                    timestamp_ms=r["timestamp_ms"],
                )
            )
        await producer.flush()
        for future in futures:
            await future


async def consumed(
    broker: BrokerProcess, topic: str, count: int = RECORDS
) -> list[tuple[Any, ...]]:
    """`count` records as (key, value, topic, partition, offset, timestamp ms, type, headers)."""
    rows: list[tuple[Any, ...]] = []
    async with Consumer(bootstrap_servers=broker.bootstrap) as consumer:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        while len(rows) < count:
            batches = await consumer.getmany(timeout_ms=5000)
            assert batches, f"stalled after {len(rows)} records"
            for records in batches.values():
                rows += [
                    (
                        r.key,
                        r.value,
                        r.topic,
                        r.partition,
                        r.offset,
                        r.timestamp_ms,
                        r.timestamp_type,
                        [(name, value) for name, value in r.headers],
                    )
                    for r in records
                ]
    return sorted(rows, key=lambda row: (row[3], row[4]))


def spark_rows(spark: SparkSession, **options: str) -> list[tuple[Any, ...]]:
    df = spark.read.format("riverbed").options(**options).load()
    assert df.columns == COLUMNS
    rows = []
    for row in df.collect():
        rows.append(
            (
                row.key,
                row.value,
                row.topic,
                row.partition,
                row.offset,
                int(row.timestamp.timestamp() * 1000),
                row.timestampType,
                [(h.key, h.value) for h in row.headers],
            )
        )
    return sorted(rows, key=lambda row: (row[3], row[4]))


def local_starts(broker: BrokerProcess, topic: str, partitions: int = PARTITIONS) -> list[int]:
    return [int(broker.segment_files(topic, p)[0].stem) for p in range(partitions)]


def test_a_dataframe_over_cold_and_hot_equals_what_a_consumer_reads(
    spark: SparkSession, tiered_broker: tuple[BrokerProcess, Path]
) -> None:
    broker, store = tiered_broker
    topic = tiered_topic(broker)
    expected = asyncio.run(consumed(broker, topic))
    options = options_for(broker, f"file://{store}", subscribe=topic)
    # The default groups each partition's objects into one split; 1 byte: one split per object.
    for split_bytes in (None, "1"):
        more = {} if split_bytes is None else {"coldSplitBytes": split_bytes}
        got = spark_rows(spark, **options, **more)
        assert len(got) == RECORDS
        assert got == expected


def tiered_topic(broker: BrokerProcess) -> str:
    """A new topic of RECORDS records over PARTITIONS partitions, most of each tiered."""
    topic = f"history-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_and_fill(broker, topic))
    asyncio.run(
        wait_until(
            lambda: min(local_starts(broker, topic)) > RECORDS // PARTITIONS // 2,
            "most of each partition tiered",
        )
    )
    return topic


def options_for(broker: BrokerProcess | None, store: str, **more: str) -> dict[str, str]:
    options = {"remote.storage.url": store, "includeHeaders": "true", **more}
    if broker is not None:
        options["bootstrap.servers"] = broker.bootstrap
    return options


def test_offset_and_timestamp_bounds(
    spark: SparkSession, tiered_broker: tuple[BrokerProcess, Path]
) -> None:
    broker, store = tiered_broker
    topic = tiered_topic(broker)
    everything = asyncio.run(consumed(broker, topic))
    url = f"file://{store}"

    by_offsets = spark_rows(
        spark,
        **options_for(
            broker,
            url,
            subscribe=topic,
            startingOffsets=f'{{"{topic}": {{"0": 100, "1": -2}}}}',
            endingOffsets=f'{{"{topic}": {{"0": 1200, "1": -1}}}}',
        ),
    )
    assert by_offsets == [
        row for row in everything if (row[3] == 0 and 100 <= row[4] < 1200) or row[3] == 1
    ]

    # Record i has timestamp BASE_TIMESTAMP_MS + i: [1000, 2000) by time is records 1000..1999.
    by_time = spark_rows(
        spark,
        **options_for(
            broker,
            url,
            subscribe=topic,
            startingTimestamp=str(BASE_TIMESTAMP_MS + 1000),
            endingTimestamp=str(BASE_TIMESTAMP_MS + 2000),
        ),
    )
    assert by_time == [
        row for row in everything if BASE_TIMESTAMP_MS + 1000 <= row[5] < BASE_TIMESTAMP_MS + 2000
    ]
    assert len(by_time) == 1000


def test_subscribe_pattern_assign_and_empty_partitions(
    spark: SparkSession, tiered_broker: tuple[BrokerProcess, Path]
) -> None:
    broker, store = tiered_broker
    topic = tiered_topic(broker)
    empty = f"{topic}-empty"

    async def create_empty() -> None:
        async with Admin(bootstrap_servers=broker.bootstrap) as admin:
            await admin.create_topic(
                empty, partitions=3, replication_factor=1, configs=TIERED_TOPIC
            )

    asyncio.run(create_empty())
    everything = asyncio.run(consumed(broker, topic))
    url = f"file://{store}"
    # The pattern matches both topics; the empty one adds three empty partitions and no row.
    matched = spark_rows(spark, **options_for(broker, url, subscribePattern=f"{topic}.*"))
    assert matched == everything
    assert spark_rows(spark, **options_for(broker, url, subscribe=empty)) == []
    assigned = spark_rows(spark, **options_for(broker, url, assign=f'{{"{topic}": [1]}}'))
    assert assigned == [row for row in everything if row[3] == 1]


def test_the_cold_tier_is_read_with_the_cluster_stopped(
    spark: SparkSession, tiered_broker: tuple[BrokerProcess, Path]
) -> None:
    broker, store = tiered_broker
    topic = tiered_topic(broker)
    everything = asyncio.run(consumed(broker, topic))
    ends = {}
    for partition in range(PARTITIONS):
        manifest = latest_manifest_of(store, topic, partition)
        ends[partition] = manifest["segments"][-1]["last_offset"] + 1
    broker.kill()
    cold = spark_rows(spark, **options_for(None, f"file://{store}", subscribe=topic))
    assert cold == [row for row in everything if row[4] < ends[row[3]]]
    assert 0 < len(cold) < RECORDS


def latest_manifest_of(store: Path, topic: str, partition: int) -> dict[str, Any]:
    versions = sorted((store / topic / str(partition) / "manifest").glob("*.json"))
    manifest: dict[str, Any] = json.loads(versions[-1].read_text())
    return manifest
