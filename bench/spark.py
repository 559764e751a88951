"""Spark over a topic's history: the `riverbed` data source against the client path.

One broker tiers a JSON event dataset (5M records, ~200 bytes each, keyed by user; 8 MiB
segments, `local.retention.bytes=1`) to a file:// store, so nearly all of it is in the cold
tier. Then, in one Spark (local[2], both cores), each timed from nothing to the answer:

1. `riverbed` data source: `count()` and `groupBy("key").count()`, reading the cold tier
   straight from the store's Parquet objects and the hot tail through the broker. Once with
   the full schema, once with a schema of only the column needed (`offset` for the count,
   `key` for the group-by): Spark's Python data sources are not told a query's columns, so this
   is how a job asks for fewer.
2. Through the broker: Riverbed's consumer reads every record from offset 0 (the broker
   rebuilds the batches from Parquet), the records become an Arrow table, then a DataFrame
   (`createDataFrame`), then the same count and group-by. The consume and conversion are
   timed once and counted in both operations (the data source path re-reads for each).

Ratios: client path time / data source time, goal >= 5 for both operations. Bytes: the column
chunks a reader fetches from the objects with and without the narrow schema, from the objects'
Parquet metadata (row groups x columns read; footers not counted), next to the objects' size.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.consumers import CONSUME_BATCH_MAX, riverbed_consumer
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import Broker, ProcessFailed, zookeeper
from bench.tiering import create_topics, events, produce, wait_tiered

NAME = "spark"
RECORDS_FULL = 5_000_000
RECORDS_QUICK = 200_000
SEGMENT_BYTES = 8 * 1024 * 1024
BROKER_START_TIMEOUT_S = 120.0
TASK_INTERVAL_MS = 200
SPEEDUP_GOAL = 5.0
SPARK_CORES = 2
DRIVER_MEMORY = "8g"  # the client path holds the whole dataset in the driver
TOPIC = "history"
WARM_UP_RECORDS = 1_000
USERS = 100_000
FULL_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")


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
            **options.broker_settings,
        }
        with zookeeper(scratch_dir / "zookeeper") as zk_connect:
            log_path = options.work_dir / "logs" / f"{NAME}-broker.log"
            broker = Broker(data_dir, zk_connect, settings, log_path)
            try:
                broker.start(BROKER_START_TIMEOUT_S)
                asyncio.run(fill(broker.bootstrap, data_dir, values))
                measured = measure(broker.bootstrap, store_dir, records)
                broker.terminate()
            finally:
                broker.close()
    return summarize(records, measured)


async def fill(bootstrap: str, data_dir: Path, values: list[bytes]) -> None:
    topic_configs = {
        "remote.storage.enable": "true",
        "local.retention.bytes": "1",
        "segment.bytes": str(SEGMENT_BYTES),
    }
    await create_topics(bootstrap, {TOPIC: topic_configs})
    await produce(bootstrap, TOPIC, values, "none", keys=keys_of(len(values)))
    await wait_tiered(data_dir / f"{TOPIC}-0")


def measure(bootstrap: str, store_dir: Path, records: int) -> dict[str, Any]:
    from riverbed_spark.local import local_session

    spark = local_session(
        "riverbed-bench",
        SPARK_CORES,
        **{
            "spark.driver.memory": DRIVER_MEMORY,
            "spark.sql.execution.arrow.pyspark.enabled": "true",
        },
    )
    options = {
        "bootstrap.servers": bootstrap,
        "remote.storage.url": f"file://{store_dir}",
        "subscribe": TOPIC,
    }
    try:

        def load(schema: str | None = None) -> Any:
            # A fresh reader each time: DataFrameReader.schema() changes the reader it is on.
            reader = spark.read.format("riverbed").options(**options)
            return (reader if schema is None else reader.schema(schema)).load()

        # Warm-up, untimed: the JVM's first query and Spark's first Python workers.
        spark.read.format("riverbed").options(
            **options, endingOffsets=f'{{"{TOPIC}": {{"0": {WARM_UP_RECORDS}}}}}'
        ).load().count()
        measured: dict[str, Any] = {"data_source": {}}
        source = measured["data_source"]
        source["count"] = timed(lambda: load().count())
        source["count_narrow"] = timed(lambda: load("offset long").count())
        source["group_by"] = timed(lambda: len(load().groupBy("key").count().collect()))
        source["group_by_narrow"] = timed(
            lambda: len(load("key binary").groupBy("key").count().collect())
        )
        measured["client"] = through_the_client(spark, bootstrap, records)
        measured["bytes"] = column_bytes(store_dir)
    finally:
        spark.stop()
    for name, result in {**measured["data_source"], **measured["client"]["ops"]}.items():
        expected = records if "count" in name else min(records, USERS)
        if result["answer"] != expected:
            raise ProcessFailed(f"{name} answered {result['answer']}, expected {expected}")
    return measured


def keys_of(records: int) -> list[bytes]:
    """Record i's key: one of USERS users, as a clickstream keyed by user."""
    return [f"user-{i % USERS}".encode() for i in range(records)]


def timed(work: Any) -> dict[str, Any]:
    started = time.perf_counter()
    answer = work()
    return {"elapsed_s": time.perf_counter() - started, "answer": answer}


def through_the_client(spark: Any, bootstrap: str, records: int) -> dict[str, Any]:
    """Consume everything through the broker, into an Arrow table, into a DataFrame."""
    import pyarrow as pa

    started = time.perf_counter()
    columns = asyncio.run(consume_columns(bootstrap, records))
    consumed_s = time.perf_counter() - started
    table = pa.table(
        {
            "key": pa.array(columns["key"], pa.binary()),
            "value": pa.array(columns["value"], pa.binary()),
            "offset": pa.array(columns["offset"], pa.int64()),
            "timestamp": pa.array(columns["timestamp"], pa.timestamp("ms", tz="UTC")),
        }
    )
    frame = spark.createDataFrame(table).cache()
    frame.count()  # materialized once, so each operation below pays only for itself
    loaded_s = time.perf_counter() - started
    count = timed(frame.count)
    group_by = timed(lambda: len(frame.groupBy("key").count().collect()))
    frame.unpersist()
    for op in (count, group_by):
        op["elapsed_s"] += loaded_s
    return {
        "consume_s": consumed_s,
        "load_s": loaded_s,
        "ops": {"client_count": count, "client_group_by": group_by},
    }


async def consume_columns(bootstrap: str, records: int) -> dict[str, list[Any]]:
    from riverbed.client.types import TopicPartition

    tp = TopicPartition(TOPIC, 0)
    columns: dict[str, list[Any]] = {"key": [], "value": [], "offset": [], "timestamp": []}
    async with riverbed_consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        count = 0
        while count < records:
            batches = await consumer.getmany(max_records=CONSUME_BATCH_MAX, timeout_ms=5000)
            if not batches:
                raise ProcessFailed(f"consumed {count} of {records}")
            for batch in batches.values():
                columns["key"] += [r.key for r in batch]
                columns["value"] += [r.value for r in batch]
                columns["offset"] += [r.offset for r in batch]
                columns["timestamp"] += [r.timestamp_ms for r in batch]
                count += len(batch)
    return columns


def column_bytes(store_dir: Path) -> dict[str, int]:
    """Compressed bytes of the column chunks each read fetches, over every row group."""
    import pyarrow.parquet as pq

    totals = {"objects": 0, "full": 0, "offset_only": 0, "key_only": 0}
    for path in store_dir.rglob("*.parquet"):
        totals["objects"] += path.stat().st_size
        metadata = pq.ParquetFile(path).metadata
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            sizes: Counter[str] = Counter()  # per top-level column (headers has two leaves)
            for i in range(row_group.num_columns):
                column = row_group.column(i)
                sizes[column.path_in_schema.split(".")[0]] += column.total_compressed_size
            # Every read also takes the offsets and batch attributes (range and control filter).
            always = sizes["offset"] + sizes["batch_attributes"]
            totals["full"] += always + sum(sizes[c] for c in FULL_COLUMNS if c != "offset")
            totals["offset_only"] += always
            totals["key_only"] += always + sizes["key"]
    return totals


def summarize(records: int, measured: dict[str, Any]) -> BenchResult:
    source, client = measured["data_source"], measured["client"]["ops"]
    count_s = source["count"]["elapsed_s"]
    group_s = source["group_by"]["elapsed_s"]
    client_count_s = client["client_count"]["elapsed_s"]
    client_group_s = client["client_group_by"]["elapsed_s"]
    volumes = measured["bytes"]
    headlines: list[Headline] = [
        {"label": "count(), riverbed data source", "value": records / count_s,
         "unit": "records/s"},
        {"label": "count(), data source, schema `offset` only",
         "value": records / source["count_narrow"]["elapsed_s"], "unit": "records/s"},
        {"label": "groupBy(key).count(), riverbed data source", "value": records / group_s,
         "unit": "records/s"},
        {"label": "groupBy(key).count(), data source, schema `key` only",
         "value": records / source["group_by_narrow"]["elapsed_s"], "unit": "records/s"},
        {"label": "count(), consumed through the broker into a DataFrame",
         "value": records / client_count_s, "unit": "records/s"},
        {"label": "groupBy(key).count(), consumed through the broker into a DataFrame",
         "value": records / client_group_s, "unit": "records/s"},
        {"label": "column chunks read, full schema", "value": volumes["full"] / 1e6,
         "unit": "MB"},
        {"label": "column chunks read, schema `key` only", "value": volumes["key_only"] / 1e6,
         "unit": "MB"},
    ]  # fmt: skip
    ratios: list[Ratio] = [
        {
            "label": "count(): client path time / data source time",
            "value": client_count_s / count_s,
            "goal": f">= {SPEEDUP_GOAL:g}",
            "met": client_count_s >= SPEEDUP_GOAL * count_s,
        },
        {
            "label": "groupBy(key).count(): client path time / data source time",
            "value": client_group_s / group_s,
            "goal": f">= {SPEEDUP_GOAL:g}",
            "met": client_group_s >= SPEEDUP_GOAL * group_s,
        },
        {
            "label": "bytes read, schema `key` only / full schema",
            "value": volumes["key_only"] / volumes["full"],
            "goal": "reported",
            "met": None,
        },
    ]
    return {
        "parameters": {
            "records": records,
            "segment_bytes": SEGMENT_BYTES,
            "spark_master": f"local[{SPARK_CORES}]",
            "spark_driver_memory": DRIVER_MEMORY,
        },
        "tools": {"pyspark": _pyspark_version()},
        "measurements": measured,
        "headlines": headlines,
        "ratios": ratios,
    }


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)
