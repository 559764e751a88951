"""Spark over a topic's history: the `riverbed` data source against the client path.

One broker tiers a JSON event dataset (5M records, ~200 bytes each, keyed by user; 8 MiB
segments, `local.retention.bytes=1`) to a file:// store, so nearly all of it is in the cold
tier. Then, in one Spark (local[2], both cores), each timed from nothing to the answer:

1. `riverbed` data source: `count()` and `groupBy("key").count()`, reading the cold tier
   straight from the store's Parquet objects and the hot tail through the broker, as a user
   writes them: column pruning (riverbed_spark/pruning.py) gives the reader only the column the
   query needs (`partition` for the count, `key` for the group-by). Then the same queries with
   the pruning rule excluded (`spark.sql.optimizer.excludedRules`), so every column is read:
   what a Python data source gets from Spark by itself. Each query's read schema is checked in
   its plan before it is timed. Pruned and unpruned alternate, 3 runs each, median kept.
2. Through the broker: Riverbed's consumer reads every record from offset 0 (the broker
   rebuilds the batches from Parquet), the records become an Arrow table, then a DataFrame
   (`createDataFrame`), then the same count and group-by. The consume and conversion are
   timed once and counted in both operations (the data source path re-reads for each).

Ratios: client path time / data source time, goal >= 5 for both operations, as users run them
(pruned); the unpruned ratios are reported beside them. Bytes: the column chunks a reader fetches
from the objects with and without pruning, from the objects' Parquet metadata and the reader's
own choice of row groups and columns (footers not counted), next to the objects' size.
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
REPEATS = 3  # of each data source query (the client path's load is timed once: ~30 s)
USERS = 100_000
FULL_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
PRUNING_RULE = "riverbed.spark.ColumnPruning(riverbed)"  # the rule's ruleName()
EXCLUDED_RULES = "spark.sql.optimizer.excludedRules"
# What the reader gets in each query, pruned: count() needs no column, the cheapest is kept.
COUNT_COLUMNS = ["partition"]
GROUP_BY_COLUMNS = ["key"]


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

        def count() -> Any:
            return spark.read.format("riverbed").options(**options).load().groupBy().count()

        def group_by() -> Any:
            return spark.read.format("riverbed").options(**options).load().groupBy("key").count()

        # Warm-up, untimed: the JVM's first query and Spark's first Python workers.
        spark.read.format("riverbed").options(
            **options, endingOffsets=f'{{"{TOPIC}": {{"0": {WARM_UP_RECORDS}}}}}'
        ).load().count()
        measured: dict[str, Any] = {"data_source": {}}
        source = measured["data_source"]
        # `groupBy().count().collect()` is what `df.count()` runs. Each query's plan is checked
        # before it runs; pruned and unpruned alternate, the median of REPEATS is kept.
        runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(REPEATS):
            for suffix, count_columns, group_by_columns in (
                ("", COUNT_COLUMNS, GROUP_BY_COLUMNS),
                ("_unpruned", list(FULL_COLUMNS), list(FULL_COLUMNS)),
            ):
                if suffix:
                    spark.conf.set(EXCLUDED_RULES, PRUNING_RULE)
                expect_read_schema(count(), count_columns)
                runs.setdefault(f"count{suffix}", []).append(timed(lambda: count().collect()[0][0]))
                expect_read_schema(group_by(), group_by_columns)
                runs.setdefault(f"group_by{suffix}", []).append(
                    timed(lambda: len(group_by().collect()))
                )
                spark.conf.unset(EXCLUDED_RULES)
        measured["data_source_runs"] = runs
        for name, results in runs.items():
            source[name] = sorted(results, key=lambda r: r["elapsed_s"])[len(results) // 2]
        measured["client"] = through_the_client(spark, bootstrap, records)
        measured["bytes"] = column_bytes(store_dir)
    finally:
        spark.stop()
    answers = [(name, r) for name, results in measured["data_source_runs"].items() for r in results]
    for name, result in [*answers, *measured["client"]["ops"].items()]:
        expected = records if "count" in name else min(records, USERS)
        if result["answer"] != expected:
            raise ProcessFailed(f"{name} answered {result['answer']}, expected {expected}")
    return measured


def expect_read_schema(df: Any, columns: list[str]) -> None:
    """The schema the riverbed reader gets in `df`'s optimized plan must be `columns`."""
    jvm = df.sparkSession.sparkContext._jvm
    leaves = jvm.scala.jdk.javaapi.CollectionConverters.asJava(
        df._jdf.queryExecution().optimizedPlan().collectLeaves()
    )
    read = [list(leaf.scan().readSchema().fieldNames()) for leaf in leaves]
    if read != [columns]:
        raise ProcessFailed(f"the reader would read {read}, expected [{columns}]")


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
    """Compressed bytes of the column chunks each read fetches, over every row group: the
    reader's own choice (riverbed_spark.cold): a row group wholly wanted gives only the
    query's columns, another one also its offsets and batch attributes, to filter."""
    import pyarrow.parquet as pq
    from riverbed_spark.cold import row_groups_overlapping

    reads = {"full": list(FULL_COLUMNS), "count": COUNT_COLUMNS, "key_only": GROUP_BY_COLUMNS}
    totals = dict.fromkeys(["objects", *reads], 0)
    for path in store_dir.rglob("*.parquet"):
        totals["objects"] += path.stat().st_size
        file = pq.ParquetFile(path)
        # The whole history: every offset a row group can hold is in the range.
        for group, whole in row_groups_overlapping(file, 0, 2**63 - 1):
            row_group = file.metadata.row_group(group)
            sizes: Counter[str] = Counter()  # per top-level column (headers has two leaves)
            for i in range(row_group.num_columns):
                column = row_group.column(i)
                sizes[column.path_in_schema.split(".")[0]] += column.total_compressed_size
            for name, columns in reads.items():
                read = set(columns) if whole else {*columns, "offset", "batch_attributes"}
                totals[name] += sum(sizes[c] for c in read)
    return totals


def summarize(records: int, measured: dict[str, Any]) -> BenchResult:
    source, client = measured["data_source"], measured["client"]["ops"]
    seconds = {name: result["elapsed_s"] for name, result in {**source, **client}.items()}
    volumes = measured["bytes"]
    rates = {
        "count(), riverbed data source (pruned to `partition`)": "count",
        "count(), data source, pruning off (every column)": "count_unpruned",
        "groupBy(key).count(), riverbed data source (pruned to `key`)": "group_by",
        "groupBy(key).count(), data source, pruning off (every column)": "group_by_unpruned",
        "count(), consumed through the broker into a DataFrame": "client_count",
        "groupBy(key).count(), consumed through the broker into a DataFrame": "client_group_by",
    }
    headlines: list[Headline] = [
        *(
            Headline(label=label, value=records / seconds[key], unit="records/s")
            for label, key in rates.items()
        ),
        {"label": "column chunks read, every column", "value": volumes["full"] / 1e6,
         "unit": "MB"},
        {"label": "column chunks read, count() pruned", "value": volumes["count"] / 1e3,
         "unit": "kB"},
        {"label": "column chunks read, groupBy(key) pruned", "value": volumes["key_only"] / 1e6,
         "unit": "MB"},
    ]  # fmt: skip
    ratios: list[Ratio] = [
        _speedup("count(): client path time / data source time", seconds, "count"),
        _speedup("groupBy(key).count(): client path time / data source time", seconds, "group_by"),
        _speedup("count(), pruning off: client path / data source", seconds, "count_unpruned"),
        _speedup(
            "groupBy(key).count(), pruning off: client path / data source",
            seconds,
            "group_by_unpruned",
        ),
        {
            "label": "bytes read, groupBy(key) pruned / every column",
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
            "data_source_repeats": REPEATS,
        },
        "tools": {"pyspark": _pyspark_version()},
        "measurements": measured,
        "headlines": headlines,
        "ratios": ratios,
    }


def _speedup(label: str, seconds: dict[str, float], source_op: str) -> Ratio:
    client_op = "client_count" if source_op.startswith("count") else "client_group_by"
    ratio = seconds[client_op] / seconds[source_op]
    return {"label": label, "value": ratio, "goal": f">= {SPEEDUP_GOAL:g}",
            "met": ratio >= SPEEDUP_GOAL}  # fmt: skip


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)
