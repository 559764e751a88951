"""Spark reading a compacted topic: the broker's cleaner has left offset gaps in the log (and
dropped whole batches), and the `riverbed` source still reads every surviving record exactly
once and ends; the DataFrame equals what a consumer reads, and folding it gives the latest value
of every key."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from pyspark.sql import SparkSession
from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition

from tests.support.broker import BrokerFactory
from tests.tiering.test_tiering_broker import wait_until

PARTITIONS = 2
KEYS = 40
ROUNDS = 50


async def fill(bootstrap: str, topic: str) -> tuple[dict[tuple[int, bytes], bytes], list[int]]:
    """Every key written ROUNDS times in each partition; returns the latest values and the end
    offsets."""
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic(
            topic,
            partitions=PARTITIONS,
            replication_factor=1,
            configs={"cleanup.policy": "compact", "segment.bytes": "8192"},
        )
    latest: dict[tuple[int, bytes], bytes] = {}
    async with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=2) as producer:
        for round_ in range(ROUNDS):
            for key in range(KEYS):
                for partition in range(PARTITIONS):
                    value = b"%d/%d/%d" % (partition, key, round_)
                    await producer.send(topic, value, key=b"k%d" % key, partition=partition)
                    latest[(partition, b"k%d" % key)] = value
        await producer.flush()
    return latest, [ROUNDS * KEYS] * PARTITIONS


async def consumed(bootstrap: str, topic: str, ends: list[int]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    async with Consumer(bootstrap_servers=bootstrap) as consumer:
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        while [await consumer.position(tp) for tp in tps] != ends:
            for records in (await consumer.getmany(timeout_ms=5000)).values():
                rows += [(r.partition, r.offset, r.key, r.value) for r in records]
    return sorted(rows)


def test_spark_reads_a_compacted_topic_with_offset_gaps(
    spark: SparkSession, broker_factory: BrokerFactory
) -> None:
    broker = broker_factory({"log.cleaner.backoff.ms": "200"})
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    latest, ends = asyncio.run(fill(broker.bootstrap, topic))
    written_bytes = [
        sum(path.stat().st_size for path in broker.segment_files(topic, p))
        for p in range(PARTITIONS)
    ]

    def compacted() -> bool:
        return all(
            sum(path.stat().st_size for path in broker.segment_files(topic, p))
            < written_bytes[p] / 3
            for p in range(PARTITIONS)
        )

    asyncio.run(wait_until(compacted, "both partitions compacted"))
    expected = asyncio.run(consumed(broker.bootstrap, topic, ends))
    assert len(expected) < PARTITIONS * KEYS * ROUNDS / 3

    df = (
        spark.read.format("riverbed")
        .options(**{"bootstrap.servers": broker.bootstrap, "subscribe": topic})
        .load()
    )
    rows = sorted((r.partition, r.offset, r.key, r.value) for r in df.collect())
    assert rows == expected
    state: dict[tuple[int, bytes], bytes] = {}
    for partition, _, key, value in rows:
        state[(partition, key)] = value
    assert state == latest
