"""Records written by Riverbed's Producer are read byte-exact by clients written by others."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Message, TopicPartition
from riverbed import Admin, Producer

from tests.support.broker import BrokerProcess

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
TIMEOUT_S = 30
RECORDS: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]] = [
    (b"k1", b"plain value", [("h", b"1")], 1_700_000_000_000),
    (None, b"\x00\xff binary \xc3\xa9", [], 1_700_000_000_001),
    (b"k2", b"", [("a", b"x"), ("a", None)], 1_700_000_000_002),
    (b"k3", None, [], 1_600_000_000_000),  # a tombstone, with an older timestamp
]


async def _produce(broker: BrokerProcess, topic: str, codec: str) -> None:
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1)
    async with Producer(bootstrap_servers=broker.bootstrap, compression_type=codec) as producer:
        for key, value, headers, timestamp_ms in RECORDS:
            await producer.send(
                topic, value, key=key, headers=headers, partition=0, timestamp_ms=timestamp_ms
            )
        await producer.flush()


@pytest.mark.parametrize("codec", CODECS)
async def test_confluent_kafka_reads_what_riverbed_wrote(broker: BrokerProcess, codec: str) -> None:
    topic = f"to-confluent-{codec}"
    await _produce(broker, topic, codec)
    consumer = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "x", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    messages: list[Message] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(messages) < len(RECORDS) and time.monotonic() < deadline:
        messages += [m for m in consumer.consume(10, 1.0) if m.error() is None]
    consumer.close()
    got = [(m.key(), m.value(), m.headers() or [], m.timestamp()[1]) for m in messages]
    assert got == RECORDS


@pytest.mark.parametrize("codec", CODECS)
async def test_kcat_reads_what_riverbed_wrote(broker: BrokerProcess, codec: str) -> None:
    topic = f"to-kcat-{codec}"
    await _produce(broker, topic, codec)
    # Length-prefixed output: key and value lengths (-1 for null), timestamp, then the raw bytes.
    read = await asyncio.to_thread(
        subprocess.run,
        ["kcat", "-C", "-b", broker.bootstrap, "-t", topic, "-e", "-q",
         "-f", "%K,%S,%T;%k%s"],
        capture_output=True, check=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert _parse_kcat(read.stdout) == [(k, v, t) for k, v, _, t in RECORDS]


def _parse_kcat(out: bytes) -> list[tuple[bytes | None, bytes | None, int]]:
    records = []
    position = 0
    while position < len(out):
        end = out.index(b";", position)
        key_len, value_len, timestamp = (int(f) for f in out[position:end].split(b","))
        position = end + 1
        key = out[position : position + key_len] if key_len >= 0 else None
        position += max(key_len, 0)
        value = out[position : position + value_len] if value_len >= 0 else None
        position += max(value_len, 0)
        records.append((key, value, timestamp))
    return records
