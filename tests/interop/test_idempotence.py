"""Idempotent producers end to end: real clients with idempotence on, and the broker's dedup rules
checked byte by byte with hand-built idempotent batches, across a clean restart too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import confluent_kafka
import kafka
from kafka.record import MemoryRecords
from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.records import encode_batch

from tests.interop.drivers import OPERATION_TIMEOUT_S, ConfluentKafka, KafkaPython
from tests.support.broker import HOST, BrokerProcess

RECORDS = 20
ERROR_NONE = 0
ERROR_OUT_OF_ORDER_SEQUENCE_NUMBER = 45
ERROR_INVALID_TRANSACTION_TIMEOUT = 50
# The partition is not served yet just after CreateTopics: unknown partition, not leader.
ERRORS_WHILE_SETTLING = {3, 5, 6}
SETTLE_TIMEOUT_S = 10.0


def stored_producer_ids(broker: BrokerProcess, topic: str) -> list[int]:
    """The producer id of every batch in the partition's segment files, read by kafka-python."""
    ids = []
    for segment in broker.segment_files(topic, 0):
        records = MemoryRecords(segment.read_bytes())
        while (batch := records.next_batch()) is not None:
            ids.append(batch.producer_id)
    return ids


def test_kafka_python_with_default_settings_produces_exactly_once(
    broker: BrokerProcess, topic: str
) -> None:
    # No settings beyond the bootstrap: kafka-python 3 turns idempotence on by default.
    producer = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap)
    try:
        futures = [
            producer.send(topic, value=f"v{i}".encode(), partition=0) for i in range(RECORDS)
        ]
        producer.flush(timeout=OPERATION_TIMEOUT_S)
        offsets = [future.get(timeout=OPERATION_TIMEOUT_S).offset for future in futures]
    finally:
        producer.close(timeout=OPERATION_TIMEOUT_S)

    assert offsets == list(range(RECORDS))
    consumed = KafkaPython(broker.bootstrap).consume(topic, 0, 0, RECORDS)
    assert [c.message.value for c in consumed] == [f"v{i}".encode() for i in range(RECORDS)]
    assert ConfluentKafka(broker.bootstrap).earliest_latest(topic, 0) == (0, RECORDS)
    producer_ids = stored_producer_ids(broker, topic)
    assert producer_ids, producer_ids
    assert all(pid >= 0 for pid in producer_ids), producer_ids


def test_confluent_kafka_with_idempotence_produces_exactly_once(
    broker: BrokerProcess, topic: str
) -> None:
    driver = ConfluentKafka(broker.bootstrap)
    producer = driver.producer(**{"enable.idempotence": True})
    reports: list[tuple[confluent_kafka.KafkaError | None, int | None]] = []
    for i in range(RECORDS):
        producer.produce(
            topic,
            value=f"v{i}".encode(),
            partition=0,
            on_delivery=lambda error, record: reports.append((error, record.offset())),
        )
    assert producer.flush(OPERATION_TIMEOUT_S) == 0
    assert [error for error, _ in reports if error is not None] == []

    assert sorted(offset for _, offset in reports if offset is not None) == list(range(RECORDS))
    consumed = driver.consume(topic, 0, 0, RECORDS)
    assert [c.message.value for c in consumed] == [f"v{i}".encode() for i in range(RECORDS)]
    assert driver.earliest_latest(topic, 0) == (0, RECORDS)
    assert all(pid >= 0 for pid in stored_producer_ids(broker, topic))


# -- hand-built idempotent batches -----------------------------------------------------------


@dataclass(frozen=True)
class Produced:
    error_code: int
    base_offset: int


class RawProducer:
    """InitProducerId and Produce over Riverbed's own connection, batches built by hand."""

    def __init__(self, connection: BrokerConnection, topic: str) -> None:
        self.connection = connection
        self.topic = topic

    async def init_producer_id(
        self, transactional_id: str | None = None
    ) -> m.InitProducerIdResponse:
        request = m.InitProducerIdRequest(transactional_id=transactional_id)
        response: m.InitProducerIdResponse = await self.connection.request(request)
        return response

    async def produce(self, batch: bytes) -> Produced:
        partition_data = m.ProduceRequest.PartitionProduceData(index=0, records=batch)
        request = m.ProduceRequest(
            acks=-1,
            timeout_ms=int(OPERATION_TIMEOUT_S * 1000),
            topic_data=[m.ProduceRequest.TopicProduceData(self.topic, [partition_data])],
        )
        response: m.ProduceResponse = await self.connection.request(request)
        (partition,) = response.responses[0].partition_responses
        return Produced(partition.error_code, partition.base_offset)

    async def produce_when_ready(self, batch: bytes) -> Produced:
        """Retry while the new topic settles: retrying an idempotent batch is always safe."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while (produced := await self.produce(batch)).error_code in ERRORS_WHILE_SETTLING:
            assert time.monotonic() < deadline, f"partition never became ready: {produced}"
            await asyncio.sleep(0.1)
        return produced


@asynccontextmanager
async def raw_producer(broker: BrokerProcess, topic: str) -> AsyncIterator[RawProducer]:
    connection = await BrokerConnection.open(HOST, broker.port)
    try:
        yield RawProducer(connection, topic)
    finally:
        await connection.close()


def idempotent_batch(producer_id: int, epoch: int, base_sequence: int, count: int) -> bytes:
    records = [(None, f"seq{base_sequence + i}".encode(), (), 1_000) for i in range(count)]
    return encode_batch(
        records, producer_id=producer_id, producer_epoch=epoch, base_sequence=base_sequence
    )


def test_duplicates_get_the_original_offsets_and_gaps_are_refused(
    broker: BrokerProcess, topic: str
) -> None:
    assert ConfluentKafka(broker.bootstrap).create_topic(topic, 1) == 0

    async def scenario() -> None:
        async with raw_producer(broker, topic) as raw:
            init = await raw.init_producer_id()
            assert init.error_code == ERROR_NONE
            pid, epoch = init.producer_id, init.producer_epoch
            assert pid >= 0
            assert epoch == 0

            first = idempotent_batch(pid, epoch, 0, 3)
            assert await raw.produce_when_ready(first) == Produced(ERROR_NONE, 0)
            assert await raw.produce(first) == Produced(ERROR_NONE, 0)  # a retry
            second = idempotent_batch(pid, epoch, 3, 2)
            assert await raw.produce(second) == Produced(ERROR_NONE, 3)
            assert await raw.produce(first) == Produced(ERROR_NONE, 0)  # still remembered
            gap = await raw.produce(idempotent_batch(pid, epoch, 9, 1))
            assert gap.error_code == ERROR_OUT_OF_ORDER_SEQUENCE_NUMBER

            # A transactional id goes to the transaction coordinator, which checks the timeout
            # first (as Kafka's does): none was given.
            transactional = await raw.init_producer_id("txn-1")
            assert transactional.error_code == ERROR_INVALID_TRANSACTION_TIMEOUT

    asyncio.run(scenario())
    values = [v.message.value for v in KafkaPython(broker.bootstrap).consume(topic, 0, 0, 5)]
    assert values == [f"seq{i}".encode() for i in range(5)]
    assert ConfluentKafka(broker.bootstrap).earliest_latest(topic, 0) == (0, 5)


def test_duplicates_are_recognised_after_a_clean_restart(broker: BrokerProcess, topic: str) -> None:
    assert ConfluentKafka(broker.bootstrap).create_topic(topic, 1) == 0

    async def before_restart() -> tuple[int, int, list[bytes]]:
        async with raw_producer(broker, topic) as raw:
            init = await raw.init_producer_id()
            pid, epoch = init.producer_id, init.producer_epoch
            batches = [idempotent_batch(pid, epoch, 2 * i, 2) for i in range(3)]
            assert await raw.produce_when_ready(batches[0]) == Produced(ERROR_NONE, 0)
            for i, batch in enumerate(batches[1:], start=1):
                assert await raw.produce(batch) == Produced(ERROR_NONE, 2 * i)
        return pid, epoch, batches

    async def after_restart(pid: int, epoch: int, batches: list[bytes]) -> None:
        async with raw_producer(broker, topic) as raw:
            assert await raw.produce_when_ready(batches[1]) == Produced(ERROR_NONE, 2)
            assert await raw.produce(batches[2]) == Produced(ERROR_NONE, 4)
            following = idempotent_batch(pid, epoch, 6, 1)
            assert await raw.produce(following) == Produced(ERROR_NONE, 6)
            gap = await raw.produce(idempotent_batch(pid, epoch, 8, 1))
            assert gap.error_code == ERROR_OUT_OF_ORDER_SEQUENCE_NUMBER

    pid, epoch, batches = asyncio.run(before_restart())
    assert broker.terminate() == 0
    snapshots = [path.name for path in broker.partition_dir(topic, 0).glob("*.snapshot")]
    assert snapshots == [f"{6:020d}.snapshot"]  # written at the clean shutdown
    broker.restart()
    asyncio.run(after_restart(pid, epoch, batches))
    assert ConfluentKafka(broker.bootstrap).earliest_latest(topic, 0) == (0, 7)
