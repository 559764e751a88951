"""The broker's cold-tier compaction: compacted tiered topics' remote segments rewritten against
the whole partition, cold and hot, in the broker for partitions small enough (larger ones are
left to the Spark job, riverbed_spark.jobs.compact_cold). What stays is decided by
riverbed.tiering.cold_compaction; the manifest steps are riverbed.tiering.cold_commit.

One task per broker, owned by TieredStorage. Every `log.cleaner.backoff.ms`, or at once after a
pass, it looks at every partition this broker leads whose topic has `cleanup.policy=compact` and
`remote.storage.enable=true`, and whose manifest the offloader has claimed at the current leader
epoch (commits go through the offloader's RemoteMetadata, so each sees the other's). For each:
1. tidy: abort a pending compaction that is stale (cold_commit.is_stale), and delete the
   objects of retired segments past `remote.log.compaction.grace.ms`;
2. plan (cold_compaction.plan_cold_compaction). Among the partitions that are due, and whose
   cleanable cold range is at most `remote.log.compaction.broker.max.bytes` of log, the one
   with the highest dirty ratio gets a pass. A larger one is logged once per leadership and
   left to the Spark job.
A pass claims the compaction in the manifest, then a worker thread downloads the objects
(ranged GETs into the broker's `.tiering/compaction/`), builds the offset map from the dirty
cold segments and the hot log up to the high watermark as it was when the pass began (never
records that are not committed), rewrites the groups below the map's end and uploads their new
objects, all paced by `log.cleaner.io.max.bytes.per.second` (object bytes read and written, hot
bytes read); back on the event loop the swap is committed. Any failure aborts the compaction
(the manifest is left as it was); a fenced commit leaves it to the new leader, which aborts it.
At shutdown the worker stops at its next row group, and the pending entry is left for the
next leader (at a later epoch, so it aborts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from riverbed.common.log_events import event
from riverbed.common.throttle import StopRequested, Throttle
from riverbed.configs import TopicConfig
from riverbed.hot.local_log import LocalPartition, ReadResult
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records_header import CorruptRecordError, iter_batch_headers
from riverbed.tiering import cold_commit
from riverbed.tiering.background import background_executor
from riverbed.tiering.cold_compaction import (
    MAP_COLUMNS,
    ColdOffsetMap,
    ColdPlan,
    GroupRewrite,
    KeepRule,
    compacted_segment,
    map_rows,
    plan_cold_compaction,
    rewrite_group,
    row_group_bytes,
)
from riverbed.tiering.manifest import ManifestError, PendingCompaction, RemoteSegment
from riverbed.tiering.offloader import Offloader
from riverbed.tiering.remote_metadata import RemoteMetadata
from riverbed.tiering.segment_rows import RowGroupRows
from riverbed.tiering.store import ObjectStore, ObjectStoreError
from riverbed.tiering.txn_ranges import AbortedRange, with_local

log = logging.getLogger(__name__)

T = TypeVar("T")

# Objects are downloaded in ranged GETs of this size (the bound on a download's buffer).
DOWNLOAD_CHUNK_BYTES = 8 * 1024 * 1024
# The hot log is read for the offset map in reads of about this size.
HOT_READ_BYTES = 4 * 1024 * 1024
# How long the worker waits for one store call or hot read it handed to the event loop (the
# store's own timeouts and retries come first; this only bounds a stuck loop).
LOOP_CALL_WAIT_S = 300.0
# Errors that end a pass (and abort its compaction) without ending the task.
PASS_ERRORS = (ObjectStoreError, KafkaError, ManifestError, OSError, CorruptRecordError, ValueError)


@dataclass(frozen=True, slots=True)
class ColdCompactionSettings:
    backoff_ms: int  # log.cleaner.backoff.ms
    dedupe_buffer_bytes: int  # log.cleaner.dedupe.buffer.size
    io_max_bytes_per_second: float  # log.cleaner.io.max.bytes.per.second
    broker_max_bytes: int  # remote.log.compaction.broker.max.bytes
    grace_ms: int  # remote.log.compaction.grace.ms
    work_dir: Path  # where objects are downloaded and written (emptied at start)
    owner: str  # "broker-<id>": whose pending compactions are ours
    # log.cleaner.enable: without it no pass runs, but stale compactions are still aborted and
    # replaced objects deleted (a Spark job's, say).
    passes_enabled: bool = True


@dataclass(slots=True)
class ColdCompactionResult:
    """What one pass did."""

    topic: str
    partition: int
    swapped: bool = False
    groups: int = 0
    groups_rewritten: int = 0
    log_bytes_in: int = 0  # of the plan's segments
    log_bytes_out: int = 0  # of what replaced the rewritten groups, plus the untouched ones
    records_in: int = 0
    records_out: int = 0
    object_bytes_read: int = 0
    object_bytes_written: int = 0
    hot_bytes_read: int = 0
    map_keys: int = 0
    map_end_offset: int = 0
    map_full: bool = False  # the map stopped before the high watermark
    compacted_end_offset: int = 0
    seconds: float = 0.0
    written: dict[str, RemoteSegment] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Job:
    """One pass, as the worker runs it."""

    topic: str
    partition: int
    plan: ColdPlan
    pending: PendingCompaction
    leader_epoch: int
    delete_horizon_ms: int
    # The last stable offset when the pass began: records of open transactions decide nothing
    # (Kafka's cleaner stops at the first unstable offset too).
    hot_end_offset: int
    work_dir: Path
    # The aborted transactions of both tiers below hot_end_offset: their records decide nothing.
    aborted: tuple[AbortedRange, ...] = ()


class ColdCompactor:
    """Owned by TieredStorage: `start()` runs the loop as a task, `stop()` cancels and awaits
    it (a pass in progress stops at its worker's next row group)."""

    def __init__(
        self,
        store: ObjectStore,
        offloader: Offloader,
        partitions: Iterable[LocalPartition],
        topic_config: Callable[[str], TopicConfig | None],
        settings: ColdCompactionSettings,
        now_ms: Callable[[], int],
    ) -> None:
        self._store = store
        self._offloader = offloader
        self._partitions = partitions
        self._topic_config = topic_config
        # Read at each pass (a test or tool may replace it between passes).
        self.settings = settings
        self._now_ms = now_ms
        self._worker = background_executor(1, "cold-compaction")
        self._task: asyncio.Task[None] | None = None
        self._running_id: str | None = None
        # Partitions (and leader epochs) already logged as too large for the broker.
        self._left_to_spark: set[tuple[str, int, int]] = set()
        self.passes = 0

    def prepare(self) -> None:
        """What `start()` does before its loop: enough for `run_once()` driven by hand."""
        shutil.rmtree(self.settings.work_dir, ignore_errors=True)
        self.settings.work_dir.mkdir(parents=True)

    def start(self) -> None:
        self.prepare()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="cold-compaction")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._worker.shutdown(wait=True)

    async def _run(self) -> None:
        while True:
            try:
                result = await self.run_once()
            except Exception:  # a bug in one pass must not end cold compaction for good
                log.exception("cold compaction round failed")
                result = None
            if result is None:
                await asyncio.sleep(self.settings.backoff_ms / 1000)

    async def run_once(self, *, force: bool = False) -> ColdCompactionResult | None:
        """Tidy every eligible partition, then one pass over the one that needs it most (with
        `force`, any with something dirty). None if no pass ran."""
        best: tuple[ColdPlan, LocalPartition, RemoteMetadata, int] | None = None
        for partition in list(self._partitions):
            found = await self._candidate(partition, force=force)
            if found is not None and (best is None or found[0].dirty_ratio > best[0].dirty_ratio):
                best = found
        if best is None:
            return None
        plan, partition, metadata, epoch = best
        return await self._pass(partition, metadata, epoch, plan)

    async def _candidate(
        self, partition: LocalPartition, *, force: bool
    ) -> tuple[ColdPlan, LocalPartition, RemoteMetadata, int] | None:
        config = self._topic_config(partition.topic)
        if (
            config is None
            or not config.compact
            or not config.remote_storage_enable
            or not partition.is_leader
        ):
            return None
        claimed = self._offloader.claimed(partition.topic, partition.index)
        if claimed is None:
            return None
        metadata, epoch = claimed
        now_ms = self._now_ms()
        try:
            manifest = await metadata.latest()
            if manifest.leader_epoch > epoch:
                return None  # deposed: the offloader finds out and stops too
            pending = manifest.compaction
            if pending is not None and cold_commit.is_stale(
                pending,
                leader_epoch=epoch,
                owner=self.settings.owner,
                running_id=self._running_id,
                now_ms=now_ms,
            ):
                manifest = await cold_commit.abort(self._store, metadata, epoch, pending)
            if manifest.retired:
                manifest = await cold_commit.delete_retired(
                    self._store, metadata, epoch, now_ms, self.settings.grace_ms
                )
        except (ObjectStoreError, KafkaError, ManifestError) as error:
            log.warning("%s: cold compaction cannot look at the manifest: %s", partition, error)
            return None
        plan = plan_cold_compaction(manifest, config, now_ms)
        if not self.settings.passes_enabled:
            return None
        if plan is None or manifest.compaction is not None or not (plan.due or force):
            return None
        if plan.log_bytes > self.settings.broker_max_bytes:
            self._leave_to_spark(partition, plan)
            return None
        return plan, partition, metadata, epoch

    def _leave_to_spark(self, partition: LocalPartition, plan: ColdPlan) -> None:
        key = (partition.topic, partition.index, partition.leader_epoch)
        if key in self._left_to_spark:
            return
        self._left_to_spark.add(key)
        event(
            log,
            logging.INFO,
            "tiering.cold_compaction_left_to_spark",
            topic=partition.topic,
            partition=partition.index,
            log_bytes=plan.log_bytes,
            broker_max_bytes=self.settings.broker_max_bytes,
            hint="python -m riverbed_spark.jobs.compact_cold",
        )

    async def _pass(
        self, partition: LocalPartition, metadata: RemoteMetadata, epoch: int, plan: ColdPlan
    ) -> ColdCompactionResult | None:
        config = self._topic_config(partition.topic)
        if config is None:
            return None
        started = time.monotonic()
        now_ms = self._now_ms()
        stable_end = partition.log.last_stable_offset
        pending = cold_commit.new_pending(
            plan,
            partition.topic,
            partition.index,
            owner=self.settings.owner,
            leader_epoch=epoch,
            now_ms=now_ms,
        )
        job = _Job(
            partition.topic,
            partition.index,
            plan,
            pending,
            epoch,
            now_ms - config.delete_retention_ms,
            stable_end,
            self.settings.work_dir / pending.id,
            tuple(with_local(plan.transactions, partition.log.aborted_transactions(0, stable_end))),
        )
        self._running_id = pending.id
        try:
            await cold_commit.claim(metadata, epoch, pending)
            self.passes += 1
            result = await self._run_worker(partition, job)
            if not partition.is_leader or partition.leader_epoch != epoch:
                raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{partition}: not leading")
            await cold_commit.swap(
                metadata,
                epoch,
                pending,
                result.written,
                result.compacted_end_offset,
                self._now_ms(),
            )
            result.swapped = True
        except PASS_ERRORS as error:
            await self._abandon(partition, metadata, epoch, pending, error)
            return None
        finally:
            self._running_id = None
            shutil.rmtree(job.work_dir, ignore_errors=True)
        result.seconds = time.monotonic() - started
        event(
            log,
            logging.INFO,
            "tiering.cold_compacted",
            topic=partition.topic,
            partition=partition.index,
            groups=result.groups,
            groups_rewritten=result.groups_rewritten,
            records_in=result.records_in,
            records_out=result.records_out,
            log_bytes_in=result.log_bytes_in,
            log_bytes_out=result.log_bytes_out,
            keys=result.map_keys,
            compacted_end_offset=result.compacted_end_offset,
            seconds=round(result.seconds, 3),
        )
        return result

    async def _abandon(
        self,
        partition: LocalPartition,
        metadata: RemoteMetadata,
        epoch: int,
        pending: PendingCompaction,
        error: Exception,
    ) -> None:
        if isinstance(error, KafkaError) and error.code == ErrorCode.FENCED_LEADER_EPOCH:
            log.info("%s: cold compaction fenced, left to the new leader: %s", partition, error)
            return
        log.warning("%s: cold compaction abandoned: %s", partition, error)
        try:
            await cold_commit.abort(self._store, metadata, epoch, pending)
        except (ObjectStoreError, KafkaError, ManifestError) as abort_error:
            # The pending entry stays; the next round (or leader) aborts it.
            log.warning("%s: aborting the cold compaction failed: %s", partition, abort_error)

    async def _run_worker(self, partition: LocalPartition, job: _Job) -> ColdCompactionResult:
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        io = _LoopIO(loop, self._store, partition, stop)
        worker = loop.run_in_executor(
            self._worker,
            _compact,
            job,
            io,
            self.settings.dedupe_buffer_bytes,
            Throttle(self.settings.io_max_bytes_per_second, stop),
        )
        try:
            return await asyncio.shield(worker)
        except asyncio.CancelledError:
            stop.set()
            await asyncio.gather(worker, return_exceptions=True)
            raise


class _LoopIO:
    """What the worker thread needs from the event loop, as blocking calls: the store, and the
    partition's hot log (PartitionLog belongs to the loop)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        store: ObjectStore,
        partition: LocalPartition,
        stop: threading.Event,
    ) -> None:
        self._loop = loop
        self._store = store
        self._partition = partition
        self._stop = stop

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._stop.is_set():
            coroutine.close()
            raise StopRequested
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(LOOP_CALL_WAIT_S)

    def download(self, segment: RemoteSegment, path: Path, throttle: Throttle) -> None:
        temporary = path.with_suffix(".download")
        with temporary.open("wb") as out:
            position = 0
            while position < segment.size_bytes:
                size = min(DOWNLOAD_CHUNK_BYTES, segment.size_bytes - position)
                throttle.account(size)
                data = self.call(self._store.get(segment.key, position, size))
                if not data:
                    raise ObjectStoreError(f"{segment.key}: ends at {position} bytes")
                out.write(data)
                position += len(data)
        os.replace(temporary, path)

    def upload(self, key: str, path: Path, throttle: Throttle) -> None:
        throttle.account(path.stat().st_size)
        self.call(self._store.put_file(key, path))

    def hot_reads(self, start: int, end: int) -> Iterator[tuple[bytes, int]]:
        """(whole batches, the offset after them) of the hot log from `start` to `end`."""
        offset = start
        while offset < end:
            found = self.call(self._read_hot(offset, end))
            if found is None:
                return
            region = found.region
            try:
                data = os.pread(region.fd, region.size, region.position)
            finally:
                region.close()
            yield data, found.next_offset
            offset = found.next_offset

    async def _read_hot(self, offset: int, end: int) -> ReadResult | None:
        partition_log = self._partition.log
        offset = max(offset, partition_log.log_start_offset)
        if offset >= end:
            return None
        return partition_log.read(offset, HOT_READ_BYTES, end)


def _compact(
    job: _Job, io: _LoopIO, map_capacity_bytes: int, throttle: Throttle
) -> ColdCompactionResult:
    """The worker's part of a pass (blocking): the offset map, then every group below its end
    rewritten and uploaded."""
    job.work_dir.mkdir(parents=True, exist_ok=True)
    result = ColdCompactionResult(job.topic, job.partition)
    result.log_bytes_in = job.plan.log_bytes
    downloaded: dict[str, Path] = {}

    def local(segment: RemoteSegment) -> Path:
        path = downloaded.get(segment.key)
        if path is None:
            path = job.work_dir / f"{len(downloaded)}.parquet"
            io.download(segment, path, throttle)
            result.object_bytes_read += segment.size_bytes
            downloaded[segment.key] = path
        return path

    offsets = _offset_map(job, io, local, map_capacity_bytes, throttle, result)
    rule = KeepRule(job.delete_horizon_ms, offsets.end_offset)
    result.map_keys = len(offsets)
    result.map_end_offset = offsets.end_offset
    result.map_full = offsets.full
    result.compacted_end_offset = min(offsets.end_offset, job.plan.end_offset)
    pending_groups = {group.base_offset: group for group in job.pending.groups}
    for group in job.plan.groups:
        result.groups += 1
        if group[0].base_offset >= offsets.end_offset:
            result.log_bytes_out += sum(s.log_bytes for s in group)
            continue  # past the map: nothing in it can go
        planned = pending_groups[group[0].base_offset]
        out_path = job.work_dir / f"out-{result.groups}.parquet"
        sources = [pq.ParquetFile(local(segment)) for segment in group]
        try:
            rewrite = rewrite_group(
                sources,
                lambda rows: offsets.latest(rows.column("key")),
                rule,
                out_path,
                throttle.account,
            )
        finally:
            for source in sources:
                source.close()
        _count(rewrite, group, result)
        if rewrite.changed:
            io.upload(planned.output, out_path, throttle)
            size_bytes = out_path.stat().st_size
            result.object_bytes_written += size_bytes
            result.written[planned.output] = compacted_segment(
                group, rewrite, planned.output, size_bytes, job.leader_epoch
            )
            result.groups_rewritten += 1
        for segment in group:  # the disk holds at most the dirty objects and one group
            path = downloaded.pop(segment.key, None)
            if path is not None:
                path.unlink()
        out_path.unlink(missing_ok=True)
    return result


def _offset_map(
    job: _Job,
    io: _LoopIO,
    local: Callable[[RemoteSegment], Path],
    capacity_bytes: int,
    throttle: Throttle,
    result: ColdCompactionResult,
) -> ColdOffsetMap:
    """The map over the dirty cold segments, then the hot log, up to the last stable offset
    (a transaction open in the cold tier may stop it there), until it is full."""
    plan = job.plan
    stable_end = job.hot_end_offset
    offsets = ColdOffsetMap(capacity_bytes, plan.first_dirty_offset)
    for segment in plan.map_segments:
        if segment.base_offset >= stable_end:
            offsets.finish()
            return offsets
        with pq.ParquetFile(local(segment)) as source:
            for group in range(source.metadata.num_row_groups):
                throttle.account(row_group_bytes(source.metadata, group))
                rows = source.read_row_group(group, columns=MAP_COLUMNS, use_threads=False)
                keys, row_offsets = map_rows(rows, plan.first_dirty_offset, job.aborted, stable_end)
                if not offsets.add(keys, row_offsets, min(segment.next_offset, stable_end)):
                    offsets.finish()
                    return offsets
    if job.hot_end_offset > plan.cold_end_offset:
        for data, next_offset in io.hot_reads(plan.cold_end_offset, job.hot_end_offset):
            throttle.account(len(data))
            result.hot_bytes_read += len(data)
            rows = _hot_rows(job, data)
            if rows is None:
                continue
            keys, row_offsets = map_rows(rows, plan.cold_end_offset, job.aborted)
            if not offsets.add(keys, row_offsets, min(next_offset, job.hot_end_offset)):
                break
        # Every committed offset was offered (the last ones may hold no batch any more).
        offsets.add(pa.array([], pa.binary()), pa.array([], pa.int64()), job.hot_end_offset)
    offsets.finish()
    return offsets


def _hot_rows(job: _Job, data: bytes) -> pa.Table | None:
    """The rows of hot batches (keys, offsets, attributes are what the map reads)."""
    rows = RowGroupRows(job.topic, job.partition)
    for position, header in iter_batch_headers(data):
        if header.records_count > 0:
            rows.add(data, position, header)
    return rows.table() if rows.rows else None


def _count(
    rewrite: GroupRewrite, group: tuple[RemoteSegment, ...], result: ColdCompactionResult
) -> None:
    result.records_in += rewrite.rows_in
    result.records_out += rewrite.rows_out
    result.log_bytes_out += (
        rewrite.log_bytes if rewrite.changed else sum(s.log_bytes for s in group)
    )


def owner_name(broker_id: int) -> str:
    return f"broker-{broker_id}"
