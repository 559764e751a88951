"""Total retention (`retention.bytes`, `retention.ms`) on a tiered topic, with a real broker and
a file:// store: the oldest remote segments go (the manifest's log start first, then the
objects, then the entries), exactly as many as Kafka's rules say, and readers start at the new
log start: ListOffsets earliest names it and a consumer from the beginning gets every record
from there on."""

from __future__ import annotations

import itertools
import time
import uuid
from pathlib import Path
from typing import Any, Final

from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition

from tests.support.broker import BrokerProcess
from tests.tiering.test_tiering_broker import (
    RECORDS,
    TIERED_TOPIC,
    finished,
    latest_manifest,
    value_of,
    wait_until,
)

HOUR_MS: Final = 3_600_000


async def produce(broker: BrokerProcess, topic: str, timestamps_ms: list[int]) -> None:
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5) as producer:
        futures = [
            await producer.send(topic, value_of(i), partition=0, timestamp_ms=timestamp_ms)
            for i, timestamp_ms in enumerate(timestamps_ms)
        ]
        await producer.flush()
        assert [(await f).offset for f in futures] == list(range(len(timestamps_ms)))


async def new_topic(broker: BrokerProcess, **configs: str) -> str:
    topic = f"retained-{uuid.uuid4().hex[:8]}"
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(
            topic, partitions=1, replication_factor=1, configs={**TIERED_TOPIC, **configs}
        )
    return topic


def local_start(broker: BrokerProcess, topic: str) -> int:
    return int(broker.segment_files(topic, 0)[0].stem)


def settled_manifest(store: Path, topic: str) -> dict[str, Any]:
    manifest = latest_manifest(store, topic)
    assert manifest is not None
    return manifest


def check_after_retention(store: Path, topic: str) -> list[dict[str, Any]]:
    """The remaining segments: from the log start on, finished, contiguous, each object in the
    store and nothing else in it."""
    manifest = settled_manifest(store, topic)
    kept: list[dict[str, Any]] = manifest["segments"]
    assert all(s["state"] == "COPY_FINISHED" for s in kept)
    assert kept[0]["base_offset"] == manifest["log_start_offset"]
    for before, after in itertools.pairwise(kept):
        assert after["base_offset"] == before["last_offset"] + 1
    stored = {p.relative_to(store).as_posix() for p in store.rglob("*.parquet")}
    assert stored == {s["key"] for s in kept}  # deleted objects are gone, and only those
    return kept


async def read_from_beginning(broker: BrokerProcess, topic: str) -> tuple[int, list[int]]:
    """ListOffsets earliest, and the offsets a consumer from the beginning reads to the end,
    checking each value."""
    tp = TopicPartition(topic, 0)
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        earliest = (await admin.list_offsets({tp: "earliest"}))[tp].offset
    offsets: list[int] = []
    async with Consumer(bootstrap_servers=broker.bootstrap) as consumer:
        consumer.assign([tp])
        await consumer.seek_to_beginning()
        while not offsets or offsets[-1] < RECORDS - 1:
            batches = await consumer.getmany(timeout_ms=5000)
            assert batches, f"stalled after offset {offsets[-1] if offsets else None}"
            for records in batches.values():
                for record in records:
                    assert record.value == value_of(record.offset)
                    offsets.append(record.offset)
    return earliest, offsets


async def test_retention_bytes_deletes_the_oldest_remote_segments_as_kafka_counts_them(
    tiered_broker: tuple[BrokerProcess, Path],
) -> None:
    broker, store = tiered_broker
    topic = await new_topic(broker)
    now_ms = int(time.time() * 1000)
    await produce(broker, topic, [now_ms] * RECORDS)
    await wait_until(lambda: local_start(broker, topic) > RECORDS // 2, "tiered")
    uploaded = finished(settled_manifest(store, topic))
    # The log's bytes, not the objects' (smaller), are what the limit counts: counted by object
    # size, fewer segments would go and the last assertion on the total would fail.
    log_bytes = sum(s["log_bytes"] for s in uploaded)
    assert sum(s["size_bytes"] for s in uploaded) < log_bytes
    limit_bytes = log_bytes // 2

    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.alter_configs(topic, set={"retention.bytes": str(limit_bytes)})
    await wait_until(
        lambda: settled_manifest(store, topic)["log_start_offset"] > 0, "retention ran"
    )
    await wait_until(
        lambda: all(
            s["state"] == "COPY_FINISHED" for s in settled_manifest(store, topic)["segments"]
        ),
        "deletions finished",
    )
    kept = check_after_retention(store, topic)
    # Kafka's rule: delete the oldest while what stays still reaches the limit.
    local_bytes = sum(p.stat().st_size for p in broker.segment_files(topic, 0))
    remote_only = sum(s["log_bytes"] for s in kept if s["last_offset"] < local_start(broker, topic))
    total_bytes = remote_only + local_bytes
    assert total_bytes >= limit_bytes
    assert total_bytes - kept[0]["log_bytes"] < limit_bytes

    earliest, offsets = await read_from_beginning(broker, topic)
    assert earliest == kept[0]["base_offset"] > 0
    assert offsets == list(range(earliest, RECORDS))


async def test_retention_ms_deletes_remote_segments_whose_records_are_all_too_old(
    tiered_broker: tuple[BrokerProcess, Path],
) -> None:
    broker, store = tiered_broker
    topic = await new_topic(broker, **{"retention.ms": str(HOUR_MS)})
    now_ms = int(time.time() * 1000)
    old = RECORDS // 2  # records 0..old-1 are two hours old, the rest are new
    await produce(broker, topic, [now_ms - 2 * HOUR_MS] * old + [now_ms] * (RECORDS - old))

    def holding_old_records() -> list[dict[str, Any]]:
        return [s for s in settled_manifest(store, topic)["segments"] if s["base_offset"] < old]

    await wait_until(
        lambda: (
            local_start(broker, topic) > old
            and len(holding_old_records()) == 1
            and holding_old_records()[0]["last_offset"] >= old
        ),
        "only the segment that also holds new records kept",
    )
    kept = check_after_retention(store, topic)
    # The segment holding the first new record stays whole, with old records below it.
    assert kept[0]["base_offset"] <= old <= kept[0]["last_offset"]

    earliest, offsets = await read_from_beginning(broker, topic)
    assert earliest == kept[0]["base_offset"] > 0
    assert offsets == list(range(earliest, RECORDS))
