"""Admin's consumer-group operations against real brokers and a real librdkafka group member.

The groups are made by confluent-kafka consumers (subscribe + commit), so what the admin lists,
describes and changes is what a third-party client did and will see.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from riverbed.broker.groups.offsets_topic import partition_for
from riverbed.client.admin import Admin, GroupState
from riverbed.client.types import OffsetAndMetadata, TopicPartition
from riverbed.errors import CoordinatorError, GroupError, KafkaTimeoutError
from riverbed.protocol.errors import ErrorCode

from tests.support.broker import BrokerFactory, BrokerProcess

GROUP_SETTINGS = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
}
OFFSETS_TOPIC_PARTITIONS = 3
PARTITIONS = 3
RECORDS_PER_PARTITION = 4
POLL_TIMEOUT_S = 0.2
CONSUME_TIMEOUT_S = 60.0
FLUSH_TIMEOUT_S = 30
CLIENT_ID = "admin-groups-test"


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(bootstrap: str, topic: str) -> None:
    """RECORDS_PER_PARTITION records in each partition."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for partition in range(PARTITIONS):
        for _ in range(RECORDS_PER_PARTITION):
            producer.produce(topic, b"v", partition=partition)
    assert producer.flush(FLUSH_TIMEOUT_S) == 0


def group_consumer(bootstrap: str, group_id: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "client.id": CLIENT_ID,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )


def consume_and_commit(consumer: Consumer, topic: str, count: int) -> dict[TopicPartition, int]:
    """Subscribe, consume `count` records, commit synchronously; the positions committed."""
    consumer.subscribe([topic])
    positions: dict[TopicPartition, int] = {}
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    consumed = 0
    while consumed < count:
        assert time.monotonic() < deadline, f"consumed {consumed} of {count} records"
        message = consumer.poll(POLL_TIMEOUT_S)
        if message is None:
            continue
        assert message.error() is None, message.error()
        name, partition, offset = message.topic(), message.partition(), message.offset()
        assert name is not None
        assert partition is not None
        assert offset is not None
        positions[TopicPartition(name, partition)] = offset + 1
        consumed += 1
    consumer.commit(asynchronous=False)
    return positions


@contextlib.contextmanager
def member(bootstrap: str, group_id: str, topic: str) -> Iterator[dict[TopicPartition, int]]:
    """A live group member that consumed every record and committed; it leaves on exit."""
    consumer = group_consumer(bootstrap, group_id)
    try:
        yield consume_and_commit(consumer, topic, PARTITIONS * RECORDS_PER_PARTITION)
    finally:
        consumer.close()  # LeaveGroup: the group becomes Empty at once


def first_records(bootstrap: str, group_id: str, topic: str) -> dict[int, int]:
    """The offset each partition's first record has for a new member of the group: where the
    group's committed offsets make librdkafka start."""
    consumer = group_consumer(bootstrap, group_id)
    consumer.subscribe([topic])
    first: dict[int, int] = {}
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    try:
        while len(first) < PARTITIONS:
            assert time.monotonic() < deadline, f"records came from partitions {sorted(first)}"
            message = consumer.poll(POLL_TIMEOUT_S)
            if message is not None and message.error() is None:
                partition, offset = message.partition(), message.offset()
                assert partition is not None
                assert offset is not None
                first.setdefault(partition, offset)
    finally:
        consumer.close()
    return first


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory(GROUP_SETTINGS)


async def new_topic(admin: Admin, bootstrap: str) -> str:
    topic = new_name("orders")
    await admin.create_topic(topic, partitions=PARTITIONS)
    await asyncio.to_thread(produce, bootstrap, topic)
    return topic


async def test_a_live_group_is_listed_described_and_protected(broker: BrokerProcess) -> None:
    group_id = new_name("live")
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        topic = await new_topic(admin, broker.bootstrap)
        with member(broker.bootstrap, group_id, topic) as positions:
            listed = {g.group_id: g for g in await admin.list_groups()}
            assert listed[group_id].state is GroupState.STABLE
            assert listed[group_id].protocol_type == "consumer"
            assert group_id in {g.group_id for g in await admin.list_groups([GroupState.STABLE])}
            assert group_id not in {g.group_id for g in await admin.list_groups([GroupState.EMPTY])}

            group = (await admin.describe_groups([group_id]))[group_id]
            assert (group.state, group.protocol_type) == (GroupState.STABLE, "consumer")
            assert group.protocol == "range"  # librdkafka's first partition.assignment.strategy
            assert group.coordinator == broker.broker_id
            (only,) = group.members
            assert only.client_id == CLIENT_ID
            assert "127.0.0.1" in only.client_host
            assert only.group_instance_id is None
            assert set(only.assignment or ()) == {
                TopicPartition(topic, p) for p in range(PARTITIONS)
            }

            committed = await admin.list_group_offsets(group_id)
            assert {tp: o.offset for tp, o in committed.items()} == positions
            assert positions == {
                TopicPartition(topic, p): RECORDS_PER_PARTITION for p in range(PARTITIONS)
            }
            tp0 = TopicPartition(topic, 0)
            assert await admin.list_group_offsets(group_id, [tp0]) == {tp0: committed[tp0]}

            # A member is in the group: the coordinator refuses commits and deletion from outside.
            with pytest.raises(GroupError) as altered:
                await admin.alter_group_offsets(group_id, {tp0: 0})
            assert altered.value.code == ErrorCode.UNKNOWN_MEMBER_ID
            assert "active members" in str(altered.value)
            with pytest.raises(GroupError) as deleted:
                await admin.delete_groups([group_id])
            assert deleted.value.code == ErrorCode.NON_EMPTY_GROUP
            assert (await admin.list_group_offsets(group_id))[tp0].offset == RECORDS_PER_PARTITION

        group = (await admin.describe_groups([group_id]))[group_id]
        assert (group.state, group.members) == (GroupState.EMPTY, ())


async def test_offsets_of_an_empty_group_are_altered_then_the_group_deleted(
    broker: BrokerProcess,
) -> None:
    group_id = new_name("empty")
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        topic = await new_topic(admin, broker.bootstrap)
        with member(broker.bootstrap, group_id, topic):
            pass
        tp0, tp1, tp2 = (TopicPartition(topic, p) for p in range(PARTITIONS))
        offsets = {
            tp0: OffsetAndMetadata(1),
            tp1: OffsetAndMetadata(2, metadata="rewound", leader_epoch=0),
            tp2: OffsetAndMetadata(3),
        }
        await admin.alter_group_offsets(group_id, {**offsets, tp0: 1})  # an int is an offset
        assert await admin.list_group_offsets(group_id) == offsets
        assert await admin.list_group_offsets(group_id, [tp1]) == {tp1: offsets[tp1]}
        # librdkafka's next member starts where the admin put the offsets.
        starts = await asyncio.to_thread(first_records, broker.bootstrap, group_id, topic)
        assert starts == {0: 1, 1: 2, 2: 3}

        await admin.delete_groups([group_id])
        assert group_id not in {g.group_id for g in await admin.list_groups()}
        assert (await admin.describe_groups([group_id]))[group_id].state is GroupState.DEAD
        assert await admin.list_group_offsets(group_id) == {}
        with pytest.raises(GroupError) as again:
            await admin.delete_groups([group_id])
        assert again.value.code == ErrorCode.GROUP_ID_NOT_FOUND


async def test_groups_on_every_coordinator_are_listed(broker_factory: BrokerFactory) -> None:
    brokers = [broker_factory(GROUP_SETTINGS, broker_id=node) for node in (1, 2)]
    # One group per __consumer_offsets partition: the partitions' leaders are both brokers.
    group_ids: dict[int, str] = {}
    while len(group_ids) < OFFSETS_TOPIC_PARTITIONS:
        group_id = new_name("placed")
        group_ids.setdefault(partition_for(group_id, OFFSETS_TOPIC_PARTITIONS), group_id)
    async with Admin(bootstrap_servers=brokers[0].bootstrap) as admin:
        topic = new_name("orders")
        await admin.create_topic(topic, partitions=1)
        tp = TopicPartition(topic, 0)
        for offset, group_id in enumerate(group_ids.values()):
            await admin.alter_group_offsets(group_id, {tp: offset})

        described = await admin.describe_groups(group_ids.values())
        assert {d.coordinator for d in described.values()} == {1, 2}
        listed = {g.group_id: g for g in await admin.list_groups()}
        for offset, group_id in enumerate(group_ids.values()):
            # Offsets committed from outside make an Empty group without a protocol type.
            assert (listed[group_id].state, listed[group_id].protocol_type) == (
                GroupState.EMPTY,
                "",
            )
            assert described[group_id].state is GroupState.EMPTY
            assert await admin.list_group_offsets(group_id) == {tp: OffsetAndMetadata(offset)}

        await admin.delete_groups(group_ids.values())
        assert not set(group_ids.values()) & {g.group_id for g in await admin.list_groups()}


async def test_an_unknown_group(broker: BrokerProcess) -> None:
    group_id = new_name("nobody")
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        group = (await admin.describe_groups([group_id]))[group_id]
        assert (group.state, group.members, group.protocol_type) == (GroupState.DEAD, (), "")
        assert await admin.list_group_offsets(group_id) == {}
        with pytest.raises(GroupError) as deleted:
            await admin.delete_groups([group_id])
        assert deleted.value.code == ErrorCode.GROUP_ID_NOT_FOUND
        assert repr(group_id) in str(deleted.value)
        with pytest.raises(ValueError, match="offset"):
            await admin.alter_group_offsets(group_id, {TopicPartition("t", 0): -1})


async def test_a_coordinator_that_never_comes_up_times_out(broker_factory: BrokerFactory) -> None:
    # Three replicas wanted, one broker: __consumer_offsets is never created and FindCoordinator
    # answers COORDINATOR_NOT_AVAILABLE, which the admin retries until request_timeout_ms.
    broker = broker_factory({**GROUP_SETTINGS, "offsets.topic.replication.factor": "3"})
    async with Admin(
        bootstrap_servers=broker.bootstrap, request_timeout_ms=2000, retry_backoff_ms=50
    ) as admin:
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError) as timed_out:
            await admin.describe_groups(["waiting"])
        assert 1.5 < time.monotonic() - started < 10
    cause = timed_out.value.__cause__
    assert isinstance(cause, CoordinatorError)
    assert cause.code == ErrorCode.COORDINATOR_NOT_AVAILABLE
