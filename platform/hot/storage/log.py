"""The local log of one partition: an ordered list of segments in one directory.

Vocabulary (used with exactly these meanings everywhere in riverbed.hot):
- log_start_offset: the first offset a consumer may read here: the first segment's base offset,
  or the offset DeleteRecords moved the start to (`truncated_before`, persisted) if higher;
- log_end_offset (LEO): the offset the next appended record gets, one past the last record;
- high_watermark (HW): set by the broker once offsets are replicated; offsets below it are
  committed, and consumer reads never return a batch reaching it. log_start_offset <= HW <= LEO;
- last stable offset (LSO): the HW, or the first offset of a transaction still open or whose
  marker is not yet below the HW if lower (Kafka's firstUnstableOffset, which the partition's
  producer state keeps in `first_unstable_offset`); read_committed consumers read up to it;
- recovery point: every offset below it is on disk (fsynced, indexes included). After an unclean
  shutdown only the segments from the one holding the recovery point onward are re-scanned.

Durability of sealed segments: a roll hands the sealed segment's fsync to `flush_executor`
(LogManager passes a one-thread pool so appends never wait on a 1 GiB fsync); the recovery
point moves to the new segment's base offset once that fsync is done. Without an executor the
fsync runs inline during the roll.

Deleting segments below a new log start (retention, tiering, DeleteRecords) renames their files
to `*.deleted` on the owner thread and unlinks them on `flush_executor` (Kafka's asynchronous
delete): unlinking a big file and syncing the directory took the owner thread, the event loop,
for milliseconds. A crash in between may leave `*.deleted` files, which opening the log
removes, or undo the renames, which brings back segments below the log start: whatever deleted
them deletes them again (DeleteRecords' start is persisted apart, so nothing below it is served).

Going offline: a failed fsync (here or in the background), a failed append that could not be
undone, or a failed swap of cleaned segments leaves files that no longer match the log's state
(after a failed fsync Linux may have dropped the dirty pages). EIO from writing the leader epoch
checkpoint leaves them consistent, but says the same: the disk failed. The log then refuses
every call with KAFKA_STORAGE_ERROR and tells `on_offline` once, from whichever thread saw the
failure: a data directory holding such a log has failed (Kafka's LogDirFailureChannel), and its
owner decides what the broker does. A write refused before anything changed (ENOSPC from a full
disk, rolled back cleanly) leaves the log usable and is not reported.

Leader epochs: `leader_epochs` records where each leader epoch's batches start (see
leader_epoch.py). A new epoch is recorded in memory before the batches it describes, and its
checkpoint file written durably before the recovery point passes them (`flush`, and a roll,
before the sealed segment's background fsync). After a crash the file may therefore run ahead
of the log, which opening the log cuts back to the LEO, or lack the epochs of batches above the
recovery point, which recovery re-scans and assigns again.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from riverbed.common.fileio import fsync_dir, write_atomically
from riverbed.common.log_events import event
from riverbed.hot.storage.checkpoint import CheckpointError
from riverbed.hot.storage.cleaner_swap import (
    cap_first_dirty_offset,
    finish_interrupted_swap,
    swap_in,
)
from riverbed.hot.storage.leader_epoch import LeaderEpochCache, leader_epoch_checkpoint_path
from riverbed.hot.storage.segment import (
    DELETED_SUFFIX,
    LOG_SUFFIX,
    NO_TIMESTAMP,
    SEGMENT_SUFFIXES,
    LogSegment,
    RollbackFailedError,
    TornSegmentError,
)
from riverbed.hot.storage.transactions import AbortedTxn
from riverbed.protocol.control_records import ControlType, read_marker
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import Record, TopicPartition
from riverbed.protocol.records import (
    BatchHeader,
    CorruptRecordError,
    assign_offsets,
    decode_batch,
)
from riverbed.protocol.regions import FileRegion

log = logging.getLogger(__name__)

# Kafka encodes "no limit" for flush.messages / flush.ms as Long.MAX_VALUE.
KAFKA_LONG_MAX = 2**63 - 1
DELETED_DIR_SUFFIX = "-delete"
# After the disk refused a write (ENOSPC, rolled back cleanly), leader appends are refused for
# this long before anything else is checked (`check_writable`). A producer's next requests,
# already in flight, would otherwise fail their sequence check (OUT_OF_ORDER_SEQUENCE_NUMBER:
# the refused batch left a gap), which librdkafka answers by bumping its producer epoch and
# renumbering every un-acknowledged record of every partition, including records that may
# already be in a log: duplicates (librdkafka issue #4953). Kafka's log is offline after such a
# failure, so its appends fail with KAFKA_STORAGE_ERROR before any sequence check too.
WRITE_REFUSED_BACKOFF_MS = 1_000
# The offset DeleteRecords moved the log start to, one integer, in the partition's directory.
LOG_START_FILE = "log-start-offset-checkpoint"

# A transaction marker read back from the log: (type, coordinator epoch).
Marker = tuple[ControlType, int]


@dataclass(frozen=True)
class LogConfig:
    """Per-topic storage settings (Kafka topic config names in `from_topic_config`).

    Values are parsed here, validated by riverbed.configs. flush_messages / flush_ms None means
    the page cache decides when data reaches the disk (Kafka's default).
    """

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 60 * 60 * 1000
    index_interval_bytes: int = 4096
    flush_messages: int | None = None
    flush_ms: int | None = None
    max_message_bytes: int = 1048588

    @classmethod
    def from_topic_config(cls, config: Mapping[str, str]) -> LogConfig:
        default = cls()
        return cls(
            segment_bytes=int(config.get("segment.bytes", default.segment_bytes)),
            segment_ms=int(config.get("segment.ms", default.segment_ms)),
            index_interval_bytes=int(
                config.get("index.interval.bytes", default.index_interval_bytes)
            ),
            flush_messages=_optional_limit(config.get("flush.messages")),
            flush_ms=_optional_limit(config.get("flush.ms")),
            max_message_bytes=int(config.get("max.message.bytes", default.max_message_bytes)),
        )


def _optional_limit(value: str | None) -> int | None:
    if value is None or int(value) >= KAFKA_LONG_MAX:
        return None
    return int(value)


@dataclass(frozen=True, slots=True)
class AppendResult:
    first_offset: int
    last_offset: int
    # The broker's clock when the batches were written (Kafka's LogAppendTime).
    append_time_ms: int
    segment_base_offset: int
    position: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    # Whole batches; the caller owns (and closes) region.fd.
    region: FileRegion
    # The base offset of the first batch in the region (<= the fetch offset).
    first_batch_offset: int
    # The offset after the region's last batch: where the reader goes on.
    next_offset: int


@dataclass(frozen=True, slots=True)
class SealedBatches:
    """Whole batches of one sealed segment, for tiering: offsets [base_offset, last_offset]
    (`last_offset` is one below the next segment's base, so consecutive uploads leave no gap) at
    bytes [position, position + size_bytes) of `fd`, a duplicate the caller closes. Sealed
    segments are never written again, so a worker thread may read them while the log goes on."""

    base_offset: int
    last_offset: int
    fd: int
    position: int
    size_bytes: int
    # The segment's aborted-transaction index entries: what a read_committed reader of these
    # batches needs besides them (the tier keeps them with the batches).
    aborted_txns: tuple[AbortedTxn, ...] = ()


@dataclass(frozen=True, slots=True)
class SegmentStats:
    """What local retention looks at: one segment's offsets, size and newest timestamp."""

    base_offset: int
    next_offset: int  # the next segment's base offset (the LEO for the active one)
    size_bytes: int
    max_timestamp_ms: int
    sealed: bool


class OffsetOutOfOrderError(ValueError):
    """A follower's batches do not continue the log: offsets below the log end offset, or not
    strictly increasing. Nothing was written."""


class TimestampAndOffset(NamedTuple):
    offset: int
    timestamp_ms: int


class PartitionLog:
    """Append, read, recover and truncate one partition's segments.

    Invariants: segments are sorted by base offset and their offset ranges do not overlap; only
    the last (active) segment is appended to; log_start_offset <= high_watermark <=
    log_end_offset; the recovery point never exceeds log_end_offset. Not thread-safe: one owner
    thread calls it, except that a background fsync may advance the recovery point.
    """

    def __init__(
        self,
        directory: Path,
        tp: TopicPartition,
        config: LogConfig,
        segments: list[LogSegment],
        now_ms: Callable[[], int],
        flush_executor: Executor | None,
        on_offline: Callable[[str], None] | None,
    ) -> None:
        self._directory = directory
        self.tp = tp  # the partition whose log this is: it names the records read back
        self.config = config
        self._segments = segments
        self._now_ms = now_ms
        self._flush_executor = flush_executor
        # Background file work (sealed segments' fsyncs, deletions) not yet waited for.
        self._pending_jobs: list[Future[None]] = []
        self._recovery_point = 0
        self._recovery_point_lock = threading.Lock()
        self._high_watermark = segments[0].base_offset
        # (HW, segment, position of the first batch reaching the HW in it): see _end_position.
        self._hw_position: tuple[int, LogSegment, int] | None = None
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()
        self._closed = False
        # Why the log went offline (see the module docstring), and whom to tell, once: the lock
        # keeps it once when the owner and a background fsync fail together.
        self._offline_reason: str | None = None
        # Until when leader appends are refused after a write the disk refused (see
        # WRITE_REFUSED_BACKOFF_MS); 0: none refused lately.
        self._writes_refused_until_ms = 0
        self._on_offline = on_offline
        self._offline_lock = threading.Lock()
        # How many segments the last open re-scanned (0 after a clean shutdown).
        self.recovered_segments = 0
        # The base offset recovery re-scanned from at open (None: nothing re-scanned).
        self._recovered_from: int | None = None
        # Replaced by the persisted cache when `open` loads it.
        self.leader_epochs = LeaderEpochCache(directory)
        # Kept by the partition's producer state (see the module docstring); None: no
        # transaction is open or unreplicated.
        self.first_unstable_offset: int | None = None
        # An upper bound of the marker offsets in the txn indexes (-1: no abort in this log):
        # a read_committed fetch from above it looks at no index at all.
        self._aborted_last_offset_max = -1
        self._truncated_before = _load_truncated_before(directory)
        self._high_watermark = max(self._high_watermark, self.log_start_offset)

    # -- opening and recovery ------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        tp: TopicPartition,
        config: LogConfig,
        *,
        recovery_point: int | None,
        now_ms: Callable[[], int],
        flush_executor: Executor | None = None,
        on_offline: Callable[[str], None] | None = None,
    ) -> PartitionLog:
        """Open (or create) the log of partition `tp` in `directory`.

        Startup cost does not grow with the log: files are listed, and only the active segment's
        index tail is read to find the LEO. If `recovery_point` is None (unknown) or data exists
        above it, the segments from the one holding it onward are re-scanned (`_recover`).
        `on_offline(reason)` is called once if the log goes offline (None: nobody is told).
        """
        directory.mkdir(parents=True, exist_ok=True)
        finish_interrupted_swap(directory)
        segments = _open_segments(directory, config)
        if not segments:
            segments = [LogSegment.create(directory, 0, config.index_interval_bytes)]
            fsync_dir(directory)
        for segment in segments[:-1]:
            segment.sealed = True
        partition_log = cls(directory, tp, config, segments, now_ms, flush_executor, on_offline)
        partition_log._load(recovery_point)
        partition_log._load_leader_epochs()
        partition_log._load_txn_indexes()
        return partition_log

    def _load(self, recovery_point: int | None) -> None:
        active = self._active
        if recovery_point is None:
            self._recover(0)
        else:
            try:
                active.load_tail()
                needs_recovery = self.log_end_offset > recovery_point
            except TornSegmentError as error:
                log.warning("%s: %s", self, error)
                needs_recovery = True
            if needs_recovery:
                self._recover(self._segment_slot(recovery_point))
            else:
                self._recovery_point = min(recovery_point, self.log_end_offset)
        first_timestamp = self._active.first_batch_timestamp()
        if first_timestamp is not None:
            # segment.ms counts from the first batch, as in Kafka; a timestamp from the future
            # or none at all counts from now.
            now = self._now_ms()
            self._active.roll_base_ms = now if first_timestamp < 0 else min(first_timestamp, now)

    def _load_leader_epochs(self) -> None:
        """Load the leader epoch cache; rebuild it from the batch headers if its checkpoint is
        unreadable, or missing while the log holds data. Entries from the LEO on are dropped: their
        batches were never written, or recovery cut them (the file is rewritten only after a
        recovery; see `drop_from_end`)."""
        path = leader_epoch_checkpoint_path(self._directory)
        try:
            if self.size_bytes and not path.exists():
                raise FileNotFoundError(f"{path} is missing")
            cache = LeaderEpochCache.load(self._directory)
        except (CheckpointError, OSError) as error:
            log.warning("%s: rebuilding the leader epoch cache from the log: %s", self, error)
            cache = LeaderEpochCache.rebuild(
                self._directory, self.batch_headers(self.log_start_offset)
            )
        if self._recovered_from is None:
            cache.drop_from_end(self.log_end_offset)  # nothing re-scanned: in memory only
        else:
            # The checkpoint is durable only up to the recovery point, and may run ahead of the
            # log (entries of leaderships that wrote nothing, which opening does not rewrite):
            # the epochs of the re-scanned batches are taken from their headers instead.
            cache.truncate_from_end(self._recovered_from)
            for header in self.batch_headers(max(self._recovered_from, self.log_start_offset)):
                if header.partition_leader_epoch > cache.latest_epoch:
                    cache.assign(header.partition_leader_epoch, header.base_offset)
            cache.persist()
        self.leader_epochs = cache

    def _load_txn_indexes(self) -> None:
        """Drop txn index entries of markers recovery cut (only the active segment can hold
        any: the segments after it are gone with their files), and find the highest marker
        offset indexed. Reads at most the index files of the last segments with one."""
        self._active.txn_index.truncate_to(self.log_end_offset)
        self._refresh_aborted_last_offset_max()

    def _refresh_aborted_last_offset_max(self) -> None:
        self._aborted_last_offset_max = -1
        for segment in reversed(self._segments):
            last_offset = segment.txn_index.last_offset
            if last_offset >= 0:
                self._aborted_last_offset_max = last_offset
                return

    @property
    def recovered_from(self) -> int | None:
        """The base offset the last open re-scanned from (None: a clean open)."""
        return self._recovered_from

    def _recover(self, first_slot: int) -> None:
        """Re-scan segments from `first_slot` on; cut at the first invalid batch and delete
        every segment after it. Recovered segments are fsynced: the recovery point is the LEO."""
        self._recovered_from = self._segments[first_slot].base_offset
        cut_bytes = 0
        slot = first_slot
        for slot in range(first_slot, len(self._segments)):
            segment = self._segments[slot]
            cut_bytes = segment.recover()
            self.recovered_segments += 1
            if cut_bytes:
                break
        dropped = self._segments[slot + 1 :]
        del self._segments[slot + 1 :]
        for segment in dropped:
            cut_bytes += segment.size
            segment.delete()
        if cut_bytes:
            log.warning(
                "%s: cut %d bytes of torn or corrupt data after offset %d (%d segments dropped)",
                self,
                cut_bytes,
                self.log_end_offset,
                len(dropped),
            )
        self._active.sealed = False
        for segment in self._segments[first_slot:]:
            segment.flush()
        fsync_dir(self._directory)
        self._recovery_point = self.log_end_offset

    # -- offsets -------------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def log_start_offset(self) -> int:
        return max(self._segments[0].base_offset, self._truncated_before)

    @property
    def truncated_before(self) -> int:
        """The offset DeleteRecords moved the partition's log start to (0 if it never did): no
        record below it is served again from either tier. On a tiered topic it may lie below
        the first local segment, which the local log start also follows."""
        return self._truncated_before

    def advance_log_start_offset(self, offset: int) -> bool:
        """Move `truncated_before` up to `offset` (DeleteRecords on the leader, or a follower
        following its leader's log start), durably before it counts. Segments wholly below are
        not deleted here: the caller does that once nothing needs them (on a tiered leader,
        after the remote tier has moved its own start). Returns whether it moved."""
        self._check_usable()
        if offset <= self._truncated_before:
            return False
        if offset > self.log_end_offset:
            raise ValueError(f"{self}: log start {offset} past the log end {self.log_end_offset}")
        write_atomically(self._directory / LOG_START_FILE, f"{offset}\n".encode())
        self._truncated_before = offset
        self._high_watermark = max(self._high_watermark, self.log_start_offset)
        self._hw_position = None
        return True

    def _cap_truncated_before(self, end_offset: int) -> None:
        """After a cut to `end_offset` below the log start (an unclean election): the log
        starts again there."""
        if self._truncated_before > end_offset:
            write_atomically(self._directory / LOG_START_FILE, f"{end_offset}\n".encode())
            self._truncated_before = end_offset

    @property
    def log_end_offset(self) -> int:
        next_offset = self._active.next_offset
        if next_offset is None:
            raise RuntimeError(f"{self}: the active segment's next offset is unknown")
        return next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def last_stable_offset(self) -> int:
        unstable = self.first_unstable_offset
        high_watermark = self._high_watermark
        return high_watermark if unstable is None or unstable > high_watermark else unstable

    @property
    def recovery_point(self) -> int:
        with self._recovery_point_lock:
            return self._recovery_point

    @property
    def size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    def update_high_watermark(self, offset: int) -> None:
        if not self._high_watermark <= offset <= self.log_end_offset:
            raise ValueError(
                f"{self}: high watermark {offset} must lie in "
                f"[{self._high_watermark} (current), {self.log_end_offset} (log end)]"
            )
        self._high_watermark = offset

    def update_config(self, config: LogConfig) -> None:
        """Apply changed topic configs; they take effect from the next append or roll."""
        self.config = config
        for segment in self._segments:
            segment.index_interval_bytes = config.index_interval_bytes

    @property
    def _active(self) -> LogSegment:
        return self._segments[-1]

    def _segment_slot(self, offset: int) -> int:
        """The slot of the segment that holds `offset` (the first one for offsets below it)."""
        slot = bisect.bisect_right(self._segments, offset, key=lambda s: s.base_offset) - 1
        return max(slot, 0)

    # -- appending -----------------------------------------------------------------------------

    def append(
        self, records: memoryview, headers: list[BatchHeader], leader_epoch: int
    ) -> AppendResult:
        """The leader's append: assign offsets from the LEO and `leader_epoch` to
        already-validated batches (in place) and write them.

        Raises KafkaError(KAFKA_STORAGE_ERROR) if the disk refuses the write; the log is then
        exactly as before and stays usable, unless undoing the write failed too (it goes
        offline; see the module docstring).
        """
        self._check_usable()
        if not headers:
            raise ValueError(f"{self}: nothing to append")
        first_offset = self.log_end_offset
        headers = assign_offsets(records, headers, first_offset, leader_epoch)
        problem = _offset_order_problem(headers, first_offset, gaps_allowed=False)
        if problem is not None:
            raise KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR, f"{self}: {problem}")
        return self._write(records, headers)

    def check_writable(self) -> None:
        """Raise KAFKA_STORAGE_ERROR while a write the disk refused is recent: called before a
        leader append's producer sequences are checked (see WRITE_REFUSED_BACKOFF_MS)."""
        self._check_usable()
        if self._writes_refused_until_ms and self._now_ms() < self._writes_refused_until_ms:
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"{self}: the disk refused a write less than {WRITE_REFUSED_BACKOFF_MS} ms ago",
            )

    def append_as_follower(self, records: memoryview, headers: list[BatchHeader]) -> AppendResult:
        """A follower's append: write batches fetched from the leader (CRC-checked by the caller
        with `validate_records`) byte for byte, with the leader's offsets and epochs.

        Offset gaps are legal (a compacted leader has them); the first base offset must be >= the
        LEO and offsets must strictly increase, else OffsetOutOfOrderError and nothing is
        written. Disk errors as in `append`.
        """
        self._check_usable()
        if not headers:
            raise ValueError(f"{self}: nothing to append")
        covered_bytes = sum(header.size_bytes for header in headers)
        if covered_bytes != len(records):
            raise ValueError(f"{self}: headers cover {covered_bytes} of {len(records)} bytes")
        problem = _offset_order_problem(headers, self.log_end_offset, gaps_allowed=True)
        if problem is not None:
            raise OffsetOutOfOrderError(f"{self}: {problem}")
        return self._write(records, headers)

    def _write(self, records: memoryview, headers: list[BatchHeader]) -> AppendResult:
        """Write batches whose offsets and epochs are final: roll if due, record new leader
        epochs (before the batches, see the module docstring), write, flush if due."""
        first_offset = headers[0].base_offset
        last_offset = headers[-1].last_offset
        now = self._now_ms()
        segment = self._active
        if self._should_roll(segment, len(records), last_offset, now):
            segment = self._roll(first_offset)
        for header in headers:  # in memory only (see the module docstring)
            if header.partition_leader_epoch > self.leader_epochs.latest_epoch:
                self.leader_epochs.assign(header.partition_leader_epoch, header.base_offset)
        try:
            position = segment.append(records, headers)
        except RollbackFailedError as error:
            self._go_offline(str(error))
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"{self}: {error}") from error
        except OSError as failure:
            self._writes_refused_until_ms = now + WRITE_REFUSED_BACKOFF_MS
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"{self}: append failed: {failure}"
            ) from failure
        if segment.roll_base_ms is None:
            segment.roll_base_ms = now
        self._unflushed_messages += sum(header.records_count for header in headers)
        flush_messages = self.config.flush_messages
        if flush_messages is not None and self._unflushed_messages >= flush_messages:
            self.flush()
        else:
            self.flush_if_due()
        return AppendResult(first_offset, last_offset, now, segment.base_offset, position)

    def _should_roll(self, segment: LogSegment, size: int, last_offset: int, now: int) -> bool:
        # Checked even for an empty segment: a follower's offsets can jump beyond its reach.
        if not segment.fits(last_offset, size):
            return True
        if segment.size == 0:
            return False
        config = self.config
        return (
            segment.size + size > config.segment_bytes
            or (segment.roll_base_ms is not None and now - segment.roll_base_ms > config.segment_ms)
            or segment.offset_index.is_full
            or segment.time_index.is_full
        )

    def _roll(self, base_offset: int) -> LogSegment:
        """Start a new active segment at `base_offset`: the LEO, or above it when a follower's
        batches skip offsets. The sealed one is made durable in the background (see the module
        docstring)."""
        sealed = self._active
        try:
            new = LogSegment.create(self._directory, base_offset, self.config.index_interval_bytes)
        except OSError as error:
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"{self}: roll failed: {error}"
            ) from error
        try:
            sealed.seal()
            # The recovery point will pass the sealed segment's batches: their epochs first.
            self.leader_epochs.persist()
        except OSError as error:
            new.delete()
            raise self._sync_error("roll failed", error) from error
        self._segments.append(new)
        self._make_durable(sealed, base_offset)
        log.debug("%s: rolled to a new segment at offset %d", self, base_offset)
        return new

    def _make_durable(self, sealed: LogSegment, next_base_offset: int) -> None:
        fds = sealed.dup_fds()
        directory = self._directory

        def fsync_sealed() -> None:
            try:
                for fd in fds:
                    os.fsync(fd)
                fsync_dir(directory)  # the new segment's files must survive a crash too
            except OSError as error:
                # As in `flush`: what did not reach the disk may be gone from the page cache.
                self._go_offline(f"fsync of the segment at {sealed.base_offset} failed: {error}")
                return
            finally:
                for fd in fds:
                    os.close(fd)
            self._advance_recovery_point(sealed.base_offset, next_base_offset)

        self._in_background(fsync_sealed)

    def _in_background(self, job: Callable[[], None]) -> None:
        """Run `job` on the flush executor, after the jobs handed to it before (inline without
        one); the log waits for it before truncating or closing."""
        if self._flush_executor is None:
            job()
            return
        self._pending_jobs = [pending for pending in self._pending_jobs if not pending.done()]
        self._pending_jobs.append(self._flush_executor.submit(job))

    def _advance_recovery_point(self, durable_from: int, durable_to: int) -> None:
        """Offsets [durable_from, durable_to) are on disk: move the recovery point if that
        range joins it (a sync finishing out of order must not skip an unsynced segment)."""
        with self._recovery_point_lock:
            if self._recovery_point >= durable_from:
                self._recovery_point = max(self._recovery_point, durable_to)

    def _wait_for_background(self) -> None:
        pending, self._pending_jobs = self._pending_jobs, []
        for job in pending:
            error = job.exception()
            if error is not None:
                log.error("%s: background fsync of a sealed segment failed: %s", self, error)

    # -- flushing ------------------------------------------------------------------------------

    def flush(self) -> None:
        """fsync every segment holding offsets above the recovery point (data, then indexes);
        the recovery point becomes the LEO."""
        self._check_usable()
        end_offset = self.log_end_offset
        try:
            self.leader_epochs.persist()
        except OSError as error:
            # The recovery point must not pass batches whose epochs are not on disk.
            raise self._sync_error("leader epoch checkpoint", error) from error
        try:
            for segment in self._segments[self._segment_slot(self.recovery_point) :]:
                segment.flush()
            fsync_dir(self._directory)
        except OSError as error:
            # After a failed fsync the page cache may have dropped the dirty data (Linux): the
            # files cannot be trusted any more.
            self._go_offline(f"fsync failed: {error}")
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"{self}: {error}") from error
        self._advance_recovery_point(self.recovery_point, end_offset)
        self._unflushed_messages = 0
        self._last_flush_ms = self._now_ms()

    def _sync_error(self, what: str, error: OSError) -> KafkaError:
        """The KAFKA_STORAGE_ERROR for a failed write of the leader epoch checkpoint (on its
        own, or with a sealed segment's index tails). The file is replaced atomically, so the
        log's files stay consistent: a full disk (the usual cause) leaves the log usable, the
        entries written by a later flush or roll. EIO means the disk failed, and the log goes
        offline: otherwise every later flush and roll would fail the same way while the broker
        kept its leaderships."""
        if error.errno == errno.EIO:
            self._go_offline(f"{what}: {error}")
        return KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"{self}: {what}: {error}")

    def flush_if_due(self) -> bool:
        """Flush if flush.ms has passed since the last flush and there is unflushed data."""
        flush_ms = self.config.flush_ms
        if (
            flush_ms is None
            or self._unflushed_messages == 0
            or self._now_ms() - self._last_flush_ms < flush_ms
        ):
            return False
        self.flush()
        return True

    # -- reading -------------------------------------------------------------------------------

    def replica_start_offset(self) -> int:
        """Where a replica copying this log from scratch starts: the base offset of the batch
        holding the log start, below it when DeleteRecords cut into a batch (a follower's log
        holds whole batches, as Kafka's does after its UnexpectedAppendOffset restart)."""
        start = self.log_start_offset
        if start == self._segments[0].base_offset:
            return start  # a segment starts with a batch: no lookup on every follower fetch
        found = self._segments[self._segment_slot(start)].find_batch(start)
        return start if found is None else min(found.base_offset, start)

    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        max_offset: int,
        *,
        min_one_batch: bool = True,
        from_replica: bool = False,
    ) -> ReadResult | None:
        """Whole batches from one segment, starting with the batch holding `fetch_offset`.

        At most `max_bytes`, except that one whole batch is returned even if larger when
        `min_one_batch` (KIP-74); never a batch whose last offset is >= `max_offset` (the HW
        for consumers). None when there is nothing to return. Raises
        KafkaError(OFFSET_OUT_OF_RANGE) outside [log_start_offset, log_end_offset] (from the
        `replica_start_offset` for a follower).
        """
        self._check_usable()
        start = self.replica_start_offset() if from_replica else self.log_start_offset
        if not start <= fetch_offset <= self.log_end_offset:
            raise KafkaError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"{self}: offset {fetch_offset} is outside [{start}, {self.log_end_offset}]",
            )
        if fetch_offset >= max_offset:
            return None
        # Offsets can be missing from a segment's end (a cut after corruption): move on.
        for slot in range(self._segment_slot(fetch_offset), len(self._segments)):
            segment = self._segments[slot]
            found = segment.find_batch(fetch_offset)
            if found is None:
                continue
            start = found.position
            if found.last_offset >= max_offset:
                return None
            limit = self._end_position(slot, max_offset)
            end = limit
            if limit - start > max_bytes:
                end = segment.boundary_at_or_before(start, start + max_bytes)
            if end == start:
                if not min_one_batch:
                    return None
                end = start + found.size_bytes
            region = FileRegion(os.dup(segment.fd), start, end - start)
            return ReadResult(region, found.base_offset, self._offset_at(slot, end))
        return None

    def batch_headers(self, start_offset: int) -> Iterator[BatchHeader]:
        """Headers of the batches holding offsets >= `start_offset`, oldest first: one pread of a
        header per batch, records never read (producer state rebuilds from these)."""
        self._check_usable()
        for slot in range(self._segment_slot(start_offset), len(self._segments)):
            found = self._segments[slot].find_batch(start_offset)
            if found is not None:
                for _, header in self._segments[slot].scan(found.position):
                    yield header

    def batches_with_markers(
        self, start_offset: int
    ) -> Iterator[tuple[BatchHeader, Marker | None]]:
        """`batch_headers`, each with its transaction marker if it is a control batch (one small
        record read per marker; None for data batches and for control batches that are not
        well-formed markers, which the producer state skips as Kafka skips empty ones)."""
        self._check_usable()
        for slot in range(self._segment_slot(start_offset), len(self._segments)):
            segment = self._segments[slot]
            found = segment.find_batch(start_offset)
            if found is None:
                continue
            for position, header in segment.scan(found.position):
                marker: Marker | None = None
                if header.is_control:
                    try:
                        marker = read_marker(segment.read_batch(position, header), 0, header)
                    except CorruptRecordError as error:
                        log.warning("%s: %s", self, error)
                yield header, marker

    def record_aborted_txn(self, txn: AbortedTxn) -> None:
        """Index an aborted transaction in the segment holding its marker (skipped if that
        index has it already: a replay after a restart)."""
        self._check_usable()
        self._segments[self._segment_slot(txn.last_offset)].add_aborted_txn(txn)
        self._aborted_last_offset_max = max(self._aborted_last_offset_max, txn.last_offset)

    def aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """Every aborted transaction with data in [start_offset, upper_bound_offset): its
        marker at or after `start_offset`, its first offset below the bound (Kafka's
        collectAbortedTransactions). No index is read when no marker lies at or above
        `start_offset`, the common case of a read_committed consumer at the tail."""
        if self._aborted_last_offset_max < start_offset or start_offset >= upper_bound_offset:
            return []
        self._check_usable()
        found: list[AbortedTxn] = []
        for slot in range(self._segment_slot(start_offset), len(self._segments)):
            txns, complete = self._segments[slot].txn_index.collect(
                start_offset, upper_bound_offset
            )
            found += txns
            if complete:
                break
        return found

    def _offset_at(self, slot: int, position: int) -> int:
        """The first offset of the batch at `position` of segment `slot` (a batch boundary), or
        where the next segment starts if it is the end: one header read at most."""
        segment = self._segments[slot]
        if position < segment.size:
            return segment.read_header(position).base_offset
        if slot + 1 < len(self._segments):
            return self._segments[slot + 1].base_offset
        return self.log_end_offset

    def _end_position(self, slot: int, max_offset: int) -> int:
        """The position in segment `slot` where batches reaching `max_offset` begin.

        O(1) for the common bounds (the LEO, a later segment); the HW's position is computed
        once per HW and cached, since every consumer fetch is bounded by it.
        """
        segment = self._segments[slot]
        is_last = slot + 1 == len(self._segments)
        if max_offset >= self.log_end_offset or (
            not is_last and self._segments[slot + 1].base_offset <= max_offset
        ):
            return segment.size
        cached = self._hw_position
        if cached is not None and cached[0] == max_offset and cached[1] is segment:
            return cached[2]
        found = segment.find_batch(max_offset)
        position = segment.size if found is None else found.position
        if max_offset == self._high_watermark:
            self._hw_position = (max_offset, segment, position)
        return position

    # -- timestamps ----------------------------------------------------------------------------

    def offset_for_timestamp(self, target_ms: int) -> TimestampAndOffset | None:
        """The earliest record at or after the log start whose timestamp is >= `target_ms`
        (ListOffsets by time)."""
        self._check_usable()
        log_start = self.log_start_offset
        for segment in self._segments:
            if segment.max_timestamp[0] < target_ms:
                continue
            start_offset = max(segment.time_index_lookup(target_ms), log_start)
            found = segment.find_batch(start_offset)
            if found is None:
                continue
            for position, header in segment.scan(found.position):
                if header.max_timestamp >= target_ms:
                    record = _first_record(
                        self.tp,
                        segment.read_batch(position, header),
                        header,
                        lambda r: r.timestamp_ms >= target_ms and r.offset >= log_start,
                    )
                    if record is not None:
                        return TimestampAndOffset(record.offset, record.timestamp_ms)
        return None

    def max_timestamp_offset(self) -> TimestampAndOffset | None:
        """The record with the largest timestamp (the earliest such), for ListOffsets -3."""
        self._check_usable()
        best: tuple[int, int, LogSegment] | None = None
        for segment in self._segments:
            timestamp_ms, offset = segment.max_timestamp
            if timestamp_ms != NO_TIMESTAMP and (best is None or timestamp_ms > best[0]):
                best = (timestamp_ms, offset, segment)
        if best is None:
            return None
        timestamp_ms, offset, segment = best
        found = segment.find_batch(offset)
        if found is None:
            return None
        position = found.position
        header = segment.read_header(position)
        record = _first_record(
            self.tp,
            segment.read_batch(position, header),
            header,
            lambda r: r.timestamp_ms == timestamp_ms,
        )
        return None if record is None else TimestampAndOffset(record.offset, timestamp_ms)

    # -- tiering -------------------------------------------------------------------------------

    def sealed_batches_from(self, offset: int, below_offset: int) -> SealedBatches | None:
        """The batches at `offset` and after of the first sealed segment holding any, provided
        every offset of that segment lies below `below_offset` (the high watermark: only
        committed data is tiered). None when there is no such segment yet."""
        self._check_usable()
        for slot in range(self._segment_slot(offset), len(self._segments) - 1):
            segment = self._segments[slot]
            next_base = self._segments[slot + 1].base_offset
            if next_base <= offset:
                continue
            if next_base > below_offset:
                return None
            found = segment.find_batch(offset)
            if found is None:
                continue  # nothing at or after `offset` in this segment (a cut tail)
            position = found.position
            return SealedBatches(
                found.base_offset,
                next_base - 1,
                os.dup(segment.fd),
                position,
                segment.size - position,
                tuple(segment.aborted_txns),
            )
        return None

    def segment_stats(self) -> list[SegmentStats]:
        stats = []
        for slot, segment in enumerate(self._segments):
            sealed = slot + 1 < len(self._segments)
            stats.append(
                SegmentStats(
                    segment.base_offset,
                    self._segments[slot + 1].base_offset if sealed else self.log_end_offset,
                    segment.size,
                    segment.max_timestamp[0],
                    sealed,
                )
            )
        return stats

    def delete_segments_below(self, offset: int, *, reason: str = "tiered") -> int:
        """Delete the sealed segments all of whose offsets are below `offset` (uploaded to the
        remote tier, or past retention: `reason` says which, in the log line); the local log
        start moves to the first segment kept. The active segment is never deleted. Returns the
        bytes freed. Leader epochs are kept: they still describe the remote part of the log,
        and OffsetForLeaderEpoch answers for epochs below the log start as Kafka does."""
        self._check_usable()
        doomed = []
        while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
            doomed.append(self._segments.pop(0))
        if not doomed:
            return 0
        freed = sum(segment.size for segment in doomed)
        renamed = [path for segment in doomed for path in segment.mark_deleted()]
        self._in_background(lambda: _unlink_deleted(self._directory, renamed))
        event(
            log,
            logging.INFO,
            "log.segments_deleted",
            **self.event_fields(),
            reason=reason,
            segments=len(doomed),
            bytes=freed,
            log_start_offset=self.log_start_offset,
        )
        return freed

    # -- compaction ----------------------------------------------------------------------------

    def cleanable_segments(self, below_offset: int) -> list[LogSegment]:
        """The sealed segments from the log start on all of whose offsets are below
        `below_offset`, oldest first: what the cleaner may rewrite (never the active one)."""
        self._check_usable()
        segments = []
        for slot in range(len(self._segments) - 1):
            if self._segments[slot + 1].base_offset > below_offset:
                break
            segments.append(self._segments[slot])
        return segments

    def replace_segments(self, groups: Sequence[Sequence[LogSegment]]) -> bool:
        """Swap in the cleaned segments the cleaner wrote for `groups`, each a run of
        consecutive sealed segments, all at once (cleaner_swap.py). False, and nothing
        changed, if they no longer are runs of sealed segments of this log (retention,
        truncation or tiering removed or replaced some while the cleaner worked)."""
        self._check_usable()
        spans = self._sealed_runs(groups)
        if spans is None:
            return False
        ranges = [(self._segments[a].base_offset, self._segments[b].base_offset) for a, b in spans]
        try:
            swap_in(self._directory, ranges)
            cleaned = [
                LogSegment(self._directory, base_offset, self.config.index_interval_bytes)
                for base_offset, _ in ranges
            ]
        except OSError as error:
            # The marker may be written: only reopening the log can finish (or undo) the swap.
            self._go_offline(f"swapping in cleaned segments failed: {error}")
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"{self}: {error}") from error
        # From the last group back, so that the slots of the groups before stay right.
        swaps = sorted(zip(spans, cleaned, strict=True), key=lambda swap: swap[0], reverse=True)
        for (slot, end_slot), segment in swaps:
            for old in self._segments[slot:end_slot]:
                old.close()  # their files are gone or replaced: close, never delete
            segment.sealed = True
            self._segments[slot:end_slot] = [segment]
        self._hw_position = None
        return True

    def holds_sealed(self, segments: Sequence[LogSegment]) -> bool:
        """Whether `segments` are still a run of sealed segments of this log, untouched."""
        return self._sealed_runs([segments]) is not None

    def _sealed_runs(self, groups: Sequence[Sequence[LogSegment]]) -> list[tuple[int, int]] | None:
        """The (first, end) slots of each group, None unless every group is a run of sealed
        segments of this log (the very objects: a truncated or replaced one does not count)."""
        slots = {id(segment): slot for slot, segment in enumerate(self._segments)}
        spans = []
        for group in groups:
            slot = slots.get(id(group[0]))
            if slot is None:
                return None
            end_slot = slot + len(group)
            if end_slot >= len(self._segments) or any(
                a is not b for a, b in zip(self._segments[slot:end_slot], group, strict=True)
            ):
                return None
            spans.append((slot, end_slot))
        return spans

    # -- truncation and lifecycle --------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every batch with offsets >= `offset` (a batch straddling it goes whole, so the
        LEO may end below `offset`). Below log_start_offset the log restarts empty at `offset`.
        """
        self._check_usable()
        if offset >= self.log_end_offset:
            return
        self._wait_for_background()
        if offset < self.log_start_offset:
            self._replace_with_empty_segment(offset)
            self._cap_truncated_before(offset)
        else:
            while self._active.base_offset > offset:
                self._segments.pop().delete()
            self._active.truncate_to(offset)
            self._active.flush()
        fsync_dir(self._directory)
        end_offset = self.log_end_offset
        cap_first_dirty_offset(self._directory, end_offset)
        self.leader_epochs.truncate_from_end(end_offset)
        self._high_watermark = min(self._high_watermark, end_offset)
        self._hw_position = None
        self._refresh_aborted_last_offset_max()
        with self._recovery_point_lock:
            self._recovery_point = min(self._recovery_point, end_offset)
        if self._active.size == 0:
            self._active.roll_base_ms = None
        event(log, logging.INFO, "log.truncated", **self.event_fields(), log_end_offset=end_offset)

    def restart_at(self, offset: int) -> None:
        """Drop every segment and start empty at `offset`, even above the log end: a follower
        whose log ends below the leader's local log start (the rest is in the remote tier)
        continues from there. Leader epochs are dropped with the data they described."""
        self._check_usable()
        self._wait_for_background()
        self._replace_with_empty_segment(offset)
        self._cap_truncated_before(offset)
        fsync_dir(self._directory)
        cap_first_dirty_offset(self._directory, offset)
        self.leader_epochs.truncate_from_end(0)
        self._high_watermark = offset
        self._hw_position = None
        self._aborted_last_offset_max = -1
        with self._recovery_point_lock:
            self._recovery_point = offset
        log.info("%s: restarted empty at offset %d", self, offset)

    def _replace_with_empty_segment(self, offset: int) -> None:
        for segment in self._segments:
            segment.delete()
        self._segments = [
            LogSegment.create(self._directory, offset, self.config.index_interval_bytes)
        ]

    def close(self, *, sync: bool = True) -> None:
        """Flush and close; the recovery point is then the LEO, for the owner to checkpoint.

        `sync=False` writes what is buffered (index tails) and closes without fsyncing: the
        owner syncs the whole file system once for every log it closes (LogManager.close),
        then calls `synced_after_close`, which moves the recovery point."""
        if self._closed:
            return
        try:
            if self._offline_reason is None:
                if sync:
                    self.flush()
                else:
                    self.leader_epochs.persist(durable=False)
        finally:
            self._close_files()

    def synced_after_close(self) -> None:
        """The owner made everything this log wrote durable after `close(sync=False)`."""
        if self._offline_reason is None:
            self._advance_recovery_point(self.recovery_point, self.log_end_offset)

    def delete(self) -> None:
        """Close without flushing and remove the directory (renamed first, so a crash midway
        leaves a `-delete` directory the LogManager finishes removing, never half a log)."""
        self._close_files()
        doomed = self._directory.with_name(
            f"{self._directory.name}.{uuid.uuid4().hex}{DELETED_DIR_SUFFIX}"
        )
        os.rename(self._directory, doomed)
        fsync_dir(self._directory.parent)
        shutil.rmtree(doomed)

    def _close_files(self) -> None:
        self._closed = True
        self._wait_for_background()
        for segment in self._segments:
            segment.close()

    def _go_offline(self, reason: str) -> None:
        """Refuse every later call and tell `on_offline`, once (any thread may call this)."""
        with self._offline_lock:
            if self._offline_reason is not None:
                return
            self._offline_reason = reason
        log.error("%s is offline: %s", self, reason)
        if self._on_offline is not None:
            self._on_offline(reason)

    def _check_usable(self) -> None:
        if self._closed:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"{self} is closed")
        if self._offline_reason is not None:
            raise KafkaError(
                ErrorCode.KAFKA_STORAGE_ERROR, f"{self} is offline: {self._offline_reason}"
            )

    def __str__(self) -> str:
        return f"log {self._directory.name}"

    def event_fields(self) -> dict[str, str | int]:
        """Log event fields naming the partition."""
        return {"topic": self.tp.topic, "partition": self.tp.partition}


def _load_truncated_before(directory: Path) -> int:
    """The persisted DeleteRecords log start; 0 without one. An unreadable file is reported
    and read as 0: records DeleteRecords removed could be served again, which is less harm
    than refusing to open the log."""
    path = directory / LOG_START_FILE
    try:
        return int(path.read_text())
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as error:
        log.error("%s: unreadable, the log starts at its first segment: %s", path, error)
        return 0


def _unlink_deleted(directory: Path, paths: list[Path]) -> None:
    """Remove the files of deleted segments (renamed by `LogSegment.mark_deleted`)."""
    try:
        for path in paths:
            path.unlink(missing_ok=True)
        fsync_dir(directory)
    except OSError as error:
        # Nothing is lost: the files are out of the log, and opening it removes them.
        log.warning("%s: removing the files of deleted segments failed: %s", directory, error)


def _open_segments(directory: Path, config: LogConfig) -> list[LogSegment]:
    """Open every segment in `directory`, sorted; index files without a .log are removed, and
    so are the files of deleted segments a crash left (`*.deleted`)."""
    base_offsets = set()
    orphans = []
    for path in directory.iterdir():
        if path.suffix == DELETED_SUFFIX:
            log.info("removing %s: its segment was deleted before a restart", path)
            path.unlink()
            continue
        stem, suffix = path.stem, path.suffix
        if suffix not in SEGMENT_SUFFIXES or not stem.isdigit():
            continue
        if suffix == LOG_SUFFIX:
            base_offsets.add(int(stem))
        elif not path.with_suffix(LOG_SUFFIX).exists():
            orphans.append(path)
    for path in orphans:
        log.warning("removing %s: its segment's .log file is gone", path)
        path.unlink()
    return [
        LogSegment(directory, base_offset, config.index_interval_bytes)
        for base_offset in sorted(base_offsets)
    ]


def _offset_order_problem(
    headers: list[BatchHeader], log_end_offset: int, *, gaps_allowed: bool
) -> str | None:
    """Why `headers` cannot follow `log_end_offset`, if they cannot: offsets must strictly
    increase from it, without gaps unless `gaps_allowed`. Checked before any byte is written."""
    expected = log_end_offset
    for header in headers:
        base_offset = header.base_offset
        if (
            base_offset < expected
            or (base_offset != expected and not gaps_allowed)
            or header.last_offset_delta < 0
        ):
            return (
                f"batch offsets {base_offset}..{header.last_offset} are out of order: "
                f"expected offsets from {expected} on"
            )
        expected = header.last_offset + 1
    return None


def _first_record(
    tp: TopicPartition, batch: bytes, header: BatchHeader, wanted: Callable[[Record], bool]
) -> Record | None:
    """The first record of `batch` (one whole batch, `header` its header) that is `wanted`.
    Raises CorruptRecordError if the batch cannot be decoded."""
    records = decode_batch(tp, batch, 0, header)
    return next((record for record in records if wanted(record)), None)
