"""A real broker restarted cleanly, and after a crash, serves every acknowledged record, its end
offsets and its leader epochs: the fast startup path (no epoch file rewritten at open, a new
leader's epoch written with its first batch and fsynced before the recovery-point checkpoint)
keeps what the slow one kept."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import Consumer, TopicPartition
from riverbed import Admin, Producer
from riverbed.client.types import TopicPartition as AdminTopicPartition
from riverbed.errors import LeadershipError

from tests.broker.test_offset_for_leader_epoch import end_offset, request
from tests.support.broker import BrokerFactory, BrokerProcess

TOPIC = "restarts"
PARTITIONS = 6
# Written at the first epoch, then (all but the last partition) at the second.
FIRST_RECORDS = 3
SECOND_RECORDS = 2
UNWRITTEN = PARTITIONS - 1  # led at the second epoch, never written at it
TIMEOUT_S = 60
# A crashed broker's registration lingers until its session expires: short, to keep it quick.
SETTINGS = {"zookeeper.session.timeout.ms": "2000"}


def values(label: str, partition: int, count: int) -> list[bytes]:
    return [f"{label}-{partition}-{i}".encode() for i in range(count)]


async def produce(broker: BrokerProcess, label: str, count: int, partitions: range) -> None:
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all") as producer:
        for partition in partitions:
            for value in values(label, partition, count):
                await producer.send(TOPIC, value, partition=partition)
        await producer.flush()


async def epochs_after(broker: BrokerProcess, previous: list[int] | None) -> list[int]:
    """Each partition's leader epoch once this broker leads every one (at a newer epoch than
    `previous`, when given)."""
    deadline = time.monotonic() + TIMEOUT_S
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        while True:
            try:
                partitions = (await admin.describe_topic(TOPIC)).partitions
            except LeadershipError:  # none led yet (the crashed incarnation's session lingers)
                partitions = ()
            epochs = [p.leader_epoch for p in partitions]
            led = bool(partitions) and all(p.leader == broker.broker_id for p in partitions)
            newer = previous is None or all(map(int.__gt__, epochs, previous))
            if led and newer:
                return epochs
            assert time.monotonic() < deadline, f"not leading anew: {partitions}"
            await asyncio.sleep(0.1)


async def epoch_end(broker: BrokerProcess, epoch: int, partition: int) -> tuple[int, int]:
    """OffsetForLeaderEpoch's (epoch, end offset), retried while the leadership settles."""
    deadline = time.monotonic() + TIMEOUT_S
    body = request(epoch, topic=TOPIC, partition=partition)
    while (found := await end_offset(broker, body, 4)).error_code:
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.1)
    return found.leader_epoch, found.end_offset


async def end_offsets(broker: BrokerProcess) -> list[int]:
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        found = await admin.list_offsets(
            {AdminTopicPartition(TOPIC, p): "latest" for p in range(PARTITIONS)}
        )
    return [found[AdminTopicPartition(TOPIC, p)].offset for p in range(PARTITIONS)]


def consume_all(broker: BrokerProcess, expected: int) -> dict[int, list[bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "restarts",  # required, never joined: partitions are assigned
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    read: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + TIMEOUT_S
        while sum(map(len, read.values())) < expected and time.monotonic() < deadline:
            for message in consumer.consume(100, 0.5):
                partition, value = message.partition(), message.value()
                if message.error() is None and partition is not None and value is not None:
                    read[partition].append(value)
    finally:
        consumer.close()
    return read


def expected_values() -> dict[int, list[bytes]]:
    return {
        p: values("first", p, FIRST_RECORDS)
        + (values("second", p, SECOND_RECORDS) if p != UNWRITTEN else [])
        for p in range(PARTITIONS)
    }


async def assert_serves_everything(
    broker: BrokerProcess, first: list[int], second: list[int], *, second_is_current: bool
) -> None:
    expected = expected_values()
    assert await end_offsets(broker) == [len(expected[p]) for p in range(PARTITIONS)]
    for p in range(PARTITIONS):
        # Epoch `first` ended where the second epoch's records start. An epoch that wrote
        # nothing is known while it is the current one (it ends at the log end), and unknown
        # after a restart, so its answer is then the epoch before it, ending at the same place.
        assert await epoch_end(broker, first[p], p) == (first[p], FIRST_RECORDS)
        if p != UNWRITTEN:
            assert await epoch_end(broker, second[p], p) == (
                second[p],
                FIRST_RECORDS + SECOND_RECORDS,
            )
        else:
            answer = second[p] if second_is_current else first[p]
            assert await epoch_end(broker, second[p], p) == (answer, FIRST_RECORDS)
    total = sum(map(len, expected.values()))
    assert consume_all(broker, total) == expected


async def test_clean_and_unclean_restarts_serve_every_record_and_epoch(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(SETTINGS)
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=PARTITIONS)
    first = await epochs_after(broker, None)
    await produce(broker, "first", FIRST_RECORDS, range(PARTITIONS))

    broker.restart()  # clean: the controller elects this new incarnation at new epochs
    assert "after a clean shutdown" in broker.log_path.read_text()
    second = await epochs_after(broker, first)
    await produce(broker, "second", SECOND_RECORDS, range(UNWRITTEN))
    await assert_serves_everything(broker, first, second, second_is_current=True)

    broker.kill()  # a crash: every log's tail is re-scanned
    broker.start()
    broker.wait_ready()
    assert "after an unclean shutdown" in broker.log_path.read_text()
    third = await epochs_after(broker, second)
    await assert_serves_everything(broker, first, second, second_is_current=False)

    broker.restart()  # clean again, after the recovery
    await epochs_after(broker, third)
    await assert_serves_everything(broker, first, second, second_is_current=False)
