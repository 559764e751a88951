"""message.timestamp.type: CreateTime keeps the producer's timestamps, LogAppendTime stamps."""

from __future__ import annotations

import time

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import BrokerProcess

OLD_TIMESTAMP_MS = 1_600_000_000_000
TIMEOUT_S = 30


def _produce_and_read(
    broker: BrokerProcess, topic: str, configs: dict[str, str]
) -> list[tuple[int, int]]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(10):
        producer.produce(topic, b"v%d" % i, timestamp=OLD_TIMESTAMP_MS + i)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "t",
            # No group coordinator yet: an auto-commit at close() would wait for one.
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    messages: list[Message] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(messages) < 10 and time.monotonic() < deadline:
        messages.extend(m for m in consumer.consume(10, 1.0) if m.error() is None)
    consumer.close()
    return [m.timestamp() for m in messages]


def test_create_time_keeps_producer_timestamps(broker: BrokerProcess) -> None:
    stamps = _produce_and_read(broker, "create-time", {})
    assert stamps == [(TIMESTAMP_CREATE_TIME, OLD_TIMESTAMP_MS + i) for i in range(10)]


def test_log_append_time_stamps_with_the_broker_clock(broker: BrokerProcess) -> None:
    before_ms = int(time.time() * 1000)
    stamps = _produce_and_read(broker, "append-time", {"message.timestamp.type": "LogAppendTime"})
    after_ms = int(time.time() * 1000)
    assert len(stamps) == 10
    for kind, timestamp_ms in stamps:
        assert kind == TIMESTAMP_LOG_APPEND_TIME
        assert before_ms - 1000 <= timestamp_ms <= after_ms
