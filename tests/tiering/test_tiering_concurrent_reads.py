"""Consumers reading from offset 0 across cold -> hot while the partition keeps moving under them:
a producer keeps appending, the leader keeps tiering sealed segments and local retention keeps
deleting the uploaded ones (`local.retention.bytes=1`), so the local log start passes offsets
the readers have not reached yet. Four consumers written by different people (Riverbed's,
librdkafka through confluent-kafka, aiokafka, kafka-python) read at the same time; each must get
every record exactly once, in order, with its key, value, headers and timestamp byte-exact.
Run on both stores: file:// and moto's S3 server."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Final

import pytest
from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition

from tests.interop.drivers import DRIVERS, Consumed, Message, ProgressDeadline
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.tiering.test_tiering_broker import TIERED_TOPIC, value_of, wait_until
from tests.tiering.test_tiering_s3_broker import BROKER_SETTINGS, local_start, s3_broker

BEFORE_READERS: Final = 3_000  # records tiered (and deleted locally) before the readers start
WHILE_READING: Final = 9_000  # records produced while they read
ROUND_RECORDS: Final = 300
ROUND_PAUSE_S: Final = 0.15  # spreads production over a few seconds of tiering rounds
TOTAL: Final = BEFORE_READERS + WHILE_READING
BASE_TIMESTAMP_MS: Final = int(time.time() * 1000)


def message_of(i: int) -> Message:
    return Message(
        key=str(i).encode(),
        value=value_of(i),
        headers=(("n", str(i).encode()),),
        timestamp_ms=BASE_TIMESTAMP_MS + i,
    )


EXPECTED: Final = [Consumed(i, message_of(i)) for i in range(TOTAL)]


@pytest.fixture(params=["file", "s3"])
def broker(
    request: pytest.FixtureRequest, broker_factory: BrokerFactory, tmp_path: Path
) -> BrokerProcess:
    if request.param == "s3":
        server = request.getfixturevalue("moto_server")
        return s3_broker(broker_factory, server, request.getfixturevalue("s3_bucket"))
    return broker_factory({"remote.storage.url": f"file://{tmp_path / 'cold'}", **BROKER_SETTINGS})


async def produce(producer: Producer, topic: str, numbers: range) -> None:
    futures = []
    for i in numbers:
        message = message_of(i)
        futures.append(
            await producer.send(
                topic,
                message.value,
                key=message.key,
                headers=list(message.headers),
                partition=0,
                timestamp_ms=message.timestamp_ms,
            )
        )
    await producer.flush()
    assert [(await f).offset for f in futures] == list(numbers)


async def read_with_riverbed(bootstrap: str, topic: str) -> list[Consumed]:
    out: list[Consumed] = []
    async with Consumer(bootstrap_servers=bootstrap) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
        deadline = ProgressDeadline()  # bounded by progress, as the drivers' readers are
        while len(out) < TOTAL and not deadline.passed(len(out)):
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out += [
                    Consumed(
                        r.offset,
                        Message(r.key, r.value, tuple(r.headers), r.timestamp_ms),
                    )
                    for r in records
                ]
    deadline.check(len(out), TOTAL)
    return out


async def test_consumers_read_from_zero_across_cold_and_hot_while_tiering_and_retention_run(
    broker: BrokerProcess,
) -> None:
    topic = f"moving-{uuid.uuid4().hex[:8]}"
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=1, configs=TIERED_TOPIC)
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5) as producer:
        await produce(producer, topic, range(BEFORE_READERS))
        await wait_until(
            lambda: local_start(broker, topic) > BEFORE_READERS // 2,
            "the oldest records only in the cold tier",
        )
        start_at_readers = local_start(broker, topic)

        readers = [asyncio.create_task(read_with_riverbed(broker.bootstrap, topic))] + [
            asyncio.create_task(
                asyncio.to_thread(driver(broker.bootstrap).consume, topic, 0, 0, TOTAL)
            )
            for driver in DRIVERS
        ]
        for first in range(BEFORE_READERS, TOTAL, ROUND_RECORDS):
            await produce(producer, topic, range(first, min(first + ROUND_RECORDS, TOTAL)))
            await asyncio.sleep(ROUND_PAUSE_S)
        results = await asyncio.gather(*readers)

    # The ground moved while they read: tiering and local retention went on past where the
    # local log started when they began at offset 0.
    assert start_at_readers > 0
    assert local_start(broker, topic) > start_at_readers + WHILE_READING // 2
    for name, got in zip(["riverbed", *(d.name for d in DRIVERS)], results, strict=True):
        assert [c.offset for c in got] == list(range(TOTAL)), name
        assert got == EXPECTED, name
