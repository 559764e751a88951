"""Replication between real broker processes: followers copy the leader byte for byte, acks=all
waits for the ISR, the ISR shrinks and expands, min.insync.replicas is enforced."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable

import pytest
from riverbed import Consumer, Producer
from riverbed.client.admin import Admin, PartitionDescription
from riverbed.client.connection import BrokerConnection
from riverbed.client.types import TopicPartition
from riverbed.errors import NotEnoughReplicasError
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import encode_batch

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.cluster import registered_brokers

# Short timings so a lagging follower leaves the ISR within the test's patience.
SETTINGS = {"replica.lag.time.max.ms": "2000", "zookeeper.session.timeout.ms": "4000"}
WAIT_S = 30.0


def new_topic() -> str:
    return f"repl-{uuid.uuid4().hex[:8]}"


async def start_brokers(broker_factory: BrokerFactory, count: int) -> dict[int, BrokerProcess]:
    """`count` ready brokers, once each lists all of them: a broker answers as soon as it
    listens, and a CreateTopics reaching a controller that has not yet seen the last
    registration gets INVALID_REPLICATION_FACTOR (a CI flake)."""
    brokers = {i: broker_factory(SETTINGS, broker_id=i) for i in range(1, count + 1)}
    everyone = frozenset(brokers)

    async def all_registered() -> bool:
        views = [await registered_brokers(b.bootstrap) for b in brokers.values()]
        return all(view == everyone for view in views)

    await wait_for(all_registered, f"all {count} brokers registered")
    return brokers


def bootstrap(brokers: dict[int, BrokerProcess]) -> str:
    return ",".join(b.bootstrap for b in brokers.values() if b.running)


async def describe(admin: Admin, topic: str, partition: int = 0) -> PartitionDescription:
    return (await admin.describe_topic(topic)).partitions[partition]


async def wait_for(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def strict_topic(brokers: dict[int, BrokerProcess]) -> tuple[str, int, int]:
    """A new topic replicated to all three brokers with min.insync.replicas=3: its name, its
    partition's leader and one follower."""
    topic = new_topic()
    async with Admin(bootstrap_servers=bootstrap(brokers)) as admin:
        await admin.create_topic(
            topic, partitions=1, replication_factor=3, configs={"min.insync.replicas": "3"}
        )
        leader = (await describe(admin, topic)).leader
    return topic, leader, next(i for i in brokers if i != leader)


def segment_digest(broker: BrokerProcess, topic: str) -> str:
    digest = hashlib.sha256()
    for path in broker.segment_files(topic, 0):
        digest.update(path.read_bytes())
    return digest.hexdigest()


async def test_followers_hold_the_leaders_bytes_and_acks_all_waits_for_them(
    broker_factory: BrokerFactory,
) -> None:
    brokers = await start_brokers(broker_factory, 3)
    topic = new_topic()
    async with Admin(bootstrap_servers=bootstrap(brokers)) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=3)
        state = await describe(admin, topic)
        assert sorted(state.replicas) == [1, 2, 3]
        assert sorted(state.isr) == [1, 2, 3]
        async with Producer(bootstrap_servers=bootstrap(brokers), acks="all") as producer:
            for i in range(200):
                await producer.send(topic, f"value-{i}".encode(), partition=0)
            await producer.flush()
        # acks=all returned: every ISR member has every record, so the logs are identical.
        digests = {segment_digest(b, topic) for b in brokers.values()}
        assert len(digests) == 1
        async with Consumer(bootstrap_servers=bootstrap(brokers)) as consumer:
            consumer.assign([TopicPartition(topic, 0)])
            await consumer.seek_to_beginning(TopicPartition(topic, 0))
            values: list[bytes] = []
            while len(values) < 200:
                batch = await consumer.getmany(timeout_ms=5000)
                values += [r.value or b"" for records in batch.values() for r in records]
        assert values == [f"value-{i}".encode() for i in range(200)]


async def test_isr_shrinks_enforces_min_insync_and_expands_again(
    broker_factory: BrokerFactory,
) -> None:
    brokers = await start_brokers(broker_factory, 3)
    topic, leader, follower = await strict_topic(brokers)
    async with Admin(bootstrap_servers=bootstrap(brokers)) as admin:
        brokers[follower].kill()

        async def shrunk() -> bool:
            return follower not in (await describe(admin, topic)).isr

        await wait_for(shrunk, f"broker {follower} to leave the ISR")
        async with Producer(
            bootstrap_servers=brokers[leader].bootstrap, acks="all", retries=0
        ) as producer:
            with pytest.raises(NotEnoughReplicasError):
                await (await producer.send(topic, b"refused", partition=0))
        async with Producer(bootstrap_servers=brokers[leader].bootstrap, acks=1) as producer:
            for i in range(50):
                await producer.send(topic, f"while-down-{i}".encode(), partition=0)
            await producer.flush()

        brokers[follower].restart()

        async def expanded() -> bool:
            return follower in (await describe(admin, topic)).isr

        await wait_for(expanded, f"broker {follower} to rejoin the ISR")
        async with Producer(bootstrap_servers=bootstrap(brokers), acks="all") as producer:
            metadata = await (await producer.send(topic, b"accepted", partition=0))
        assert metadata.offset == 50
        assert segment_digest(brokers[follower], topic) == segment_digest(brokers[leader], topic)


@pytest.mark.parametrize("how", ["kill", "terminate"])
async def test_leader_loss_moves_leadership_and_acks_all_resumes(
    broker_factory: BrokerFactory, how: str
) -> None:
    brokers = await start_brokers(broker_factory, 3)
    topic = new_topic()
    async with Admin(bootstrap_servers=bootstrap(brokers)) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=3)
        before = await describe(admin, topic)
        async with Producer(bootstrap_servers=bootstrap(brokers), acks="all") as producer:
            for i in range(100):
                await producer.send(topic, f"before-{i}".encode(), partition=0)
            await producer.flush()
        started = time.monotonic()
        getattr(brokers[before.leader], how)()

        async def moved() -> bool:
            state = await describe(admin, topic)
            return state.leader not in (before.leader, -1)

        await wait_for(moved, "a new leader")
        after = await describe(admin, topic)
        assert after.leader_epoch > before.leader_epoch
        assert before.leader not in after.isr
        async with Producer(bootstrap_servers=bootstrap(brokers), acks="all") as producer:
            metadata = await (await producer.send(topic, b"after", partition=0))
        assert metadata.offset == 100
        print(f"{how}: acks=all produce succeeded {time.monotonic() - started:.2f} s after")


async def produce_one(broker: BrokerProcess, topic: str, timeout_ms: int) -> int:
    """One acks=all record sent straight to `broker`; the partition's error code."""
    batch = encode_batch([(None, b"parked", (), int(time.time() * 1000))])
    request = m.ProduceRequest(
        acks=-1,
        timeout_ms=timeout_ms,
        topic_data=[
            m.ProduceRequest.TopicProduceData(
                topic, [m.ProduceRequest.PartitionProduceData(index=0, records=batch)]
            )
        ],
    )
    connection = await BrokerConnection.open("127.0.0.1", broker.port)
    try:
        response = await connection.call(request, m.ProduceResponse, timeout_ms=timeout_ms + 30_000)
    finally:
        await connection.close()
    (answer,) = response.responses[0].partition_responses
    return int(answer.error_code)


async def test_parked_acks_all_times_out_or_fails_after_the_isr_shrinks(
    broker_factory: BrokerFactory,
) -> None:
    """A follower that stops fetching (SIGSTOP) leaves acks=all appends parked: one with a short
    timeout gets REQUEST_TIMED_OUT; one that outlives replica.lag.time.max.ms completes when the
    ISR shrinks, but below min.insync.replicas, so NOT_ENOUGH_REPLICAS_AFTER_APPEND."""
    brokers = await start_brokers(broker_factory, 3)
    topic, leader, follower = await strict_topic(brokers)

    # The leader takes up its leadership after Metadata from another broker names it: a loaded
    # run sent the first write below before that and got UNKNOWN_TOPIC_OR_PARTITION. Once an
    # acks=all write succeeds, the leader serves the partition and both followers fetch.
    async def leader_takes_acks_all() -> bool:
        return await produce_one(brokers[leader], topic, 5_000) == ErrorCode.NONE

    await wait_for(leader_takes_acks_all, "the leader to take an acks=all write")
    os.kill(brokers[follower].pid, signal.SIGSTOP)
    try:
        assert await produce_one(brokers[leader], topic, 300) == ErrorCode.REQUEST_TIMED_OUT
        started = time.monotonic()
        code = await produce_one(brokers[leader], topic, 20_000)
        assert code == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
        assert time.monotonic() - started < 10  # released by the ISR shrink, not the timeout
    finally:
        os.kill(brokers[follower].pid, signal.SIGCONT)
