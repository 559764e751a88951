"""The log cleaner: compaction of `cleanup.policy=compact` logs on the hot tier, Kafka's design.

Each partition's log is, for the cleaner, a clean head (compacted before, below the partition's
first dirty offset) and a dirty tail, then the uncleanable rest: the active segment, segments
reaching the high watermark, and segments with records newer than `min.compaction.lag.ms`.
A pass over one log (`prepare` on the owner thread, `clean` on a worker thread, `commit` back on
the owner thread):
1. reads the dirty tail oldest first into an OffsetMap (key -> latest offset), bounded by
   `log.cleaner.dedupe.buffer.size`; the pass's dirty end is where the map stopped;
2. rewrites the segments from the log start up to there, grouped so that a group's segments
   add up to at most `segment.bytes`, keeping what riverbed.hot.storage.compaction keeps; a group in
   which nothing changed is left as it is;
3. swaps the rewritten groups in, all at once and crash-safe (riverbed.hot.storage.cleaner_swap), if
   the log still holds exactly the segments they were made from (retention or a follower's
   truncation may have changed them meanwhile: then the pass is dropped and the next one
   starts over).
The first dirty offset is checkpointed in the partition's directory (`cleaner-offset-checkpoint`,
cleaner_swap.py); without it the whole log counts as dirty, which costs one needless
pass and nothing else. A truncation below it moves it back (the offsets are written again).

The worker reads sealed segments through duplicated descriptors (sealed segments are never
written again), throttled to `log.cleaner.io.max.bytes.per.second` (reads plus writes), and
stops at the next batch when asked. Which log goes first: the one with the largest dirty ratio
among those at or above `min.cleanable.dirty.ratio`, or past `max.compaction.lag.ms` (Kafka's
"filthiest log first"); one pass per log at a time.

Tombstones: on tiered topics they are never removed here, since the cold tier may still hold
older values of their keys that a reader from the start would see come back.

Transactions (as Kafka's cleaner): nothing at or past the log's last stable offset is cleaned
(an open transaction's outcome is unknown there); batches of aborted transactions are dropped
and take no part in the offset map (an aborted value must not shadow a committed one of its
key); markers (control batches) are kept, and a cleaned segment keeps every aborted-transaction
index entry of the segments it replaces. Kafka also removes markers once delete.retention.ms has
passed after their transaction's data is gone; Riverbed keeps them (they are small).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from riverbed.common.fileio import fsync_dir, pread_exact
from riverbed.common.log_events import event
from riverbed.common.throttle import Throttle
from riverbed.configs import LONG_MIN, TopicConfig
from riverbed.hot.storage.cleaner_swap import (
    cleaned_dir,
    discard_cleaned,
    load_first_dirty_offset,
    save_first_dirty_offset,
)
from riverbed.hot.storage.compaction import OffsetMap, batch_keys, thin_batch
from riverbed.hot.storage.index import RELATIVE_OFFSET_MAX
from riverbed.hot.storage.log import PartitionLog, SegmentStats
from riverbed.hot.storage.segment import LogSegment
from riverbed.hot.storage.transactions import AbortedTxn
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records import (
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    CorruptRecordError,
    batch_crc_ok,
    parse_batch_header,
)

log = logging.getLogger(__name__)

# Cleaned batches are written to the new segment in chunks of about this many bytes: the bound
# on the worker's buffer besides the offset map.
WRITE_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    dedupe_buffer_bytes: int  # log.cleaner.dedupe.buffer.size
    io_max_bytes_per_second: float  # log.cleaner.io.max.bytes.per.second


@dataclass(frozen=True, slots=True)
class CleanablePlan:
    """What a log's next pass may clean: segments below `end_offset`, the dirty part starting
    at `first_dirty_offset`; `due` when the dirty ratio or the compaction lag asks for it."""

    first_dirty_offset: int
    end_offset: int
    dirty_ratio: float
    due: bool


def plan_cleaning(
    stats: Sequence[SegmentStats],
    *,
    first_dirty_offset: int,
    high_watermark: int,
    now_ms: int,
    config: TopicConfig,
) -> CleanablePlan | None:
    """Pure: the cleanable range of a log from its segments' statistics; None if nothing in it
    is dirty. A segment is cleanable if it is sealed, below the high watermark and, when
    `min.compaction.lag.ms` is set, older than that; the first one that is not ends the range."""
    first_dirty = max(first_dirty_offset, stats[0].base_offset)
    end_offset = None
    clean_bytes = dirty_bytes = 0
    overdue = False
    for segment in stats:
        age_ms = now_ms - segment.max_timestamp_ms
        if (
            not segment.sealed
            or segment.next_offset > high_watermark
            or (config.min_compaction_lag_ms > 0 and age_ms < config.min_compaction_lag_ms)
        ):
            break
        end_offset = segment.next_offset
        if segment.next_offset <= first_dirty:
            clean_bytes += segment.size_bytes
            continue
        if dirty_bytes == 0:  # the oldest dirty segment decides the lag
            overdue = age_ms > config.max_compaction_lag_ms
        dirty_bytes += segment.size_bytes
    if end_offset is None or dirty_bytes == 0:
        return None
    ratio = dirty_bytes / (clean_bytes + dirty_bytes)
    return CleanablePlan(
        first_dirty, end_offset, ratio, ratio >= config.min_cleanable_dirty_ratio or overdue
    )


@dataclass(frozen=True, slots=True)
class SourceSegment:
    """A sealed segment as the worker reads it: offsets [base_offset, next_offset) at bytes
    [0, size_bytes) of `fd`, a duplicate the job closes."""

    base_offset: int
    next_offset: int
    size_bytes: int
    fd: int
    # Its transaction index entries, which the cleaned segment keeps.
    aborted_txns: tuple[AbortedTxn, ...] = ()


@dataclass(slots=True)
class CleaningJob:
    """One pass over one log: prepared on the owner thread, run by the worker, committed on the
    owner thread. `segments` are the live segments, for `commit` to check they are still there;
    the worker only touches `sources`."""

    directory: Path
    segments: list[LogSegment]
    sources: list[SourceSegment]
    first_dirty_offset: int
    delete_horizon_ms: int
    segment_bytes: int
    index_interval_bytes: int
    # The aborted transactions overlapping the sources, by producer id: (first, marker offset).
    aborted: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def is_aborted(self, header: BatchHeader) -> bool:
        """Whether `header` is a data batch of an aborted transaction."""
        if not header.is_transactional or header.is_control:
            return False
        ranges = self.aborted.get(header.producer_id)
        return ranges is not None and any(
            first <= header.base_offset < last for first, last in ranges
        )

    def close(self) -> None:
        for source in self.sources:
            os.close(source.fd)
        self.sources = []


@dataclass(slots=True)
class CleaningResult:
    """What a pass did. `groups` are the (first slot, count) of the job's segments whose cleaned
    segment waits in the log's `cleaned/` directory."""

    dirty_end_offset: int
    groups: list[tuple[int, int]] = field(default_factory=list)
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    map_keys: int = 0


def prepare(
    partition_log: PartitionLog,
    plan: CleanablePlan,
    config: TopicConfig,
    *,
    now_ms: int,
    keep_tombstones: bool,
) -> CleaningJob:
    """The job for `plan` (owner thread)."""
    segments = partition_log.cleanable_segments(plan.end_offset)
    next_bases = [segment.base_offset for segment in segments[1:]] + [plan.end_offset]
    sources = [
        SourceSegment(
            segment.base_offset,
            next_base,
            segment.size,
            os.dup(segment.fd),
            tuple(segment.aborted_txns),
        )
        for segment, next_base in zip(segments, next_bases, strict=True)
    ]
    aborted: dict[int, list[tuple[int, int]]] = {}
    if segments:
        for txn in partition_log.aborted_transactions(segments[0].base_offset, plan.end_offset):
            aborted.setdefault(txn.producer_id, []).append((txn.first_offset, txn.last_offset))
    return CleaningJob(
        partition_log.directory,
        segments,
        sources,
        plan.first_dirty_offset,
        LONG_MIN if keep_tombstones else now_ms - config.delete_retention_ms,
        config.segment_bytes,
        config.index_interval_bytes,
        aborted,
    )


def clean(job: CleaningJob, settings: CleanerSettings, stop: threading.Event) -> CleaningResult:
    """The worker's part: build the offset map, write cleaned groups into `cleaned/`. Raises
    CorruptRecordError for a batch that fails its CRC (the log is then left alone)."""
    throttle = Throttle(settings.io_max_bytes_per_second, stop)
    offsets = OffsetMap(settings.dedupe_buffer_bytes)
    offsets.end_offset = _build_offset_map(job, offsets, throttle)
    result = CleaningResult(dirty_end_offset=offsets.end_offset)
    result.map_keys = len(offsets)
    target = cleaned_dir(job.directory)
    discard_cleaned(job.directory)
    target.mkdir()
    for first, count in _groups(job, result.dirty_end_offset):
        if _clean_group(job, first, count, offsets, target, throttle, result):
            result.groups.append((first, count))
    fsync_dir(target)
    return result


def _build_offset_map(job: CleaningJob, offsets: OffsetMap, throttle: Throttle) -> int:
    """Read the dirty part into `offsets`; return the first offset the map did not take in."""
    first_dirty = job.first_dirty_offset
    for source in job.sources:
        if source.next_offset <= first_dirty:
            continue
        for header, batch in _batches(source, throttle):
            if header.is_control or job.is_aborted(header):
                continue
            for _, offset, key, _, _ in batch_keys(batch, header):
                if offset < first_dirty or key is None:
                    continue
                if not offsets.add(key, offset):
                    if offset == first_dirty:
                        raise ValueError(
                            "log.cleaner.dedupe.buffer.size cannot hold a single key of "
                            f"{job.directory.name}"
                        )
                    return offset
    return job.sources[-1].next_offset


def _groups(job: CleaningJob, dirty_end_offset: int) -> Iterator[tuple[int, int]]:
    """(first slot, count) of the job's segments below the dirty end, in groups whose sizes add
    up to at most segment.bytes and whose offsets a single segment can address."""
    sources = [s for s in job.sources if s.base_offset < dirty_end_offset]
    first = 0
    while first < len(sources):
        end = first + 1
        size = sources[first].size_bytes
        while (
            end < len(sources)
            and size + sources[end].size_bytes <= job.segment_bytes
            and sources[end].next_offset - 1 - sources[first].base_offset <= RELATIVE_OFFSET_MAX
        ):
            size += sources[end].size_bytes
            end += 1
        yield first, end - first
        first = end


def _clean_group(
    job: CleaningJob,
    first: int,
    count: int,
    offsets: OffsetMap,
    target: Path,
    throttle: Throttle,
    result: CleaningResult,
) -> bool:
    """Write the cleaned segment of sources [first, first + count) into `target`; False (and
    nothing kept) if no record of theirs goes."""
    sources = job.sources[first : first + count]
    cleaned = LogSegment.create(target, sources[0].base_offset, job.index_interval_bytes)
    changed = False
    try:
        pending: list[bytes] = []
        pending_headers: list[BatchHeader] = []
        pending_bytes = 0
        for source in sources:
            for header, batch in _batches(source, throttle):
                result.bytes_read += len(batch)
                if job.is_aborted(header):
                    result.records_read += header.records_count
                    changed = True
                    continue
                thinned = thin_batch(batch, header, offsets, job.delete_horizon_ms)
                result.records_read += thinned.records_in
                result.records_kept += thinned.records_out
                if thinned.batch is not batch:
                    changed = True
                if thinned.batch is None:
                    continue
                pending.append(thinned.batch)
                pending_headers.append(
                    header if thinned.batch is batch else parse_batch_header(thinned.batch)
                )
                pending_bytes += len(thinned.batch)
                if pending_bytes >= WRITE_CHUNK_BYTES:
                    _write(cleaned, pending, pending_headers, throttle, result)
                    pending, pending_headers, pending_bytes = [], [], 0
        if not changed:
            return False
        if pending:
            _write(cleaned, pending, pending_headers, throttle, result)
        for source in sources:
            for txn in source.aborted_txns:
                cleaned.add_aborted_txn(txn)
        cleaned.seal()
        cleaned.flush()
        return True
    finally:
        if changed:
            cleaned.close()
        else:
            cleaned.delete()


def _write(
    segment: LogSegment,
    batches: list[bytes],
    headers: list[BatchHeader],
    throttle: Throttle,
    result: CleaningResult,
) -> None:
    data = b"".join(batches)
    segment.append(memoryview(data), headers)
    result.bytes_written += len(data)
    throttle.account(len(data))


def _batches(source: SourceSegment, throttle: Throttle) -> Iterator[tuple[BatchHeader, bytes]]:
    """Every batch of `source`, CRC-checked (the cleaner must not spread a corrupt batch)."""
    position = 0
    while position < source.size_bytes:
        header = parse_batch_header(pread_exact(source.fd, RECORD_BATCH_OVERHEAD, position))
        batch = pread_exact(source.fd, header.size_bytes, position)
        if not batch_crc_ok(batch, 0, header):
            raise CorruptRecordError(
                ErrorCode.CORRUPT_MESSAGE,
                f"batch at byte {position} of segment {source.base_offset} fails its CRC",
            )
        throttle.account(header.size_bytes)
        yield header, batch
        position += header.size_bytes


def commit(partition_log: PartitionLog, job: CleaningJob, result: CleaningResult) -> bool:
    """Swap the cleaned groups in (owner thread) and checkpoint the new first dirty offset.
    False if the log changed under the pass: what was not swapped in yet is dropped."""
    groups = [job.segments[first : first + count] for first, count in result.groups]
    # No `finally` here: if the swap fails midway, its cleaned files are what reopening the log
    # needs to finish it.
    swapped = not groups or partition_log.replace_segments(groups)
    discard_cleaned(job.directory)
    if not swapped:
        log.info("%s changed while it was being cleaned; cleaning again", partition_log)
        return False
    save_first_dirty_offset(job.directory, result.dirty_end_offset)
    return True


def plan_for(partition_log: PartitionLog, config: TopicConfig, now_ms: int) -> CleanablePlan | None:
    """`plan_cleaning` for a live log, from its checkpointed first dirty offset."""
    return plan_cleaning(
        partition_log.segment_stats(),
        first_dirty_offset=load_first_dirty_offset(partition_log.directory),
        # Never at or past the first unstable offset (Kafka's cleaner bound).
        high_watermark=partition_log.last_stable_offset,
        now_ms=now_ms,
        config=config,
    )


def clean_log(
    partition_log: PartitionLog,
    config: TopicConfig,
    settings: CleanerSettings,
    *,
    now_ms: int,
    keep_tombstones: bool = False,
    force: bool = False,
) -> CleaningResult | None:
    """One whole pass over `partition_log` on the calling thread (tests, benchmarks, tools);
    None if nothing was due (anything dirty at all, with `force`)."""
    plan = plan_for(partition_log, config, now_ms)
    if plan is None or not (plan.due or force):
        return None
    job = prepare(partition_log, plan, config, now_ms=now_ms, keep_tombstones=keep_tombstones)
    try:
        result = clean(job, settings, threading.Event())
    finally:
        job.close()
    commit(partition_log, job, result)
    return result


class LogCleaner:
    """The broker's cleaner: `clean_filthiest` runs one pass over the log that needs it most,
    its reading and writing on a worker thread. Owned by the broker's cleaner task, which
    cancels it at shutdown (the worker stops at its next batch)."""

    def __init__(self, settings: CleanerSettings, now_ms: Callable[[], int]) -> None:
        self._settings = settings
        self._now_ms = now_ms
        # Logs whose batches failed their CRC: left alone until the broker restarts (Kafka
        # marks such partitions uncleanable); the log line says which.
        self._uncleanable: set[Path] = set()

    async def clean_filthiest(
        self,
        logs: Iterable[tuple[str, PartitionLog]],
        topic_config: Callable[[str], TopicConfig | None],
        tiered: Callable[[str], bool],
    ) -> CleaningResult | None:
        """Clean the compacted log (of `logs`, each with its topic's name) that is due with the
        largest dirty ratio; None if none is."""
        now_ms = self._now_ms()
        best: tuple[CleanablePlan, str, PartitionLog, TopicConfig] | None = None
        for topic, partition_log in logs:
            config = topic_config(topic)
            if config is None or not config.compact or partition_log.directory in self._uncleanable:
                continue
            plan = plan_for(partition_log, config, now_ms)
            if (
                plan is not None
                and plan.due
                and (best is None or plan.dirty_ratio > best[0].dirty_ratio)
            ):
                best = (plan, topic, partition_log, config)
        if best is None:
            return None
        plan, topic, partition_log, config = best
        return await self._pass(partition_log, plan, config, now_ms, tiered(topic))

    async def _pass(
        self,
        partition_log: PartitionLog,
        plan: CleanablePlan,
        config: TopicConfig,
        now_ms: int,
        keep_tombstones: bool,
    ) -> CleaningResult | None:
        job = prepare(partition_log, plan, config, now_ms=now_ms, keep_tombstones=keep_tombstones)
        stop = threading.Event()
        started = time.monotonic()
        worker = asyncio.get_running_loop().run_in_executor(None, clean, job, self._settings, stop)
        try:
            result = await asyncio.shield(worker)
        except asyncio.CancelledError:
            stop.set()
            await asyncio.gather(worker, return_exceptions=True)
            discard_cleaned(job.directory)
            raise
        except (CorruptRecordError, OSError, ValueError) as error:
            discard_cleaned(job.directory)
            if not partition_log.holds_sealed(job.segments):
                # A follower's truncation cut a segment the worker was reading: not damage.
                log.info("%s changed while it was being cleaned: %s", partition_log, error)
                return None
            self._uncleanable.add(partition_log.directory)
            log.error("%s cannot be cleaned, leaving it alone: %s", partition_log, error)
            return None
        finally:
            job.close()
        try:
            commit(partition_log, job, result)
        except KafkaError as error:  # the log was closed or deleted meanwhile
            log.info("%s: cleaning abandoned: %s", partition_log, error)
            return None
        event(
            log,
            logging.INFO,
            "log.compacted",
            **partition_log.event_fields(),
            bytes_read=result.bytes_read,
            bytes_written=result.bytes_written,
            records_read=result.records_read,
            records_kept=result.records_kept,
            keys=result.map_keys,
            seconds=round(time.monotonic() - started, 3),
        )
        return result
