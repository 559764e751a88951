"""Tiering: can it keep up with ingest, how big is the cold tier, how fast are cold reads.

A JSON event dataset (varied fields, ~200 bytes each), measured on one broker per object store,
all in one run:

1. Produce the dataset with Riverbed's producer (acks=all, 1 MB batches, uncompressed) into a
   topic that is not tiered yet (64 MiB segments): records/s of ingest.
2. Tiering throughput, as the broker's own offloader runs it (sealed segment -> Parquet ->
   object store, manifest commits included): `remote.storage.enable=true` and
   `local.retention.bytes=1` are set on that topic, and the clock runs until every sealed
   segment is uploaded and deleted locally; records/s of the records tiered. Ratio tiering /
   produce, goal >= 2 (tiering never falls behind ingest). Once with a file:// store, once with
   moto's S3 server (a local HTTP endpoint: its own CPU shares the machine's two cores).
3. Cold bytes / hot bytes: Parquet object bytes over the bytes of the segments tiered, for the
   dataset produced uncompressed and produced with zstd (file:// run).
4. Cold fetch / hot fetch: Riverbed's consumer reads the dataset from offset 0, once from the
   untiered topic (page cache, sendfile) and once from a tiered topic (8 MiB segments) whose
   sealed segments were all deleted locally (every batch rebuilt from Parquet by the broker).
   Ratio goal >= 0.3.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.consumers import CONSUME_BATCH_MAX, riverbed_consumer
from bench.kafka_clients import end_offset
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import Broker, ProcessFailed, cpu_seconds, zookeeper

NAME = "tiering"
RECORDS_FULL = 2_000_000
RECORDS_QUICK = 100_000
BATCH_BYTES = 1_000_000
# Ingest topics: Kafka's default segment.bytes (1 GiB) would seal nothing of this dataset
# (~215 MB full, ~21 MB quick); these seal all but the last quarter or so.
INGEST_SEGMENT_BYTES = 32 * 1024 * 1024
INGEST_SEGMENT_BYTES_QUICK = 8 * 1024 * 1024
# The cold-read topic: many segments, so reads cross object boundaries often.
COLD_SEGMENT_BYTES = 8 * 1024 * 1024
BROKER_START_TIMEOUT_S = 120.0
TIERED_TIMEOUT_S = 600.0
TASK_INTERVAL_MS = 200
TIERING_GOAL = 2.0
COLD_FETCH_GOAL = 0.3
TIER_NOW = {"remote.storage.enable": "true", "local.retention.bytes": "1"}


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
    from tests.support.moto_server import MotoServer

    records = RECORDS_QUICK if options.quick else RECORDS_FULL
    ingest = {
        "segment.bytes": str(INGEST_SEGMENT_BYTES_QUICK if options.quick else INGEST_SEGMENT_BYTES)
    }
    values = events(records)
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=options.work_dir) as scratch:
        scratch_dir = Path(scratch)
        store_dir = scratch_dir / "cold"
        file_settings = {"remote.storage.url": f"file://{store_dir}"}
        measured = with_broker(
            options, scratch_dir / "file", file_settings, ingest, values, store_dir
        )
        # The file:// run leaves ~1 GB of segments and objects for the kernel to write back;
        # the S3 run is measured after that, not while it runs on the same cores.
        os.sync()
        moto = MotoServer(options.work_dir / "logs" / f"{NAME}-moto.log")
        moto.start()
        try:
            bucket = moto.create_bucket("riverbed-bench")
            s3_settings = {"remote.storage.url": f"s3://{bucket}/cold", **moto.settings()}
            measured["s3"] = with_broker(
                options, scratch_dir / "s3", s3_settings, ingest, values, None, moto.pid
            )
        finally:
            moto.stop()
    return summarize(records, {**file_settings, **ingest}, measured)


def with_broker(
    options: BenchOptions,
    scratch_dir: Path,
    store_settings: dict[str, str],
    ingest: dict[str, str],
    values: list[bytes],
    store_dir: Path | None,
    store_pid: int | None = None,
) -> dict[str, Any]:
    """One broker tiering to one store: everything with a file:// store (`store_dir`), only
    ingest and tiering throughput with S3 (whose server's CPU is measured: `store_pid`)."""
    data_dir = scratch_dir / "broker-data"
    data_dir.mkdir(parents=True)
    settings = {
        **store_settings,
        "remote.log.manager.task.interval.ms": str(TASK_INTERVAL_MS),
        **options.broker_settings,
    }
    with zookeeper(scratch_dir / "zookeeper") as zk_connect:
        label = "file" if store_dir is not None else "s3"
        log_path = options.work_dir / "logs" / f"{NAME}-{label}-broker.log"
        broker = Broker(data_dir, zk_connect, settings, log_path)
        try:
            broker.start(BROKER_START_TIMEOUT_S)
            if store_dir is None:
                processes = {"broker": broker.pid}
                if store_pid is not None:
                    processes["store server"] = store_pid
                measured = asyncio.run(
                    measure_tiering_only(broker.bootstrap, data_dir, ingest, values, processes)
                )
            else:
                measured = asyncio.run(measure(broker, data_dir, store_dir, ingest, values))
            broker.terminate()
        finally:
            broker.close()
    return measured


async def measure(
    broker: Broker, data_dir: Path, store_dir: Path, ingest: dict[str, str], values: list[bytes]
) -> dict[str, Any]:
    bootstrap = broker.bootstrap
    await create_topics(
        bootstrap,
        {
            "ingest": ingest,
            # zstd batches take about a quarter of the bytes: smaller segments seal as many.
            "ingest-zstd": {"segment.bytes": str(int(ingest["segment.bytes"]) // 8)},
            "cold": {"segment.bytes": str(COLD_SEGMENT_BYTES), **TIER_NOW},
        },
    )
    measured: dict[str, Any] = {"produce": await produce(bootstrap, "ingest", values, "none")}
    await produce(bootstrap, "ingest-zstd", values, "zstd")
    await produce(bootstrap, "cold", values, "none")
    for topic in ("ingest", "ingest-zstd", "cold"):
        if end_offset(bootstrap, topic, 0) != len(values):
            raise ProcessFailed(f"{topic} does not hold {len(values)} records")
    measured["hot_fetch"] = await consume(bootstrap, "ingest", values)
    await wait_tiered(data_dir / "cold-0")
    measured["cold_fetch"] = await consume(bootstrap, "cold", values)
    broker_pid = {"broker": broker.pid}
    measured["tiering"] = await tier_now(bootstrap, data_dir / "ingest-0", "ingest", broker_pid)
    measured["tiering"]["object_bytes"] = objects_bytes(store_dir / "ingest")
    measured["tiering_zstd"] = await tier_now(
        bootstrap, data_dir / "ingest-zstd-0", "ingest-zstd", broker_pid
    )
    measured["tiering_zstd"]["object_bytes"] = objects_bytes(store_dir / "ingest-zstd")
    return measured


async def measure_tiering_only(
    bootstrap: str,
    data_dir: Path,
    ingest: dict[str, str],
    values: list[bytes],
    processes: dict[str, int],
) -> dict[str, Any]:
    await create_topics(bootstrap, {"ingest": ingest})
    measured: dict[str, Any] = {"produce": await produce(bootstrap, "ingest", values, "none")}
    measured["tiering"] = await tier_now(bootstrap, data_dir / "ingest-0", "ingest", processes)
    return measured


async def create_topics(bootstrap: str, topics: dict[str, dict[str, str]]) -> None:
    from riverbed.client.admin import Admin

    async with Admin(bootstrap_servers=bootstrap) as admin:
        for topic, configs in topics.items():
            await admin.create_topic(topic, partitions=1, replication_factor=1, configs=configs)


async def produce(
    bootstrap: str, topic: str, values: list[bytes], codec: str, keys: list[bytes] | None = None
) -> dict[str, Any]:
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
        if keys is None:
            for value in values:
                await producer.send(topic, value, partition=0)
        else:
            for key, value in zip(keys, values, strict=True):
                await producer.send(topic, value, key=key, partition=0)
        await producer.flush()
        elapsed_s = time.perf_counter() - started
    return {"records_per_s": len(values) / elapsed_s, "elapsed_s": elapsed_s}


async def tier_now(
    bootstrap: str, partition_dir: Path, topic: str, processes: dict[str, int]
) -> dict[str, Any]:
    """Turn tiering on for a produced topic and time the broker until its sealed segments are
    uploaded and deleted locally; with the CPU seconds `processes` (name: pid) used meanwhile
    (the machine has two cores: what the store's server uses, the broker cannot)."""
    from riverbed.client.admin import Admin

    segments = sorted(partition_dir.glob("*.log"))
    sealed = segments[:-1]
    records = int(segments[-1].stem) - int(sealed[0].stem) if sealed else 0
    if records == 0:
        raise ProcessFailed(f"{topic}: no sealed segment to tier")
    segment_bytes = sum(s.stat().st_size for s in sealed)
    cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    async with Admin(bootstrap_servers=bootstrap) as admin:
        started = time.perf_counter()
        await admin.alter_configs(topic, set=TIER_NOW)
    elapsed_s = await wait_tiered(partition_dir, started)
    cpu_s = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in processes.items()}
    return {
        "records": records,
        "records_per_s": records / elapsed_s,
        "elapsed_s": elapsed_s,
        "segments": len(sealed),
        "segment_bytes": segment_bytes,
        "cpu_s": cpu_s,
    }


def objects_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*.parquet"))


async def wait_tiered(partition_dir: Path, started: float | None = None) -> float:
    """Until the broker tiered the partition and deleted its sealed segments locally; the
    seconds since `started` (perf_counter; now by default)."""
    started = time.perf_counter() if started is None else started
    while True:
        segments = sorted(partition_dir.glob("*.log"))
        if segments and len(segments) == 1 and int(segments[0].stem) > 0:
            return time.perf_counter() - started
        if time.perf_counter() - started > TIERED_TIMEOUT_S:
            raise ProcessFailed(f"{partition_dir.name} not tiered within {TIERED_TIMEOUT_S} s")
        await asyncio.sleep(0.02)


async def consume(bootstrap: str, topic: str, values: list[bytes]) -> dict[str, Any]:
    """Riverbed's consumer from offset 0 to the end, as in client_throughput; every value is
    checked against the dataset as it arrives (a slice comparison: nothing accumulates, so the
    check costs the same at any dataset size)."""
    from riverbed.client.types import TopicPartition

    tp = TopicPartition(topic, 0)
    count = 0
    async with riverbed_consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        started = time.perf_counter()
        deadline = time.monotonic() + TIERED_TIMEOUT_S
        while count < len(values):
            if time.monotonic() > deadline:
                raise ProcessFailed(f"{topic}: consumed {count} of {len(values)}")
            batches = await consumer.getmany(max_records=CONSUME_BATCH_MAX, timeout_ms=1000)
            for batch in batches.values():
                if [record.value for record in batch] != values[count : count + len(batch)]:
                    raise ProcessFailed(f"{topic}: records from offset {count} differ")
                count += len(batch)
        elapsed_s = time.perf_counter() - started
    return {"records": count, "records_per_s": count / elapsed_s, "elapsed_s": elapsed_s}


def summarize(records: int, settings: dict[str, str], measured: dict[str, Any]) -> BenchResult:
    produce_rate = measured["produce"]["records_per_s"]
    tiering_rate = measured["tiering"]["records_per_s"]
    s3 = measured["s3"]
    s3_produce_rate = s3["produce"]["records_per_s"]
    s3_tiering_rate = s3["tiering"]["records_per_s"]
    hot_rate = measured["hot_fetch"]["records_per_s"]
    cold_rate = measured["cold_fetch"]["records_per_s"]
    plain, zstd = measured["tiering"], measured["tiering_zstd"]
    headlines: list[Headline] = [
        {"label": "produce (acks=all, 1 MB batches)", "value": produce_rate, "unit": "records/s"},
        {"label": "tiering by the broker: segment -> Parquet -> file:// store",
         "value": tiering_rate, "unit": "records/s"},
        {"label": "tiering by the broker: segment -> Parquet -> S3 (moto server)",
         "value": s3_tiering_rate, "unit": "records/s"},
        {"label": "hot fetch from offset 0 (Riverbed consumer)", "value": hot_rate,
         "unit": "records/s"},
        {"label": "cold fetch from offset 0 (Riverbed consumer)", "value": cold_rate,
         "unit": "records/s"},
    ]  # fmt: skip
    ratios: list[Ratio] = [
        {
            "label": "tiering / produce throughput, file://",
            "value": tiering_rate / produce_rate,
            "goal": f">= {TIERING_GOAL:g}",
            "met": tiering_rate >= TIERING_GOAL * produce_rate,
        },
        {
            "label": "tiering / produce throughput, S3 (moto server)",
            "value": s3_tiering_rate / s3_produce_rate,
            "goal": f">= {TIERING_GOAL:g}",
            "met": s3_tiering_rate >= TIERING_GOAL * s3_produce_rate,
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
            "cold_segment_bytes": COLD_SEGMENT_BYTES,
            "task_interval_ms": TASK_INTERVAL_MS,
            "broker_and_ingest_topic_settings": settings,
            "stores": "file:// and s3:// on moto's standalone server (127.0.0.1)",
        },
        "tools": {},
        "measurements": measured,
        "headlines": headlines,
        "ratios": ratios,
    }
