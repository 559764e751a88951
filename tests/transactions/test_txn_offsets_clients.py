"""Consume-transform-produce with third-party clients: offsets committed inside transactions.

Each client's consumer (in a consumer group) reads an input topic and its transactional producer
writes to an output topic, then sends the consumer's position to the transaction
(`send_offsets_to_transaction`: AddOffsetsToTxn, then TxnOffsetCommit to the group coordinator)
and commits or aborts. A committed transaction moves the group's committed offset, an aborted one
does not: the next consumer of the group starts where the last committed transaction left off.
confluent-kafka and kafka-python pass the consumer's group metadata (KIP-447 fencing, v3),
aiokafka only the group id (an older TxnOffsetCommit version). The committed offset is read with
OffsetFetch requiring stable offsets, so it is read once the transaction's markers are written.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

import confluent_kafka
import kafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

from tests.groups.test_coordinator_broker import connect
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.cluster import wait_for
from tests.transactions.txn_clients import (
    ONE_BROKER_SETTINGS,
    TIMEOUT_S,
    confluent_producer,
    create_topic,
    values,
)

SOURCE: Final = "ctp-in"
SINK: Final = "ctp-out"
FIRST: Final = 10  # records read and committed in the first transaction
SECOND: Final = 5  # records read in the second, aborted, transaction
SETTINGS: Final = {**ONE_BROKER_SETTINGS, "group.initial.rebalance.delay.ms": "0"}


@pytest.fixture
def txn_broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory(SETTINGS)


async def produce_source(bootstrap: str, start: int, count: int) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for value in values("in", start + count)[start:]:
        producer.produce(SOURCE, value, partition=0)
    assert await asyncio.to_thread(producer.flush, TIMEOUT_S) == 0


async def stable_offset(bootstrap: str, group_id: str) -> int:
    """The group's committed offset of SOURCE-0 once no transaction holds it pending."""

    async def fetched() -> tuple[int] | None:
        connection = await connect(bootstrap)
        try:
            return await _fetch_stable(connection, group_id)
        finally:
            await connection.close()

    (offset,) = await wait_for(fetched, TIMEOUT_S, what=f"a stable offset of {group_id}")
    return offset


async def _fetch_stable(connection: BrokerConnection, group_id: str) -> tuple[int] | None:
    """(the committed offset,), or None while the coordinator cannot answer or it is pending."""
    request = m.OffsetFetchRequest(
        require_stable=True,
        groups=[
            m.OffsetFetchRequest.OffsetFetchRequestGroup(
                group_id=group_id,
                topics=[m.OffsetFetchRequest.OffsetFetchRequestTopics(SOURCE, [0])],
            )
        ],
    )
    response = await connection.call(request, m.OffsetFetchResponse)
    (group,) = response.groups
    if group.error_code != ErrorCode.NONE:
        return None  # e.g. COORDINATOR_LOAD_IN_PROGRESS: asked again
    ((partition,),) = [topic.partitions for topic in group.topics]
    if partition.error_code == ErrorCode.UNSTABLE_OFFSET_COMMIT:
        return None
    assert partition.error_code == ErrorCode.NONE
    return (partition.committed_offset,)


# -- the clients' loops ---------------------------------------------------------------------


def confluent_round(bootstrap: str, group_id: str, count: int, commit: bool) -> list[bytes]:
    """Read `count` records as the group, produce them transformed, send the consumer's
    position to the transaction, commit or abort it; the values read."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = confluent_producer(bootstrap, f"tid-{group_id}")
    try:
        producer.init_transactions(TIMEOUT_S)
        consumer.subscribe([SOURCE])
        read: list[Any] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(read) < count and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                read.append(message)
        producer.begin_transaction()
        for message in read:
            producer.produce(SINK, message.value().upper(), partition=0)
        position = consumer.position(consumer.assignment())
        producer.send_offsets_to_transaction(
            position, consumer.consumer_group_metadata(), TIMEOUT_S
        )
        if commit:
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.abort_transaction(TIMEOUT_S)
        return [message.value() for message in read]
    finally:
        consumer.close()


def kafka_python_round(bootstrap: str, group_id: str, count: int, commit: bool) -> list[bytes]:
    consumer = kafka.KafkaConsumer(
        SOURCE,
        bootstrap_servers=bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tid-{group_id}")
    try:
        producer.init_transactions()
        read: list[Any] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(read) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                read += records
        producer.begin_transaction()
        for record in read:
            producer.send(SINK, record.value.upper(), partition=0)
        tp = kafka.TopicPartition(SOURCE, 0)
        offsets = {tp: kafka.structs.OffsetAndMetadata(consumer.position(tp), "", -1)}
        producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
        return [record.value for record in read]
    finally:
        producer.close()
        consumer.close()


async def aiokafka_round(bootstrap: str, group_id: str, count: int, commit: bool) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        SOURCE,
        bootstrap_servers=bootstrap,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tid-{group_id}")
    await consumer.start()
    await producer.start()
    try:
        read: list[Any] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(read) < count and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                read += records
        await producer.begin_transaction()
        for record in read:
            await producer.send(SINK, record.value.upper(), partition=0)
        tp = AioTopicPartition(SOURCE, 0)
        await producer.send_offsets_to_transaction({tp: await consumer.position(tp)}, group_id)
        if commit:
            await producer.commit_transaction()
        else:
            await producer.abort_transaction()
        return [record.value for record in read]
    finally:
        await producer.stop()
        await consumer.stop()


async def run_round(
    client: str, bootstrap: str, group_id: str, count: int, commit: bool
) -> list[bytes]:
    if client == "confluent-kafka":
        return await asyncio.to_thread(confluent_round, bootstrap, group_id, count, commit)
    if client == "kafka-python":
        return await asyncio.to_thread(kafka_python_round, bootstrap, group_id, count, commit)
    return await aiokafka_round(bootstrap, group_id, count, commit)


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python", "aiokafka"])
async def test_offsets_move_with_committed_transactions_only(
    txn_broker: BrokerProcess, client: str
) -> None:
    bootstrap = txn_broker.bootstrap
    group_id = f"ctp-{client}"
    await create_topic(bootstrap, SOURCE)
    await create_topic(bootstrap, SINK)
    await produce_source(bootstrap, 0, FIRST)

    first = await run_round(client, bootstrap, group_id, FIRST, commit=True)
    assert first == values("in", FIRST)
    assert await stable_offset(bootstrap, group_id) == FIRST

    await produce_source(bootstrap, FIRST, SECOND)
    second = await run_round(client, bootstrap, group_id, SECOND, commit=False)
    # The group resumed at the committed offset: exactly the new records.
    assert second == values("in", FIRST + SECOND)[FIRST:]
    assert await stable_offset(bootstrap, group_id) == FIRST  # the abort moved nothing

    # The next consumer of the group reads the aborted transaction's input again.
    third = await run_round(client, bootstrap, group_id, SECOND, commit=True)
    assert third == second
    assert await stable_offset(bootstrap, group_id) == FIRST + SECOND
