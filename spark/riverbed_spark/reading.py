"""What an executor does with a split: Arrow record batches in the query's schema.

A cold split is read from its object (cold.py). A hot split is read through the broker with
Riverbed's consumer, except for any part of it that has been tiered since planning: that part
is read from the objects instead, so a split planned as hot still reads every record once even
if local retention deleted it from the broker's disk meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Final

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from riverbed.client.consumer import Consumer
from riverbed.client.types import Record, TopicPartition
from riverbed.tiering.txn_ranges import overlapping

from riverbed_spark.cold import ColdStore, ColdView, DataLossError, finished_objects
from riverbed_spark.options import ReadOptions
from riverbed_spark.planning import ColdSplit, HotSplit

# Rows per Arrow batch handed to Spark from the hot tail.
HOT_BATCH_ROWS: Final = 65_536
# A hot split whose offsets stop coming for this long fails instead of hanging the task.
HOT_STALL_TIMEOUT_S: Final = 60.0
HOT_POLL_TIMEOUT_MS: Final = 1_000
# The source columns by name, in Spark's Kafka source types as Arrow holds them.
HEADER_TYPE: Final = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
COLUMN_TYPES: Final = {
    "key": pa.binary(),
    "value": pa.binary(),
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestampType": pa.int32(),
    "headers": pa.list_(HEADER_TYPE),
}


def read_split(
    split: InputPartition, options: ReadOptions, target: pa.Schema
) -> Iterator[pa.RecordBatch]:
    if not isinstance(split, ColdSplit | HotSplit):
        return  # Spark's stand-in when planning found nothing to read
    store = ColdStore(options.store) if options.store is not None else None
    if isinstance(split, ColdSplit):
        assert store is not None
        yield from _read_cold(store, split, options, target)
        return
    start = split.start
    if store is not None:
        for cold in tiered_since(
            store,
            split,
            fail_on_data_loss=options.fail_on_data_loss,
            read_committed=options.read_committed,
        ):
            yield from _read_cold(store, cold, options, target)
            start = cold.end
    if start < split.end:
        yield from _read_hot(split, start, options, target)


def tiered_since(
    store: ColdStore,
    split: HotSplit,
    *,
    fail_on_data_loss: bool = True,
    read_committed: bool = False,
) -> list[ColdSplit]:
    """The objects now holding the start of `split`, contiguous from its start (at
    read_committed, those the objects alone decide: cold.ColdView).

    A cold compaction swapped in since planning moves the manifest's compacted end past the
    planned one (every swap does), and its objects below the new compacted end may hold the
    compacted view of offsets whose older records the query's cold splits read from the objects
    they replaced: a tombstone gone from one with its key's value still in the other would bring
    the value back. Such an object is refused with DataLossError (failOnDataLoss, the default)
    or read as it is (failOnDataLoss=false)."""
    found = []
    position = split.start
    manifest = store.manifest(split.topic, split.partition)
    cold = ColdView(manifest, read_committed=read_committed)
    compacted_since = 0 <= split.compacted_end < manifest.compacted_end_offset
    for item in finished_objects(manifest):
        if item.last_offset < position:
            continue
        if item.base_offset > position or position >= min(split.end, cold.end):
            break
        rewritten = compacted_since and item.base_offset < manifest.compacted_end_offset
        if rewritten and fail_on_data_loss:
            raise DataLossError(
                f"{store.options.url}/{item.key}: {split.topic}-{split.partition}'s cold tier "
                f"was compacted after the query was planned (compacted up to offset "
                f"{manifest.compacted_end_offset}, planned at {split.compacted_end}); run "
                "the query again, or set failOnDataLoss=false to read the compacted records"
            )
        end = min(split.end, cold.end, item.last_offset + 1)
        aborted = tuple(overlapping(cold.aborted, position, end))
        found.append(ColdSplit(split.topic, split.partition, (item,), position, end, aborted))
        position = end
    return found


def _read_cold(
    store: ColdStore, split: ColdSplit, options: ReadOptions, target: pa.Schema
) -> Iterator[pa.RecordBatch]:
    for item in split.items:
        start = max(split.start, item.base_offset)
        end = min(split.end, item.last_offset + 1)
        try:
            for batch in store.read(item, start, end, target.names, split.aborted):
                if batch.num_rows:
                    yield _conform(batch, target)
        except DataLossError:
            if options.fail_on_data_loss:
                raise


def _read_hot(
    split: HotSplit, start: int, options: ReadOptions, target: pa.Schema
) -> Iterator[pa.RecordBatch]:
    records = asyncio.run(_fetch(split, start, options))
    for first in range(0, len(records), HOT_BATCH_ROWS):
        yield _from_records(records[first : first + HOT_BATCH_ROWS], target)


async def _fetch(split: HotSplit, start: int, options: ReadOptions) -> list[Record]:
    """Records with offsets in [start, split.end): until the position reaches the end, since
    the last offsets may hold no record a consumer sees (transaction markers)."""
    tp = TopicPartition(split.topic, split.partition)
    out: list[Record] = []
    async with Consumer(
        bootstrap_servers=options.bootstrap_servers,
        auto_offset_reset="none",
        isolation_level=options.isolation_level,
    ) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, start)
        stalled_at = time.monotonic()
        while await consumer.position(tp) < split.end:
            batches = await consumer.getmany(tp, timeout_ms=HOT_POLL_TIMEOUT_MS)
            got = [r for r in batches.get(tp, []) if r.offset < split.end]
            if got:
                out += got
                stalled_at = time.monotonic()
            elif time.monotonic() - stalled_at > HOT_STALL_TIMEOUT_S:
                raise TimeoutError(
                    f"{split.topic}-{split.partition}: no progress past offset "
                    f"{await consumer.position(tp)} toward {split.end} in {HOT_STALL_TIMEOUT_S} s"
                )
    return out


def _from_records(records: list[Record], target: pa.Schema) -> pa.RecordBatch:
    # Each column's values, built only for the columns the query reads.
    builders: dict[str, Callable[[], list[object]]] = {
        "key": lambda: [r.key for r in records],
        "value": lambda: [r.value for r in records],
        "topic": lambda: [r.topic for r in records],
        "partition": lambda: [r.partition for r in records],
        "offset": lambda: [r.offset for r in records],
        "timestamp": lambda: [r.timestamp_ms * 1000 for r in records],
        "timestampType": lambda: [r.timestamp_type for r in records],
        "headers": lambda: [
            [{"key": name, "value": value} for name, value in r.headers] for r in records
        ],
    }
    arrays = [pa.array(builders[name](), type=COLUMN_TYPES[name]) for name in target.names]
    return _conform(pa.RecordBatch.from_arrays(arrays, names=target.names), target)


def _conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """Spark checks the schema exactly: the types it wants, its nullability, its list field
    names."""
    return batch.cast(target)
