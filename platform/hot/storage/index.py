"""A segment's sparse indexes: offset -> file position (`.index`) and timestamp -> offset
(`.timeindex`).

Both are append-only files of fixed-size big-endian entries, offsets stored relative to the
segment's base offset (uint32). An index only narrows a search: readers always finish with a
short forward scan of batch headers, so a missing entry costs a longer scan, never a wrong
answer. Entries are loaded into memory (two compact arrays) on first lookup, not at startup, so
opening a log touches only the tail entry of each index.

New rows reach the file in groups of `INDEX_ROWS_UNWRITTEN_MAX`, and whenever the segment is
sealed, flushed or closed: two small writes on every append (one per index) were a measurable
part of the produce path, on the leader and on every follower. Memory always holds every row. A
crash loses at most that many rows from the file, which, as above, only makes the next tail scan
longer.

Invariants (checked by `is_sane` before an index file is trusted, rebuilt otherwise):
- offset index: relative offsets and positions strictly increase; every position is the start
  of a batch whose base offset is the entry's offset;
- time index: timestamps strictly increase (an entry is added only when a batch raises the
  segment's max timestamp), offsets never decrease; an entry (t, o) means every record before
  offset o's batch has a timestamp <= t and the batch at o holds a record with timestamp t.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import struct
from array import array
from pathlib import Path
from typing import ClassVar

from riverbed.common.fileio import pread_exact, write_all

log = logging.getLogger(__name__)

OFFSET_INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

# Relative offsets and file positions are uint32 on disk; a segment rolls before either overflows.
RELATIVE_OFFSET_MAX = 2**32 - 1
POSITION_MAX = 2**32 - 1
# Kafka's segment.index.bytes default: each index file stays under 10 MiB; the segment rolls
# when either index is full (an append may overshoot by its own few entries).
INDEX_BYTES_MAX = 10 * 1024 * 1024
# Rows an index holds in memory before writing them to its file (a 16 KiB batch gets a row).
INDEX_ROWS_UNWRITTEN_MAX = 64

Row = tuple[int, int]


class _IndexFile:
    """The shared mechanics of both indexes: a file of two-column rows, loaded lazily."""

    def __init__(self, path: Path, base_offset: int, row: struct.Struct, typecodes: str) -> None:
        self.path = path
        self.base_offset = base_offset
        self._row = row
        self._typecodes = typecodes
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(self._fd).st_size
        # A partial row can only come from a torn write: the file must be rebuilt.
        self.torn = size % row.size != 0
        self.entries_count = size // row.size
        # Rows appended but not yet written; the file holds the first `_written_count` rows.
        self._unwritten = bytearray()
        self._written_count = self.entries_count
        self._columns: tuple[array[int], array[int]] | None = None

    @property
    def is_full(self) -> bool:
        return (self.entries_count + 1) * self._row.size > INDEX_BYTES_MAX

    @property
    def fd(self) -> int:
        return self._fd

    def columns(self) -> tuple[array[int], array[int]]:
        if self._columns is None:
            first, second = array(self._typecodes[0]), array(self._typecodes[1])
            data = pread_exact(self._fd, self._written_count * self._row.size, 0)
            data = data[: len(data) - len(data) % self._row.size] + self._unwritten
            for a, b in self._row.iter_unpack(data):
                first.append(a)
                second.append(b)
            self._columns = (first, second)
        return self._columns

    def last_row(self) -> Row | None:
        if self.entries_count == 0:
            return None
        if self._columns is not None:
            return self._columns[0][-1], self._columns[1][-1]
        if self._unwritten:
            tail = len(self._unwritten) - self._row.size
            first, second = self._row.unpack_from(self._unwritten, tail)
            return first, second
        data = pread_exact(self._fd, self._row.size, (self.entries_count - 1) * self._row.size)
        if len(data) != self._row.size:
            return None
        first, second = self._row.unpack(data)
        return first, second

    def append_rows(self, rows: list[Row]) -> None:
        """Append `rows` to memory, and every `INDEX_ROWS_UNWRITTEN_MAX` rows to the file.

        On OSError the rows are not appended (the caller undoes its append) and the rows before
        them stay unwritten; the file is left as before.
        """
        if not rows:
            return
        pack = self._row.pack
        for a, b in rows:
            self._unwritten += pack(a, b)
        self.entries_count += len(rows)
        if self._columns is not None:
            for a, b in rows:
                self._columns[0].append(a)
                self._columns[1].append(b)
        if self.entries_count - self._written_count >= INDEX_ROWS_UNWRITTEN_MAX:
            try:
                self.write_unwritten()
            except OSError:
                self.truncate_rows(self.entries_count - len(rows))
                raise

    def write_unwritten(self) -> None:
        """Write the rows only memory holds; on OSError the file is left as before."""
        if not self._unwritten:
            return
        try:
            # A copy (a few hundred bytes): a view would pin the buffer while an error is alive.
            write_all(self._fd, bytes(self._unwritten))
        except OSError:
            os.ftruncate(self._fd, self._written_count * self._row.size)
            raise
        self._unwritten.clear()
        self._written_count = self.entries_count

    def truncate_rows(self, count: int) -> None:
        count = min(count, self.entries_count)
        if count >= self._written_count:
            del self._unwritten[(count - self._written_count) * self._row.size :]
        else:
            os.ftruncate(self._fd, count * self._row.size)
            self._unwritten.clear()
            self._written_count = count
        self.entries_count = count
        self.torn = False
        if self._columns is not None:
            del self._columns[0][count:]
            del self._columns[1][count:]

    def reset(self) -> None:
        os.ftruncate(self._fd, 0)
        self._unwritten.clear()
        self.entries_count = self._written_count = 0
        self.torn = False
        self._columns = (array(self._typecodes[0]), array(self._typecodes[1]))

    def flush(self) -> None:
        self.write_unwritten()
        os.fsync(self._fd)

    def close(self) -> None:
        try:
            self.write_unwritten()
        except OSError as error:
            # Nothing is lost: a shorter index only makes the next tail scan longer.
            unwritten_count = self.entries_count - self._written_count
            log.warning("%s: %d index rows not written: %s", self.path, unwritten_count, error)
        finally:
            os.close(self._fd)


def _strictly_increasing(values: array[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


class OffsetIndex(_IndexFile):
    """Rows (relative base offset of a batch uint32, file position of that batch uint32).

    Kafka indexes a batch's last offset; we index its base offset, so the batch header read at
    an entry's position can be checked against the entry.
    """

    ROW: ClassVar[struct.Struct] = struct.Struct(">II")

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset, self.ROW, "II")

    def lookup(self, offset: int) -> Row:
        """(offset, position) of the last entry at or below `offset`; (base offset, 0) if none."""
        relatives, positions = self.columns()
        slot = bisect.bisect_right(relatives, offset - self.base_offset) - 1
        if slot < 0:
            return self.base_offset, 0
        return self.base_offset + relatives[slot], positions[slot]

    def lookup_position(self, position: int) -> int:
        """The largest indexed batch position <= `position` (0, the first batch, if none)."""
        positions = self.columns()[1]
        slot = bisect.bisect_right(positions, position) - 1
        return positions[slot] if slot >= 0 else 0

    def last_entry(self) -> Row | None:
        """(offset, position) of the last entry, read from the file's tail if not loaded."""
        row = self.last_row()
        return None if row is None else (self.base_offset + row[0], row[1])

    def append(self, entries: list[Row]) -> None:
        """Append (offset, position) entries; the caller keeps them increasing."""
        rows = []
        for offset, position in entries:
            relative = offset - self.base_offset
            if not 0 <= relative <= RELATIVE_OFFSET_MAX or not 0 <= position <= POSITION_MAX:
                raise ValueError(f"{self.path}: entry ({offset}, {position}) does not fit")
            rows.append((relative, position))
        self.append_rows(rows)

    def truncate_from(self, offset: int) -> None:
        """Drop the entries for batches at or above `offset`."""
        relatives = self.columns()[0]
        self.truncate_rows(bisect.bisect_left(relatives, offset - self.base_offset))

    def is_sane(self, segment_size: int) -> bool:
        if self.torn:
            return False
        relatives, positions = self.columns()
        return (
            _strictly_increasing(relatives)
            and _strictly_increasing(positions)
            and (not positions or positions[-1] < segment_size)
        )


class TimeIndex(_IndexFile):
    """Rows (max timestamp so far int64, relative base offset of the batch holding it uint32)."""

    ROW: ClassVar[struct.Struct] = struct.Struct(">qI")

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset, self.ROW, "qI")

    def lookup_before(self, timestamp_ms: int) -> int | None:
        """The offset of the last entry with a timestamp below `timestamp_ms`, if any.

        Strictly below: every record before that entry's batch is then older than the target,
        so the earliest record at or after the target cannot be missed.
        """
        timestamps, relatives = self.columns()
        slot = bisect.bisect_left(timestamps, timestamp_ms) - 1
        return None if slot < 0 else self.base_offset + relatives[slot]

    def last_entry(self) -> Row | None:
        """(timestamp, offset) of the last entry: the segment's max timestamp once sealed."""
        row = self.last_row()
        return None if row is None else (row[0], self.base_offset + row[1])

    def append(self, entries: list[Row]) -> None:
        """Append (timestamp, offset) entries; the caller keeps timestamps increasing."""
        rows = []
        for timestamp_ms, offset in entries:
            relative = offset - self.base_offset
            if not 0 <= relative <= RELATIVE_OFFSET_MAX:
                raise ValueError(f"{self.path}: offset {offset} does not fit")
            rows.append((timestamp_ms, relative))
        self.append_rows(rows)

    def truncate_from(self, offset: int) -> None:
        """Drop the entries pointing at batches at or above `offset`."""
        relatives = self.columns()[1]
        self.truncate_rows(bisect.bisect_left(relatives, offset - self.base_offset))

    def is_sane(self) -> bool:
        if self.torn:
            return False
        timestamps, relatives = self.columns()
        return _strictly_increasing(timestamps) and all(
            a <= b for a, b in itertools.pairwise(relatives)
        )
