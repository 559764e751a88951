"""Fetch sessions (KIP-227) on a real broker, seen from the wire with Riverbed's own codec and
connection: a full fetch creates a session, incremental fetches carry only news, session errors
are Kafka's, a restarted broker knows no session, and a tiny cache evicts without breaking
consumers (Riverbed's, which use sessions, and kafka-python's)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Final

import pytest
from riverbed import Admin, Consumer, Producer
from riverbed.client.connection import BrokerConnection
from riverbed.client.types import TopicPartition
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import encode_batch

from tests.interop.drivers import DRIVERS, Driver, KafkaPython
from tests.support.broker import HOST, BrokerFactory, BrokerProcess
from tests.support.metrics import WITH_METRICS, scrape

PARTITIONS: Final = 4
IDLE_WAIT_MS: Final = 300
CONSUMED_WAIT_S: Final = 30.0


async def _topic(broker: BrokerProcess, partitions: int = PARTITIONS) -> tuple[str, uuid.UUID]:
    name = f"fs-{uuid.uuid4().hex[:8]}"
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        return name, await admin.create_topic(name, partitions=partitions)


async def _produce(connection: BrokerConnection, topic: str, partition: int, value: bytes) -> None:
    batch = encode_batch([(None, value, (), int(time.time() * 1000))])
    response = await connection.request(
        m.ProduceRequest(
            acks=1,
            timeout_ms=5000,
            topic_data=[
                m.ProduceRequest.TopicProduceData(
                    name=topic,
                    partition_data=[
                        m.ProduceRequest.PartitionProduceData(index=partition, records=batch)
                    ],
                )
            ],
        )
    )
    assert response.responses[0].partition_responses[0].error_code == 0


def _fetch(
    topic: tuple[str, uuid.UUID],
    offsets: dict[int, int],
    *,
    session_id: int,
    epoch: int,
    forgotten: list[int] | None = None,
) -> m.FetchRequest:
    # Name and id both: the connection picks the version (v13+ by id).
    return m.FetchRequest(
        replica_id=-1,
        max_wait_ms=IDLE_WAIT_MS,
        min_bytes=1,
        max_bytes=1 << 20,
        session_id=session_id,
        session_epoch=epoch,
        topics=[
            m.FetchRequest.FetchTopic(
                topic=topic[0],
                topic_id=topic[1],
                partitions=[
                    m.FetchRequest.FetchPartition(
                        partition=index, fetch_offset=offset, partition_max_bytes=1 << 20
                    )
                    for index, offset in offsets.items()
                ],
            )
        ]
        if offsets
        else [],
        forgotten_topics_data=[
            m.FetchRequest.ForgottenTopic(topic=topic[0], topic_id=topic[1], partitions=forgotten)
        ]
        if forgotten
        else [],
    )


def _answered(response: m.FetchResponse) -> dict[int, m.FetchResponse.PartitionData]:
    return {p.partition_index: p for t in response.responses for p in t.partitions}


async def test_a_session_answers_only_what_changed(broker: BrokerProcess) -> None:
    topic = await _topic(broker)
    connection = await BrokerConnection.open(HOST, broker.port)
    try:
        full = await connection.request(
            _fetch(topic, dict.fromkeys(range(PARTITIONS), 0), session_id=0, epoch=0)
        )
        assert full.error_code == ErrorCode.NONE
        session_id = full.session_id
        assert session_id != 0, "the broker handed out no session"
        assert sorted(_answered(full)) == list(range(PARTITIONS))  # a full answer: all of them

        # Nothing changed: the incremental fetch names nothing, waits, and answers nothing.
        started = time.monotonic()
        idle = await connection.request(_fetch(topic, {}, session_id=session_id, epoch=1))
        assert idle.error_code == ErrorCode.NONE
        assert idle.session_id == session_id
        assert _answered(idle) == {}
        assert time.monotonic() - started >= IDLE_WAIT_MS / 1000 * 0.8  # it long-polled

        # An append to partition 2 wakes a parked incremental fetch, which carries only it.
        producer = await BrokerConnection.open(HOST, broker.port)
        try:
            parked = asyncio.create_task(
                connection.request(_fetch(topic, {}, session_id=session_id, epoch=2))
            )
            await asyncio.sleep(0.05)
            await _produce(producer, topic[0], 2, b"news")
            woken = await asyncio.wait_for(parked, 5)
        finally:
            await producer.close()
        answered = _answered(woken)
        assert list(answered) == [2]
        assert answered[2].high_watermark == 1
        records = answered[2].records
        assert isinstance(records, bytes | memoryview)
        assert bytes(records)  # the record itself

        # The client moved on: partition 2 at offset 1; forgetting 0 and 1 drops them.
        moved = await connection.request(
            _fetch(topic, {2: 1}, session_id=session_id, epoch=3, forgotten=[0, 1])
        )
        assert moved.error_code == ErrorCode.NONE
        assert _answered(moved) == {}

        # Session errors are Kafka's, and leave the session as it was.
        wrong_epoch = await connection.request(_fetch(topic, {}, session_id=session_id, epoch=9))
        assert wrong_epoch.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH
        unknown = await connection.request(_fetch(topic, {}, session_id=session_id + 1, epoch=1))
        assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        still = await connection.request(_fetch(topic, {}, session_id=session_id, epoch=4))
        assert still.error_code == ErrorCode.NONE

        # Epoch -1 is a sessionless full fetch, closing the session it names.
        closing = await connection.request(_fetch(topic, {0: 0}, session_id=session_id, epoch=-1))
        assert closing.session_id == 0
        assert list(_answered(closing)) == [0]
        gone = await connection.request(_fetch(topic, {}, session_id=session_id, epoch=5))
        assert gone.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    finally:
        await connection.close()


async def test_a_restarted_broker_knows_no_session_and_the_consumer_recovers(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(WITH_METRICS)
    topic = await _topic(broker, partitions=2)
    connection = await BrokerConnection.open(HOST, broker.port)
    try:
        full = await connection.request(_fetch(topic, {0: 0, 1: 0}, session_id=0, epoch=0))
        session_id = full.session_id
        assert session_id != 0
    finally:
        await connection.close()
    await asyncio.to_thread(broker.restart)
    connection = await BrokerConnection.open(HOST, broker.port)
    try:
        stale = await connection.request(_fetch(topic, {}, session_id=session_id, epoch=1))
        assert stale.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    finally:
        await connection.close()
    # Riverbed's consumer: a session, records across a broker restart in the middle.
    tp = TopicPartition(topic[0], 0)
    async with (
        Producer(bootstrap_servers=broker.bootstrap) as producer,
        Consumer(bootstrap_servers=broker.bootstrap, fetch_max_wait_ms=100) as consumer,
    ):
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        for i in range(50):
            await producer.send(topic[0], f"a-{i}".encode(), partition=0)
        await producer.flush()
        values = await _consume(consumer, 50)
        await _assert_incremental_fetches(broker, consumer)
        await asyncio.to_thread(broker.restart)
        for i in range(50):
            await producer.send(topic[0], f"b-{i}".encode(), partition=0)
        await producer.flush()
        values += await _consume(consumer, 50)
        await _assert_incremental_fetches(broker, consumer)  # a new session on the new broker
    assert values == [f"a-{i}".encode() for i in range(50)] + [f"b-{i}".encode() for i in range(50)]


async def _assert_incremental_fetches(broker: BrokerProcess, consumer: Consumer) -> None:
    """The consumer, idle a moment, fetched through a session (the broker's count restarts
    with the broker)."""
    assert await consumer.getmany(timeout_ms=IDLE_WAIT_MS * 3) == {}
    metrics = await asyncio.to_thread(scrape, broker)
    assert metrics.value("riverbed_incremental_fetches") > 0, "the consumer used no session"


async def _consume(consumer: Consumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + CONSUMED_WAIT_S
    while len(values) < count:
        assert time.monotonic() < deadline, f"consumed {len(values)} of {count}"
        batch = await consumer.getmany(timeout_ms=1000)
        values += [r.value or b"" for records in batch.values() for r in records]
    return values


async def test_one_slot_shared_by_two_consumers_evicts_without_losing_records(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory(
        {
            **WITH_METRICS,
            "max.incremental.fetch.session.cache.slots": "1",
            # Any session older than this may be evicted by a larger one.
            "min.incremental.fetch.session.eviction.ms": "0",
        }
    )
    topic = await _topic(broker, partitions=2)
    count = 200
    async with Producer(bootstrap_servers=broker.bootstrap) as producer:
        for i in range(count):
            await producer.send(topic[0], f"v-{i}".encode(), partition=i % 2)
        await producer.flush()

    async def consume(partitions: list[int]) -> list[bytes]:
        async with Consumer(bootstrap_servers=broker.bootstrap, fetch_max_wait_ms=50) as c:
            tps = [TopicPartition(topic[0], p) for p in partitions]
            c.assign(tps)
            for tp in tps:
                await c.seek_to_beginning(tp)
            return await _consume(c, count // 2 * len(partitions))

    # Riverbed's consumers and kafka-python's (which implements sessions) side by side.
    driver = KafkaPython(broker.bootstrap)
    ours_a, ours_b, theirs = await asyncio.gather(
        consume([0, 1]),
        consume([1]),
        asyncio.to_thread(driver.consume, topic[0], 0, 0, count // 2),
    )
    assert sorted(ours_a) == sorted(f"v-{i}".encode() for i in range(count))
    assert ours_b == [f"v-{i}".encode() for i in range(1, count, 2)]
    assert [c.message.value for c in theirs] == [f"v-{i}".encode() for i in range(0, count, 2)]
    metrics = await asyncio.to_thread(scrape, broker)
    assert metrics.value("riverbed_fetch_sessions") <= 1
    assert metrics.value("riverbed_fetch_session_evictions") > 0


@pytest.mark.parametrize("driver_class", DRIVERS, ids=lambda d: d.__name__)
async def test_kafka_clients_consume_with_sessions_on(
    broker_factory: BrokerFactory, driver_class: type[Driver]
) -> None:
    """librdkafka (confluent-kafka), aiokafka and kafka-python all read a topic exactly, with
    sessions on; of those only kafka-python asks for sessions (its FetchSessionHandler):
    librdkafka and aiokafka send sessionless fetches (epoch -1)."""
    broker = broker_factory(WITH_METRICS)
    topic = await _topic(broker, partitions=1)
    count = 300
    async with Producer(bootstrap_servers=broker.bootstrap) as producer:
        for i in range(count):
            await producer.send(topic[0], f"c-{i}".encode(), partition=0)
        await producer.flush()
    consumed = await asyncio.to_thread(
        driver_class(broker.bootstrap).consume, topic[0], 0, 0, count
    )
    assert [c.offset for c in consumed] == list(range(count))
    assert [c.message.value for c in consumed] == [f"c-{i}".encode() for i in range(count)]
    metrics = await asyncio.to_thread(scrape, broker)
    # The client's session outlives it in the cache (until evicted as stale).
    sessions = metrics.value("riverbed_fetch_sessions")
    assert sessions == (1 if driver_class is KafkaPython else 0)
