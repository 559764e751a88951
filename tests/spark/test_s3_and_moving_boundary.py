"""The data source against a real S3 HTTP endpoint (moto's server): executors read the objects
themselves, and a schema naming fewer columns reads fewer bytes from the store (so does a
select(): test_column_pruning.py). And a hot split planned before its offsets were tiered and
deleted from the broker's disk is read from the store instead, every record once."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession
from riverbed.client.admin import Admin
from riverbed.client.producer import Producer
from riverbed_spark.cold import ColdStore
from riverbed_spark.options import parse_read_options
from riverbed_spark.planning import HotSplit
from riverbed_spark.reading import COLUMN_TYPES, read_split, tiered_since

from tests.spark.test_batch_read import (
    COLUMNS,
    PARTITIONS,
    RECORDS,
    consumed,
    create_and_fill,
    local_starts,
    options_for,
    spark_rows,
    tiered_topic,
)
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.moto_server import MotoServer
from tests.tiering.test_tiering_broker import TIERED_TOPIC, wait_until
from tests.tiering.test_tiering_s3_broker import ROOT, s3_broker


def test_executors_read_s3_directly_and_a_narrow_schema_reads_fewer_bytes(
    spark: SparkSession, broker_factory: BrokerFactory, moto_server: MotoServer, s3_bucket: str
) -> None:
    broker = s3_broker(broker_factory, moto_server, s3_bucket)
    topic = tiered_topic(broker)
    everything = asyncio.run(consumed(broker, topic))
    options = options_for(
        broker, f"s3://{s3_bucket}/{ROOT}", subscribe=topic, **moto_server.settings()
    )
    assert spark_rows(spark, **options) == everything

    # Projection: objects large enough that their values dominate (1 KB of random bytes each;
    # a reader fetches a small object whole with its footer anyway).
    wide = f"wide-{uuid.uuid4().hex[:8]}"
    asyncio.run(fill_wide(broker, wide))
    asyncio.run(wait_until(lambda: local_starts(broker, wide, 1)[0] > 0, "wide topic tiered"))
    options = {**options, "subscribe": wide}
    reader = spark.read.format("riverbed").options(**options)

    before = moto_server.bytes_served()
    full = [(row.partition, row.offset) for row in reader.load().collect()]
    full_bytes = moto_server.bytes_served() - before
    before = moto_server.bytes_served()
    narrow = [tuple(row) for row in reader.schema("partition int, offset long").load().collect()]
    narrow_bytes = moto_server.bytes_served() - before
    assert sorted(narrow) == sorted(full)
    assert len(full) == WIDE_RECORDS
    assert 0 < narrow_bytes < full_bytes / 10, (narrow_bytes, full_bytes)


WIDE_RECORDS = 4_000
WIDE_VALUE_BYTES = 1_000


async def fill_wide(broker: BrokerProcess, topic: str) -> None:
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(
            topic,
            partitions=1,
            replication_factor=1,
            configs={**TIERED_TOPIC, "segment.bytes": str(1024 * 1024)},
        )
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5) as producer:
        futures = [
            await producer.send(topic, os.urandom(WIDE_VALUE_BYTES), partition=0)
            for _ in range(WIDE_RECORDS)
        ]
        await producer.flush()
        for future in futures:
            await future


def test_a_hot_split_tiered_and_deleted_locally_since_planning_is_read_from_the_store(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    store = tmp_path / "cold"
    # Tiering held back (a long interval) while the splits are planned as hot.
    broker = broker_factory(
        {
            "remote.storage.url": f"file://{store}",
            "offsets.topic.replication.factor": "1",
            "remote.log.manager.task.interval.ms": "3600000",
        }
    )
    topic = f"moving-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_and_fill(broker, topic))
    everything = asyncio.run(consumed(broker, topic))
    assert local_starts(broker, topic) == [0] * PARTITIONS  # nothing tiered yet
    options = parse_read_options(options_for(broker, f"file://{store}", subscribe=topic))
    high = RECORDS // PARTITIONS
    planned = [HotSplit(topic, p, 0, high) for p in range(PARTITIONS)]

    # Then tiering runs, and deletes the local segments the splits were planned on.
    broker.settings["remote.log.manager.task.interval.ms"] = "200"
    broker.restart()
    asyncio.run(
        wait_until(lambda: min(local_starts(broker, topic)) > high // 2, "tiered, deleted locally")
    )
    assert options.store is not None
    cold_store = ColdStore(options.store)
    target = pa.schema([(name, COLUMN_TYPES[name]) for name in COLUMNS if name != "headers"])
    for split in planned:
        remote_end = cold_store.manifest(topic, split.partition).finished_end_offset
        # The tiered part is taken from the objects, from the split's start with no gap...
        tiered = tiered_since(cold_store, split)
        assert tiered[0].start == 0
        assert tiered[-1].end == remote_end > high // 2
        # ...and the split reads every record once: that part from the store, the rest through
        # the broker.
        rows = [r for batch in read_split(split, options, target) for r in batch.to_pylist()]
        assert [(r["partition"], r["offset"], r["value"]) for r in rows] == [
            (row[3], row[4], row[1]) for row in everything if row[3] == split.partition
        ]
