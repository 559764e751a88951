"""Spark's `riverbed` source over a compacted cold tier: the rows are exactly what a consumer
reads through the broker's read path, across compacted objects with gaps, thinned batches and
objects left with no row; and a query whose hot splits meet objects a compaction rewrote after
it was planned fails (failOnDataLoss) rather than mixing the old and the new view.

The partition is driven in-process with the broker's own parts (tests/tiering/cold_harness.py)
on a file:// store; Spark reads the store alone (no cluster)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from riverbed.protocol.compression import CompressionType
from riverbed_spark.cold import ColdStore, DataLossError
from riverbed_spark.options import StoreOptions
from riverbed_spark.planning import HotSplit
from riverbed_spark.reading import tiered_since

from tests.tiering.cold_harness import NOW_MS, TOPIC, KeyedRecord, Model, TieredPartition

OVERRIDES = {"local.retention.bytes": "1"}
DELETE_RETENTION_MS = 100_000


def write_rounds(tiered: TieredPartition, model: Model, rounds: range) -> None:
    for round_ in rounds:
        records: list[KeyedRecord] = [
            (b"k%d" % i, b"round %d of %d" % (round_, i) * 3, NOW_MS - 1_000 + round_)
            for i in range(5)
        ]
        records.append((b"k%d" % (round_ % 7 + 10), None, NOW_MS - 2 * DELETE_RETENTION_MS))
        tiered.write(model, records, CompressionType.ZSTD if round_ % 2 else CompressionType.NONE)


async def compacted_partition(root: Path) -> tuple[list[tuple[object, ...]], int]:
    tiered = await TieredPartition.open(root, topic_overrides=OVERRIDES)
    try:
        model = Model()
        write_rounds(tiered, model, range(20))
        tiered.seal(model, b"~hot")
        await tiered.tier()
        while await tiered.compact_cold() is not None:
            pass
        cold_end = tiered.manifest().finished_end_offset
        read = await tiered.read_from(0)
        assert len(read) < 100  # compaction dropped most of the 120 records
        return [
            (r.offset, r.key, r.value, r.timestamp_ms) for r in read if r.offset < cold_end
        ], cold_end
    finally:
        await tiered.close()


def test_spark_reads_a_compacted_cold_tier_as_the_broker_serves_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    expected, cold_end = asyncio.run(compacted_partition(tmp_path))
    frame = (
        spark.read.format("riverbed")
        .option("remote.storage.url", f"file://{tmp_path / 'cold'}")
        .option("subscribe", TOPIC)
        .load()
    )
    rows = sorted(
        (r.offset, r.key, r.value, int(r.timestamp.timestamp() * 1000)) for r in frame.collect()
    )
    assert rows == expected
    assert rows[-1][0] < cold_end


async def plan_then_compact(root: Path, compact: bool) -> tuple[HotSplit, StoreOptions]:
    """A hot split planned above the cold tier's end; then more is tiered, and compacted (or
    not)."""
    tiered = await TieredPartition.open(root, topic_overrides=OVERRIDES)
    try:
        model = Model()
        write_rounds(tiered, model, range(10))
        tiered.seal(model)
        await tiered.tier()
        manifest = tiered.manifest()
        split = HotSplit(
            TOPIC,
            0,
            manifest.finished_end_offset,
            tiered.log.high_watermark + 1000,
            manifest.compacted_end_offset,
        )
        write_rounds(tiered, model, range(10, 20))
        tiered.seal(model)
        await tiered.tier()
        if compact:
            assert await tiered.compact_cold() is not None
        return split, StoreOptions(f"file://{tiered.store_root}")
    finally:
        await tiered.close()


@pytest.mark.parametrize("compacted_since", [False, True])
def test_a_hot_split_never_mixes_objects_compacted_after_planning_into_its_snapshot(
    tmp_path: Path, compacted_since: bool
) -> None:
    split, options = asyncio.run(plan_then_compact(tmp_path, compacted_since))
    store = ColdStore(options)
    if not compacted_since:
        tiered = tiered_since(store, split)
        assert tiered
        assert tiered[0].start == split.start  # objects tiered since planning
        return
    with pytest.raises(DataLossError, match="compacted after the query was planned"):
        tiered_since(store, split)
    assert tiered_since(store, split, fail_on_data_loss=False)[0].start == split.start
