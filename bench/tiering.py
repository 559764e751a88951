"""Tiering: can it keep up with ingest, how big is the cold tier, how fast are cold reads.

One broker with a file:// object store (S3 is not built yet: see docs/tiering.md), a JSON event
dataset (varied fields, ~200 bytes each), all in one run:

1. Produce the dataset with Riverbed's producer (acks=all, 1 MB batches, uncompressed) into a
   topic that is not tiered: records/s of ingest.
2. Tiering throughput: the same segments that topic holds, converted to Parquet and written to
   the file:// store exactly as the broker's offloader does it (segment_to_parquet, then
   FileStore.put_file), one segment after another: records/s. Ratio tiering / produce, goal
   >= 2 (tiering never falls behind ingest).
3. Cold bytes / hot bytes: Parquet object bytes over segment bytes, for the dataset produced
   uncompressed and produced with zstd.
4. Cold fetch / hot fetch: Riverbed's consumer reads the dataset from offset 0, once from the
   untiered topic (page cache, sendfile) and once from a tiered topic whose local segments were
   all deleted (every batch rebuilt from Parquet by the broker). Ratio goal >= 0.3.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.consumers import CONSUME_BATCH_MAX, riverbed_consumer
from bench.kafka_clients import end_offset
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import Broker, ProcessFailed, zookeeper

NAME = "tiering"
RECORDS_FULL = 1_000_000
RECORDS_QUICK = 100_000
BATCH_BYTES = 1_000_000
SEGMENT_BYTES = 8 * 1024 * 1024
BROKER_START_TIMEOUT_S = 120.0
TIERED_TIMEOUT_S = 600.0
TASK_INTERVAL_MS = 200
TIERING_GOAL = 2.0
COLD_FETCH_GOAL = 0.3


def events(records: int) -> list[bytes]:
    """A JSON event dataset: what a clickstream or order topic holds (seeded: same each run)."""
    rng = random.Random(7)
    kinds = ["view", "click", "add_to_cart", "purchase", "refund"]
    countries = ["DE", "FR", "US", "BR", "JP", "IN", "GB", "NL"]
    return [
        json.dumps(
            {
                "event_id": f"{rng.getrandbits(64):016x}",
                "kind": rng.choice(kinds),
                "user": f"user-{rng.randrange(100_000)}",
                "country": rng.choice(countries),
                "amount_cents": rng.randrange(100, 50_000),
                "ts": 1_763_800_000_000 + i * 3,
                "items": [rng.randrange(10_000) for _ in range(rng.randrange(1, 4))],
            },
            separators=(",", ":"),
        ).encode()
        for i in range(records)
    ]


def run(options: BenchOptions) -> BenchResult:
    records = RECORDS_QUICK if options.quick else RECORDS_FULL
    values = events(records)
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=options.work_dir) as scratch:
        scratch_dir = Path(scratch)
        store_dir = scratch_dir / "cold"
        data_dir = scratch_dir / "broker-data"
        data_dir.mkdir()
        settings = {
            "remote.storage.url": f"file://{store_dir}",
            "remote.log.manager.task.interval.ms": str(TASK_INTERVAL_MS),
            "log.segment.bytes": str(SEGMENT_BYTES),
            **options.broker_settings,
        }
        with zookeeper(scratch_dir / "zookeeper") as zk_connect:
            log_path = options.work_dir / "logs" / f"{NAME}-broker.log"
            broker = Broker(data_dir, zk_connect, settings, log_path)
            try:
                broker.start(BROKER_START_TIMEOUT_S)
                measured = asyncio.run(measure(broker, data_dir, scratch_dir, store_dir, values))
                broker.terminate()
            finally:
                broker.close()
    return summarize(records, settings, measured)


async def measure(
    broker: Broker, data_dir: Path, scratch_dir: Path, store_dir: Path, values: list[bytes]
) -> dict[str, Any]:
    from riverbed.client.admin import Admin

    bootstrap = broker.bootstrap
    records = len(values)
    tiered = {"remote.storage.enable": "true", "local.retention.bytes": "1"}
    async with Admin(bootstrap_servers=bootstrap) as admin:
        for topic, configs in (
            ("hot", {}),
            ("hot-zstd", {}),
            ("cold", tiered),
        ):
            await admin.create_topic(topic, partitions=1, replication_factor=1, configs=configs)
    measured: dict[str, Any] = {"produce": await produce(bootstrap, "hot", values, "none")}
    await produce(bootstrap, "hot-zstd", values, "zstd")
    await produce(bootstrap, "cold", values, "none")
    for topic in ("hot", "hot-zstd", "cold"):
        if end_offset(bootstrap, topic, 0) != records:
            raise ProcessFailed(f"{topic} does not hold {records} records")
    measured["tiering"] = await asyncio.to_thread(
        tier_offline, data_dir / "hot-0", scratch_dir / "offline-store"
    )
    measured["tiering_zstd"] = await asyncio.to_thread(
        tier_offline, data_dir / "hot-zstd-0", scratch_dir / "offline-store-zstd"
    )
    measured["tiered_after_s"] = await wait_tiered(data_dir / "cold-0", records)
    measured["hot_fetch"] = await consume(bootstrap, "hot", values)
    measured["cold_fetch"] = await consume(bootstrap, "cold", values)
    measured["cold_objects_bytes"] = sum(p.stat().st_size for p in store_dir.rglob("*.parquet"))
    return measured


async def produce(bootstrap: str, topic: str, values: list[bytes], codec: str) -> dict[str, Any]:
    from riverbed.client.producer import Producer

    async with Producer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        batch_size=BATCH_BYTES,
        max_request_size=2 * BATCH_BYTES,
        compression_type=codec,
        enable_idempotence=False,
    ) as producer:
        await producer.partitions_for(topic)
        started = time.perf_counter()
        for value in values:
            await producer.send(topic, value, partition=0)
        await producer.flush()
        elapsed_s = time.perf_counter() - started
    return {"records_per_s": len(values) / elapsed_s, "elapsed_s": elapsed_s}


def tier_offline(partition_dir: Path, store_dir: Path) -> dict[str, Any]:
    """What the offloader does per segment, timed: map, convert, write to the store."""
    from riverbed.tiering.file_store import FileStore
    from riverbed.tiering.parquet_codec import segment_to_parquet

    store = FileStore(store_dir)
    segments = sorted(partition_dir.glob("*.log"))
    records = 0
    started = time.perf_counter()
    for index, segment in enumerate(segments):
        data = segment.read_bytes()
        if not data:
            continue
        out = store_dir.parent / f"{store_dir.name}-{index}.parquet"
        summary = segment_to_parquet(data, "t", 0, out)
        asyncio.run(store.put_file(f"t/0/{index}.parquet", out))
        out.unlink()
        records += summary.records
    elapsed_s = time.perf_counter() - started
    return {
        "records": records,
        "records_per_s": records / elapsed_s,
        "elapsed_s": elapsed_s,
        "segment_bytes": sum(s.stat().st_size for s in segments),
        "object_bytes": sum(p.stat().st_size for p in store_dir.rglob("*.parquet")),
    }


async def wait_tiered(partition_dir: Path, records: int) -> float:
    """Until the broker tiered the cold topic and deleted its sealed segments locally."""
    started = time.perf_counter()
    while True:
        segments = sorted(partition_dir.glob("*.log"))
        if segments and len(segments) == 1 and int(segments[0].stem) > 0:
            return time.perf_counter() - started
        if time.perf_counter() - started > TIERED_TIMEOUT_S:
            raise ProcessFailed(f"{partition_dir.name} not tiered within {TIERED_TIMEOUT_S} s")
        await asyncio.sleep(0.2)


async def consume(bootstrap: str, topic: str, values: list[bytes]) -> dict[str, Any]:
    """Riverbed's consumer from offset 0 to the end, as in client_throughput; every value is
    checked against the dataset after the clock stops."""
    from riverbed.client.types import TopicPartition

    tp = TopicPartition(topic, 0)
    seen: list[bytes | None] = []
    async with riverbed_consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        started = time.perf_counter()
        deadline = time.monotonic() + TIERED_TIMEOUT_S
        while len(seen) < len(values):
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{topic}: consumed {len(seen)} of {len(values)}")
            batches = await consumer.getmany(max_records=CONSUME_BATCH_MAX, timeout_ms=1000)
            for batch in batches.values():
                seen += [record.value for record in batch]
        elapsed_s = time.perf_counter() - started
    if seen != values:
        raise ProcessFailed(f"{topic}: the records read back differ from the dataset")
    return {"records": len(seen), "records_per_s": len(seen) / elapsed_s, "elapsed_s": elapsed_s}


def summarize(records: int, settings: dict[str, str], measured: dict[str, Any]) -> BenchResult:
    produce_rate = measured["produce"]["records_per_s"]
    tiering_rate = measured["tiering"]["records_per_s"]
    hot_rate = measured["hot_fetch"]["records_per_s"]
    cold_rate = measured["cold_fetch"]["records_per_s"]
    plain, zstd = measured["tiering"], measured["tiering_zstd"]
    headlines: list[Headline] = [
        {"label": "produce (acks=all, 1 MB batches)", "value": produce_rate, "unit": "records/s"},
        {"label": "tiering: segment -> Parquet -> file:// store", "value": tiering_rate,
         "unit": "records/s"},
        {"label": "hot fetch from offset 0 (Riverbed consumer)", "value": hot_rate,
         "unit": "records/s"},
        {"label": "cold fetch from offset 0 (Riverbed consumer)", "value": cold_rate,
         "unit": "records/s"},
    ]  # fmt: skip
    ratios: list[Ratio] = [
        {
            "label": "tiering / produce throughput",
            "value": tiering_rate / produce_rate,
            "goal": f">= {TIERING_GOAL:g}",
            "met": tiering_rate >= TIERING_GOAL * produce_rate,
        },
        {
            "label": "cold bytes / hot bytes, produced uncompressed",
            "value": plain["object_bytes"] / plain["segment_bytes"],
            "goal": "reported",
            "met": None,
        },
        {
            "label": "cold bytes / hot bytes, produced with zstd",
            "value": zstd["object_bytes"] / zstd["segment_bytes"],
            "goal": "reported",
            "met": None,
        },
        {
            "label": "cold fetch / hot fetch, records/s",
            "value": cold_rate / hot_rate,
            "goal": f">= {COLD_FETCH_GOAL:g}",
            "met": cold_rate >= COLD_FETCH_GOAL * hot_rate,
        },
    ]
    return {
        "parameters": {
            "records": records,
            "dataset": "JSON events, ~200 bytes, seeded",
            "batch_bytes": BATCH_BYTES,
            "broker_settings": settings,
            "store": "file:// (S3 store not built yet)",
        },
        "tools": {},
        "measurements": measured,
        "headlines": headlines,
        "ratios": ratios,
    }
