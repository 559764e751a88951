"""The Consumer against a real Riverbed broker: every setting, positions, and interop with
records written by confluent-kafka and kcat in every codec."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Sequence

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from riverbed.client.consumer import Consumer, ConsumerState, OffsetAndTimestamp
from riverbed.client.positions import FetchState
from riverbed.client.types import Record, TopicPartition
from riverbed.errors import OffsetOutOfRangeError

from tests.support.broker import BrokerProcess
from tests.support.waiting import eventually

KCAT = "/usr/bin/kcat"
TIMEOUT_S = 30.0
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
Headers = Sequence[tuple[str, bytes | None]]


def create_topic(broker: BrokerProcess, partitions: int = 1) -> str:
    name = f"consumer-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT_S)
    return name


def produce(
    broker: BrokerProcess,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None, Headers, int]],
    *,
    partition: int = 0,
    compression_type: str = "none",
) -> None:
    """Write (key, value, headers, timestamp_ms) records with confluent-kafka, acks=all."""
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "linger.ms": 5,
            "acks": "all",
            "compression.type": compression_type,
        }
    )
    for key, value, headers, timestamp_ms in records:
        producer.produce(
            topic, value, key, partition=partition, headers=list(headers), timestamp=timestamp_ms
        )
    assert producer.flush(TIMEOUT_S) == 0


def simple(count: int, start: int = 0) -> list[tuple[bytes | None, bytes | None, Headers, int]]:
    return [(None, b"v%d" % i, (), 1_700_000_000_000 + i) for i in range(start, start + count)]


async def read(consumer: Consumer, count: int) -> list[Record]:
    out: list[Record] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(out) < count and time.monotonic() < deadline:
        for records in (await consumer.getmany(timeout_ms=500)).values():
            out += records
    return out


def consumer(broker: BrokerProcess, **settings: object) -> Consumer:
    return Consumer(bootstrap_servers=broker.bootstrap, **settings)


def fetch_in_flight(c: Consumer) -> bool:
    """Whether the consumer's fetch went out and awaits its answer."""
    pool, fetcher = c._pool, c._fetcher
    return (
        pool is not None
        and fetcher is not None
        and any(
            (connection := pool.open_connection(node)) is not None
            and connection.in_flight_count > 0
            for node in fetcher.fetching_nodes
        )
    )


# -- positions --------------------------------------------------------------------------------
async def test_seek_position_and_seek_to_either_end(broker: BrokerProcess) -> None:
    topic = create_topic(broker)
    produce(broker, topic, simple(10))
    tp = TopicPartition(topic, 0)
    async with consumer(broker) as c:
        assert c.state is ConsumerState.RUNNING
        c.assign([tp])
        assert c.assignment() == frozenset({tp})
        await c.seek_to_beginning()
        assert await c.position(tp) == 0
        c.seek(tp, 7)
        assert [r.offset for r in await read(c, 3)] == [7, 8, 9]
        assert await c.position(tp) == 10
        assert c.highwater(tp) == 10
        await c.seek_to_beginning(tp)
        assert (await c.getmany(max_records=2, timeout_ms=5000))[tp][0].offset == 0
        await c.seek_to_end(tp)
        assert await c.position(tp) == 10
        assert await c.getmany(timeout_ms=300) == {}
    assert c.state.value == ConsumerState.CLOSED.value


async def test_offsets_for_times_finds_the_first_record_at_or_after(broker: BrokerProcess) -> None:
    topic = create_topic(broker)
    produce(broker, topic, [(None, b"x", (), ts) for ts in (1_000, 2_000, 3_000)])
    tp = TopicPartition(topic, 0)
    async with consumer(broker) as c:
        c.assign([tp])
        found = await c.offsets_for_times({tp: 1_500})
        assert found == {tp: OffsetAndTimestamp(1, 2_000)}
        assert await c.offsets_for_times({tp: 9_000}) == {tp: None}


async def test_auto_offset_reset_earliest_and_latest(broker: BrokerProcess) -> None:
    topic = create_topic(broker)
    produce(broker, topic, simple(5))
    tp = TopicPartition(topic, 0)
    async with consumer(broker, auto_offset_reset="earliest") as earliest:
        earliest.assign([tp])
        assert [r.offset for r in await read(earliest, 5)] == [0, 1, 2, 3, 4]
        earliest.seek(tp, 1_000)  # out of range: back to the log start
        assert (await read(earliest, 1))[0].offset == 0
    async with consumer(broker, auto_offset_reset="latest") as latest:
        latest.assign([tp])
        assert await latest.position(tp) == 5
        assert await latest.getmany(timeout_ms=300) == {}
        produce(broker, topic, simple(1, start=5))
        assert [r.value for r in await read(latest, 1)] == [b"v5"]


async def test_auto_offset_reset_none_raises_until_seeked(broker: BrokerProcess) -> None:
    topic = create_topic(broker)
    produce(broker, topic, simple(3))
    tp = TopicPartition(topic, 0)
    async with consumer(broker, auto_offset_reset="none") as c:
        c.assign([tp])
        with pytest.raises(OffsetOutOfRangeError):
            await c.getmany(timeout_ms=5000)
        assert c.partition_state(tp) is FetchState.FAILED
        c.seek(tp, 50)  # beyond the end: the broker answers OFFSET_OUT_OF_RANGE
        with pytest.raises(OffsetOutOfRangeError):
            await c.getmany(timeout_ms=5000)
        c.seek(tp, 1)
        assert [r.offset for r in await read(c, 2)] == [1, 2]


# -- fetch settings ---------------------------------------------------------------------------
async def test_fetch_min_bytes_makes_the_broker_wait_fetch_max_wait_ms(
    broker: BrokerProcess,
) -> None:
    topic = create_topic(broker)
    tp = TopicPartition(topic, 0)

    async def latency(**settings: object) -> float:
        async with consumer(broker, auto_offset_reset="latest", **settings) as c:
            c.assign([tp])
            await c.position(tp)
            await eventually(lambda: fetch_in_flight(c))  # parked on the broker: nothing to read
            started = time.monotonic()
            await asyncio.to_thread(produce, broker, topic, simple(1))
            records = await read(c, 1)
            assert len(records) == 1
            return time.monotonic() - started

    # One small record never reaches fetch_min_bytes: the broker answers at fetch_max_wait_ms.
    assert await latency(fetch_min_bytes=1_000_000, fetch_max_wait_ms=1_500) > 1.0
    assert await latency(fetch_min_bytes=1, fetch_max_wait_ms=1_500) < 1.0


async def test_max_partition_fetch_bytes_bounds_what_one_fetch_returns(
    broker: BrokerProcess,
) -> None:
    topic = create_topic(broker)
    # Ten batches of ten records each.
    for start in range(0, 100, 10):
        produce(broker, topic, simple(10, start))
    tp = TopicPartition(topic, 0)

    async def first_getmany(**settings: object) -> int:
        async with consumer(broker, **settings) as c:
            c.assign([tp])
            c.seek(tp, 0)
            batches = await c.getmany(max_records=1_000, timeout_ms=5000)
            return len(batches[tp])

    # A fetch holds at least one whole batch (KIP-74), and no more when the limit is tiny.
    assert await first_getmany(max_partition_fetch_bytes=1) <= 20
    assert await first_getmany() == 100


async def test_max_records_and_several_partitions_read_together(broker: BrokerProcess) -> None:
    topic = create_topic(broker, partitions=3)
    for partition in range(3):
        produce(broker, topic, simple(50, start=partition * 100), partition=partition)
    tps = [TopicPartition(topic, p) for p in range(3)]
    async with consumer(broker, auto_offset_reset="earliest") as c:
        c.assign(tps)
        got: dict[TopicPartition, list[bytes | None]] = {tp: [] for tp in tps}
        deadline = time.monotonic() + TIMEOUT_S
        while sum(map(len, got.values())) < 150 and time.monotonic() < deadline:
            batches = await c.getmany(max_records=40, timeout_ms=500)
            assert sum(map(len, batches.values())) <= 40
            for tp, records in batches.items():
                got[tp] += [r.value for r in records]
    for partition, tp in enumerate(tps):
        assert got[tp] == [b"v%d" % i for i in range(partition * 100, partition * 100 + 50)]


async def test_read_committed_reads_plain_records_and_async_for_yields_them(
    broker: BrokerProcess,
) -> None:
    topic = create_topic(broker)
    produce(broker, topic, simple(3))
    tp = TopicPartition(topic, 0)
    async with consumer(broker, isolation_level="read_committed") as c:
        c.assign([tp])
        c.seek(tp, 0)
        offsets = []
        async for record in c:
            offsets.append(record.offset)
            if len(offsets) == 3:
                break
        assert offsets == [0, 1, 2]
        assert c.last_stable_offset(tp) == 3


# -- interop ----------------------------------------------------------------------------------
def varied_records(count: int) -> list[tuple[bytes | None, bytes | None, Headers, int]]:
    records: list[tuple[bytes | None, bytes | None, Headers, int]] = []
    for i in range(count):
        key = None if i % 5 == 0 else bytes([i % 256]) * (i % 40)
        value = None if i % 7 == 3 else bytes(range(256)) * (i % 9) + b"#%d" % i
        headers: Headers = [] if i % 3 else [("h\u00e9", b"\x00\xff"), ("empty", None)]
        records.append((key, value, headers, 1_600_000_000_000 + i * 1_000))
    return records


@pytest.mark.parametrize("codec", CODECS)
async def test_reads_confluent_kafka_records_byte_exact(broker: BrokerProcess, codec: str) -> None:
    topic = create_topic(broker)
    sent = varied_records(300)
    produce(broker, topic, sent, compression_type=codec)
    tp = TopicPartition(topic, 0)
    async with consumer(broker, auto_offset_reset="earliest") as c:
        c.assign([tp])
        records = await read(c, len(sent))
    got = [(r.key, r.value, list(r.headers), r.timestamp_ms) for r in records]
    assert got == [(k, v, list(h), ts) for k, v, h, ts in sent]
    assert [r.offset for r in records] == list(range(len(sent)))


@pytest.mark.parametrize("codec", CODECS)
async def test_reads_kcat_records_byte_exact(broker: BrokerProcess, codec: str) -> None:
    topic = create_topic(broker)
    lines = [(b"key%d" % i, b"value \x01\xfe %d" % i) for i in range(200)]
    stdin = b"".join(k + b"\t" + v + b"\n" for k, v in lines)
    await asyncio.to_thread(
        subprocess.run,
        [KCAT, "-b", broker.bootstrap, "-P", "-t", topic, "-p", "0", "-K", "\t", "-z", codec,
         "-H", "origin=kcat", "-X", "acks=all"],
        input=stdin, check=True, capture_output=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    read_back = await asyncio.to_thread(
        subprocess.run,
        [KCAT, "-b", broker.bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning", "-e",
         "-q", "-f", "%T\n"],
        check=True, capture_output=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    timestamps = read_back.stdout.split()
    tp = TopicPartition(topic, 0)
    async with consumer(broker, auto_offset_reset="earliest") as c:
        c.assign([tp])
        records = await read(c, len(lines))
    assert [(r.key, r.value) for r in records] == lines
    assert all(r.headers == (("origin", b"kcat"),) for r in records)
    assert [r.timestamp_ms for r in records] == [int(t) for t in timestamps]
