"""Compaction: the log cleaner's throughput, and what it buys a consumer rebuilding state.

Dataset: 10M records (500k with --quick) over 100k keys, each key written in turn (so every key
is overwritten ~100 times), values of 60 bytes, uncompressed batches of 1,000 records.

1. Cleaner throughput, hot tier: the dataset is appended to a PartitionLog on disk (64 MiB
   segments; 4 MiB with --quick) in this process, then one whole cleaner pass (`clean_log`:
   offset map of the dirty part, rewrite of every sealed segment, crash-safe swap) is timed.
   MB/s = log bytes the pass covered / its wall time (the pass runs on one thread).
2. Cleaner throughput, cold tier, in the same run, twice: the same dataset is appended to
   another PartitionLog (same segments) that leads a compacted tiered partition; the broker's
   offloader uploads every sealed segment as a Parquet object to a file:// store in the scratch
   dir (not timed), then one whole pass of the broker's cold compactor (ColdCompactor.run_once:
   claim, objects downloaded from the store, offset map of the cold tier and the hot tail,
   every group rewritten and uploaded, swap) is timed. MB/s = bytes in the log of the batches
   the pass covered (the manifest's `log_bytes` of the objects it planned) / its wall time, so
   the hot and cold MB/s measure the same log bytes.
   - "whole dataset tiered": the segment holding the last records is rolled (by segment.ms,
     with one record of another key) and tiered too, so the cold tier keeps the latest record
     of each of the 100k keys: thinned batches are rebuilt, as the hot pass does.
   - "latest records in the hot tail": the active segment (the last ~650k records, every key
     among them) stays local, as in a broker; every cold record has a later one there, so the
     pass drops them all and writes objects with no row. Less work than the hot pass.
3. Rebuilding state through a broker: one broker, a topic with 16 MiB segments (2 MiB with
   --quick) filled with the dataset by Riverbed's producer. A new consumer reads it from
   offset 0 and folds it into a dict (key -> latest value), timed; the topic is switched to
   `cleanup.policy=compact` (live), the broker's cleaner is timed until its checkpoint shows
   the pass done, and a new consumer rebuilds the state again. Ratio: uncompacted rebuild time
   / compacted rebuild time. The active segment is never compacted, so the compacted topic
   still holds up to one segment of uncompacted tail.

The cold pass runs the Arrow kernels of riverbed.tiering.cold_compaction on a worker thread;
its CPU time counts every thread of the process.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.consumers import riverbed_consumer
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import Broker, ProcessFailed, zookeeper
from bench.tiering import create_topics, produce

NAME = "compaction"
RECORDS_FULL = 10_000_000
RECORDS_QUICK = 500_000
KEYS = 100_000
VALUE_BYTES = 60
BATCH_RECORDS = 1_000
# (full, --quick): the quick dataset (~45 MB) must still span several segments.
LOCAL_SEGMENT_BYTES = (64 * 1024 * 1024, 4 * 1024 * 1024)
BROKER_SEGMENT_BYTES = (16 * 1024 * 1024, 2 * 1024 * 1024)
TOPIC = "state"
BROKER_START_TIMEOUT_S = 120.0
CLEANED_TIMEOUT_S = 1800.0
NOW_MS = 1_700_000_000_000
SEGMENT_MS = 3_600_000  # only rolls the cold run's last segment ("whole dataset tiered")


def key_of(index: int) -> bytes:
    return b"key-%06d" % (index % KEYS)


def value_of(index: int) -> bytes:
    return (b"%012d" % index) * (VALUE_BYTES // 12)


def run(options: BenchOptions) -> BenchResult:
    records = RECORDS_QUICK if options.quick else RECORDS_FULL
    local_segment_bytes = LOCAL_SEGMENT_BYTES[options.quick]
    broker_segment_bytes = BROKER_SEGMENT_BYTES[options.quick]
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=options.work_dir) as scratch:
        scratch_dir = Path(scratch)
        measured: dict[str, Any] = {
            "local_pass": clean_local_log(scratch_dir / "local-0", records, local_segment_bytes),
            "cold_pass_all_tiered": asyncio.run(
                compact_cold_tier(
                    scratch_dir / "cold-all", records, local_segment_bytes, everything_tiered=True
                )
            ),
            "cold_pass_hot_tail": asyncio.run(
                compact_cold_tier(
                    scratch_dir / "cold-tail", records, local_segment_bytes, everything_tiered=False
                )
            ),
        }
        data_dir = scratch_dir / "broker-data"
        data_dir.mkdir()
        settings = {"log.cleaner.backoff.ms": "500", **options.broker_settings}
        with zookeeper(scratch_dir / "zookeeper") as zk_connect:
            log_path = options.work_dir / "logs" / f"{NAME}-broker.log"
            broker = Broker(data_dir, zk_connect, settings, log_path)
            try:
                broker.start(BROKER_START_TIMEOUT_S)
                measured["broker"] = asyncio.run(
                    rebuild_before_and_after(
                        broker.bootstrap, data_dir / f"{TOPIC}-0", records, broker_segment_bytes
                    )
                )
                broker.terminate()
            finally:
                broker.close()
    measured["segment_bytes"] = {"local": local_segment_bytes, "broker": broker_segment_bytes}
    return summarize(records, measured)


def fill_log(directory: Path, records: int, segment_bytes: int, *, seal: bool = False) -> Any:
    """A PartitionLog holding the dataset, every record committed; with `seal`, a record of
    another key rolls the segment holding the last ones (segment.ms passed), so all the dataset
    is in sealed segments."""
    from riverbed.hot.storage.log import LogConfig, PartitionLog
    from riverbed.protocol.record_types import TopicPartition
    from riverbed.protocol.records import encode_batch, validate_records

    clock = [NOW_MS]
    log = PartitionLog.open(
        directory,
        TopicPartition(TOPIC, 0),
        LogConfig(segment_bytes=segment_bytes, segment_ms=SEGMENT_MS),
        recovery_point=0,
        now_ms=lambda: clock[0],
    )

    def append(batch: bytes) -> None:
        buf = memoryview(bytearray(batch))
        log.append(buf, validate_records(buf, 1 << 20), leader_epoch=0)

    for first in range(0, records, BATCH_RECORDS):
        append(
            encode_batch(
                [(key_of(i), value_of(i), (), NOW_MS) for i in range(first, first + BATCH_RECORDS)]
            )
        )
    if seal:
        clock[0] += 2 * SEGMENT_MS
        append(encode_batch([(b"~end", b"end", (), clock[0])]))
    log.update_high_watermark(log.log_end_offset)
    log.flush()
    return log


def clean_local_log(directory: Path, records: int, segment_bytes: int) -> dict[str, Any]:
    from riverbed.configs import BrokerConfig, topic_config
    from riverbed.hot.storage.cleaner import CleanerSettings, clean_log

    log = fill_log(directory, records, segment_bytes)
    try:
        stats = log.segment_stats()
        sealed_bytes = sum(s.size_bytes for s in stats if s.sealed)
        config = topic_config(
            BrokerConfig.from_mapping({"zookeeper.connect": "127.0.0.1:1"}),
            {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)},
        )
        settings = CleanerSettings(
            dedupe_buffer_bytes=128 * 1024 * 1024, io_max_bytes_per_second=1e300
        )
        started = time.perf_counter()
        cpu_before = time.process_time()
        result = clean_log(log, config, settings, now_ms=NOW_MS)
        elapsed_s = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_before
        if result is None:
            raise ProcessFailed("the cleaner found nothing to do")
        return {
            "log_bytes": sum(s.size_bytes for s in stats),
            "cleaned_range_bytes": sealed_bytes,
            "bytes_after": result.bytes_written,
            "records_read": result.records_read,
            "records_kept": result.records_kept,
            "map_keys": result.map_keys,
            "elapsed_s": elapsed_s,
            "cpu_s": cpu_s,
        }
    finally:
        log.close()


async def compact_cold_tier(
    directory: Path, records: int, segment_bytes: int, *, everything_tiered: bool
) -> dict[str, Any]:
    """The dataset tiered by the broker's offloader, then one timed pass of its cold
    compactor, in this process (as the broker runs them, without the network)."""
    from riverbed.configs import BrokerConfig, topic_config
    from riverbed.hot.replication.partitions import Partition
    from riverbed.hot.storage.producer_state import ProducerStateManager
    from riverbed.tiering.service import TieredStorage

    log = fill_log(directory / f"{TOPIC}-0", records, segment_bytes, seal=everything_tiered)
    partition = Partition(TOPIC, 0, log, ProducerStateManager(), broker_id=1)
    partition.become_leader(1, (1,), frozenset({1}), 0, NOW_MS)
    broker = BrokerConfig.from_mapping(
        {
            "zookeeper.connect": "127.0.0.1:1",
            "broker.id": "1",
            "remote.storage.url": f"file://{directory / 'store'}",
            "log.cleaner.dedupe.buffer.size": str(128 * 1024 * 1024),
        }
    )
    config = topic_config(
        broker,
        {
            "cleanup.policy": "compact",
            "remote.storage.enable": "true",
            "segment.bytes": str(segment_bytes),
            "local.retention.bytes": "1",  # uploaded segments leave the disk, as in production
        },
    )
    tiering = TieredStorage(broker, directory, [partition], lambda _: config, lambda: NOW_MS)
    await tiering.start(run_tasks=False)
    try:
        while await tiering.offloader.run_once():
            pass
        manifest = tiering.offloader.manifest_of(TOPIC, 0)
        if manifest is None or not manifest.finished():
            raise ProcessFailed("nothing was tiered")
        objects_before = sum(s.size_bytes for s in manifest.finished())
        started = time.perf_counter()
        cpu_before = time.process_time()
        result = await tiering.compactor.run_once(force=True)
        elapsed_s = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_before
        if result is None or not result.swapped:
            raise ProcessFailed("the cold compactor did no pass")
        after = tiering.offloader.manifest_of(TOPIC, 0)
        assert after is not None
        return {
            "objects": len(manifest.finished()),
            "cold_log_bytes": result.log_bytes_in,
            "cold_log_bytes_after": result.log_bytes_out,
            "object_bytes_before": objects_before,
            "object_bytes_after": sum(s.size_bytes for s in after.finished()),
            "object_bytes_read": result.object_bytes_read,
            "object_bytes_written": result.object_bytes_written,
            "hot_bytes_read": result.hot_bytes_read,
            "records_read": result.records_in,
            "records_kept": result.records_out,
            "groups": result.groups,
            "groups_rewritten": result.groups_rewritten,
            "map_keys": result.map_keys,
            "elapsed_s": elapsed_s,
            "cpu_s": cpu_s,
        }
    finally:
        await tiering.stop()
        log.close()


async def rebuild_before_and_after(
    bootstrap: str, partition_dir: Path, records: int, segment_bytes: int
) -> dict[str, Any]:
    from riverbed.client.admin import Admin

    await create_topics(bootstrap, {TOPIC: {"segment.bytes": str(segment_bytes)}})
    await produce(
        bootstrap,
        TOPIC,
        [value_of(i) for i in range(records)],
        "none",
        keys=[key_of(i) for i in range(records)],
    )
    uncompacted = await rebuild_state(bootstrap, records)
    bytes_before = _partition_bytes(partition_dir)
    started = time.perf_counter()
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.alter_configs(TOPIC, set={"cleanup.policy": "compact"})
    checkpoint = partition_dir / "cleaner-offset-checkpoint"
    while not checkpoint.exists():
        if time.perf_counter() - started > CLEANED_TIMEOUT_S:
            raise ProcessFailed(f"not compacted within {CLEANED_TIMEOUT_S} s")
        await asyncio.sleep(0.05)
    cleaned_s = time.perf_counter() - started
    compacted = await rebuild_state(bootstrap, records)
    if compacted["state"] != uncompacted["state"]:
        raise ProcessFailed("the compacted topic rebuilds a different state")
    for measurement in (uncompacted, compacted):
        del measurement["state"]
    return {
        "uncompacted": uncompacted,
        "compacted": compacted,
        "bytes_before": bytes_before,
        "bytes_after": _partition_bytes(partition_dir),
        "broker_clean_s": cleaned_s,
    }


async def rebuild_state(bootstrap: str, records: int) -> dict[str, Any]:
    """A new consumer folds the topic from offset 0 to its end into key -> latest value."""
    from riverbed.client.types import TopicPartition

    tp = TopicPartition(TOPIC, 0)
    state: dict[bytes | None, bytes | None] = {}
    read = 0
    started = time.perf_counter()
    async with riverbed_consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        while await consumer.position(tp) < records:
            batches = await consumer.getmany(max_records=10_000, timeout_ms=1000)
            for batch in batches.values():
                read += len(batch)
                for record in batch:
                    state[record.key] = record.value
    elapsed_s = time.perf_counter() - started
    if len(state) != min(KEYS, records):
        raise ProcessFailed(f"rebuilt {len(state)} keys, expected {min(KEYS, records)}")
    return {"elapsed_s": elapsed_s, "records_read": read, "state": state}


def _partition_bytes(partition_dir: Path) -> int:
    return sum(path.stat().st_size for path in partition_dir.glob("*.log"))


def summarize(records: int, measured: dict[str, Any]) -> BenchResult:
    local, broker = measured["local_pass"], measured["broker"]
    cold, tail = measured["cold_pass_all_tiered"], measured["cold_pass_hot_tail"]
    before_s = broker["uncompacted"]["elapsed_s"]
    after_s = broker["compacted"]["elapsed_s"]
    headlines: list[Headline] = [
        {"label": "cleaner pass, hot tier (in process)",
         "value": local["cleaned_range_bytes"] / local["elapsed_s"] / 1e6, "unit": "MB/s"},
        {"label": "cleaner pass, hot tier (in process)",
         "value": local["records_read"] / local["elapsed_s"], "unit": "records/s"},
        {"label": "cold compaction pass, file://, whole dataset tiered (in process)",
         "value": cold["cold_log_bytes"] / cold["elapsed_s"] / 1e6, "unit": "MB/s"},
        {"label": "cold compaction pass, file://, whole dataset tiered (in process)",
         "value": cold["records_read"] / cold["elapsed_s"], "unit": "records/s"},
        {"label": "cold compaction pass, file://, latest records in the hot tail (in process)",
         "value": tail["cold_log_bytes"] / tail["elapsed_s"] / 1e6, "unit": "MB/s"},
        {"label": "cleaner in the broker, switch to compact -> pass done",
         "value": broker["bytes_before"] / broker["broker_clean_s"] / 1e6, "unit": "MB/s"},
        {"label": "state rebuild, uncompacted topic", "value": before_s, "unit": "s"},
        {"label": "state rebuild, compacted topic", "value": after_s, "unit": "s"},
    ]  # fmt: skip
    ratios: list[Ratio] = [
        {
            "label": "state rebuild time: uncompacted / compacted",
            "value": before_s / after_s,
            "goal": "reported",
            "met": None,
        },
        {
            "label": "log bytes after / before a pass (in process)",
            "value": local["bytes_after"] / local["cleaned_range_bytes"],
            "goal": "reported",
            "met": None,
        },
        {
            "label": "cold pass (whole dataset tiered) MB/s / hot pass MB/s",
            "value": (cold["cold_log_bytes"] / cold["elapsed_s"])
            / (local["cleaned_range_bytes"] / local["elapsed_s"]),
            "goal": "reported",
            "met": None,
        },
        {
            "label": "cold tier object bytes after / before a pass (whole dataset tiered)",
            "value": cold["object_bytes_after"] / cold["object_bytes_before"],
            "goal": "reported",
            "met": None,
        },
    ]
    return {
        "parameters": {
            "records": records,
            "keys": KEYS,
            "value_bytes": VALUE_BYTES,
            "batch_records": BATCH_RECORDS,
            "local_segment_bytes": measured["segment_bytes"]["local"],
            "broker_segment_bytes": measured["segment_bytes"]["broker"],
        },
        "tools": {},
        "measurements": measured,
        "headlines": headlines,
        "ratios": ratios,
    }
