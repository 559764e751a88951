"""Cold compaction in a real broker process, read by real clients.

A compacted tiered topic (`cleanup.policy=compact`, `remote.storage.enable=true`, uploaded
segments deleted locally) is filled with overwritten keys, keys deleted long ago (tombstones
past delete.retention.ms) and keys deleted just now. The broker tiers it and compacts its cold
tier; then Riverbed's consumer, confluent-kafka (librdkafka) and kcat read it from offset 0
across the cold and hot tiers and get exactly the compacted view: offsets increasing, the cold
part holding only each key's latest record, no trace of the keys deleted long ago, the latest
value of every other key, and the store holding exactly the objects the manifest names once the
replaced ones' grace is over. The same on moto's S3 server. And a broker SIGKILLed in the
middle of a throttled pass: after its restart the log reads as before or as after, the next
leader epoch aborts the left-over compaction, and the partition ends compacted with no orphan."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.moto_server import MotoServer
from tests.tiering.test_tiering_broker import current_manifest, latest_manifest, wait_until
from tests.tiering.test_tiering_s3_broker import Bucket, s3_broker

KEYS = 40
ROUNDS = 40
EXPIRED_KEYS = range(0, 8)  # deleted long ago: their tombstones are past delete.retention.ms
RECENT_KEYS = range(8, 12)  # deleted just now: their tombstones stay
DELETE_RETENTION_MS = 60_000
COMPACTED_TIERED = {
    "cleanup.policy": "compact",
    "remote.storage.enable": "true",
    "segment.bytes": "16384",
    "local.retention.bytes": "1",
    "delete.retention.ms": str(DELETE_RETENTION_MS),
    # A pass after every upload: the tests wait for a fully compacted cold tier.
    "min.cleanable.dirty.ratio": "0.01",
}
BROKER = {
    "remote.log.manager.task.interval.ms": "200",
    "log.cleaner.backoff.ms": "200",
    "remote.log.compaction.grace.ms": "1000",
    "remote.log.orphan.grace.ms": "1000",
    "offsets.topic.replication.factor": "1",
    "zookeeper.session.timeout.ms": "6000",  # a killed broker re-registers sooner
}
WAIT_TIMEOUT_S = 90.0
THROTTLE = "log.cleaner.io.max.bytes.per.second"

Row = tuple[int, bytes | None, bytes | None]  # offset, key, value
Manifest = dict[str, Any]


def key_of(i: int) -> bytes:
    return b"key-%03d" % i


def value_of(round_: int, i: int) -> bytes:
    return b"round-%03d-of-key-%03d-" % (round_, i) * 3


class Written:
    """What was produced, by offset: what the compacted log must agree with."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[bytes, bytes | None, int, tuple[tuple[str, bytes], ...]]] = {}

    def latest(self) -> dict[bytes, int]:
        last: dict[bytes, int] = {}
        for offset, (key, _, _, _) in sorted(self.rows.items()):
            last[key] = offset
        return last

    def state(self) -> dict[bytes, bytes]:
        return {
            key: value
            for key, offset in self.latest().items()
            if (value := self.rows[offset][1]) is not None
        }


async def fill(bootstrap: str, topic: str) -> Written:
    """KEYS keys overwritten ROUNDS times (headers on each record), old tombstones for
    EXPIRED_KEYS, more rounds of the others (so those tombstones are sealed and tiered), then
    fresh tombstones for RECENT_KEYS."""
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic(
            topic, partitions=1, replication_factor=1, configs=COMPACTED_TIERED
        )
    written = Written()
    # Now, not at import: a full run reaches this minutes after collection (past
    # delete.retention.ms for the "fresh" tombstones).
    now_ms = int(time.time() * 1000)
    plan: list[tuple[bytes, bytes | None, int, tuple[tuple[str, bytes], ...]]] = []
    for round_ in range(ROUNDS):
        for i in range(KEYS):
            plan.append((key_of(i), value_of(round_, i), now_ms, (("round", b"%d" % round_),)))
    old = now_ms - 3 * DELETE_RETENTION_MS
    plan += [(key_of(i), None, old, ()) for i in EXPIRED_KEYS]
    for round_ in range(ROUNDS, ROUNDS + 10):
        for i in range(EXPIRED_KEYS.stop, KEYS):
            plan.append((key_of(i), value_of(round_, i), now_ms, (("round", b"%d" % round_),)))
    plan += [(key_of(i), None, now_ms, ()) for i in RECENT_KEYS]
    async with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5) as producer:
        futures = [
            await producer.send(
                topic, value, key=key, partition=0, timestamp_ms=timestamp, headers=list(headers)
            )
            for key, value, timestamp, headers in plan
        ]
        await producer.flush()
        for future, row in zip(futures, plan, strict=True):
            written.rows[(await future).offset] = row
    assert sorted(written.rows) == list(range(len(plan)))
    return written


def compacted(manifest: Manifest | None, local_start: int) -> bool:
    """Everything sealed is tiered and cold-compacted, and what compaction replaced is gone."""
    if manifest is None or manifest.get("compaction") or manifest.get("retired"):
        return False
    finished = [s for s in manifest["segments"] if s["state"] == "COPY_FINISHED"]
    end = finished[-1]["last_offset"] + 1 if finished else 0
    return end == local_start and manifest.get("compacted_end_offset", 0) == end


def local_start(broker: BrokerProcess, topic: str) -> int:
    return int(broker.segment_files(topic, 0)[0].stem)


async def wait_compacted(
    broker: BrokerProcess, topic: str, manifest_of: Callable[[], Manifest | None]
) -> Manifest:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while True:
        files = broker.segment_files(topic, 0)
        manifest = manifest_of()
        if len(files) == 1 and compacted(manifest, local_start(broker, topic)):
            assert manifest is not None
            return manifest
        if time.monotonic() > deadline:
            raise AssertionError(f"not compacted within {WAIT_TIMEOUT_S} s: {manifest}")
        await asyncio.sleep(0.2)


def check_compacted_view(rows: list[Row], written: Written, cold_end: int) -> None:
    """Offsets increase; each record is the one written at its offset; the cold part holds only
    each key's latest record (minus expired tombstones); folding gives the written state; keys
    deleted long ago left no trace at all."""
    offsets = [offset for offset, _, _ in rows]
    assert offsets == sorted(set(offsets)), "offsets must strictly increase"
    latest = written.latest()
    for offset, key, value in rows:
        assert (key, value) == written.rows[offset][:2], f"offset {offset}"
        assert key is not None
        if offset < cold_end:
            assert latest[key] == offset, f"offset {offset}: a superseded record in the cold tier"
    state: dict[bytes, bytes] = {}
    for _, key, value in rows:
        assert key is not None
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    assert state == written.state()
    gone = {key_of(i) for i in EXPIRED_KEYS}
    assert not [offset for offset, key, _ in rows if key in gone], "an expired key resurfaced"
    recent = {key_of(i) for i in RECENT_KEYS}
    assert {key for _, key, value in rows if value is None} == recent


async def read_riverbed(bootstrap: str, topic: str, end: int) -> list[Row]:
    tp = TopicPartition(topic, 0)
    rows: list[Row] = []
    async with Consumer(bootstrap_servers=bootstrap) as consumer:
        consumer.assign([tp])
        await consumer.seek_to_beginning()
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(timeout_ms=5000)).values():
                rows += [(r.offset, r.key, r.value) for r in records]
    return rows


def read_confluent(bootstrap: str, topic: str, end: int) -> list[Row]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    rows: list[Row] = []
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            offset = message.offset()
            assert offset is not None  # a record's, or where the partition ends
            error = message.error()
            if error is not None:
                assert error.code() == confluent_kafka.KafkaError._PARTITION_EOF
                if offset >= end:
                    return rows
                continue
            rows.append((offset, message.key(), message.value()))
        raise AssertionError(f"librdkafka read {len(rows)} records, not to offset {end}")
    finally:
        consumer.close()


def read_kcat(bootstrap: str, topic: str) -> list[Row]:
    command = ["kcat", "-C", "-b", bootstrap, "-t", topic, "-p", "0", "-o", "beginning", "-e"]
    out = subprocess.run(
        [*command, "-q", "-Z", "-f", "%o\t%k\t%s\n"],
        capture_output=True,
        timeout=WAIT_TIMEOUT_S,
        check=True,
    ).stdout
    rows: list[Row] = []
    for line in out.splitlines():
        offset, key, value = line.split(b"\t")
        rows.append((int(offset), key, None if value == b"NULL" else value))
    return rows


async def check_every_reader(
    broker: BrokerProcess, topic: str, written: Written, cold_end: int
) -> None:
    end = max(written.rows) + 1
    rows = await read_riverbed(broker.bootstrap, topic, end)
    check_compacted_view(rows, written, cold_end)
    assert await asyncio.to_thread(read_confluent, broker.bootstrap, topic, end) == rows
    assert await asyncio.to_thread(read_kcat, broker.bootstrap, topic) == rows
    assert len(rows) < len(written.rows) / 4


def stored_objects(store: Path, topic: str) -> set[str]:
    return {p.relative_to(store).as_posix() for p in (store / topic).rglob("*.parquet")}


async def test_a_compacted_tiered_topic_reads_as_its_compacted_view_across_both_tiers(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    store = tmp_path / "cold"
    broker = broker_factory({"remote.storage.url": f"file://{store}", **BROKER})
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    written = await fill(broker.bootstrap, topic)
    manifest = await wait_compacted(broker, topic, lambda: latest_manifest(store, topic))
    cold_end = manifest["compacted_end_offset"]
    assert cold_end > len(written.rows) / 2  # most of the log is in the cold tier
    await check_every_reader(broker, topic, written, cold_end)
    # Once the replaced objects' grace is over, the store holds exactly what the manifest names.
    await wait_until(
        lambda: (
            stored_objects(store, topic)
            == {s["key"] for s in current_manifest(store, topic)["segments"]}
        ),
        "the replaced objects deleted",
    )
    log = broker.log_path.read_text()
    assert "event=tiering.cold_compacted " in log


async def test_the_same_on_s3(
    broker_factory: BrokerFactory, moto_server: MotoServer, s3_bucket: str
) -> None:
    bucket = Bucket(moto_server, s3_bucket)
    broker = s3_broker(broker_factory, moto_server, s3_bucket, BROKER)
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    written = await fill(broker.bootstrap, topic)
    manifest = await wait_compacted(broker, topic, lambda: bucket.latest_manifest(topic))
    await check_every_reader(broker, topic, written, manifest["compacted_end_offset"])
    await wait_until(
        lambda: (
            bucket.data_keys() == {s["key"] for s in bucket.current_manifest(topic)["segments"]}
        ),
        "the replaced objects deleted",
    )


async def test_a_broker_killed_in_the_middle_of_a_pass_reads_as_before_or_after_and_finishes(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    store = tmp_path / "cold"
    # A pass held to 10 kB/s of object bytes takes several seconds: time to catch it pending.
    broker = broker_factory({"remote.storage.url": f"file://{store}", **BROKER, THROTTLE: "10000"})
    topic = f"compacted-{uuid.uuid4().hex[:8]}"
    written = await fill(broker.bootstrap, topic)
    end = max(written.rows) + 1
    await wait_until(
        lambda: bool((latest_manifest(store, topic) or {}).get("compaction")), "a pass pending"
    )
    pending = current_manifest(store, topic)["compaction"]
    before = await asyncio.to_thread(read_confluent, broker.bootstrap, topic, end)
    still = (latest_manifest(store, topic) or {}).get("compaction")
    assert still is not None, "the pass ended too soon to test"
    assert still["id"] == pending["id"], "the pass ended too soon to test"
    broker.kill()

    # Restarted with passes too slow to finish while it is read (1 kB/s).
    broker.settings[THROTTLE] = "1000"
    broker.restart()
    read = await asyncio.to_thread(read_confluent, broker.bootstrap, topic, end)
    manifest = latest_manifest(store, topic)
    assert manifest is not None
    if read == before:
        # Killed before the swap: the next leader epoch aborted what the pass left.
        await wait_until(
            lambda: f"aborted compaction {pending['id']}" in broker.log_path.read_text(),
            "the left-over compaction aborted",
        )
    else:
        # Killed after the swap: the cold part is the compacted one.
        check_compacted_view(read, written, manifest["compacted_end_offset"])
    # SIGTERM in the middle of a new (throttled) pass: the worker stops at its next row group.
    await wait_until(
        lambda: bool((latest_manifest(store, topic) or {}).get("compaction")), "a new pass"
    )
    stopping = time.monotonic()
    assert broker.terminate() == 0
    assert time.monotonic() - stopping < 15

    del broker.settings[THROTTLE]
    broker.restart()
    manifest = await wait_compacted(broker, topic, lambda: latest_manifest(store, topic))
    assert manifest["leader_epoch"] > pending["leader_epoch"]
    await check_every_reader(broker, topic, written, manifest["compacted_end_offset"])
    await wait_until(
        lambda: (
            stored_objects(store, topic)
            == {s["key"] for s in current_manifest(store, topic)["segments"]}
        ),
        "no orphan left (aborted outputs, replaced objects)",
    )
