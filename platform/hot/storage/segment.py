"""One log segment: a `.log` file of whole v2 record batches plus its two sparse indexes and,
once a transaction aborts in it, its aborted-transaction index (txn_index.py).

Files are named by the segment's base offset padded to 20 digits (`00000000000000000000.log`,
`.index`, `.timeindex`, `.txnindex`) so that `ls` lists them in offset order.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from riverbed.common.fileio import pread_exact, write_all
from riverbed.hot.storage.index import (
    OFFSET_INDEX_SUFFIX,
    POSITION_MAX,
    RELATIVE_OFFSET_MAX,
    TIME_INDEX_SUFFIX,
    OffsetIndex,
    Row,
    TimeIndex,
)
from riverbed.hot.storage.transactions import AbortedTxn
from riverbed.hot.storage.txn_index import TXN_INDEX_SUFFIX, TransactionIndex
from riverbed.protocol.records import (
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    CorruptRecordError,
    batch_crc_ok,
    parse_batch_header,
)

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
SEGMENT_SUFFIXES = (LOG_SUFFIX, OFFSET_INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
# Added to the files of a segment that is gone from its log but not yet unlinked (Kafka's name).
DELETED_SUFFIX = ".deleted"
# Kafka's RecordBatch.NO_TIMESTAMP: the max timestamp of a segment without timestamps.
NO_TIMESTAMP = -1
# Recovery writes rebuilt index entries in chunks of this many batches (bounds its memory).
RECOVERY_CHUNK_BATCHES = 1024
# Batches whose spans an active segment remembers (see `find_batch`): a follower or a
# consumer at the tail asks for one of the last few; 8 spans are ~1.5 KiB per partition.
RECENT_BATCHES_MAX = 8


class BatchSpan(NamedTuple):
    """Where a batch lies in its segment and the offsets it holds: what a read needs to find
    it (its other header fields are one `read_header` away)."""

    position: int
    base_offset: int
    last_offset: int
    size_bytes: int


def segment_file(directory: Path, base_offset: int, suffix: str) -> Path:
    return directory / f"{base_offset:020d}{suffix}"


class TornSegmentError(Exception):
    """The segment's tail or indexes cannot be trusted: the segment must be recovered."""


class RollbackFailedError(Exception):
    """A failed append could not be undone: the files no longer match the segment's state."""


@dataclass(slots=True)
class _IndexPlan:
    """Index entries (and the state after them) for batches about to be written."""

    offset_entries: list[Row] = field(default_factory=list)
    time_entries: list[Row] = field(default_factory=list)
    bytes_since_index_entry: int = 0
    max_timestamp: Row = (NO_TIMESTAMP, 0)


class LogSegment:
    """A segment of a partition log.

    Invariants:
    - `base_offset` <= the base offset of the first batch; batch offsets strictly increase and
      every batch lies whole inside the file (recovery cuts a torn tail to make this true);
    - every offset in the segment is below the next segment's base offset, and its relative
      offset (offset - base_offset) fits a uint32, as does every file position;
    - index entries are only ever added after the batch bytes they point at are written, and
      indexes of a segment written after the last fsync are rebuilt, not trusted, after an
      unclean shutdown (`recover`); a sealed segment's last time index entry is its max
      timestamp (`seal`).
    `next_offset` is known for the active segment and recovered ones; it is None for sealed
    segments opened from disk, which are never appended to.
    """

    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int) -> None:
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.log_path = segment_file(directory, base_offset, LOG_SUFFIX)
        index_path = segment_file(directory, base_offset, OFFSET_INDEX_SUFFIX)
        time_index_path = segment_file(directory, base_offset, TIME_INDEX_SUFFIX)
        self._indexes_missing = self.log_path.exists() and not (
            index_path.exists() and time_index_path.exists()
        )
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self._fd).st_size
        self.offset_index = OffsetIndex(index_path, base_offset)
        self.time_index = TimeIndex(time_index_path, base_offset)
        self.txn_index = TransactionIndex(segment_file(directory, base_offset, TXN_INDEX_SUFFIX))
        self.sealed = False
        self.next_offset: int | None = None
        # The broker time the segment.ms clock of this segment started at (None while empty).
        self.roll_base_ms: int | None = None
        self._indexes_checked = self.size == 0 and not self._indexes_missing
        # The batches appended last, oldest first: fetches mostly ask for the tail, and finding
        # a batch there otherwise preads every header from the last index entry on (up to
        # index.interval.bytes of small batches). A span found here costs no read at all: at
        # 4,000 partitions the header pread of each follower fetch was ~7% of a leader's CPU.
        self._recent: deque[BatchSpan] = deque(maxlen=RECENT_BATCHES_MAX)
        self._bytes_since_index_entry = 0
        self._max_timestamp: Row | None = None

    @classmethod
    def create(cls, directory: Path, base_offset: int, index_interval_bytes: int) -> LogSegment:
        segment = cls(directory, base_offset, index_interval_bytes)
        if segment.size != 0:
            segment.close()
            raise FileExistsError(f"{segment.log_path} already holds data")
        # Index files left by an earlier segment at this offset describe other data.
        segment.offset_index.reset()
        segment.time_index.reset()
        segment.txn_index.reset()
        segment.next_offset = base_offset
        segment._max_timestamp = (NO_TIMESTAMP, base_offset)
        return segment

    @property
    def fd(self) -> int:
        return self._fd

    @property
    def max_timestamp(self) -> Row:
        """(largest batch max timestamp, base offset of the batch holding it) of this segment."""
        if self._max_timestamp is None:
            self.check_indexes()  # a damaged time index must not hide the segment's max
            if self._max_timestamp is None:
                self._max_timestamp = self.time_index.last_entry() or (
                    NO_TIMESTAMP,
                    self.base_offset,
                )
        return self._max_timestamp

    # -- reading -------------------------------------------------------------------------------

    def read_header(self, position: int) -> BatchHeader:
        return parse_batch_header(pread_exact(self._fd, RECORD_BATCH_OVERHEAD, position))

    def read_batch(self, position: int, header: BatchHeader) -> bytes:
        return pread_exact(self._fd, header.size_bytes, position)

    def scan(self, position: int) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch from `position` to the end of the segment."""
        while position < self.size:
            header = self.read_header(position)
            yield position, header
            position += header.size_bytes

    def find_batch(self, offset: int) -> BatchSpan | None:
        """The first batch whose last offset is >= `offset`: among the recent appends if it
        is one of them, else index lookup, then a short scan."""
        recent = self._recent
        # From the first recent batch's base offset on, the batch before it cannot qualify.
        if recent and offset >= recent[0].base_offset:
            slot = bisect.bisect_left(recent, offset, key=lambda span: span.last_offset)
            return None if slot == len(recent) else recent[slot]  # None: past the last batch
        self.check_indexes()
        _, indexed_position = self.offset_index.lookup(offset)
        for position, header in self.scan(indexed_position):
            if header.last_offset >= offset:
                return BatchSpan(
                    position, header.base_offset, header.last_offset, header.size_bytes
                )
        return None

    def time_index_lookup(self, timestamp_ms: int) -> int:
        """An offset at or before the earliest record with a timestamp >= `timestamp_ms`."""
        self.check_indexes()
        offset = self.time_index.lookup_before(timestamp_ms)
        return self.base_offset if offset is None else offset

    def boundary_at_or_before(self, start: int, limit: int) -> int:
        """The largest batch boundary in [start, limit], `start` being a batch boundary."""
        self.check_indexes()
        position = max(start, self.offset_index.lookup_position(limit))
        for batch_position, header in self.scan(position):
            if batch_position + header.size_bytes > limit:
                return batch_position
        return self.size

    def check_indexes(self) -> None:
        """Trust the index files only once they pass a sanity check; rebuild them otherwise."""
        if self._indexes_checked:
            return
        if (
            self._indexes_missing
            or not self.offset_index.is_sane(self.size)
            or not self.time_index.is_sane()
        ):
            log.warning("%s: indexes are missing or damaged, rebuilding them", self.log_path)
            self.recover()
        self._indexes_checked = True

    # -- writing -------------------------------------------------------------------------------

    def append(self, records: memoryview, headers: list[BatchHeader]) -> int:
        """Write whole batches (offsets already assigned) and index them; return their position.

        All or nothing: if any write fails the files are cut back to their previous sizes and
        the error is re-raised (an OSError from that cut-back means the segment is unusable).
        """
        if self.next_offset is None:
            raise RuntimeError(f"{self.log_path}: appending to a segment that is not active")
        position = self.size
        plan = self._plan_indexes(headers, position)
        offset_entries_before = self.offset_index.entries_count
        time_entries_before = self.time_index.entries_count
        try:
            write_all(self._fd, records)
            self.offset_index.append(plan.offset_entries)
            self.time_index.append(plan.time_entries)
        except BaseException:
            try:
                os.ftruncate(self._fd, position)
                self.offset_index.truncate_rows(offset_entries_before)
                self.time_index.truncate_rows(time_entries_before)
            except OSError as error:
                raise RollbackFailedError(
                    f"{self.log_path}: undoing a failed append: {error}"
                ) from error
            raise
        self.size = position + len(records)
        self._apply(plan, headers[-1].last_offset + 1)
        batch_position = position
        for header in headers:
            size_bytes = header.size_bytes
            self._recent.append(
                BatchSpan(batch_position, header.base_offset, header.last_offset, size_bytes)
            )
            batch_position += size_bytes
        return position

    def _plan_indexes(self, headers: list[BatchHeader], position: int) -> _IndexPlan:
        """Index entries for `headers` written at `position`, like Kafka: an offset entry once
        more than index.interval.bytes were written since the last one, and with it a time entry
        if the segment's max timestamp rose since the last time entry."""
        time_entry = self.time_index.last_entry()
        indexed_timestamp = NO_TIMESTAMP if time_entry is None else time_entry[0]
        plan = _IndexPlan(
            bytes_since_index_entry=self._bytes_since_index_entry, max_timestamp=self.max_timestamp
        )
        for header in headers:
            if header.max_timestamp > plan.max_timestamp[0]:
                plan.max_timestamp = (header.max_timestamp, header.base_offset)
            if plan.bytes_since_index_entry > self.index_interval_bytes:
                plan.offset_entries.append((header.base_offset, position))
                if plan.max_timestamp[0] > indexed_timestamp:
                    plan.time_entries.append(plan.max_timestamp)
                    indexed_timestamp = plan.max_timestamp[0]
                plan.bytes_since_index_entry = 0
            plan.bytes_since_index_entry += header.size_bytes
            position += header.size_bytes
        return plan

    def _apply(self, plan: _IndexPlan, next_offset: int) -> None:
        self.next_offset = next_offset
        self._bytes_since_index_entry = plan.bytes_since_index_entry
        self._max_timestamp = plan.max_timestamp

    def seal(self) -> None:
        """This segment takes no more appends: index its max timestamp for time lookups."""
        max_timestamp = self.max_timestamp
        last = self.time_index.last_entry()
        if max_timestamp[0] > (NO_TIMESTAMP if last is None else last[0]):
            self.time_index.append([max_timestamp])
        # Its rows are final: on file before the roll fsyncs the index files in the background.
        self.offset_index.write_unwritten()
        self.time_index.write_unwritten()
        self.sealed = True
        self._recent.clear()  # reads move on to the new active segment

    def add_aborted_txn(self, txn: AbortedTxn) -> bool:
        """Index a transaction whose abort marker this segment holds (skipped if indexed)."""
        return self.txn_index.append(txn)

    @property
    def aborted_txns(self) -> list[AbortedTxn]:
        """The aborted transactions whose markers this segment holds, by marker offset."""
        return self.txn_index.entries

    def fits(self, last_offset: int, size_bytes: int) -> bool:
        """Whether a relative offset and file position can still address such an append."""
        return (
            last_offset - self.base_offset <= RELATIVE_OFFSET_MAX
            and self.size + size_bytes <= POSITION_MAX
        )

    # -- recovery ------------------------------------------------------------------------------

    def load_tail(self) -> None:
        """Find the next offset and max timestamp of a trusted segment without a full scan:
        start at the last offset index entry and walk the batch headers to the end.

        Raises TornSegmentError if anything there is off (a torn index, an entry that does not
        point at its batch, a batch running past the end of the file).
        """
        if self._indexes_missing or self.offset_index.torn or self.time_index.torn:
            raise TornSegmentError(f"{self.log_path}: index files are missing or torn")
        entry = self.offset_index.last_entry()
        next_offset, position = entry if entry is not None else (self.base_offset, 0)
        max_timestamp = self.time_index.last_entry() or (NO_TIMESTAMP, self.base_offset)
        indexed_position = position
        if entry is not None and position >= self.size:
            raise TornSegmentError(f"{self.log_path}: index points past the end of the file")
        try:
            for batch_position, header in self.scan(position):
                if header.base_offset < next_offset or (
                    batch_position == indexed_position
                    and entry is not None
                    and header.base_offset != entry[0]
                ):
                    raise TornSegmentError(
                        f"{self.log_path}: offsets out of order at {batch_position}"
                    )
                if batch_position + header.size_bytes > self.size:
                    raise TornSegmentError(f"{self.log_path}: batch at {batch_position} is torn")
                if header.max_timestamp > max_timestamp[0]:
                    max_timestamp = (header.max_timestamp, header.base_offset)
                next_offset = header.last_offset + 1
        except CorruptRecordError as error:
            raise TornSegmentError(f"{self.log_path}: {error}") from error
        if entry is None and self.size == 0:
            next_offset = self.base_offset
        self.next_offset = next_offset
        self._max_timestamp = max_timestamp
        self._bytes_since_index_entry = self.size - indexed_position

    def recover(self) -> int:
        """Validate every batch (header, CRC, increasing offsets), rebuild both indexes from
        scratch, and cut the file after the last whole valid batch. Returns the bytes cut."""
        self.offset_index.reset()
        self.time_index.reset()
        self._indexes_missing = False
        self._bytes_since_index_entry = 0
        self._max_timestamp = (NO_TIMESTAMP, self.base_offset)
        self.next_offset = self.base_offset
        chunk_position = valid_end = 0
        chunk: list[BatchHeader] = []
        while True:
            header = self._valid_batch_at(valid_end, self.next_offset)
            if header is not None:
                chunk.append(header)
                valid_end += header.size_bytes
            if chunk and (header is None or len(chunk) == RECOVERY_CHUNK_BATCHES):
                plan = self._plan_indexes(chunk, chunk_position)
                self.offset_index.append(plan.offset_entries)
                self.time_index.append(plan.time_entries)
                self._apply(plan, chunk[-1].last_offset + 1)
                chunk_position, chunk = valid_end, []
            if header is None:
                break
        self._recent.clear()
        cut_bytes = self.size - valid_end
        if cut_bytes:
            os.ftruncate(self._fd, valid_end)
            self.size = valid_end
        if self.sealed:
            self.seal()
        self._indexes_checked = True
        return cut_bytes

    def _valid_batch_at(self, position: int, expected_offset: int) -> BatchHeader | None:
        """The batch at `position` if it is whole, starts at or after `expected_offset` and its
        CRC matches; None at the end of the file or at the first bad batch."""
        if position >= self.size:
            return None
        try:
            header = self.read_header(position)
        except CorruptRecordError:
            return None
        if (
            position + header.size_bytes > self.size
            or header.base_offset < expected_offset
            or header.last_offset_delta < 0
            or header.last_offset - self.base_offset > RELATIVE_OFFSET_MAX
        ):
            return None
        if not batch_crc_ok(self.read_batch(position, header), 0, header):
            return None
        return header

    def first_batch_timestamp(self) -> int | None:
        return self.read_header(0).max_timestamp if self.size else None

    # -- truncation and lifecycle --------------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove the batches whose last offset is >= `offset` (a batch straddling `offset`
        goes whole). Returns the bytes removed; the segment becomes appendable again."""
        found = self.find_batch(offset)
        removed_bytes = 0
        if found is not None:
            position = found.position
            self.offset_index.truncate_from(found.base_offset)
            self.time_index.truncate_from(found.base_offset)
            removed_bytes = self.size - position
            os.ftruncate(self._fd, position)
            self.size = position
            self._recent.clear()
        self.txn_index.truncate_to(offset)
        self.sealed = False
        self.load_tail()
        return removed_bytes

    def flush(self) -> None:
        """fsync data first, then indexes: an index entry must never outlive its batch."""
        os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def dup_fds(self) -> list[int]:
        """Descriptors a background thread may fsync and close without racing `close`."""
        fds = [os.dup(fd) for fd in (self._fd, self.offset_index.fd, self.time_index.fd)]
        txn_fd = self.txn_index.dup_fd()
        return fds if txn_fd is None else [*fds, txn_fd]

    def close(self) -> None:
        os.close(self._fd)
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()

    def delete(self) -> None:
        self.close()
        for path in self._paths():
            path.unlink(missing_ok=True)

    def mark_deleted(self) -> list[Path]:
        """Close the segment and rename its files to `<name>.deleted`, as Kafka does: the
        segment is out of the log at once, and unlinking the files (slow for a big one) can
        happen later, off the owner thread. Opening the log removes any left by a crash.
        Returns the renamed files."""
        self.close()
        renamed = []
        for path in self._paths():
            target = path.with_name(path.name + DELETED_SUFFIX)
            try:
                path.rename(target)
            except FileNotFoundError:
                continue  # as `delete`, a missing index is no error
            renamed.append(target)
        return renamed

    def _paths(self) -> tuple[Path, Path, Path, Path]:
        return (self.log_path, self.offset_index.path, self.time_index.path, self.txn_index.path)
