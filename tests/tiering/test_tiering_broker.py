"""Tiering end to end with a real broker process and a file:// object store: sealed segments
become Parquet objects and manifest versions in the store, local segments past local retention
are deleted only once uploaded, and consumers reading from offset 0 get every record exactly
once, in order, byte-exact, across the cold and hot tiers."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pyarrow.parquet as pq
from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition

from tests.support.broker import BrokerProcess

RECORDS = 3_000
WAIT_TIMEOUT_S = 60.0
TIERED_TOPIC = {
    "remote.storage.enable": "true",
    "segment.bytes": "16384",  # many small sealed segments
    "local.retention.bytes": "1",  # keep no sealed segment locally once uploaded
}
# Record i is stamped BASE_TIMESTAMP_MS + i (recent: retention.ms must not delete them).
BASE_TIMESTAMP_MS = int(time.time() * 1000)
SPARK_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]


def value_of(i: int) -> bytes:
    return json.dumps({"n": i, "pad": "x" * (i % 50)}).encode()


async def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_TIMEOUT_S} s: {what}")
        await asyncio.sleep(0.1)


def latest_manifest(store: Path, topic: str) -> dict[str, Any] | None:
    versions = sorted((store / topic / "0" / "manifest").glob("*.json"))
    return json.loads(versions[-1].read_text()) if versions else None


def current_manifest(store: Path, topic: str) -> dict[str, Any]:
    """The latest manifest, which must exist by now."""
    manifest = latest_manifest(store, topic)
    assert manifest is not None, f"{topic}: no manifest in {store}"
    return manifest


def finished(manifest: dict[str, Any] | None) -> list[dict[str, Any]]:
    if manifest is None:
        return []
    return [s for s in manifest["segments"] if s["state"] == "COPY_FINISHED"]


async def produce_all(broker: BrokerProcess, topic: str) -> None:
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5) as producer:
        futures = [
            await producer.send(
                topic,
                value_of(i),
                key=str(i).encode(),
                partition=0,
                timestamp_ms=BASE_TIMESTAMP_MS + i,
            )
            for i in range(RECORDS)
        ]
        await producer.flush()
        offsets = [(await f).offset for f in futures]
    assert offsets == list(range(RECORDS))


Row = tuple[int, bytes | None, bytes | None]
EXPECTED: list[Row] = [(i, str(i).encode(), value_of(i)) for i in range(RECORDS)]


async def tiered_topic(broker: BrokerProcess) -> str:
    """A new tiered topic holding the RECORDS records."""
    topic = f"tiered-{uuid.uuid4().hex[:8]}"
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=1, configs=TIERED_TOPIC)
    await produce_all(broker, topic)
    return topic


async def read_all_from_zero(broker: BrokerProcess, topic: str) -> list[Row]:
    """Riverbed's consumer from offset 0 to RECORDS: (offset, key, value) of each record."""
    seen: list[Row] = []
    async with Consumer(bootstrap_servers=broker.bootstrap) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
        while len(seen) < RECORDS:
            batches = await consumer.getmany(timeout_ms=2000)
            assert batches, f"stalled after {len(seen)} records"
            for records in batches.values():
                seen += [(r.offset, r.key, r.value) for r in records]
    return seen


async def test_segments_are_tiered_deleted_locally_and_read_back_from_offset_zero(
    tiered_broker: tuple[BrokerProcess, Path],
) -> None:
    broker, store = tiered_broker
    topic = await tiered_topic(broker)

    def local_start() -> int:
        return int(broker.segment_files(topic, 0)[0].stem)

    # Uploaded and then deleted locally: the local log starts well above 0.
    await wait_until(lambda: local_start() > RECORDS // 2, "local segments tiered and deleted")
    manifest = latest_manifest(store, topic)
    done = finished(manifest)
    assert done
    assert done[0]["base_offset"] == 0
    for before, after in itertools.pairwise(done):
        assert after["base_offset"] == before["last_offset"] + 1  # no gap, no overlap
    assert done[-1]["last_offset"] + 1 >= local_start()

    # The objects are plain Parquet with Spark's Kafka source columns, sorted by offset.
    table = pq.read_table(store / str(done[0]["key"]))
    assert table.column_names[: len(SPARK_COLUMNS)] == SPARK_COLUMNS
    offsets = table.column("offset").to_pylist()
    assert offsets == sorted(offsets)
    assert offsets[0] == 0
    assert table.column("value").to_pylist()[:3] == [value_of(i) for i in range(3)]

    # ListOffsets: earliest is the remote log start; by time searches the remote tier first.
    tp = TopicPartition(topic, 0)
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert (await admin.list_offsets({tp: "earliest"}))[tp].offset == 0
        for wanted in (100, local_start() - 1, local_start() + 5):
            found = (await admin.list_offsets({tp: BASE_TIMESTAMP_MS + wanted}))[tp]
            assert (found.offset, found.timestamp_ms) == (wanted, BASE_TIMESTAMP_MS + wanted)

    # Riverbed's consumer from offset 0: every record once, in order, byte-exact.
    assert await read_all_from_zero(broker, topic) == EXPECTED

    # ...and a librdkafka consumer.
    read = await asyncio.to_thread(consume_with_confluent, broker.bootstrap, topic)
    assert read == EXPECTED


# As librdkafka gives them: offset, key, value (each None on an error, which fails the test).
ConfluentRecord = tuple[int | None, bytes | None, bytes | None]


def consume_with_confluent(bootstrap: str, topic: str) -> list[ConfluentRecord]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        out: list[ConfluentRecord] = []
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while len(out) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            out.append((message.offset(), message.key(), message.value()))
        return out
    finally:
        consumer.close()


def no_copy_in_progress(store: Path, topic: str) -> bool:
    """Local segments are deleted as each upload commits, while the copies after it are already
    recorded as started: the manifest is all finished only once tiering has caught up."""
    manifest = latest_manifest(store, topic)
    return manifest is not None and all(s["state"] == "COPY_FINISHED" for s in manifest["segments"])


def assert_contiguous_from_zero(store: Path, topic: str) -> list[dict[str, Any]]:
    on_disk = {p.relative_to(store).as_posix() for p in store.rglob("*.parquet")}
    return check_contiguous_from_zero(latest_manifest(store, topic), on_disk)


def check_contiguous_from_zero(
    manifest: dict[str, Any] | None, stored_keys: set[str]
) -> list[dict[str, Any]]:
    """The manifest's segments: all finished, from offset 0 with no gap and no overlap, and
    every data object in the store (`stored_keys`, relative to its root) one of them."""
    assert manifest is not None
    assert all(s["state"] == "COPY_FINISHED" for s in manifest["segments"]), manifest
    done = finished(manifest)
    assert done
    assert done[0]["base_offset"] == 0
    for before, after in itertools.pairwise(done):
        assert after["base_offset"] == before["last_offset"] + 1  # no gap, no overlap
    assert stored_keys == {s["key"] for s in done}  # no orphaned object left behind
    return done


async def test_an_unreachable_store_keeps_the_backlog_locally_and_uploads_resume(
    tiered_broker: tuple[BrokerProcess, Path],
) -> None:
    broker, store = tiered_broker
    # The store's root replaced by a plain file: every write fails (ENOTDIR), as root too.
    store.mkdir(parents=True, exist_ok=True)
    hidden = store.with_name("cold-away")
    store.rename(hidden)
    store.write_bytes(b"not a directory")
    topic = await tiered_topic(broker)  # produce is unaffected
    # Retried after 1 s: a second failure came from a round after the first.
    await wait_until(
        lambda: (
            f"event=tiering.upload_failed topic={topic} partition=0 failures_in_a_row=2 "
            in broker.log_path.read_text()
        ),
        "two tiering rounds failed",
    )
    segments = broker.segment_files(topic, 0)
    assert int(segments[0].stem) == 0
    assert len(segments) > 5  # nothing deleted locally
    assert await read_all_from_zero(broker, topic) == EXPECTED

    store.unlink()
    hidden.rename(store)
    await wait_until(
        lambda: int(broker.segment_files(topic, 0)[0].stem) > RECORDS // 2,
        "uploads resumed and local segments were deleted",
    )
    await wait_until(lambda: no_copy_in_progress(store, topic), "no unfinished copy left")
    assert_contiguous_from_zero(store, topic)
    assert await read_all_from_zero(broker, topic) == EXPECTED


async def test_a_broker_killed_while_tiering_redoes_unfinished_copies_without_gap_or_overlap(
    tiered_broker: tuple[BrokerProcess, Path],
) -> None:
    broker, store = tiered_broker
    topic = await tiered_topic(broker)
    # Killed as soon as tiering has started (some copies may be half done).
    await wait_until(lambda: latest_manifest(store, topic) is not None, "tiering started")
    broker.kill()
    broker.restart()
    await wait_until(
        lambda: int(broker.segment_files(topic, 0)[0].stem) > RECORDS // 2,
        "tiering finished after the restart",
    )
    await wait_until(lambda: no_copy_in_progress(store, topic), "no unfinished copy left")
    assert_contiguous_from_zero(store, topic)
    assert await read_all_from_zero(broker, topic) == EXPECTED


async def test_a_consumer_of_several_partitions_all_in_the_cold_tier_reads_every_one(
    tiered_broker: tuple[BrokerProcess, Path],
) -> None:
    """Only one partition per fetch is read from the remote tier; the others must be answered
    empty, not OFFSET_OUT_OF_RANGE (which made consumers reset them to the end: data skipped)."""
    broker, _ = tiered_broker
    topic = f"spread-{uuid.uuid4().hex[:8]}"
    partitions = 3
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(
            topic, partitions=partitions, replication_factor=1, configs=TIERED_TOPIC
        )
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5) as producer:
        futures = [
            await producer.send(topic, value_of(i), partition=i % partitions)
            for i in range(RECORDS)
        ]
        await producer.flush()
        for future in futures:
            await future
    await wait_until(
        lambda: all(
            int(broker.segment_files(topic, p)[0].stem) > RECORDS // partitions // 2
            for p in range(partitions)
        ),
        "every partition mostly tiered",
    )
    expected = {(i % partitions, i // partitions, value_of(i)) for i in range(RECORDS)}

    seen: list[tuple[int, int, bytes | None]] = []
    async with Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        await consumer.seek_to_beginning()
        while len(seen) < RECORDS:
            batches = await consumer.getmany(timeout_ms=5000)
            assert batches, f"stalled after {len(seen)} records"
            for records in batches.values():
                seen += [(r.partition, r.offset, r.value) for r in records]
    assert len(seen) == RECORDS
    assert set(seen) == expected

    def with_librdkafka() -> set[tuple[int | None, int | None, bytes | None]]:
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": f"g-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
            }
        )
        try:
            consumer.assign(
                [confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)]
            )
            got: list[tuple[int | None, int | None, bytes | None]] = []
            deadline = time.monotonic() + WAIT_TIMEOUT_S
            while len(got) < RECORDS and time.monotonic() < deadline:
                for message in consumer.consume(1000, 1.0):
                    assert message.error() is None, message.error()
                    got.append((message.partition(), message.offset(), message.value()))
            assert len(got) == RECORDS
            return set(got)
        finally:
            consumer.close()

    assert await asyncio.to_thread(with_librdkafka) == expected
