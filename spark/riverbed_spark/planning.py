"""Planning a read: which offsets of which partitions, and the splits that read them.

Planning fixes a snapshot: each partition's range [start, end) is decided once, on the driver
(the end is the high watermark at planning time unless endingOffsets says otherwise). The part
of a range below the end of the partition's finished remote segments is read by executors from
the objects themselves (one split per object); the part above it, the hot tail, through the
broker in splits of at most `hot_split_offsets` offsets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pyspark.sql.datasource import InputPartition
from riverbed.client.admin import Admin
from riverbed.client.admin import OffsetSpec as ListOffsetSpec
from riverbed.client.types import TopicPartition
from riverbed.tiering.txn_ranges import AbortedRange, overlapping

from riverbed_spark.cold import ColdObject, ColdStore, ColdView, finished_objects
from riverbed_spark.options import EARLIEST, LATEST, OffsetSpec, ReadOptions

T = TypeVar("T")
# Offsets of a Spark offset dict: {"topic": {"partition": offset}} (JSON keys are strings).
OffsetDict = dict[str, dict[str, int]]


@dataclass(frozen=True)
class PartitionRange:
    topic: str
    partition: int
    start: int
    end: int  # exclusive


@dataclass(frozen=True)
class ColdSplit(InputPartition):
    """Offsets [start, end) of a run of consecutive objects, read from the store by the
    executor, one after the other; at read_committed without the records of the `aborted`
    transactions."""

    topic: str
    partition: int
    items: tuple[ColdObject, ...]
    start: int
    end: int
    aborted: tuple[AbortedRange, ...] = ()


@dataclass(frozen=True)
class HotSplit(InputPartition):
    """Offsets [start, end) above the remote end at planning time, read through the broker
    (or from the store, if they have been tiered and deleted locally since).
    `compacted_end` is the manifest's compacted_end_offset at planning (-1 without a store):
    objects a cold compaction rewrote after planning are not mixed into the query's snapshot
    (reading.tiered_since)."""

    topic: str
    partition: int
    start: int
    end: int
    compacted_end: int = -1


Split = ColdSplit | HotSplit


def splits_for(
    ranges: list[PartitionRange], options: ReadOptions, store: ColdStore | None
) -> list[Split]:
    splits: list[Split] = []
    for r in ranges:
        if r.start >= r.end:
            continue
        hot_start = r.start
        compacted_end = -1
        if store is not None:
            manifest = store.manifest(r.topic, r.partition)
            compacted_end = manifest.compacted_end_offset
            cold = ColdView(manifest, read_committed=options.read_committed)
            items = [
                item
                for item in finished_objects(manifest)
                if item.last_offset >= r.start and item.base_offset < min(r.end, cold.end)
            ]
            for run in _runs(items, options.cold_split_bytes):
                start = max(r.start, run[0].base_offset)
                end = min(r.end, cold.end, run[-1].last_offset + 1)
                aborted = tuple(overlapping(cold.aborted, start, end))
                splits.append(ColdSplit(r.topic, r.partition, tuple(run), start, end, aborted))
                hot_start = max(hot_start, end)
        if options.bootstrap_servers is None:
            continue  # the store alone: the cold part is all there is
        for start in range(hot_start, r.end, options.hot_split_offsets):
            end = min(start + options.hot_split_offsets, r.end)
            splits.append(HotSplit(r.topic, r.partition, start, end, compacted_end))
    return splits


def _runs(items: list[ColdObject], bytes_max: int) -> list[list[ColdObject]]:
    """Consecutive objects grouped up to `bytes_max` of object bytes each (at least one per
    run): a task per object would spend more on starting than on reading small objects."""
    runs: list[list[ColdObject]] = []
    run_bytes = 0
    for item in items:
        if runs and run_bytes + item.size_bytes <= bytes_max:
            runs[-1].append(item)
            run_bytes += item.size_bytes
        else:
            runs.append([item])
            run_bytes = item.size_bytes
    return runs


class Planner:
    """Resolves topics, partitions and offsets on the driver: through the cluster when it is
    given, else from the store's manifests alone."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self.store = ColdStore(options.store) if options.store is not None else None

    def batch_ranges(self) -> list[PartitionRange]:
        partitions = self.partitions()
        starts = self.offsets(partitions, self.options.starting, self.options.starting_timestamp_ms)
        ends = self.offsets(partitions, self.options.ending, self.options.ending_timestamp_ms)
        return [PartitionRange(t, p, starts[(t, p)], ends[(t, p)]) for t, p in partitions]

    def partitions(self) -> list[tuple[str, int]]:
        subscription = self.options.subscription
        if subscription.assigned:
            return sorted(subscription.assigned)
        if self.options.bootstrap_servers is not None:
            return _run(self._cluster_partitions(self.options.bootstrap_servers))
        assert self.store is not None
        return [
            (topic, partition)
            for topic in self.store.topics()
            if subscription.matches(topic)
            for partition in self.store.partitions(topic)
        ]

    def offsets(
        self, partitions: list[tuple[str, int]], spec: OffsetSpec, timestamp_ms: int | None
    ) -> dict[tuple[str, int], int]:
        """Each partition's offset for `spec` (a timestamp wins over it when given)."""
        if isinstance(spec, dict):
            unknown = sorted(set(spec) - set(partitions))
            if unknown:
                raise ValueError(f"offsets given for {unknown[0]}, which is not being read")
            missing = sorted(set(partitions) - set(spec))
            if missing:
                raise ValueError(f"no offset given for {missing[0]}")
        wanted: dict[tuple[str, int], int] = {}
        for tp in partitions:
            if timestamp_ms is not None:
                wanted[tp] = timestamp_ms
            else:
                wanted[tp] = spec[tp] if isinstance(spec, dict) else spec
        if self.options.bootstrap_servers is None:
            # parse_read_options refuses timestamps without bootstrap.servers.
            assert timestamp_ms is None
            return {tp: self._store_offset(tp, value) for tp, value in wanted.items()}
        by_time = timestamp_ms is not None
        return _run(self._cluster_offsets(self.options.bootstrap_servers, wanted, by_time))

    def _store_offset(self, tp: tuple[str, int], value: int) -> int:
        assert self.store is not None
        manifest = self.store.manifest(*tp)
        if value == EARLIEST:
            return manifest.log_start_offset
        if value == LATEST:
            # At read_committed the store's "last stable offset": where its first transaction
            # without a marker in the store starts.
            return ColdView(manifest, read_committed=self.options.read_committed).end
        return value

    async def _cluster_partitions(self, bootstrap: str) -> list[tuple[str, int]]:
        subscription = self.options.subscription
        async with Admin(bootstrap_servers=bootstrap) as admin:
            if subscription.pattern is not None:
                topics = [t for t in await admin.list_topics() if subscription.matches(t)]
            else:
                topics = list(subscription.topics)
            found = []
            for topic in topics:
                description = await admin.describe_topic(topic)
                found += [(topic, p.partition) for p in description.partitions]
        return sorted(found)

    async def _cluster_offsets(
        self, bootstrap: str, wanted: Mapping[tuple[str, int], int], by_time: bool
    ) -> dict[tuple[str, int], int]:
        """ListOffsets for the symbolic and timestamp ones; literal offsets as given."""
        specs: dict[TopicPartition, ListOffsetSpec] = {}
        for (topic, partition), value in wanted.items():
            if by_time:
                specs[TopicPartition(topic, partition)] = value
            elif value == EARLIEST:
                specs[TopicPartition(topic, partition)] = "earliest"
            elif value == LATEST:
                specs[TopicPartition(topic, partition)] = "latest"
        resolved = dict(wanted)
        if not specs:
            return resolved
        isolation: Literal["read_uncommitted", "read_committed"] = (
            "read_committed" if self.options.read_committed else "read_uncommitted"
        )
        async with Admin(bootstrap_servers=bootstrap) as admin:
            found = await admin.list_offsets(specs, isolation_level=isolation)
            # By time, a partition with no record at or after the timestamp ends at its end.
            latest = (
                await admin.list_offsets({tp: "latest" for tp in specs}, isolation_level=isolation)
                if by_time
                else {}
            )
        for tp, answer in found.items():
            offset = answer.offset if answer.offset >= 0 or not by_time else latest[tp].offset
            resolved[(tp.topic, tp.partition)] = offset
        return resolved


def as_offset_dict(offsets: Mapping[tuple[str, int], int]) -> OffsetDict:
    document: OffsetDict = {}
    for (topic, partition), offset in sorted(offsets.items()):
        document.setdefault(topic, {})[str(partition)] = offset
    return document


def from_offset_dict(document: OffsetDict) -> dict[tuple[str, int], int]:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in document.items()
        for partition, offset in partitions.items()
    }


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Planning runs on Spark's driver thread, outside any event loop."""
    return asyncio.run(coroutine)
