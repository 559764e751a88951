"""Cold-tier compaction of a compacted tiered topic with Spark, for histories too large for the
broker (`remote.log.compaction.broker.max.bytes`).

    python -m riverbed_spark.jobs.compact_cold --bootstrap-servers 127.0.0.1:9092 \\
        --object-store file://$PWD/.riverbed/cold --topic state [--partition 0 ...] [--force]

It computes what a broker's pass computes (riverbed.tiering.cold_compaction: the same plan, the
same rule, the same group rewrite) and commits it through the same manifest steps
(riverbed.tiering.cold_commit), so both give the same compacted log. For each partition:

1. On the driver: the topic's configs and last stable offset from the cluster, the latest manifest
   from the store, the plan. Nothing due (or a compaction already pending): skipped.
2. The claim is committed at the manifest's leader epoch, as `spark-<application id>`, with a
   lease (--lease-ms): a leader change (a later epoch) fences the job's swap, and the leader
   aborts a claim whose lease ran out; a broker never starts a pass while it is pending.
3. On the executors: every row of the plan's objects is read from the store; the latest offset
   of each key is the largest among the dirty cold rows and the hot log up to the last stable
   offset (read through the brokers by the `riverbed` source at read_committed), records of
   aborted transactions left out (they must not decide); a left join gives each row
   its key's latest offset. Unlike the broker's map, this aggregation has no memory bound of
   Riverbed's: Spark spills it.
4. One task per group rewrites its objects into one new object (only if something in it goes)
   and uploads it under the key the claim named.
5. On the driver: the swap, one manifest version. Any failure aborts the compaction.

Progress and a summary per partition go to stderr. With `spark-submit` the master is
spark-submit's; alone, --master (default local[*]).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType
from riverbed.client.admin import Admin
from riverbed.client.types import TopicPartition
from riverbed.configs import (
    REMOTE_STORAGE_S3,
    TOPIC_CONFIGS,
    BrokerConfig,
    TopicConfig,
    topic_config,
)
from riverbed.tiering import cold_commit
from riverbed.tiering.cold_compaction import (
    CONTROL_BATCH_BIT,
    MAP_COLUMNS,
    ColdPlan,
    GroupRewrite,
    KeepRule,
    aborted_mask,
    compacted_segment,
    plan_cold_compaction,
    rewrite_group,
)
from riverbed.tiering.manifest import Manifest, PendingCompaction, RemoteSegment
from riverbed.tiering.remote_metadata import RemoteMetadata
from riverbed.tiering.store import ObjectStore
from riverbed.tiering.stores import open_store
from riverbed.tiering.txn_ranges import AbortedRange

from riverbed_spark.cold import ColdStore
from riverbed_spark.jobs.session import job_session, progress
from riverbed_spark.options import StoreOptions
from riverbed_spark.source import RiverbedDataSource

_progress = functools.partial(progress, "compact_cold")

LEASE_MS_DEFAULT = 6 * 60 * 60 * 1000
ROW_SCHEMA = "grp int, offset long, key binary, aborted boolean"


@dataclass(frozen=True)
class GroupTask:
    """What an executor needs to rewrite one group (pickled to it)."""

    index: int
    objects: tuple[tuple[str, int], ...]  # (key, size) of the group's objects, oldest first
    output: str


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    store = StoreOptions(args.object_store, dict(_settings(args.set)))
    partitions = asyncio.run(_partitions(args.bootstrap_servers, args.topic, args.partition))
    config = asyncio.run(_topic_config(args.bootstrap_servers, args.topic))
    if not (config.compact and config.remote_storage_enable):
        _progress(f"{args.topic} is not a compacted tiered topic (cleanup.policy=compact, "
                  "remote.storage.enable=true)")  # fmt: skip
        return 2
    spark = job_session("riverbed-compact-cold", args.master)
    try:
        for source in (RiverbedDataSource, RowsSource, GroupsSink):
            spark.dataSource.register(source)
        owner = f"spark-{spark.sparkContext.applicationId}"
        for partition in partitions:
            _compact_partition(spark, args, store, config, partition, owner)
    finally:
        spark.stop()
    return 0


def _compact_partition(
    spark: SparkSession,
    args: argparse.Namespace,
    store: StoreOptions,
    config: TopicConfig,
    partition: int,
    owner: str,
) -> None:
    """Spark's calls stay on this (the main) thread: from another, a session's registered data
    sources are not found. Each store step runs in an event loop of its own, with a store opened
    for it (an S3 store's client belongs to the loop that opened it)."""
    where = f"{args.topic}-{partition}"
    started = time.monotonic()
    stable_end = asyncio.run(_last_stable_offset(args.bootstrap_servers, args.topic, partition))
    now_ms = int(time.time() * 1000)
    manifest = asyncio.run(_in_store(store, args.topic, partition, _latest))
    if manifest.compaction is not None:
        _progress(f"{where}: compaction {manifest.compaction.id} of "
                  f"{manifest.compaction.owner} is in progress; skipped")  # fmt: skip
        return
    plan = plan_cold_compaction(manifest, config, now_ms)
    if plan is None or not (plan.due or args.force):
        ratio = 0.0 if plan is None else plan.dirty_ratio
        _progress(f"{where}: nothing due (dirty ratio {ratio:.3f}); skipped")
        return
    epoch = manifest.leader_epoch
    pending = cold_commit.new_pending(
        plan,
        args.topic,
        partition,
        owner=owner,
        leader_epoch=epoch,
        now_ms=now_ms,
        lease_expires_ms=now_ms + args.lease_ms,
    )

    async def claim(objects: ObjectStore, metadata: RemoteMetadata) -> Manifest:
        return await cold_commit.claim(metadata, epoch, pending)

    asyncio.run(_in_store(store, args.topic, partition, claim))
    _progress(f"{where}: claimed compaction {pending.id}: {len(plan.groups)} groups, "
              f"{plan.log_bytes} log bytes, last stable offset {stable_end}")  # fmt: skip
    try:
        written = _rewrite(spark, args, store, config, plan, pending, manifest, stable_end, now_ms)

        async def swap(objects: ObjectStore, metadata: RemoteMetadata) -> Manifest:
            swapped_ms = int(time.time() * 1000)
            return await cold_commit.swap(
                metadata, epoch, pending, written, plan.end_offset, swapped_ms
            )

        asyncio.run(_in_store(store, args.topic, partition, swap))
    except BaseException:
        _abort(store, args.topic, partition, epoch, pending, where)
        raise
    _progress(f"{where}: swapped in {len(written)} of {len(plan.groups)} groups in "
              f"{time.monotonic() - started:.1f} s")  # fmt: skip


T = TypeVar("T")


async def _in_store(
    store: StoreOptions,
    topic: str,
    partition: int,
    step: Callable[[ObjectStore, RemoteMetadata], Awaitable[T]],
) -> T:
    objects = open_store(store.url, store.settings)
    try:
        return await step(objects, RemoteMetadata(objects, topic, partition))
    finally:
        await objects.close()


async def _latest(objects: ObjectStore, metadata: RemoteMetadata) -> Manifest:
    return await metadata.latest()


def _abort(
    store: StoreOptions,
    topic: str,
    partition: int,
    epoch: int,
    pending: PendingCompaction,
    where: str,
) -> None:
    async def abort(objects: ObjectStore, metadata: RemoteMetadata) -> Manifest:
        return await cold_commit.abort(objects, metadata, epoch, pending)

    try:
        asyncio.run(_in_store(store, topic, partition, abort))
        _progress(f"{where}: compaction {pending.id} aborted")
    except Exception as error:  # fenced or unreachable: the leader aborts it (epoch, lease)
        _progress(f"{where}: compaction {pending.id} left to the leader to abort: {error}")


def _rewrite(
    spark: SparkSession,
    args: argparse.Namespace,
    store: StoreOptions,
    config: TopicConfig,
    plan: ColdPlan,
    pending: PendingCompaction,
    manifest: Manifest,
    stable_end: int,
    now_ms: int,
) -> dict[str, RemoteSegment]:
    """Steps 3 and 4: the new objects written; output key -> its manifest entry.

    The map leaves out records of aborted transactions and stops at the last stable offset
    (`stable_end`), as the broker's does. Below the first transaction still open at the cold
    tier's end, the objects' own transactions decide which records are aborted; from there the
    `riverbed` source at read_committed does (through the broker, which knows how those ended)."""
    unstable_from = plan.transactions.unstable_from
    cold_decided = min(
        plan.cold_end_offset,
        stable_end,
        plan.cold_end_offset if unstable_from is None else unstable_from,
    )
    map_end = max(stable_end, cold_decided)
    rule = KeepRule(now_ms - config.delete_retention_ms, map_end)
    tasks = [
        GroupTask(index, tuple((s.key, s.size_bytes) for s in group), planned.output)
        for index, (group, planned) in enumerate(zip(plan.groups, pending.groups, strict=True))
    ]
    rows = _cold_rows(spark, store, plan)
    dirty = rows.where(
        (F.col("offset") >= plan.first_dirty_offset)
        & (F.col("offset") < cold_decided)
        & F.col("key").isNotNull()
        & ~F.col("aborted")
    ).select("key", "offset")
    if stable_end > cold_decided:
        hot = _hot_keys(args, spark, store, cold_decided, stable_end, manifest.partition)
        dirty = dirty.unionByName(hot)
    latest = dirty.groupBy("key").agg(F.max("offset").alias("latest"))
    joined = (
        rows.where(F.col("grp") >= 0)
        .join(latest, on="key", how="left")
        .select("grp", "offset", "latest")
    )
    with tempfile.TemporaryDirectory(prefix="riverbed-compact-") as scratch:
        results_path = Path(scratch) / "results.json"
        partitions = max(1, min(len(tasks), spark.sparkContext.defaultParallelism * 2))
        (
            joined.repartition(partitions, "grp")
            .sortWithinPartitions("grp", "offset")
            .write.format(GroupsSink.name())
            .option("store", json.dumps([store.url, dict(store.settings)]))
            .option("rule", json.dumps([rule.delete_horizon_ms, rule.map_end_offset]))
            .option("tasks", json.dumps([[t.index, t.objects, t.output] for t in tasks]))
            .option("results", str(results_path))
            .mode("append")
            .save()
        )
        results = json.loads(results_path.read_text())
    written: dict[str, RemoteSegment] = {}
    for result in results:
        if result["rows_in"] == result["rows_out"]:
            continue  # nothing in it went: the group keeps its segments
        index = result["grp"]
        rewrite = GroupRewrite(
            rows_in=result["rows_in"],
            rows_out=result["rows_out"],
            log_bytes=result["log_bytes"],
            min_timestamp_ms=result["min_ts"],
            max_timestamp_ms=result["max_ts"],
        )
        output = tasks[index].output
        written[output] = compacted_segment(
            plan.groups[index], rewrite, output, result["size_bytes"], manifest.leader_epoch
        )
    return written


def _cold_rows(spark: SparkSession, store: StoreOptions, plan: ColdPlan) -> DataFrame:
    """(group, offset, key) of every data row of the plan's objects, and of the objects past
    it that the map reads (group -1); control rows are left out (they always stay)."""
    objects: list[tuple[int, str]] = []
    in_plan: set[str] = set()
    for index, group in enumerate(plan.groups):
        for segment in group:
            objects.append((index, segment.key))
            in_plan.add(segment.key)
    objects += [(-1, s.key) for s in plan.map_segments if s.key not in in_plan]
    return (
        spark.read.format(RowsSource.name())
        .option("store", json.dumps([store.url, dict(store.settings)]))
        .option("objects", json.dumps(objects))
        .option("aborted", json.dumps([list(a) for a in plan.transactions.aborted]))
        .load()
    )


def _hot_keys(
    args: argparse.Namespace,
    spark: SparkSession,
    store: StoreOptions,
    start: int,
    end: int,
    partition: int,
) -> DataFrame:
    """(key, offset) of the keyed records of [start, end) at read_committed, read by the
    `riverbed` source (the brokers' hot log, or objects tiered since)."""
    topic = args.topic
    options = {
        "bootstrap.servers": args.bootstrap_servers,
        "remote.storage.url": store.url,
        "assign": json.dumps({topic: [partition]}),
        "startingOffsets": json.dumps({topic: {str(partition): start}}),
        "endingOffsets": json.dumps({topic: {str(partition): end}}),
        "kafka.isolation.level": "read_committed",
        **store.settings,
    }
    return (
        spark.read.format("riverbed")
        .options(**options)
        .schema("key binary, offset long")
        .load()
        .where(F.col("key").isNotNull())
    )


# -- the job's own data sources: rows of the plan's objects in, rewritten groups out ---------


@dataclass(frozen=True)
class ObjectsSplit(InputPartition):
    objects: tuple[tuple[int, str], ...]  # (group, key)


class RowsSource(DataSource):
    """Reads (group, offset, key, aborted) of the data rows of the objects in option `objects`
    (JSON [[group, key], ...]) from the store in option `store` (JSON [url, settings]);
    `aborted`: whether the row is a record of one of the aborted transactions in option
    `aborted` (JSON [[producer id, first offset, last offset], ...])."""

    @classmethod
    def name(cls) -> str:
        return "riverbed-compaction-rows"

    def schema(self) -> str:
        return ROW_SCHEMA

    def reader(self, schema: StructType) -> RowsReader:
        url, settings = json.loads(self.options["store"])
        objects = [(int(g), str(k)) for g, k in json.loads(self.options["objects"])]
        aborted = [AbortedRange(*map(int, a)) for a in json.loads(self.options["aborted"])]
        return RowsReader(StoreOptions(url, settings), objects, aborted)


class RowsReader(DataSourceReader):
    def __init__(
        self, store: StoreOptions, objects: list[tuple[int, str]], aborted: list[AbortedRange]
    ) -> None:
        self.store = store
        self.objects = objects
        self.aborted = aborted

    def partitions(self) -> list[ObjectsSplit]:
        # A few objects per task: starting a task costs more than reading a small object.
        per_task = max(1, len(self.objects) // 64)
        return [
            ObjectsSplit(tuple(self.objects[first : first + per_task]))
            for first in range(0, len(self.objects), per_task)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ObjectsSplit)
        cold = ColdStore(self.store)
        for grp, key in partition.objects:
            with pq.ParquetFile(cold.filesystem.open_input_file(cold.path(key))) as source:
                for group in range(source.metadata.num_row_groups):
                    rows = source.read_row_group(group, columns=MAP_COLUMNS)
                    attributes = rows.column("batch_attributes")
                    rows = rows.filter(pc.equal(pc.bit_wise_and(attributes, CONTROL_BATCH_BIT), 0))
                    yield pa.RecordBatch.from_arrays(
                        [
                            pa.array([grp] * rows.num_rows, pa.int32()),
                            rows.column("offset").combine_chunks(),
                            rows.column("key").combine_chunks(),
                            aborted_mask(rows, self.aborted).combine_chunks(),
                        ],
                        names=["grp", "offset", "key", "aborted"],
                    )


@dataclass(frozen=True)
class GroupsDone(WriterCommitMessage):
    results: tuple[dict[str, Any], ...]


class GroupsSink(DataSource):
    """Rows (grp, offset, latest) sorted by (grp, offset) within each task: each group's objects
    are rewritten and uploaded; the driver-side commit writes every group's result as JSON to
    the path in option `results`."""

    @classmethod
    def name(cls) -> str:
        return "riverbed-compaction-groups"

    def writer(self, schema: StructType, overwrite: bool) -> GroupsWriter:
        return GroupsWriter(dict(self.options))


class GroupsWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        url, settings = json.loads(options["store"])
        horizon, map_end = json.loads(options["rule"])
        self.store = StoreOptions(url, settings)
        self.rule = KeepRule(int(horizon), int(map_end))
        self.tasks = {
            int(index): GroupTask(int(index), tuple((k, int(n)) for k, n in objects), output)
            for index, objects, output in json.loads(options["tasks"])
        }
        self.results_path = options["results"]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> GroupsDone:
        results = []
        current: int | None = None
        batches: list[pa.RecordBatch] = []
        for batch in iterator:
            for grp, part in _by_group(batch):
                if current is not None and grp != current:
                    results.append(self._rewrite(current, batches))
                    batches = []
                if current is not None and grp < current:
                    raise RuntimeError("the rows of a task are not sorted by group")
                current = grp
                batches.append(part)
        if current is not None:
            results.append(self._rewrite(current, batches))
        return GroupsDone(tuple(results))

    def _rewrite(self, grp: int, batches: list[pa.RecordBatch]) -> dict[str, Any]:
        table = pa.Table.from_batches(batches)
        return _rewrite_group(self.store, self.rule, self.tasks[grp], table)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        results: list[dict[str, Any]] = []
        for message in messages:
            if message is not None:
                assert isinstance(message, GroupsDone)  # what write() returns
                results += message.results
        Path(self.results_path).write_text(json.dumps(results))


def _by_group(batch: pa.RecordBatch) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The runs of one group's rows in `batch` (sorted by group)."""
    groups = batch.column("grp")
    runs = pc.run_end_encode(groups)
    start = 0
    for grp, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist(), strict=True):
        yield grp, batch.slice(start, end - start)
        start = end


def _rewrite_group(
    store: StoreOptions, rule: KeepRule, task: GroupTask, joined: pa.Table
) -> dict[str, Any]:
    """On an executor: the group's objects rewritten with each row's latest offset, the new
    object uploaded if anything went."""
    offsets = joined.column("offset").combine_chunks()
    if (
        len(offsets) > 1
        and not pc.all(pc.greater(offsets.slice(1), offsets.slice(0, len(offsets) - 1))).as_py()
    ):
        raise RuntimeError(f"group {task.index}: rows not sorted by offset")
    cursor = _Cursor(offsets, joined.column("latest").combine_chunks())
    cold = ColdStore(store)
    sources = [
        pq.ParquetFile(cold.filesystem.open_input_file(cold.path(key))) for key, _ in task.objects
    ]
    with tempfile.TemporaryDirectory(prefix="riverbed-compact-") as scratch:
        out = Path(scratch) / "group.parquet"
        try:
            result = rewrite_group(sources, cursor.latest_for, rule, out, _no_pace)
        finally:
            for source in sources:
                source.close()
        size_bytes = out.stat().st_size
        if result.changed:
            asyncio.run(_upload(store, task.output, out))
    return {
        "grp": task.index,
        "rows_in": result.rows_in,
        "rows_out": result.rows_out,
        "log_bytes": result.log_bytes,
        "min_ts": result.min_timestamp_ms,
        "max_ts": result.max_timestamp_ms,
        "size_bytes": size_bytes,
    }


class _Cursor:
    """The joined (offset, latest) rows of a group's data records, sorted by offset, handed out
    to the group's row groups in order. Control rows are not among them: they get no latest
    offset (they always stay)."""

    def __init__(self, offsets: pa.Array, latest: pa.Array) -> None:
        self._offsets = offsets
        self._latest = latest
        self._position = 0

    def latest_for(self, rows: pa.Table) -> pa.Array:
        data = pc.equal(pc.bit_wise_and(rows.column("batch_attributes"), CONTROL_BATCH_BIT), 0)
        count = pc.sum(pc.cast(data, pa.int64())).as_py() or 0
        first = self._position
        joined = self._offsets.slice(first, count)
        if not joined.equals(rows.column("offset").filter(data).combine_chunks()):
            raise RuntimeError("the joined rows do not match the objects' rows")
        self._position += count
        # Row i of the data rows takes latest[first + i]; control rows take none.
        ranks = pc.subtract(pc.cumulative_sum(pc.cast(data, pa.int64())), 1)
        positions = pc.if_else(data, pc.add(ranks, first), pa.scalar(None, pa.int64()))
        return pc.take(self._latest, positions)


async def _upload(store: StoreOptions, key: str, path: Path) -> None:
    objects = open_store(store.url, store.settings)
    try:
        await objects.put_file(key, path)
    finally:
        await objects.close()


def _no_pace(_size_bytes: int) -> None:
    pass


async def _partitions(bootstrap: str, topic: str, wanted: list[int] | None) -> list[int]:
    async with Admin(bootstrap_servers=bootstrap) as admin:
        description = await admin.describe_topic(topic)
    found = sorted(p.partition for p in description.partitions)
    if wanted:
        unknown = sorted(set(wanted) - set(found))
        if unknown:
            raise SystemExit(f"compact_cold: {topic} has no partition {unknown[0]}")
        return sorted(wanted)
    return found


async def _topic_config(bootstrap: str, topic: str) -> TopicConfig:
    """The topic's effective configs as its brokers report them, typed as the broker types
    them."""
    async with Admin(bootstrap_servers=bootstrap) as admin:
        entries = await admin.describe_configs(topic)
    values = {
        name: entry.value
        for name, entry in entries.items()
        if name in TOPIC_CONFIGS and entry.value is not None
    }
    return topic_config(BrokerConfig.from_mapping({"zookeeper.connect": "unused:1"}), values)


async def _last_stable_offset(bootstrap: str, topic: str, partition: int) -> int:
    tp = TopicPartition(topic, partition)
    async with Admin(bootstrap_servers=bootstrap) as admin:
        found = await admin.list_offsets({tp: "latest"}, isolation_level="read_committed")
        return found[tp].offset


def _settings(pairs: list[str]) -> Iterator[tuple[str, str]]:
    for pair in pairs:
        key, _, value = pair.partition("=")
        if not key.startswith(REMOTE_STORAGE_S3):
            raise SystemExit(f"compact_cold: --set takes {REMOTE_STORAGE_S3}* settings, not {key}")
        yield key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m riverbed_spark.jobs.compact_cold", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--bootstrap-servers", required=True, help="the cluster")
    parser.add_argument("--object-store", required=True, help="file:///path or s3://bucket/prefix")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partition", type=int, action="append", help="(repeatable; default all)")
    parser.add_argument("--force", action="store_true", help="compact even if not due")
    parser.add_argument("--lease-ms", type=int, default=LEASE_MS_DEFAULT,
                        help="how long the claim holds before the leader may abort it")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="remote.storage.s3.K=V",
                        help="S3 settings, named as the broker's")  # fmt: skip
    parser.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    return parser


if __name__ == "__main__":
    sys.exit(main())
