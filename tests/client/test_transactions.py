"""Riverbed's transactional producer against a real broker and ZooKeeper: what it commits is read
by read_committed consumers (Riverbed's and confluent-kafka's), what it aborts never is, a second
producer with the same transactional id fences the first, `async with producer.transaction()`
aborts on an exception, and offsets sent to a transaction move a group only when it commits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import confluent_kafka
import pytest
from riverbed import Admin, Consumer, Producer
from riverbed.client.producer import DeliveryFuture
from riverbed.client.transactions import TxnState
from riverbed.client.types import ConsumerGroupMetadata, TopicPartition
from riverbed.errors import (
    MessageTooLargeError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
)

from tests.support.broker import BrokerFactory, BrokerProcess

# One broker: the transaction state topic and the offsets topic get one replica, and a few
# partitions so that the broker loads them quickly.
TXN_BROKER_SETTINGS = {
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
}
TIMEOUT_S = 30
QUIET_MS = 1_000  # how long a reader waits for records that must not come


@pytest.fixture
def txn_broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory(TXN_BROKER_SETTINGS)


async def create_topic(broker: BrokerProcess, topic: str, partitions: int = 1) -> None:
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(topic, partitions=partitions)


@asynccontextmanager
async def transactional(
    broker: BrokerProcess, transactional_id: str, **settings: Any
) -> AsyncIterator[Producer]:
    async with Producer(
        bootstrap_servers=broker.bootstrap, transactional_id=transactional_id, **settings
    ) as producer:
        await producer.init_transactions()
        yield producer


async def read_values(
    broker: BrokerProcess, topic: str, isolation_level: str, expected: int, partitions: int = 1
) -> dict[int, list[bytes]]:
    """Every value of `topic` from the beginning, per partition: read until `expected` values
    came, then QUIET_MS longer to see that no more come."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    values: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    async with Consumer(
        bootstrap_servers=broker.bootstrap, isolation_level=isolation_level
    ) as consumer:
        consumer.assign(tps)
        await consumer.seek_to_beginning()
        deadline = time.monotonic() + TIMEOUT_S
        while sum(map(len, values.values())) < expected and time.monotonic() < deadline:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                values[tp.partition] += [r.value or b"" for r in records]
        for tp, records in (await consumer.getmany(timeout_ms=QUIET_MS)).items():
            values[tp.partition] += [r.value or b"" for r in records]
    return values


async def end_offset(broker: BrokerProcess, tp: TopicPartition, isolation_level: str) -> int:
    async with Consumer(
        bootstrap_servers=broker.bootstrap, isolation_level=isolation_level
    ) as consumer:
        consumer.assign([tp])
        await consumer.seek_to_end()
        return await consumer.position(tp)


def confluent_read_committed(broker: BrokerProcess, topic: str, expected: int) -> list[bytes]:
    """librdkafka's read_committed consumer, from the beginning of partition 0."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"confluent-{topic}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < expected and time.monotonic() < deadline:
            values += [m.value() or b"" for m in consumer.consume(100, 0.5) if m.error() is None]
        values += [
            m.value() or b"" for m in consumer.consume(100, QUIET_MS / 1000) if m.error() is None
        ]
        return values
    finally:
        consumer.close()


async def test_committed_records_are_read_and_aborted_ones_never(txn_broker: BrokerProcess) -> None:
    topic = "txn-commit-abort"
    await create_topic(txn_broker, topic)
    async with transactional(txn_broker, "commit-abort") as producer:
        producer.begin_transaction()
        for i in range(5):
            await producer.send(topic, b"c1-%d" % i, partition=0)
        await producer.commit_transaction()

        producer.begin_transaction()
        aborted = [await producer.send(topic, b"a-%d" % i, partition=0) for i in range(3)]
        await producer.flush()  # written to the log, then aborted
        await producer.abort_transaction()
        assert [(await f).offset for f in aborted] == [6, 7, 8]  # after c1 and its marker

        producer.begin_transaction()
        for i in range(2):
            await producer.send(topic, b"c2-%d" % i, partition=0)
        await producer.commit_transaction()
        assert producer.transaction_state is TxnState.READY

    committed = [b"c1-%d" % i for i in range(5)] + [b"c2-%d" % i for i in range(2)]
    read_committed = await read_values(txn_broker, topic, "read_committed", len(committed))
    assert read_committed[0] == committed
    # The aborted records are in the log: a read_uncommitted consumer sees them (markers never).
    read_uncommitted = await read_values(txn_broker, topic, "read_uncommitted", 10)
    assert read_uncommitted[0] == [*committed[:5], b"a-0", b"a-1", b"a-2", *committed[5:]]
    confluent = await asyncio.to_thread(confluent_read_committed, txn_broker, topic, len(committed))
    assert confluent == committed


async def test_an_open_transaction_is_hidden_until_it_commits(txn_broker: BrokerProcess) -> None:
    topic = "txn-open"
    await create_topic(txn_broker, topic, partitions=2)
    async with transactional(txn_broker, "open") as producer:
        producer.begin_transaction()
        for i in range(4):  # both partitions: one AddPartitionsToTxn names them both
            await producer.send(topic, b"v%d" % i, partition=i % 2)
        await producer.flush()
        hidden = await read_values(txn_broker, topic, "read_committed", 0, partitions=2)
        assert hidden == {0: [], 1: []}
        # ListOffsets "latest" honours the isolation level: the LSO for read_committed.
        assert await end_offset(txn_broker, TopicPartition(topic, 0), "read_committed") == 0
        assert await end_offset(txn_broker, TopicPartition(topic, 0), "read_uncommitted") == 2
        seen = await read_values(txn_broker, topic, "read_uncommitted", 4, partitions=2)
        assert seen == {0: [b"v0", b"v2"], 1: [b"v1", b"v3"]}
        await producer.commit_transaction()
    visible = await read_values(txn_broker, topic, "read_committed", 4, partitions=2)
    assert visible == {0: [b"v0", b"v2"], 1: [b"v1", b"v3"]}


async def test_a_second_producer_with_the_same_id_fences_the_first(
    txn_broker: BrokerProcess,
) -> None:
    topic = "txn-fencing"
    await create_topic(txn_broker, topic)
    async with transactional(txn_broker, "fenced-id") as zombie:
        zombie.begin_transaction()
        await zombie.send(topic, b"zombie", partition=0)
        await zombie.flush()
        async with transactional(txn_broker, "fenced-id") as successor:
            # The successor's init_transactions() aborted the zombie's open transaction.
            assert successor.status().producer_epoch > zombie.status().producer_epoch
            with pytest.raises(ProducerFencedError, match="fenced-id"):
                await zombie.commit_transaction()
            assert zombie.transaction_state is TxnState.FATAL_ERROR
            with pytest.raises(ProducerFencedError):
                zombie.begin_transaction()
            async with successor.transaction():
                await successor.send(topic, b"successor", partition=0)
    values = await read_values(txn_broker, topic, "read_committed", 1)
    assert values[0] == [b"successor"]


async def test_async_with_aborts_on_an_exception(txn_broker: BrokerProcess) -> None:
    topic = "txn-context"
    await create_topic(txn_broker, topic)
    async with transactional(txn_broker, "context", linger_ms=10_000) as producer:
        futures: list[DeliveryFuture] = []

        async def process() -> None:
            async with producer.transaction():
                futures.append(await producer.send(topic, b"sent-then-aborted", partition=0))
                await producer.flush()
                futures.append(await producer.send(topic, b"never-sent", partition=0))
                raise ValueError("processing failed")

        with pytest.raises(ValueError, match="processing failed"):
            await process()
        sent, unsent = futures
        assert producer.transaction_state is TxnState.READY
        assert (await sent).offset == 0
        with pytest.raises(TransactionAbortedError):
            await unsent  # lingering when the abort came: dropped, never written
        async with producer.transaction():
            await producer.send(topic, b"committed", partition=0)
    assert (await read_values(txn_broker, topic, "read_committed", 1))[0] == [b"committed"]
    uncommitted = await read_values(txn_broker, topic, "read_uncommitted", 2)
    assert uncommitted[0] == [b"sent-then-aborted", b"committed"]


async def test_offsets_sent_to_a_transaction_move_the_group_only_on_commit(
    txn_broker: BrokerProcess,
) -> None:
    source, sink, group = "txn-source", "txn-sink", "txn-group"
    await create_topic(txn_broker, source)
    await create_topic(txn_broker, sink)
    async with Producer(bootstrap_servers=txn_broker.bootstrap) as plain:
        for i in range(6):
            await plain.send(source, b"in-%d" % i, partition=0)
    tp = TopicPartition(source, 0)
    async with Consumer(
        bootstrap_servers=txn_broker.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    ) as consumer:
        consumer.subscribe([source])
        records: list[Any] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(records) < 6 and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records += batch
        assert [r.value for r in records] == [b"in-%d" % i for i in range(6)]
        metadata = consumer.group_metadata()
        assert metadata.group_id == group
        assert metadata.generation_id >= 1
        assert metadata.member_id == consumer.member_id

        async with transactional(txn_broker, "consume-transform-produce") as producer:
            producer.begin_transaction()
            await producer.send(sink, b"out-aborted", partition=0)
            await producer.send_offsets_to_transaction({tp: 3}, metadata)
            await producer.abort_transaction()
            assert (await consumer.committed([tp]))[tp] is None

            async with producer.transaction():
                await producer.send(sink, b"out-committed", partition=0)
                await producer.send_offsets_to_transaction({tp: 6}, consumer.group_metadata())
            committed = (await consumer.committed([tp]))[tp]
            assert committed is not None
            assert committed.offset == 6

            # KIP-447: offsets from a member the group no longer knows are refused, and only
            # the transaction fails (abortable), not the producer.
            producer.begin_transaction()
            stale = ConsumerGroupMetadata(group, metadata.generation_id, "gone-member")
            with pytest.raises(TransactionAbortableError):
                await producer.send_offsets_to_transaction({tp: 1}, stale)
            assert producer.transaction_state is TxnState.ABORTABLE_ERROR
            await producer.abort_transaction()
            assert (await consumer.committed([tp]))[tp] == committed
    assert (await read_values(txn_broker, sink, "read_committed", 1))[0] == [b"out-committed"]


async def test_a_refused_record_makes_the_transaction_abortable(
    txn_broker: BrokerProcess,
) -> None:
    topic = "txn-refused"
    async with Admin(bootstrap_servers=txn_broker.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1, configs={"max.message.bytes": "300"})
    async with transactional(txn_broker, "refused") as producer:
        epoch = producer.status().producer_epoch
        producer.begin_transaction()
        await producer.send(topic, b"small", partition=0)
        await producer.flush()
        refused = await producer.send(topic, b"x" * 1_000, partition=0)  # over the topic's limit
        with pytest.raises(TransactionAbortableError, match="refused"):
            await producer.commit_transaction()
        assert producer.transaction_state is TxnState.ABORTABLE_ERROR
        with pytest.raises(MessageTooLargeError):
            await refused  # the record's own error; the transaction's is abortable
        await producer.abort_transaction()
        # The refused batch had a sequence number: the abort got a new epoch, which restarts
        # every sequence, so the next transaction's records are accepted.
        assert producer.status().producer_epoch > epoch
        async with producer.transaction():
            await producer.send(topic, b"after", partition=0)
    assert (await read_values(txn_broker, topic, "read_committed", 1))[0] == [b"after"]
