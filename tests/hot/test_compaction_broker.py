"""The log cleaner in a real broker: a compacted topic shrinks on disk while the broker serves,
librdkafka (confluent-kafka) reads the compacted log across its offset gaps and gets the latest
value of every key, and `__consumer_offsets` is compacted too, so a restarted coordinator
reloads a short log and still serves the last commit."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import confluent_kafka
import pytest
from riverbed.client.admin import Admin
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.tiering.test_tiering_broker import wait_until

KEYS = 50
ROUNDS = 60
DELETED_KEYS = 10  # the last round writes tombstones for these


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory(
        {
            "log.cleaner.backoff.ms": "200",
            "offsets.topic.num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.segment.bytes": "4096",
        }
    )


def partition_bytes(broker: BrokerProcess, topic: str) -> int:
    """The bytes of the partition's segments; a file the cleaner swapped out between the
    listing and its stat counts as 0 (the next poll sees the new files)."""
    total = 0
    for path in broker.segment_files(topic, 0):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def offset_of(message: confluent_kafka.Message) -> int:
    offset = message.offset()
    assert offset is not None  # a record's (an error has none)
    return offset


def consume_all(bootstrap: str, topic: str, end_offset: int) -> list[confluent_kafka.Message]:
    """Every record of partition 0 from the beginning, read by librdkafka."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        messages: list[confluent_kafka.Message] = []
        while not messages or offset_of(messages[-1]) < end_offset - 1:
            message = consumer.poll(10)
            assert message is not None, (
                f"no record after offset {offset_of(messages[-1]) if messages else None}"
            )
            assert message.error() is None, message.error()
            messages.append(message)
        return messages
    finally:
        consumer.close()


async def compacted_topic(broker: BrokerProcess, prefix: str) -> str:
    """A new one-partition compacted topic with 16 KiB segments (many to clean)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(
            topic,
            partitions=1,
            replication_factor=1,
            configs={"cleanup.policy": "compact", "segment.bytes": "16384"},
        )
    return topic


async def test_a_compacted_topic_shrinks_and_readers_get_the_latest_value_of_each_key(
    broker: BrokerProcess,
) -> None:
    topic = await compacted_topic(broker, "compacted")
    expected: dict[bytes, bytes] = {}
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=2) as producer:
        for round_ in range(ROUNDS):
            for key in range(KEYS):
                value = b"round %03d of key %03d " % (round_, key) * 4
                await producer.send(topic, value, key=b"key-%03d" % key, partition=0)
                expected[b"key-%03d" % key] = value
        for key in range(DELETED_KEYS):
            await producer.send(topic, None, key=b"key-%03d" % key, partition=0)
            del expected[b"key-%03d" % key]
        await producer.flush()
    written = ROUNDS * KEYS + DELETED_KEYS
    produced_bytes = partition_bytes(broker, topic)

    # Most of what was written is overwritten: the cleaner brings the log down to about one
    # record per key plus the active segment.
    await wait_until(
        lambda: partition_bytes(broker, topic) < produced_bytes / 4, "the topic was compacted"
    )
    messages = await asyncio.to_thread(consume_all, broker.bootstrap, topic, written)
    offsets = [offset_of(message) for message in messages]
    assert offsets == sorted(set(offsets))
    assert offsets[-1] == written - 1
    assert len(messages) < written / 4
    state: dict[bytes, bytes] = {}
    for message in messages:
        record_key = message.key()
        assert record_key is not None
        record_value = message.value()
        if record_value is None:
            state.pop(record_key, None)
        else:
            state[record_key] = record_value
    assert state == expected
    assert "event=log.compacted " in broker.log_tail(200)


async def test_consumer_offsets_is_compacted_and_a_restarted_coordinator_serves_the_last_commit(
    broker: BrokerProcess,
) -> None:
    group = f"committer-{uuid.uuid4().hex[:6]}"
    tp = TopicPartition("orders", 0)
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic("orders", partitions=1, replication_factor=1)
        for offset in range(600):
            await admin.alter_group_offsets(group, {tp: offset})
    commits_bytes = partition_bytes(broker, "__consumer_offsets")
    await wait_until(
        lambda: partition_bytes(broker, "__consumer_offsets") < commits_bytes / 4,
        "__consumer_offsets was compacted",
    )
    broker.restart()
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        committed = await admin.list_group_offsets(group)
    assert committed[tp].offset == 599


async def test_a_broker_stopped_in_the_middle_of_a_throttled_pass_stops_promptly_and_loses_nothing(
    broker_factory: BrokerFactory,
) -> None:
    # 20 kB/s: the pass over ~300 kB would take about half a minute.
    broker = broker_factory(
        {"log.cleaner.backoff.ms": "200", "log.cleaner.io.max.bytes.per.second": "20000"}
    )
    topic = await compacted_topic(broker, "slow")
    expected: dict[bytes, bytes] = {}
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=2) as producer:
        for i in range(3_000):
            key, value = b"key-%02d" % (i % 30), b"value %05d " % i * 8
            await producer.send(topic, value, key=key, partition=0)
            expected[key] = value
        await producer.flush()
    cleaning = broker.partition_dir(topic, 0) / "cleaned"
    await wait_until(cleaning.exists, "a pass is writing cleaned segments")

    started = asyncio.get_running_loop().time()
    assert broker.terminate() == 0
    assert asyncio.get_running_loop().time() - started < 15, "the worker held up the shutdown"
    broker.restart()
    assert not cleaning.exists()
    messages = await asyncio.to_thread(consume_all, broker.bootstrap, topic, 3_000)
    state = {message.key(): message.value() for message in messages}
    assert state == expected
