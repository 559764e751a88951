"""DeleteRecords (KIP-107) against real brokers: Riverbed's Admin, confluent-kafka's and
aiokafka's admin clients, and `riverbed topics truncate`; the log start moves on the leader and
its follower (and stays after a failover), readers below it get OFFSET_OUT_OF_RANGE and reset,
and on a tiered topic the cold tier's objects below it go."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient
from riverbed import Admin, Consumer, Producer, TopicPartition
from riverbed.errors import ConfigError, OffsetOutOfRangeError

from tests.broker.test_cli_describe import riverbed
from tests.support.broker import BrokerProcess
from tests.support.cluster import ClusterFactory, TestCluster, partition_state

RECORDS: Final = 400
VALUE: Final = b"v" * 200
WAIT_S: Final = 60.0
SETTINGS: Final = {"zookeeper.session.timeout.ms": "4000", "replica.lag.time.max.ms": "3000"}


async def produce(bootstrap: str, topic: str, partitions: int = 1) -> None:
    async with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=2) as producer:
        for i in range(RECORDS):
            await producer.send(topic, VALUE, partition=i % partitions)
        await producer.flush()


async def earliest(bootstrap: str, topic: str, partition: int = 0) -> int:
    async with Admin(bootstrap_servers=bootstrap) as admin:
        found = await admin.list_offsets({TopicPartition(topic, partition): "earliest"})
    return found[TopicPartition(topic, partition)].offset


async def first_offset_read(bootstrap: str, topic: str) -> int:
    """What a consumer starting at offset 0 (below the log start) reads first, after its
    auto.offset.reset=earliest."""
    async with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest") as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        batches = await consumer.getmany(max_records=1, timeout_ms=int(WAIT_S * 1000))
        return batches[tp][0].offset


async def kill_leader(cluster: TestCluster, topic: str) -> BrokerProcess:
    """Kill partition 0's leader; the other broker, once it leads."""
    cluster.kill((await partition_state(cluster.bootstrap, topic, 0)).leader)
    survivor = next(b for b in cluster.brokers.values() if b.running)

    async def leads() -> bool:
        return (await partition_state(survivor.bootstrap, topic, 0)).leader == survivor.broker_id

    await cluster.wait_for(leads, WAIT_S, what="the follower to lead")
    return survivor


async def start(
    cluster_factory: ClusterFactory,
    topic: str,
    settings: Mapping[str, str] = SETTINGS,
    **configs: str,
) -> TestCluster:
    cluster = await cluster_factory(2, settings)
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(
            topic,
            partitions=1,
            replication_factor=2,
            configs={"segment.bytes": "8192", **configs},
        )
    await produce(cluster.bootstrap, topic)
    return cluster


async def test_delete_records_moves_the_start_on_every_replica_and_through_failover(
    cluster_factory: ClusterFactory,
) -> None:
    topic = "truncated"
    cluster = await start(cluster_factory, topic)
    bootstrap = cluster.bootstrap
    tp = TopicPartition(topic, 0)
    async with Admin(bootstrap_servers=bootstrap) as admin:
        # Inside a batch and a segment: offset-granular, answered once both replicas follow.
        assert await admin.delete_records({tp: 123}) == {tp: 123}
        assert await admin.delete_records({tp: 50}) == {tp: 123}  # never backward
        with pytest.raises(OffsetOutOfRangeError):
            await admin.delete_records({tp: RECORDS + 1})
    assert await earliest(bootstrap, topic) == 123
    assert await first_offset_read(bootstrap, topic) == 123

    # The follower followed: it leads now and starts at 123 too, its sealed segments below gone.
    survivor = await kill_leader(cluster, topic)
    assert await earliest(survivor.bootstrap, topic) == 123
    assert await first_offset_read(survivor.bootstrap, topic) == 123
    segments = survivor.segment_files(topic, 0)
    assert int(segments[0].stem) <= 123 < (int(segments[1].stem) if len(segments) > 1 else RECORDS)

    async with Admin(bootstrap_servers=survivor.bootstrap) as admin:
        # -1: everything below the high watermark (the ISR is the survivor alone by now).
        async def alone() -> bool:
            state = await partition_state(survivor.bootstrap, topic, 0)
            return set(state.isr) == {survivor.broker_id}

        await cluster.wait_for(alone, WAIT_S, what="the ISR to shrink to the survivor")
        assert await admin.delete_records({tp: -1}) == {tp: RECORDS}


async def test_a_compacted_topic_refuses_with_policy_violation(
    cluster_factory: ClusterFactory,
) -> None:
    topic = "compacted-only"
    cluster = await cluster_factory(1, SETTINGS)
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1, configs={"cleanup.policy": "compact"})
        async with Producer(bootstrap_servers=cluster.bootstrap) as producer:
            await producer.send_and_wait(topic, b"v", key=b"k")
        with pytest.raises(ConfigError, match="POLICY_VIOLATION"):
            await admin.delete_records({TopicPartition(topic, 0): 1})


async def test_confluent_kafka_and_aiokafka_delete_records(
    cluster_factory: ClusterFactory,
) -> None:
    topic = "interop-truncated"
    cluster = await start(cluster_factory, topic)
    bootstrap = cluster.bootstrap

    def confluent_delete(offset: int) -> int:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.delete_records([CkTopicPartition(topic, 0, offset)])
        (result,) = (future.result(timeout=WAIT_S) for future in futures.values())
        return int(result.low_watermark)

    assert await asyncio.to_thread(confluent_delete, 100) == 100
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        answered = await admin.delete_records({AioTopicPartition(topic, 0): RecordsToDelete(250)})
    finally:
        await admin.close()
    assert answered == {AioTopicPartition(topic, 0): 250}
    # aiokafka's consumer, positioned below the start, is told OFFSET_OUT_OF_RANGE and resets.
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = AioTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 10)
        fetched = await consumer.getmany(tp, timeout_ms=int(WAIT_S * 1000), max_records=1)
        assert fetched[tp][0].offset == 250
    finally:
        await consumer.stop()


async def test_topics_truncate_cli(cluster_factory: ClusterFactory) -> None:
    topic = "cli-truncated"
    cluster = await cluster_factory(1, SETTINGS)
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(topic, partitions=2)
    await produce(cluster.bootstrap, topic, partitions=2)
    args = ("--bootstrap-server", cluster.bootstrap)
    done = await asyncio.to_thread(
        riverbed, "topics", "truncate", topic, "--partition", "1", "--before", "77", *args
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[1].split() == [topic, "1", "77"]
    assert await earliest(cluster.bootstrap, topic, 1) == 77
    assert await earliest(cluster.bootstrap, topic, 0) == 0
    every = await asyncio.to_thread(riverbed, "topics", "truncate", topic, "--before", "hw", *args)
    assert every.returncode == 0, every.stderr
    assert [line.split()[2] for line in every.stdout.splitlines()[1:]] == ["200", "200"]
    past = await asyncio.to_thread(riverbed, "topics", "truncate", topic, "--before", "999", *args)
    assert past.returncode != 0
    assert "OFFSET_OUT_OF_RANGE" in past.stderr
    assert len(past.stderr.strip().splitlines()) == 1, past.stderr
    bad = await asyncio.to_thread(riverbed, "topics", "truncate", topic, "--before", "x", *args)
    assert bad.returncode == 2
    assert "'x' is not an offset" in bad.stderr


def manifest(store: Path, topic: str) -> dict[str, object]:
    versions = sorted((store / topic / "0" / "manifest").glob("*.json"))
    return json.loads(versions[-1].read_text()) if versions else {}


def finished_segments(store: Path, topic: str) -> list[dict[str, int]]:
    segments = manifest(store, topic).get("segments", [])
    assert isinstance(segments, list)
    return [s for s in segments if s["state"] == "COPY_FINISHED"]


async def test_on_a_tiered_topic_the_cold_tier_follows(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    store = tmp_path / "cold"
    topic = "tiered-truncated"
    tiering = {
        **SETTINGS,
        "remote.storage.url": f"file://{store}",
        "remote.log.manager.task.interval.ms": "200",
    }
    configs = {"remote.storage.enable": "true", "local.retention.bytes": "1"}
    cluster = await start(cluster_factory, topic, tiering, **configs)
    await cluster.wait_for(
        lambda: len(finished_segments(store, topic)) >= 5, WAIT_S, what="uploads"
    )
    third = finished_segments(store, topic)[2]
    cut = int(third["base_offset"]) + 3  # inside the third remote segment
    objects_before = sorted(p.name for p in (store / topic / "0" / "segments").iterdir())
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        assert await admin.delete_records({TopicPartition(topic, 0): cut}) == {
            TopicPartition(topic, 0): cut
        }
    assert manifest(store, topic)["log_start_offset"] == cut  # committed before the answer
    assert await earliest(cluster.bootstrap, topic) == cut
    assert await first_offset_read(cluster.bootstrap, topic) == cut

    def two_objects_gone() -> bool:
        remaining = sorted(p.name for p in (store / topic / "0" / "segments").iterdir())
        return (
            len(objects_before) - len(remaining) == 2
            and finished_segments(store, topic)[0]["base_offset"] == third["base_offset"]
        )

    await cluster.wait_for(two_objects_gone, WAIT_S, what="the offloader's deletes")

    # A new leader reads the start from the manifest.
    survivor = await kill_leader(cluster, topic)
    assert await earliest(survivor.bootstrap, topic) == cut
    assert await first_offset_read(survivor.bootstrap, topic) == cut
