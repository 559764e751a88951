"""The producer against a real Riverbed broker: every setting shows on the wire or on disk.

Segment files are read with kafka-python's record reader (tests/interop/disk.py), so what the
producer wrote is judged by code other than Riverbed's own.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from kafka.record import MemoryRecords
from riverbed.client import connection as connection_module
from riverbed.client.producer import Producer
from riverbed.client.types import RecordMetadata
from riverbed.errors import KafkaTimeoutError, MessageTooLargeError, UnknownTopicOrPartitionError
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.messages import ProduceRequest
from riverbed.protocol.records import RECORD_BATCH_OVERHEAD

from tests.interop.disk import StoredBatch, read_partition
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.waiting import eventually

VALUE = b"v" * 100


@asynccontextmanager
async def producer_for(broker: BrokerProcess, **settings: Any) -> AsyncIterator[Producer]:
    async with Producer(bootstrap_servers=broker.bootstrap, **settings) as producer:
        yield producer


@contextmanager
def paused(broker: BrokerProcess) -> Iterator[None]:
    """SIGSTOP the broker: it accepts bytes into its socket buffer but answers nothing."""
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(broker.pid, signal.SIGCONT)


def stored(broker: BrokerProcess, topic: str, partition: int = 0) -> list[StoredBatch]:
    return read_partition(broker.segment_files(topic, partition))


def stored_records(broker: BrokerProcess, topic: str) -> list[Any]:
    data = b"".join(path.read_bytes() for path in broker.segment_files(topic, 0))
    records = MemoryRecords(data)
    result: list[Any] = []
    while (batch := records.next_batch()) is not None:
        result.extend((batch, record) for record in batch)
    return result


async def test_send_returns_metadata_in_order(broker: BrokerProcess) -> None:
    async with producer_for(broker, acks="all", linger_ms=5) as producer:
        futures = [await producer.send("orders", b"v%d" % i, key=b"k") for i in range(100)]
        metadata = await asyncio.gather(*futures)
        assert producer.status().idempotent  # the default, and the broker has InitProducerId
    assert all(isinstance(m, RecordMetadata) for m in metadata)
    assert [m.offset for m in metadata] == list(range(100))
    assert len({m.partition for m in metadata}) == 1
    assert producer.status().closed


async def test_record_fields_reach_the_log(broker: BrokerProcess) -> None:
    async with producer_for(broker) as producer:
        future = await producer.send(
            "fields", b"value", key=b"key", headers=[("h", b"1"), ("n", None)], timestamp_ms=1234
        )
        await producer.send("fields", None, partition=0)
        metadata = await future
        await producer.flush()
    assert (metadata.offset, metadata.timestamp_ms, metadata.timestamp_type) == (0, 1234, 0)
    (batch, first), (_, second) = stored_records(broker, "fields")
    assert (first.key, first.value, first.timestamp) == (b"key", b"value", 1234)
    assert [(h[0], h[1]) for h in first.headers] == [("h", b"1"), ("n", None)]
    assert second.value is None
    assert batch.producer_id >= 0  # idempotent by default


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_compression_type_compresses_on_disk(broker: BrokerProcess, codec: str) -> None:
    topic = f"compressed-{codec}"
    async with producer_for(broker, compression_type=codec, linger_ms=50) as producer:
        futures = [await producer.send(topic, VALUE) for _ in range(50)]
        await asyncio.gather(*futures)
    batches = stored(broker, topic)
    assert {b.compression for b in batches} == {CompressionType[codec.upper()]}
    assert sum(len(b.values) for b in batches) == 50
    assert all(value == VALUE for b in batches for value in b.values)
    assert sum(b.size_bytes for b in batches) < 50 * len(VALUE) / 2  # 100 equal bytes compress


async def test_linger_ms_holds_records_back_and_batches_them(broker: BrokerProcess) -> None:
    async with producer_for(broker, linger_ms=400) as producer:
        await producer.partitions_for("lingering")
        started = time.monotonic()
        futures = []
        for i in range(10):
            futures.append(await producer.send("lingering", b"%d" % i))
            await asyncio.sleep(0.01)  # the sender gets every chance to run between sends
        await asyncio.gather(*futures)
        waited_s = time.monotonic() - started
    assert waited_s >= 0.35
    assert [len(b.values) for b in stored(broker, "lingering")] == [10]


async def test_batch_size_caps_batches(broker: BrokerProcess) -> None:
    async with producer_for(broker, batch_size=1_000, linger_ms=1_000) as producer:
        futures = [await producer.send("small-batches", VALUE) for _ in range(100)]
        await producer.flush()
        offsets = [(await f).offset for f in futures]
    assert offsets == list(range(100))
    batches = stored(broker, "small-batches")
    assert len(batches) >= 10
    assert max(b.size_bytes for b in batches) <= 1_000 + 100


async def test_acks_0_resolves_without_an_answer(broker: BrokerProcess) -> None:
    async with producer_for(broker, acks=0, linger_ms=0) as producer:
        await (await producer.send("fire-and-forget", VALUE))  # connected, metadata known
        with paused(broker):
            metadata = await asyncio.wait_for(
                await producer.send("fire-and-forget", VALUE), timeout=2
            )
        assert metadata.offset == -1
        assert not producer.status().idempotent  # acks=0 turns default idempotence off


async def test_acks_0_still_blocks_send_when_the_broker_reads_nothing(
    broker: BrokerProcess,
) -> None:
    # An acks=0 batch counts as sent once written; written into a connection whose socket is
    # full it must wait for room, or buffer.memory bounds nothing and the transport's buffer
    # grows with every record.
    accepted_bytes_max = 50_000_000  # buffer.memory, socket buffers and in-flight: far less
    value = b"v" * 10_000
    async with producer_for(
        broker, acks=0, linger_ms=0, buffer_memory=1_000_000, max_block_ms=60_000
    ) as producer:
        await (await producer.send("fire-hose", value))
        with paused(broker):
            accepted = 0
            blocked = False
            while accepted < accepted_bytes_max:
                sending = asyncio.ensure_future(producer.send("fire-hose", value))
                done, _ = await asyncio.wait({sending}, timeout=1.0)
                if not done:
                    blocked = True
                    break
                accepted += len(value)
            assert blocked, f"{accepted} bytes accepted while the broker read nothing"
        await sending  # room again once the broker reads
        await producer.flush()


async def test_acks_all_waits_for_the_answer(broker: BrokerProcess) -> None:
    async with producer_for(broker, acks="all", linger_ms=0) as producer:
        await (await producer.send("acked", VALUE))
        with paused(broker):
            future = await producer.send("acked", VALUE)
            # Sent, and unanswered while the broker is stopped: not acknowledged meanwhile.
            await eventually(lambda: sum(producer._sender._node_in_flight.values()) == 1)
            assert not future.done()
        assert (await future).offset == 1


async def test_buffer_memory_blocks_send_and_cancel_leaves_producer_usable(
    broker: BrokerProcess,
) -> None:
    async with producer_for(broker, buffer_memory=20_000, batch_size=2_000) as producer:
        await (await producer.send("bounded", VALUE))
        with paused(broker):
            sent = []
            blocked = None
            for _ in range(1_000):
                task = asyncio.ensure_future(producer.send("bounded", VALUE))
                await asyncio.sleep(0)
                await asyncio.sleep(0)
                if not task.done():
                    blocked = task
                    break
                sent.append(task.result())
            assert blocked is not None, "send() never waited for buffer space"
            assert producer.status().buffered_bytes <= 20_000
            # Nothing frees space while the broker is stopped: still waiting a while later (the
            # wait is the subject; max_block_ms is a minute).
            await asyncio.sleep(0.3)
            assert not blocked.done()
            blocked.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocked
        # Usable after the cancellation: everything accepted before it and after it arrives.
        after = await producer.send("bounded", b"after")
        await producer.flush()
        offsets = [(await f).offset for f in [*sent, after]]
    assert offsets == list(range(1, len(sent) + 2))


async def test_max_block_ms_bounds_the_wait_for_space(broker: BrokerProcess) -> None:
    # The topic exists first: its creation through ZooKeeper may take longer than 300 ms on a
    # loaded machine, and this test is about the wait for buffer space.
    async with producer_for(broker) as creator:
        await (await creator.send("blocked", VALUE))
    async with producer_for(
        broker, buffer_memory=2_000, batch_size=1_000, max_block_ms=300
    ) as producer:
        await (await producer.send("blocked", VALUE))

        async def fill_the_buffer() -> None:
            for _ in range(100):
                await producer.send("blocked", VALUE)

        with paused(broker), pytest.raises(KafkaTimeoutError):
            await fill_the_buffer()
        await producer.flush()


async def test_request_and_delivery_timeouts_fail_the_future(broker: BrokerProcess) -> None:
    async with producer_for(
        broker, linger_ms=0, request_timeout_ms=300, delivery_timeout_ms=1_000
    ) as producer:
        await (await producer.send("timeouts", VALUE))
        with paused(broker):
            started = time.monotonic()
            future = await producer.send("timeouts", VALUE)
            with pytest.raises(KafkaTimeoutError):
                await asyncio.wait_for(future, timeout=5)
            assert 0.9 <= time.monotonic() - started < 3


async def test_retries_0_fails_on_the_first_error(broker: BrokerProcess) -> None:
    async with producer_for(
        broker, linger_ms=0, retries=0, request_timeout_ms=300, delivery_timeout_ms=10_000
    ) as producer:
        assert not producer.settings.enable_idempotence  # retries=0 turns it off
        await (await producer.send("no-retries", VALUE))
        with paused(broker):
            started = time.monotonic()
            future = await producer.send("no-retries", VALUE)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(future, timeout=5)
            assert time.monotonic() - started < 2  # not the 10 s delivery timeout


async def test_max_in_flight_limits_unanswered_requests(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_flight_max = 0
    original = connection_module.BrokerConnection.send_nowait

    def counting(self: Any, body: Any, **kwargs: Any) -> Any:
        nonlocal in_flight_max
        if isinstance(body, ProduceRequest):
            in_flight_max = max(in_flight_max, self.in_flight_count + 1)
        return original(self, body, **kwargs)

    monkeypatch.setattr(connection_module.BrokerConnection, "send_nowait", counting)
    for limit in (1, 3):
        in_flight_max = 0
        async with producer_for(
            broker, max_in_flight_requests_per_connection=limit, batch_size=200, linger_ms=0
        ) as producer:
            for _ in range(300):
                await producer.send(f"in-flight-{limit}", VALUE)
            await producer.flush()
        assert in_flight_max == limit


async def test_unknown_topic_fails_after_max_block_ms(broker_factory: BrokerFactory) -> None:
    broker = broker_factory({"auto.create.topics.enable": "false"})
    async with producer_for(broker, max_block_ms=800) as producer:
        started = time.monotonic()
        with pytest.raises(UnknownTopicOrPartitionError):
            await producer.send("does-not-exist", VALUE)
        assert 0.7 <= time.monotonic() - started < 5


async def test_record_larger_than_max_request_size_is_refused(broker: BrokerProcess) -> None:
    async with producer_for(broker, max_request_size=1_000) as producer:
        with pytest.raises(MessageTooLargeError):
            await producer.send("large", b"x" * 2_000)


async def test_enable_idempotence_false_sends_no_producer_id(broker: BrokerProcess) -> None:
    async with producer_for(broker, enable_idempotence=False) as producer:
        await (await producer.send("plain", VALUE))
        assert not producer.status().idempotent
    ((batch, _),) = stored_records(broker, "plain")
    assert batch.producer_id == -1


async def test_requests_leave_in_sequence_order_while_a_connection_opens(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches made while the leader's connection is still opening wait in the accumulator, not
    in request tasks: such a task once went out after a later one that found the connection
    open, and the broker refused the earlier sequence (OUT_OF_ORDER_SEQUENCE_NUMBER). The race
    itself depends on scheduling; what rules it out is that no request exists before the
    connection does."""
    sent_sequences: list[int] = []
    producers: list[Producer] = []
    requests_while_opening: list[int] = []
    original_send = connection_module.BrokerConnection.send_nowait
    original_open = connection_module.BrokerConnection.open.__func__  # type: ignore[attr-defined]
    opens = 0

    async def slow_open(cls: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal opens
        opens += 1
        connection = await original_open(cls, *args, **kwargs)
        if opens > 1:  # the leader's connection (the first is the bootstrap one)
            await asyncio.sleep(0.2)  # records are sent meanwhile
            requests_while_opening.append(sum(producers[0]._sender._node_in_flight.values()))
        return connection

    def recording(self: Any, body: Any, **kwargs: Any) -> Any:
        if isinstance(body, ProduceRequest):
            for topic in body.topic_data:
                for data in topic.partition_data:
                    assert isinstance(data.records, bytes | memoryview)
                    batch = MemoryRecords(bytes(data.records)).next_batch()
                    sent_sequences.append(batch.base_sequence)
        return original_send(self, body, **kwargs)

    monkeypatch.setattr(connection_module.BrokerConnection, "open", classmethod(slow_open))
    monkeypatch.setattr(connection_module.BrokerConnection, "send_nowait", recording)
    async with producer_for(broker, linger_ms=0, max_in_flight_requests_per_connection=5) as p:
        producers.append(p)
        futures = []
        for i in range(60):
            futures.append(await p.send("opening", VALUE, partition=0))
            await asyncio.sleep(0.005 if i % 2 else 0)
        offsets = [(await future).offset for future in futures]
    assert requests_while_opening, requests_while_opening
    assert not any(requests_while_opening), requests_while_opening
    assert offsets == sorted(offsets)
    assert sent_sequences, sent_sequences
    assert sent_sequences == sorted(sent_sequences), sent_sequences


async def test_batch_size_holds_as_many_records_as_their_encoding_allows(
    broker: BrokerProcess,
) -> None:
    # A 100-byte value without key or headers takes 110 bytes in a batch (Kafka's Java client
    # fits 148 in 16 KiB). Sized by a worst case of 136 bytes a batch held 120 records.
    async with producer_for(broker, batch_size=16_384, linger_ms=1_000) as producer:
        for _ in range(1_000):
            await producer.send("filled", VALUE, partition=0)
        await producer.flush()
    batches = stored(broker, "filled")
    full = batches[:-1]
    assert full
    for batch in full:
        records = batch.last_offset - batch.base_offset + 1
        assert batch.size_bytes - RECORD_BATCH_OVERHEAD <= 16_384
        assert records >= 140, f"a batch of {batch.size_bytes} bytes holds only {records} records"


@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (None, b"", None),
        (b"k" * 63, b"v" * 63, None),  # lengths just below a second varint byte
        (b"k" * 64, b"v" * 8_000, None),  # a record just below 8 KiB
        (None, b"v" * 8_200, None),  # just above: sized exactly
        (b"k", b"v" * 100_000, [("h" * 70, b"x" * 200), ("\u00e9t\u00e9", None)]),
    ],
)
async def test_buffered_bytes_never_undercount_the_encoded_records(
    broker: BrokerProcess, key: bytes | None, value: bytes, headers: Any
) -> None:
    # buffer.memory and batch.size are only bounds if no record takes more bytes in its batch
    # than send() counted for it.
    records = min(50, 500_000 // (len(value) + 100))  # all in one batch
    async with producer_for(broker, linger_ms=60_000, batch_size=1_000_000) as producer:
        for _ in range(records):
            await producer.send("sized", value, key=key, headers=headers, partition=0)
        counted = producer.status().buffered_bytes
        await producer.flush()
    (batch,) = stored(broker, "sized")
    encoded = batch.size_bytes - RECORD_BATCH_OVERHEAD
    assert encoded <= counted <= encoded + records * 8  # at most a few bytes over, per record
