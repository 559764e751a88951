"""Third-party transactional clients against real brokers: what the coordinator tests share.

Producers and consumers of confluent-kafka (librdkafka), aiokafka and kafka-python, built the way
their users build them; `committed_values` reads a topic at an isolation level with each client's
consumer, and `describe` / `list_states` ask the coordinators through kafka-python's admin
(DescribeTransactions / ListTransactions: confluent-kafka 2.16 has no such admin methods).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import confluent_kafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient
from riverbed import Admin, Consumer
from riverbed.client.types import TopicPartition as RiverbedTopicPartition

# One broker: the transaction state topic and the offsets topic get one replica, and few
# partitions so that the broker loads them quickly; timed-out transactions are looked for often.
ONE_BROKER_SETTINGS: Final = {
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "5",
    "offsets.topic.replication.factor": "1",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
}
TIMEOUT_S: Final = 30
PARTITIONS: Final = 3
QUIET_S: Final = 1.5  # how long a reader waits for records that must not come


async def create_topic(
    bootstrap: str, topic: str, partitions: int = 1, replication_factor: int = 1
) -> None:
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic(
            topic, partitions=partitions, replication_factor=replication_factor
        )


def confluent_producer(bootstrap: str, transactional_id: str, **extra: Any) -> Any:
    return confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "linger.ms": 5,
            **extra,
        }
    )


# -- producing ------------------------------------------------------------------------------


def values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


def produce_confluent(bootstrap: str, transactional_id: str, topic: str) -> None:
    """Commit c1, abort a, commit c2; the partitions spread over the topic."""
    producer = confluent_producer(bootstrap, transactional_id)
    producer.init_transactions(30)
    for prefix, commit in (("c1", True), ("a", False), ("c2", True)):
        producer.begin_transaction()
        for i, value in enumerate(values(prefix, 6)):
            producer.produce(topic, value, partition=i % PARTITIONS)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


def produce_kafka_python(bootstrap: str, transactional_id: str, topic: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id)
    try:
        producer.init_transactions()
        for prefix, commit in (("c1", True), ("a", False), ("c2", True)):
            producer.begin_transaction()
            for i, value in enumerate(values(prefix, 6)):
                producer.send(topic, value, partition=i % PARTITIONS)
            producer.flush()
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close()


class _Abort(Exception):
    pass


async def produce_aiokafka(bootstrap: str, transactional_id: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id)
    await producer.start()
    try:
        for prefix, commit in (("c1", True), ("a", False), ("c2", True)):
            try:
                async with producer.transaction():
                    for i, value in enumerate(values(prefix, 6)):
                        await producer.send_and_wait(topic, value, partition=i % PARTITIONS)
                    if not commit:
                        raise _Abort  # leaving the block with an exception aborts
            except _Abort:
                pass
    finally:
        await producer.stop()


async def produce_commit_abort_commit(
    client: str, bootstrap: str, transactional_id: str, topic: str
) -> None:
    """With `client`'s transactional producer: commit c1-*, abort a-*, commit c2-*."""
    if client == "confluent-kafka":
        await asyncio.to_thread(produce_confluent, bootstrap, transactional_id, topic)
    elif client == "kafka-python":
        await asyncio.to_thread(produce_kafka_python, bootstrap, transactional_id, topic)
    else:
        await produce_aiokafka(bootstrap, transactional_id, topic)


# -- reading back -----------------------------------------------------------------------------


def read_confluent(
    bootstrap: str, topic: str, isolation: str, partitions: int, expected: int
) -> list[bytes]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(partitions)
            ]
        )
        values: list[bytes] = []
        _drain(lambda: _poll_confluent(consumer), values, expected)
        return values
    finally:
        consumer.close()


def _poll_confluent(consumer: Any) -> list[bytes]:
    message = consumer.poll(0.2)
    if message is None or message.error() is not None:
        return []
    return [message.value()]


def read_kafka_python(
    bootstrap: str, topic: str, isolation: str, partitions: int, expected: int
) -> list[bytes]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False
    )
    try:
        tps = [KafkaTopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        values: list[bytes] = []

        def poll() -> list[bytes]:
            batches = consumer.poll(timeout_ms=200)
            return [record.value for records in batches.values() for record in records]

        _drain(poll, values, expected)
        return values
    finally:
        consumer.close()


async def read_aiokafka(
    bootstrap: str, topic: str, isolation: str, partitions: int, expected: int
) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < expected and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                values += [r.value for r in records if r.value is not None]
        quiet_until = time.monotonic() + QUIET_S
        while time.monotonic() < quiet_until:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                values += [r.value for r in records if r.value is not None]
        return values
    finally:
        await consumer.stop()


async def read_riverbed(
    bootstrap: str, topic: str, isolation: str, partitions: int, expected: int
) -> list[bytes]:
    tps = [RiverbedTopicPartition(topic, p) for p in range(partitions)]
    values: list[bytes] = []
    async with Consumer(bootstrap_servers=bootstrap, isolation_level=isolation) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + TIMEOUT_S
        quiet_until: float | None = None
        while quiet_until is None or time.monotonic() < quiet_until:
            for records in (await consumer.getmany(*tps, timeout_ms=200)).values():
                values += [r.value for r in records if r.value is not None]
            if quiet_until is None and (len(values) >= expected or time.monotonic() > deadline):
                quiet_until = time.monotonic() + QUIET_S
    return values


def _drain(poll: Callable[[], list[bytes]], values: list[bytes], expected: int) -> None:
    """Poll until `expected` values came, then QUIET_S longer to see that no more come."""
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < expected and time.monotonic() < deadline:
        values += poll()
    quiet_until = time.monotonic() + QUIET_S
    while time.monotonic() < quiet_until:
        values += poll()


async def read_all_clients(
    bootstrap: str, topic: str, isolation: str, partitions: int, expected: int
) -> dict[str, list[bytes]]:
    """What each client's consumer reads of `topic` at `isolation`, sorted."""
    return {
        "confluent-kafka": sorted(
            await asyncio.to_thread(
                read_confluent, bootstrap, topic, isolation, partitions, expected
            )
        ),
        "kafka-python": sorted(
            await asyncio.to_thread(
                read_kafka_python, bootstrap, topic, isolation, partitions, expected
            )
        ),
        "aiokafka": sorted(await read_aiokafka(bootstrap, topic, isolation, partitions, expected)),
        "riverbed": sorted(await read_riverbed(bootstrap, topic, isolation, partitions, expected)),
    }


# -- the coordinator's view -------------------------------------------------------------------


def describe(bootstrap: str, transactional_id: str) -> Any:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return admin.describe_transactions([transactional_id])[transactional_id]
    finally:
        admin.close()


def list_states(bootstrap: str, state_filters: Sequence[str] | None = None) -> dict[str, str]:
    """transactional id -> state name, from every broker."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        by_broker = admin.list_transactions(state_filters=list(state_filters or []) or None)
        return {
            t.transactional_id: str(t.state.value)
            for listings in by_broker.values()
            for t in listings
        }
    finally:
        admin.close()


def wait_state(
    bootstrap: str, transactional_id: str, state: str, timeout_s: float = TIMEOUT_S
) -> Any:
    """The description once the id is in `state` (AssertionError with the last one if never)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = describe(bootstrap, transactional_id)
        except Exception as error:  # not yet coordinated (a failover): asked again
            last = error
        else:
            if str(last.state.value) == state:
                return last
        time.sleep(0.2)
    raise AssertionError(f"{transactional_id} never reached {state}: last {last!r}")
