"""The broker's tiering task: upload sealed segments of the partitions it leads, then free the
local disk they no longer need.

For each partition led here with `remote.storage.enable=true`, every round:
1. On a new leader epoch, read the latest manifest, commit a version at this epoch (which
   fences the previous leader's late writes from then on), and clean up copies left unfinished
   by an earlier leader or a crash (COPY_STARTED -> DELETE_STARTED -> object deleted ->
   dropped), so the partition's remote log has no half-written segment and the next upload
   starts where the last finished one ended.
2. Upload: the batches of the oldest sealed segment from the manifest's end offset on, when all
   of that segment is below the high watermark (committed: identical on every replica), become
   one Parquet object: COPY_STARTED is committed first (so a crash leaves a record of the
   object to delete), then the object is written, then COPY_FINISHED. The commit finishing a
   copy records the next scheduled copies as started: one manifest write per segment. Local
   retention (3.) runs after each upload.
3. Local retention: sealed segments wholly uploaded (below the manifest's finished end) and
   beyond `local.retention.ms` / `local.retention.bytes` are deleted locally. Nothing that is
   not uploaded is ever deleted, so an unreachable store only makes the local backlog grow.

Every manifest write is fenced by the leader epoch (remote_metadata.py): a deposed leader's
late write is refused and it stops tiering that partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from pathlib import Path

from riverbed.common.log_events import event
from riverbed.configs import TopicConfig
from riverbed.hot.local_log import (
    UNLIMITED,
    LocalLog,
    LocalPartition,
    SealedBatches,
    log_start_after_retention,
)
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.tiering.manifest import (
    Manifest,
    ManifestError,
    RemoteSegment,
    SegmentState,
    partition_prefix,
    segment_key,
)
from riverbed.tiering.parquet_codec import SegmentSummary, segment_to_parquet
from riverbed.tiering.remote_metadata import RemoteMetadata
from riverbed.tiering.store import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

# Segment bytes uploaded per partition per round (at least one segment), so one partition's
# backlog cannot starve the others: a few seconds of work. By bytes, not segments: segment.bytes
# ranges from a few MiB to 1 GiB.
UPLOAD_BYTES_PER_ROUND_MAX = 1024 * 1024 * 1024
# Segments converted while the one before is uploaded: two use both cores; each holds at most
# two row groups in memory (parquet_codec).
CONVERSIONS_AHEAD_MAX = 2
# After a failed round a partition waits, doubling, up to the max (store down: few retries).
RETRY_BACKOFF_MS = 1_000
RETRY_BACKOFF_MAX_MS = 30_000
# Kafka's -2 for local.retention.*: "the same as retention.*" (-1, UNLIMITED: no limit).
FROM_TOTAL_RETENTION = -2


@dataclass(frozen=True, slots=True)
class TieringSettings:
    task_interval_ms: int  # remote.log.manager.task.interval.ms
    work_dir: Path  # where Parquet files are built before upload
    orphan_grace_ms: int  # remote.log.orphan.grace.ms


@dataclass
class _PartitionState:
    metadata: RemoteMetadata
    leader_epoch: int
    manifest: Manifest | None = None  # None until loaded and cleaned at this epoch
    # Where the uploaded offsets end, as last known (0: nothing known to be uploaded).
    uploaded_end: int = 0
    failures: int = 0
    retry_at_s: float = 0.0
    fenced: bool = False
    orphans_swept_ms: int = 0  # when the bucket was last swept for orphans (0: not yet)


@dataclass
class TieringStatus:
    """What operators and tests look at: per partition, the local bytes waiting for upload."""

    backlog_bytes: dict[tuple[str, int], int] = field(default_factory=dict)
    uploaded_segments: int = 0
    upload_failures: int = 0
    last_error: str | None = None


class Offloader:
    """Owned by the broker: `start()` runs the loop as a task, `stop()` cancels and awaits it."""

    def __init__(
        self,
        store: ObjectStore,
        partitions: Iterable[LocalPartition],
        topic_config: Callable[[str], TopicConfig | None],
        executor: Executor,
        settings: TieringSettings,
        now_ms: Callable[[], int],
    ) -> None:
        self._store = store
        self._partitions = partitions
        self._topic_config = topic_config
        self._executor = executor
        self._settings = settings
        self._now_ms = now_ms
        self._states: dict[tuple[str, int], _PartitionState] = {}
        self._task: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()
        self.status = TieringStatus()

    def prepare(self) -> None:
        """What `start()` does before its loop: enough for `run_once()` driven by hand."""
        self._settings.work_dir.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        self.prepare()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="tiering")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def manifest_of(self, topic: str, partition: int) -> Manifest | None:
        """The manifest as of this broker's last round or the cold compactor's last commit,
        whichever is newer (None if it does not lead the partition or has not loaded it yet)."""
        state = self._states.get((topic, partition))
        return None if state is None else _newest(state)

    def claimed(self, topic: str, partition: int) -> tuple[RemoteMetadata, int] | None:
        """(the partition's manifest store, the leader epoch) once this broker leads the
        partition and has claimed its manifest at that epoch (so a deposed leader's writes are
        fenced), for the cold compactor to commit through the same RemoteMetadata; None
        before that, or once fenced."""
        state = self._states.get((topic, partition))
        if state is None or state.manifest is None or state.fenced:
            return None
        return state.metadata, state.leader_epoch

    def wake(self) -> None:
        """Run the next round now, not at the end of the interval: the broker calls it when
        partitions' roles or topics' configs change (a new leadership, tiering turned on)."""
        self._woken.set()

    async def _run(self) -> None:
        while True:
            backlog = await self.run_once()
            # A partition with more sealed segments than one round uploads goes on at once:
            # waiting out the interval between rounds would let the backlog outgrow ingest.
            if not backlog:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._settings.task_interval_ms / 1000):
                        await self._woken.wait()
            self._woken.clear()

    async def run_once(self) -> bool:
        """One round over every partition this broker leads; True if a partition has sealed
        segments left to upload that this round had no room for."""
        led = set()
        backlog = False
        for partition in list(self._partitions):
            config = self._topic_config(partition.topic)
            if not partition.is_leader or config is None or not config.remote_storage_enable:
                continue
            key = (partition.topic, partition.index)
            led.add(key)
            state = self._states.get(key)
            if state is None or state.leader_epoch != partition.leader_epoch:
                state = _PartitionState(
                    RemoteMetadata(self._store, partition.topic, partition.index),
                    partition.leader_epoch,
                )
                self._states[key] = state
            if state.fenced or time.monotonic() < state.retry_at_s:
                continue
            try:
                backlog |= await self._tier(partition, config, state)
                state.failures = 0
            except (ObjectStoreError, KafkaError, ManifestError, OSError) as error:
                self._failed(partition, state, error)
        for key in set(self._states) - led:
            del self._states[key]
            self.status.backlog_bytes.pop(key, None)  # its new leader reports it
        return backlog

    def _failed(self, partition: LocalPartition, state: _PartitionState, error: Exception) -> None:
        self.status.upload_failures += 1
        self.status.last_error = f"{partition}: {error}"
        if isinstance(error, KafkaError) and error.code == ErrorCode.FENCED_LEADER_EPOCH:
            state.fenced = True  # a newer leader tiers it now; our epoch will change soon
            log.warning("%s: tiering fenced: %s", partition, error)
            return
        state.failures += 1
        if state.manifest is not None:
            state.uploaded_end = state.manifest.finished_end_offset
        state.manifest = None  # re-read: a commit may have landed before the failure
        # The store may have failed before this round measured anything.
        self._update_backlog(partition, state.uploaded_end)
        backoff_ms = min(RETRY_BACKOFF_MS * 2 ** (state.failures - 1), RETRY_BACKOFF_MAX_MS)
        state.retry_at_s = time.monotonic() + backoff_ms / 1000
        event(
            log,
            logging.WARNING,
            "tiering.upload_failed",
            topic=partition.topic,
            partition=partition.index,
            failures_in_a_row=state.failures,
            retry_in_ms=backoff_ms,
            backlog_bytes=self.status.backlog_bytes.get((partition.topic, partition.index), 0),
            error=str(error),
        )

    async def _tier(
        self, partition: LocalPartition, config: TopicConfig, state: _PartitionState
    ) -> bool:
        """Upload what is due, then apply retention; True if segments are left to upload."""
        if state.manifest is None:
            state.manifest = await self._clean_unfinished(state)
        # The cold compactor may have committed through the same RemoteMetadata since.
        state.manifest = _fresher(state.manifest, state.metadata.known)
        # DeleteRecords (this leader's, or a predecessor's recorded in the manifest) first, so
        # nothing below the log start is uploaded.
        state.manifest = await self._move_log_start(
            partition,
            state,
            max(state.manifest.log_start_offset, partition.log.truncated_before),
            "log start",
        )
        left = await self._upload_sealed(partition, config, state)
        await self._delete_orphans(state)
        state.uploaded_end = state.manifest.finished_end_offset
        self._update_backlog(partition, state.uploaded_end)
        state.manifest = await self._apply_total_retention(partition, config, state)
        self._apply_local_retention(partition.log, config, state.manifest)
        return left

    async def _upload_sealed(
        self, partition: LocalPartition, config: TopicConfig, state: _PartitionState
    ) -> bool:
        """Upload sealed segments in offset order, up to UPLOAD_BYTES_PER_ROUND_MAX of them
        (at least one), converting up to CONVERSIONS_AHEAD_MAX of the next ones meanwhile
        (worker threads: Parquet encoding releases the GIL, so they use both cores while the
        store is waited on), and applying local retention after each upload (a long backlog
        frees local disk as it goes, not at the end of the round). True if the round stopped
        with segments left."""
        assert state.manifest is not None
        pending: deque[_Copy] = deque()
        next_offset = state.manifest.end_offset
        budget_bytes = UPLOAD_BYTES_PER_ROUND_MAX

        def convert_ahead() -> None:
            nonlocal next_offset, budget_bytes
            while len(pending) < CONVERSIONS_AHEAD_MAX and budget_bytes > 0:
                batches = self._sealed_from(partition, state, next_offset)
                if batches is None:
                    return
                entry = _started_entry(partition, state, batches)
                pending.append(
                    _Copy(
                        entry,
                        asyncio.get_running_loop().create_task(
                            self._convert(partition, entry, batches),
                            name=f"tiering-convert-{partition}",
                        ),
                    )
                )
                next_offset = batches.last_offset + 1
                budget_bytes -= batches.size_bytes

        try:
            while True:
                convert_ahead()
                if not pending:
                    left = self._sealed_from(partition, state, next_offset, close=True)
                    return budget_bytes <= 0 and left is not None
                if not pending[0].started:
                    # The round's first copies (later ones are recorded by the commit that
                    # finishes the copy before them): recorded while they convert.
                    state.manifest = await self._record_started(state, pending)
                copy = pending.popleft()
                with await copy.converting:
                    convert_ahead()  # its thread is free: the next one starts before the upload
                    state.manifest = await self._upload(partition, state, copy, pending)
                self._apply_local_retention(partition.log, config, state.manifest)
        finally:
            for waiting in pending:
                converting = waiting.converting
                # Let the worker thread finish with the file it writes before it is removed.
                await asyncio.wait([converting])
                if not converting.cancelled() and converting.exception() is None:
                    converting.result().close()

    async def _delete_orphans(self, state: _PartitionState) -> None:
        """Delete data objects that no manifest entry points at and that are older than
        remote.log.orphan.grace.ms. A leader commits COPY_STARTED before it writes an object,
        so such an object is no live copy: it is a deposed leader's late upload, written after
        the next leader cleaned up its COPY_STARTED entry, whose commit was fenced. The grace
        keeps this broker, should it be deposed without knowing yet, from deleting the new
        leader's fresh objects. A sweep lists every object of the partition, so it runs at
        most once per grace period."""
        now_ms = self._now_ms()
        if now_ms - state.orphans_swept_ms < self._settings.orphan_grace_ms:
            return
        prefix = f"{partition_prefix(state.metadata.topic, state.metadata.partition)}segments/"
        listed = await self._store.list(prefix)
        latest = await state.metadata.latest()  # after the listing: it names every object listed
        if latest.leader_epoch > state.leader_epoch:
            return  # deposed: the new leader tidies up
        # Retired segments (old readers may still read them) and a pending compaction's
        # outputs (being written) are not orphans.
        referenced = latest.referenced_keys()
        state.orphans_swept_ms = now_ms
        too_old_ms = now_ms - self._settings.orphan_grace_ms
        orphans = [
            info.key
            for info in listed
            if info.key not in referenced and info.modified_ms < too_old_ms
        ]
        for key in orphans:
            await self._store.delete(key)
        if orphans:
            log.info(
                "%s-%d: deleted %d orphaned objects",
                state.metadata.topic,
                state.metadata.partition,
                len(orphans),
            )

    def _sealed_from(
        self, partition: LocalPartition, state: _PartitionState, offset: int, *, close: bool = False
    ) -> SealedBatches | None:
        """The sealed segment holding `offset`, if it is wholly below the high watermark and
        this broker still leads at the epoch (its fd closed with `close`: only asking)."""
        if not partition.is_leader or partition.leader_epoch != state.leader_epoch:
            return None
        batches = partition.log.sealed_batches_from(offset, partition.log.high_watermark)
        if batches is not None and close:
            os.close(batches.fd)
        return batches

    async def _convert(
        self, partition: LocalPartition, started: RemoteSegment, batches: SealedBatches
    ) -> _Converted:
        work = tempfile.TemporaryDirectory(dir=self._settings.work_dir)
        path = Path(work.name) / "segment.parquet"
        try:
            summary = await asyncio.get_running_loop().run_in_executor(
                self._executor, _to_parquet, batches, partition.topic, partition.index, path
            )
            if summary.base_offset != batches.base_offset:
                raise KafkaError(
                    ErrorCode.CORRUPT_MESSAGE,
                    f"{partition}: segment data starts at {summary.base_offset}, "
                    f"expected {batches.base_offset}",
                )
        except BaseException:
            work.cleanup()
            raise
        finally:
            os.close(batches.fd)
        finished = replace(
            started,
            size_bytes=path.stat().st_size,
            records=summary.records,
            min_timestamp_ms=summary.min_timestamp_ms,
            max_timestamp_ms=summary.max_timestamp_ms,
            state=SegmentState.COPY_FINISHED,
            transactions=summary.transactions,
        )
        return _Converted(finished, path, work)

    async def _clean_unfinished(self, state: _PartitionState) -> Manifest:
        manifest = await state.metadata.latest()
        # Multipart uploads (or temporary files) of copies that died mid-write: not objects,
        # so no manifest entry points at them, but their parts are stored (and billed).
        left = await self._store.abort_unfinished(
            f"{partition_prefix(state.metadata.topic, state.metadata.partition)}segments/"
        )
        if left:
            log.info("%s: removed %d unfinished uploads", state.metadata.topic, left)
        unfinished = [s.key for s in manifest.segments if s.state is not SegmentState.COPY_FINISHED]
        if not unfinished:
            if manifest.version > 0 and manifest.leader_epoch < state.leader_epoch:
                # Claim the manifest for this epoch now, unchanged: from here on a deposed
                # leader's late write is fenced, even before this leader has uploaded anything.
                manifest = await state.metadata.commit(state.leader_epoch, lambda m: m)
            return manifest
        manifest = await state.metadata.commit(
            state.leader_epoch,
            lambda m: m.with_state(unfinished, SegmentState.DELETE_STARTED),
        )
        for key in unfinished:
            await self._store.delete(key)
        log.info("%s: removed %d unfinished remote segments", state.metadata.topic, len(unfinished))
        return await state.metadata.commit(state.leader_epoch, lambda m: m.without(unfinished))

    async def _record_started(self, state: _PartitionState, copies: deque[_Copy]) -> Manifest:
        """Commit the COPY_STARTED of `copies` (before any of their objects is written)."""
        manifest = await state.metadata.commit(
            state.leader_epoch, lambda m: _with_started(m, copies)
        )
        for copy in copies:
            copy.started = True
        return manifest

    async def _upload(
        self,
        partition: LocalPartition,
        state: _PartitionState,
        copy: _Copy,
        following: deque[_Copy],
    ) -> Manifest:
        """Upload `copy` (converted; its COPY_STARTED committed), then commit its COPY_FINISHED
        together with the COPY_STARTED of the copies scheduled after it (`following`),
        converted or not: when their turn comes their record is there, so a segment costs one
        manifest write, not two."""
        assert copy.started and copy.converting.done()
        converted = copy.converting.result()
        await self._store.put_file(converted.segment.key, converted.path)
        manifest = await state.metadata.commit(
            state.leader_epoch,
            lambda m: _with_started(m.with_copy_finished(converted.segment), following),
        )
        for waiting in following:
            waiting.started = True
        segment = converted.segment
        self.status.uploaded_segments += 1
        event(
            log,
            logging.INFO,
            "tiering.segment_uploaded",
            topic=partition.topic,
            partition=partition.index,
            base_offset=segment.base_offset,
            last_offset=segment.last_offset,
            records=segment.records,
            bytes=segment.size_bytes,
            key=segment.key,
        )
        return manifest

    def _update_backlog(self, partition: LocalPartition, uploaded_end: int) -> None:
        """The bytes of sealed local segments not (known to be) uploaded."""
        waiting = sum(
            s.size_bytes
            for s in partition.log.segment_stats()
            if s.sealed and s.next_offset > uploaded_end
        )
        self.status.backlog_bytes[(partition.topic, partition.index)] = waiting

    async def _apply_total_retention(
        self, partition: LocalPartition, config: TopicConfig, state: _PartitionState
    ) -> Manifest:
        """`retention.ms` / `retention.bytes` over the whole log: the oldest remote segments
        past them go, the log start first (readers stop asking for them), then the objects,
        then the manifest entries; local segments below the new log start go too. Not on a
        topic whose cleanup.policy lacks `delete`: a compacted topic keeps each key's latest
        record however old (cold compaction thins its cold tier instead)."""
        manifest = state.manifest
        assert manifest is not None
        if not config.delete:
            return manifest
        finished = manifest.finished()
        local_start = partition.log.log_start_offset
        total_bytes = partition.log.size_bytes + sum(
            s.log_bytes for s in finished if s.next_offset <= local_start
        )
        now_ms = self._now_ms()
        doomed = []
        for segment in finished:
            too_old = (
                config.retention_ms != UNLIMITED
                and now_ms - segment.max_timestamp_ms > config.retention_ms
            )
            too_big = (
                config.retention_bytes != UNLIMITED
                and total_bytes - segment.log_bytes >= config.retention_bytes
            )
            if not (too_old or too_big) or segment.next_offset > partition.log.high_watermark:
                break
            doomed.append(segment)
            if segment.next_offset <= local_start:
                total_bytes -= segment.log_bytes
        if not doomed:
            return manifest
        return await self._move_log_start(partition, state, doomed[-1].next_offset, "retention")

    async def _move_log_start(
        self, partition: LocalPartition, state: _PartitionState, start: int, reason: str
    ) -> Manifest:
        """Move the whole log's start to `start`: the manifest's first (readers stop asking
        below it), then the objects wholly below it go, then their manifest entries; the local
        log follows (its start, persisted, and its segments wholly below)."""
        manifest = state.manifest
        assert manifest is not None
        if start > manifest.log_start_offset or _below(manifest, start):
            # The segments below are taken from the version being changed, not from this
            # broker's copy: the cold compactor may have swapped some since.
            manifest = await state.metadata.commit(
                state.leader_epoch,
                lambda m: m.with_log_start_offset(start).with_state(
                    _below(m, start), SegmentState.DELETE_STARTED
                ),
            )
        keys = [
            s.key
            for s in manifest.segments
            if s.state is SegmentState.DELETE_STARTED and s.next_offset <= start
        ]
        for key in keys:
            await self._store.delete(key)
        if keys:
            manifest = await state.metadata.commit(state.leader_epoch, lambda m: m.without(keys))
        # A new leader's log may end below a start its predecessor set (an unclean election).
        partition.log.advance_log_start_offset(min(start, partition.log.log_end_offset))
        partition.log.delete_segments_below(start, reason=reason)
        if keys:
            event(
                log,
                logging.INFO,
                "tiering.remote_segments_deleted",
                topic=partition.topic,
                partition=partition.index,
                reason=reason,
                segments=len(keys),
                log_start_offset=start,
            )
        return manifest

    def _apply_local_retention(
        self, partition_log: LocalLog, config: TopicConfig, manifest: Manifest
    ) -> None:
        """Delete local segments that are uploaded and past local retention."""
        start = log_start_after_retention(
            partition_log.segment_stats(),
            retention_ms=_local_limit(config.local_retention_ms, config.retention_ms),
            retention_bytes=_local_limit(config.local_retention_bytes, config.retention_bytes),
            now_ms=self._now_ms(),
            limit_offset=manifest.finished_end_offset,
        )
        if start is not None:
            partition_log.delete_segments_below(start)


def _below(manifest: Manifest, start: int) -> list[str]:
    return [s.key for s in manifest.finished() if s.next_offset <= start]


def _newest(state: _PartitionState) -> Manifest | None:
    return None if state.manifest is None else _fresher(state.manifest, state.metadata.known)


def _fresher(manifest: Manifest, known: Manifest | None) -> Manifest:
    """The newer of the offloader's own manifest and the last one committed or read through
    its RemoteMetadata (by the cold compactor too): versions only grow."""
    return known if known is not None and known.version > manifest.version else manifest


def _local_limit(local: int, total: int) -> int:
    return total if local == FROM_TOTAL_RETENTION else local


@dataclass
class _Converted:
    """A sealed segment converted to a Parquet file in a temporary directory of its own, which
    `close()` (or leaving the `with` block) removes; `segment` is its COPY_FINISHED entry."""

    segment: RemoteSegment
    path: Path
    work: tempfile.TemporaryDirectory[str]

    def __enter__(self) -> _Converted:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self.work.cleanup()


@dataclass
class _Copy:
    """A segment scheduled for upload: its COPY_STARTED entry (`started` once committed) and
    its conversion."""

    entry: RemoteSegment
    converting: asyncio.Task[_Converted]
    started: bool = False


def _with_started(manifest: Manifest, copies: deque[_Copy]) -> Manifest:
    """`manifest` with the COPY_STARTED of `copies` (those already in it stay as they are)."""
    for copy in copies:
        manifest = manifest.with_copy_started(copy.entry)
    return manifest


def _started_entry(
    partition: LocalPartition, state: _PartitionState, batches: SealedBatches
) -> RemoteSegment:
    """The COPY_STARTED record of a segment about to be converted: its key and offsets; what
    only the object tells (its size, records, timestamps) stays 0 until COPY_FINISHED."""
    return RemoteSegment(
        key=segment_key(
            partition.topic,
            partition.index,
            batches.base_offset,
            batches.last_offset,
            uuid.uuid4().hex,
        ),
        base_offset=batches.base_offset,
        last_offset=batches.last_offset,
        size_bytes=0,
        log_bytes=batches.size_bytes,
        records=0,
        min_timestamp_ms=0,
        max_timestamp_ms=0,
        leader_epoch=state.leader_epoch,
        state=SegmentState.COPY_STARTED,
    )


def _to_parquet(batches: SealedBatches, topic: str, partition: int, path: Path) -> SegmentSummary:
    """In a worker thread: map the segment's bytes (no copy) and write the Parquet file."""
    with mmap.mmap(batches.fd, 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)[batches.position : batches.position + batches.size_bytes]
        try:
            return segment_to_parquet(view, topic, partition, path)
        finally:
            view.release()
