"""murmur2 as the Java client and librdkafka compute it; sticky partitioning of unkeyed records."""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka.admin import AdminClient, NewTopic
from riverbed.client.partitioner import StickyPartitioner, murmur2, partition_for_key
from riverbed.client.producer import Producer

from tests.support.broker import BrokerProcess

PARTITIONS = 7


# Vectors from Apache Kafka's UtilsTest.testMurmur2.
@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_sticky_partitioner_moves_to_another_partition() -> None:
    sticky = StickyPartitioner(random.Random(1))
    chosen = [sticky.next_partition("t", 3) for _ in range(50)]
    assert all(a != b for a, b in itertools.pairwise(chosen))
    assert set(chosen) == {0, 1, 2}
    assert sticky.next_partition("single", 1) == 0


async def test_unkeyed_records_stick_until_the_batch_closes(broker: BrokerProcess) -> None:
    _create(broker, "sticky")
    async with Producer(bootstrap_servers=broker.bootstrap, linger_ms=1000) as producer:
        futures = [await producer.send("sticky", b"x" * 100) for _ in range(50)]
        await producer.flush()
        partitions = [(await f).partition for f in futures]
    assert len(set(partitions)) == 1  # 50 x 100 B fit one 16 KiB batch


async def test_keyed_partitions_match_confluent_murmur2_random(broker: BrokerProcess) -> None:
    _create(broker, "keyed")
    keys = [b"key-%d" % i for i in range(300)] + [bytes([i]) * (i % 13 + 1) for i in range(40)]
    confluent = ConfluentProducer(
        {"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random"}
    )
    theirs: dict[bytes, int] = {}

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        assert error is None, error
        key, partition = message.key(), message.partition()
        assert key is not None
        assert partition is not None
        theirs[key] = partition

    for key in keys:
        confluent.produce("keyed", b"v", key=key, on_delivery=on_delivery)
    assert await asyncio.to_thread(confluent.flush, 30) == 0
    async with Producer(bootstrap_servers=broker.bootstrap) as producer:
        futures = [await producer.send("keyed", b"v", key=key) for key in keys]
        ours = [(await f).partition for f in futures]
    assert ours == [theirs[key] for key in keys]
    assert ours == [partition_for_key(key, PARTITIONS) for key in keys]
    assert len(set(ours)) == PARTITIONS


def _create(broker: BrokerProcess, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(timeout=30)
