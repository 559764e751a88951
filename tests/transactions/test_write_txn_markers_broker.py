"""The partition side of transactions in a real broker: transactional batches produced with raw
requests, markers written with WriteTxnMarkers as a transaction coordinator sends them (Riverbed's
own connection; no authorizer, so the request is allowed), then read by confluent-kafka and
kafka-python consumers at read_committed and read_uncommitted, and ListOffsets per isolation
level; across a kill -9 and restart of the broker too."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Final

import confluent_kafka
import kafka
from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import encode_batch

from tests.interop.drivers import ConfluentKafka
from tests.support.broker import HOST, BrokerProcess

ABORTED_PID: Final = 5000
COMMITTED_PID: Final = 5001
OPEN_PID: Final = 5002
READ_COMMITTED: Final = 1
READ_UNCOMMITTED: Final = 0
# How long a consumer goes on polling after its last record: what it has not seen by then it
# must not see at all.
QUIET_S: Final = 3.0
DEADLINE_S: Final = 30.0
SETTLING: Final = {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER}


def txn_batch(
    producer_id: int, seq: int, values: list[bytes], *, transactional: bool = True
) -> bytes:
    now = int(time.time() * 1000)
    return encode_batch(
        [(None, value, (), now) for value in values],
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=seq if producer_id >= 0 else -1,
        is_transactional=transactional,
    )


async def produce(connection: BrokerConnection, topic: str, batch: bytes) -> int:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        request = m.ProduceRequest(
            acks=-1,
            timeout_ms=10_000,
            topic_data=[
                m.ProduceRequest.TopicProduceData(
                    topic, [m.ProduceRequest.PartitionProduceData(0, batch)]
                )
            ],
        )
        response: m.ProduceResponse = await connection.request(request)
        answer = response.responses[0].partition_responses[0]
        if answer.error_code in SETTLING and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            continue
        assert answer.error_code == ErrorCode.NONE, answer
        return answer.base_offset


async def write_marker(
    connection: BrokerConnection,
    topic: str,
    producer_id: int,
    *,
    commit: bool,
    coordinator_epoch: int = 0,
    partitions: tuple[int, ...] = (0,),
) -> list[int]:
    request = m.WriteTxnMarkersRequest(
        markers=[
            m.WriteTxnMarkersRequest.WritableTxnMarker(
                producer_id=producer_id,
                producer_epoch=0,
                transaction_result=commit,
                topics=[m.WriteTxnMarkersRequest.WritableTxnMarkerTopic(topic, list(partitions))],
                coordinator_epoch=coordinator_epoch,
            )
        ]
    )
    response: m.WriteTxnMarkersResponse = await connection.request(request)
    return [p.error_code for p in response.markers[0].topics[0].partitions]


async def latest(connection: BrokerConnection, topic: str, isolation_level: int) -> int:
    request = m.ListOffsetsRequest(
        replica_id=-1,
        isolation_level=isolation_level,
        topics=[
            m.ListOffsetsRequest.ListOffsetsTopic(
                topic, [m.ListOffsetsRequest.ListOffsetsPartition(partition_index=0, timestamp=-1)]
            )
        ],
    )
    response: m.ListOffsetsResponse = await connection.request(request)
    answer = response.topics[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE, answer
    return answer.offset


async def describe_producers(connection: BrokerConnection, topic: str) -> dict[int, int]:
    """producer id -> its open transaction's first offset (-1: none)."""
    request = m.DescribeProducersRequest(
        topics=[m.DescribeProducersRequest.TopicRequest(topic, [0])]
    )
    response: m.DescribeProducersResponse = await connection.request(request)
    answer = response.topics[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE, answer
    return {p.producer_id: p.current_txn_start_offset for p in answer.active_producers}


def confluent_values(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
        }
    )
    values: list[bytes] = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        quiet_until = time.monotonic() + QUIET_S
        while time.monotonic() < quiet_until:
            for record in consumer.consume(10, 0.2):
                if record.error() is None:
                    value = record.value()
                    assert isinstance(value, bytes)
                    values.append(value)
                    quiet_until = time.monotonic() + QUIET_S
    finally:
        consumer.close()
    return values


def kafka_python_values(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False
    )
    values: list[bytes] = []
    try:
        partition = kafka.TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        quiet_until = time.monotonic() + QUIET_S
        while time.monotonic() < quiet_until:
            for records in consumer.poll(timeout_ms=200).values():
                values += [record.value for record in records]
                if records:
                    quiet_until = time.monotonic() + QUIET_S
    finally:
        consumer.close()
    return values


def all_values(bootstrap: str, topic: str, isolation: str) -> tuple[list[bytes], list[bytes]]:
    return (
        confluent_values(bootstrap, topic, isolation),
        kafka_python_values(bootstrap, topic, isolation),
    )


async def write_mixed_log(connection: BrokerConnection, topic: str) -> int:
    """An aborted, a committed and an open transaction among plain records; returns the open
    transaction's first offset."""
    await produce(connection, topic, txn_batch(ABORTED_PID, 0, [b"a0", b"a1", b"a2"]))
    await produce(connection, topic, txn_batch(COMMITTED_PID, 0, [b"c0", b"c1"]))
    await produce(connection, topic, txn_batch(-1, 0, [b"p0"], transactional=False))
    assert await write_marker(connection, topic, ABORTED_PID, commit=False) == [ErrorCode.NONE]
    assert await write_marker(connection, topic, COMMITTED_PID, commit=True) == [ErrorCode.NONE]
    open_first = await produce(connection, topic, txn_batch(OPEN_PID, 0, [b"o0"]))
    await produce(connection, topic, txn_batch(-1, 0, [b"p1"], transactional=False))
    return open_first


COMMITTED_VIEW: Final = [b"c0", b"c1", b"p0"]
EVERYTHING: Final = [b"a0", b"a1", b"a2", b"c0", b"c1", b"p0", b"o0", b"p1"]


def test_read_committed_sees_committed_data_up_to_the_open_transaction(
    broker: BrokerProcess,
) -> None:
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    assert ConfluentKafka(broker.bootstrap).create_topic(topic, 1) == 0

    async def scenario() -> None:
        connection = await BrokerConnection.open(HOST, broker.port)
        try:
            open_first = await write_mixed_log(connection, topic)
            assert open_first == 8  # 3 + 2 + 1 records and two markers before it
            assert await latest(connection, topic, READ_UNCOMMITTED) == 10
            assert await latest(connection, topic, READ_COMMITTED) == open_first
            producers = await describe_producers(connection, topic)
            assert producers[OPEN_PID] == open_first
            assert producers[ABORTED_PID] == -1
            # A marker from an older coordinator epoch than the last one is fenced; an unknown
            # partition is named.
            assert await write_marker(
                connection, topic, COMMITTED_PID, commit=True, coordinator_epoch=3
            ) == [ErrorCode.NONE]
            assert await write_marker(
                connection, topic, COMMITTED_PID, commit=True, coordinator_epoch=2
            ) == [ErrorCode.TRANSACTION_COORDINATOR_FENCED]
            assert await write_marker(
                connection, topic, COMMITTED_PID, commit=True, partitions=(7,)
            ) == [ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
        finally:
            await connection.close()

    asyncio.run(scenario())
    assert all_values(broker.bootstrap, topic, "read_committed") == (COMMITTED_VIEW,) * 2
    assert all_values(broker.bootstrap, topic, "read_uncommitted") == (EVERYTHING,) * 2

    async def commit_open() -> None:
        connection = await BrokerConnection.open(HOST, broker.port)
        try:
            assert await write_marker(connection, topic, OPEN_PID, commit=True) == [ErrorCode.NONE]
            assert await latest(connection, topic, READ_COMMITTED) == 12  # two more markers
        finally:
            await connection.close()

    asyncio.run(commit_open())
    assert (
        all_values(broker.bootstrap, topic, "read_committed")
        == ([*COMMITTED_VIEW, b"o0", b"p1"],) * 2
    )


def test_a_killed_broker_keeps_aborts_and_open_transactions(broker: BrokerProcess) -> None:
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    assert ConfluentKafka(broker.bootstrap).create_topic(topic, 1) == 0

    async def write() -> int:
        connection = await BrokerConnection.open(HOST, broker.port)
        try:
            return await write_mixed_log(connection, topic)
        finally:
            await connection.close()

    open_first = asyncio.run(write())
    broker.kill()
    broker.restart()
    assert list(broker.partition_dir(topic, 0).glob("*.txnindex")), "no txn index on disk"

    async def check() -> None:
        deadline = time.monotonic() + DEADLINE_S
        connection = await BrokerConnection.open(HOST, broker.port)
        try:
            while True:
                try:
                    lso = await latest(connection, topic, READ_COMMITTED)
                    break
                except AssertionError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.2)
            assert lso == open_first
            assert (await describe_producers(connection, topic))[OPEN_PID] == open_first
        finally:
            await connection.close()

    asyncio.run(check())
    assert all_values(broker.bootstrap, topic, "read_committed") == (COMMITTED_VIEW,) * 2
