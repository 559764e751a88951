"""Column pruning with the default schema: `df.select("value")` creates the reader with the
schema `value binary` (riverbed_spark/pruning.py, spark/jvm), so only that column is fetched
from the objects. The session is the suite's `spark` fixture, which does what a user does:
`spark.dataSource.register(RiverbedDataSource)`, with no other setting.

Checked in the plan (the scan's read schema) and in what moto's S3 server serves, with the
results byte-exact."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from riverbed.client.admin import Admin
from riverbed.client.producer import Producer
from riverbed_spark import RiverbedDataSource

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.moto_server import MotoServer
from tests.tiering.test_tiering_broker import TIERED_TOPIC, wait_until
from tests.tiering.test_tiering_s3_broker import ROOT, s3_broker

ALL = ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
T = TypeVar("T")


def scans(df: DataFrame) -> list[tuple[str, list[str]]]:
    """Each scan in the optimized plan: its source's name and the schema its reader gets."""
    jvm = df.sparkSession.sparkContext._jvm
    assert jvm is not None
    leaves = df._jdf.queryExecution().optimizedPlan().collectLeaves()
    found = []
    for leaf in jvm.scala.jdk.javaapi.CollectionConverters.asJava(leaves):
        assert leaf.getClass().getSimpleName() == "DataSourceV2ScanRelation"
        found.append((leaf.relation().table().name(), list(leaf.scan().readSchema().fieldNames())))
    return found


def test_the_scan_reads_only_the_columns_the_query_references(
    spark: SparkSession, tmp_path: Path
) -> None:
    # An empty store: plans are made and run (no rows) with no cluster.
    df = (
        spark.read.format("riverbed")
        .option("remote.storage.url", f"file://{tmp_path}")
        .option("subscribe", "orders")
        .load()
    )
    assert scans(df.select("value")) == [("riverbed", ["value"])]
    assert scans(df.select("key", "offset")) == [("riverbed", ["key", "offset"])]
    assert scans(df.select(F.col("value").alias("key"))) == [("riverbed", ["value"])]
    # What filters and aggregates above the projection reference is kept too.
    assert scans(df.filter(F.col("offset") > 5).select("value")) == [
        ("riverbed", ["value", "offset"])
    ]
    assert scans(df.groupBy("key").agg(F.sum(F.length("value")))) == [
        ("riverbed", ["key", "value"])
    ]
    # count() needs no column; the reader still yields rows, of the cheapest column.
    assert scans(df.groupBy().count()) == [("riverbed", ["partition"])]
    assert df.count() == 0
    assert df.select("value").collect() == []
    # Nothing to narrow: the whole row, or every column.
    assert scans(df) == [("riverbed", ALL)]
    assert scans(df.select(*ALL)) == [("riverbed", ALL)]
    # The scans of one relation are narrowed together, to the columns either needs (they share
    # one planned reader, one snapshot)...
    pairs = df.select("key", "value").join(df.groupBy("key").count(), "key")
    assert scans(pairs) == [("riverbed", ["key", "value"])] * 2
    assert scans(df.select("value").union(df.select("key"))) == [("riverbed", ["key", "value"])] * 2
    # ...and not at all if one of them needs every column.
    assert scans(df.join(df.select("key"), "key")) == [("riverbed", ALL)] * 2

    # A narrow schema given by the user is narrowed further; headers are a column like others.
    def reader() -> DataFrameReader:  # a DataFrameReader's schema() changes it: one each
        return (
            spark.read.format("riverbed")
            .option("remote.storage.url", f"file://{tmp_path}")
            .option("subscribe", "orders")
        )

    narrow = reader().schema("offset long, value binary").load()
    assert scans(narrow.select("value")) == [("riverbed", ["value"])]
    with_headers = reader().option("includeHeaders", "true").load()
    assert scans(with_headers.select("headers")) == [("riverbed", ["headers"])]


def test_pruning_can_be_switched_off_by_its_rule_name(spark: SparkSession, tmp_path: Path) -> None:
    """Spark's own switch for an optimizer rule (docs/spark.md): every column is read again."""
    df = (
        spark.read.format("riverbed")
        .option("remote.storage.url", f"file://{tmp_path}")
        .option("subscribe", "orders")
        .load()
    )
    spark.conf.set("spark.sql.optimizer.excludedRules", "riverbed.spark.ColumnPruning(riverbed)")
    try:
        assert scans(df.select("value")) == [("riverbed", ALL)]
        assert df.select("value").collect() == []
    finally:
        spark.conf.unset("spark.sql.optimizer.excludedRules")
    assert scans(df.select("value")) == [("riverbed", ["value"])]


def test_other_sources_are_left_alone_and_registering_again_installs_nothing_more(
    spark: SparkSession,
) -> None:
    class Other(DataSource):
        """Riverbed's columns under another name."""

        @classmethod
        def name(cls) -> str:
            return "not-riverbed"

        def schema(self) -> str:
            return "key binary, value binary, partition int"

        def reader(self, schema: Any) -> DataSourceReader:
            return NoRows()

    class NoRows(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(0)]

        def read(self, partition: InputPartition) -> Any:
            return iter([])

    spark.dataSource.register(Other)
    other = spark.read.format("not-riverbed").load()
    assert scans(other.select("value")) == [("not-riverbed", ["key", "value", "partition"])]
    assert other.select("value").collect() == []

    def pruning_rules() -> list[str]:
        rules = spark._jsparkSession.experimental().extraOptimizations()
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        names = [r.ruleName() for r in jvm.scala.jdk.javaapi.CollectionConverters.asJava(rules)]
        return [name for name in names if "ColumnPruning" in name]

    assert pruning_rules() == ["riverbed.spark.ColumnPruning(riverbed)"]
    spark.dataSource.register(RiverbedDataSource)
    assert pruning_rules() == ["riverbed.spark.ColumnPruning(riverbed)"]


# Keys and values of the same size, both random (incompressible): a read of one of them fetches
# about half of what a read of every column does.
PAIRS = 4_000
PAIR_BYTES = 1_000


async def fill_pairs(broker: BrokerProcess, topic: str) -> dict[int, tuple[bytes, bytes]]:
    """PAIRS records of random key and value into partition 0: {offset: (key, value)}."""
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(
            topic,
            partitions=1,
            replication_factor=1,
            configs={**TIERED_TOPIC, "segment.bytes": str(1024 * 1024)},
        )
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5) as producer:
        pairs = [(os.urandom(PAIR_BYTES), os.urandom(PAIR_BYTES)) for _ in range(PAIRS)]
        futures = [await producer.send(topic, v, key=k, partition=0) for k, v in pairs]
        await producer.flush()
        return {(await future).offset: pair for future, pair in zip(futures, pairs, strict=True)}


def test_select_fetches_only_the_referenced_columns_from_s3(
    spark: SparkSession, broker_factory: BrokerFactory, moto_server: MotoServer, s3_bucket: str
) -> None:
    broker = s3_broker(broker_factory, moto_server, s3_bucket)
    topic = f"pairs-{uuid.uuid4().hex[:8]}"
    produced = asyncio.run(fill_pairs(broker, topic))
    # Every sealed segment tiered (only the active one left on disk): the split between cold
    # and hot no longer moves, so each query below reads the same objects.
    asyncio.run(
        wait_until(lambda: len(broker.segment_files(topic, 0)) == 1, "all sealed segments tiered")
    )
    options = {
        "bootstrap.servers": broker.bootstrap,
        "remote.storage.url": f"s3://{s3_bucket}/{ROOT}",
        "subscribe": topic,
        **moto_server.settings(),
    }
    df = spark.read.format("riverbed").options(**options).load()

    def served(action: Callable[[], T]) -> tuple[T, int]:
        before = moto_server.bytes_served()
        result = action()
        return result, moto_server.bytes_served() - before

    everything, full_bytes = served(df.collect)
    assert {row.offset: (row.key, row.value) for row in everything} == produced
    assert full_bytes > PAIRS * PAIR_BYTES  # most of the keys and values come from S3

    def narrow(schema: str) -> int:
        return served(
            spark.read.format("riverbed").options(**options).schema(schema).load().collect
        )[1]

    def about(got: int, expected: int) -> bool:
        return abs(got - expected) <= expected // 10

    # select("value"): what a reader given only `value` fetches, about half the full read.
    values, value_bytes = served(df.select("value").collect)
    assert sorted(row.value for row in values) == sorted(v for _, v in produced.values())
    assert about(value_bytes, narrow("value binary")), (value_bytes, full_bytes)
    assert 0.35 * full_bytes < value_bytes < 0.65 * full_bytes, (value_bytes, full_bytes)
    assert scans(df.select("value")) == [("riverbed", ["value"])]

    keys, key_bytes = served(df.select("key", "offset").collect)
    assert {row.offset: row.key for row in keys} == {o: k for o, (k, _) in produced.items()}
    assert about(key_bytes, narrow("key binary, offset long")), (key_bytes, full_bytes)
    assert 0.35 * full_bytes < key_bytes < 0.65 * full_bytes, (key_bytes, full_bytes)

    # count(): no key or value fetched at all, and every record counted.
    count, count_bytes = served(df.count)
    assert count == PAIRS
    assert count_bytes < full_bytes / 10, (count_bytes, full_bytes)

    # Filters and aggregates on top.
    even, even_bytes = served(df.filter(F.col("offset") % 2 == 0).select("value").collect)
    assert sorted(row.value for row in even) == sorted(
        v for o, (_, v) in produced.items() if o % 2 == 0
    )
    assert even_bytes < 0.65 * full_bytes, (even_bytes, full_bytes)
    totals = df.groupBy("partition").agg(F.count("*").alias("n"), F.sum(F.length("value")))
    (total,), total_bytes = served(totals.collect)
    assert tuple(total) == (0, PAIRS, PAIRS * PAIR_BYTES)
    assert total_bytes < 0.65 * full_bytes, (total_bytes, full_bytes)
