"""The aborted-transaction index of one segment: `<base offset 20 digits>.txnindex`.

Kafka's TransactionIndex format, so the file means the same thing to anyone who knows Kafka:
fixed 34-byte entries, big-endian, each version int16 (0), producer id int64, first offset
int64, last offset int64 (the abort marker's offset), last stable offset int64. An entry lives
in the segment that holds its marker; entries are in increasing last-offset order.

The file is created on the first abort only (most segments never have one). Entries are kept in
memory once read, so a read_committed fetch looks them up without I/O; a segment holds the
aborts of its own offsets, so that is bounded by what the log retains.

Crash safety: entries are appended after their marker is written and fsynced with the segment
(`flush`). After an unclean shutdown the file may lack the last entries (the producer state's
replay of the log adds them again: `append` skips entries it already holds, so a replay from an
older snapshot does not duplicate any) or hold entries of markers recovery cut from the log
(`truncate_to` the log end drops them); a torn last entry is dropped when the file is read.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path
from typing import Final

from riverbed.common.fileio import write_all
from riverbed.hot.storage.transactions import AbortedTxn

log = logging.getLogger(__name__)

TXN_INDEX_SUFFIX: Final = ".txnindex"
TXN_INDEX_ENTRY_VERSION: Final = 0
_ENTRY: Final = struct.Struct(">hqqqq")
TXN_INDEX_ENTRY_BYTES: Final = _ENTRY.size  # 34


def encode_entry(txn: AbortedTxn) -> bytes:
    return _ENTRY.pack(
        TXN_INDEX_ENTRY_VERSION,
        txn.producer_id,
        txn.first_offset,
        txn.last_offset,
        txn.last_stable_offset,
    )


def decode_entries(data: bytes) -> list[AbortedTxn]:
    """The whole entries of `data` (a torn last one is left out). Raises ValueError for an
    entry of an unknown version."""
    entries = []
    for position in range(0, len(data) - TXN_INDEX_ENTRY_BYTES + 1, TXN_INDEX_ENTRY_BYTES):
        version, producer_id, first, last, lso = _ENTRY.unpack_from(data, position)
        if version != TXN_INDEX_ENTRY_VERSION:
            raise ValueError(f"transaction index entry of unknown version {version}")
        entries.append(AbortedTxn(producer_id, first, last, lso))
    return entries


class TransactionIndex:
    """The aborted transactions whose markers one segment holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: list[AbortedTxn] | None = None  # read on first use
        self._fd: int | None = None
        # Whether the file may exist: a stat at open, so segments without aborts cost nothing.
        self._exists = path.exists()
        if not self._exists:
            self._entries = []

    @property
    def entries(self) -> list[AbortedTxn]:
        if self._entries is None:
            self._entries = self._read()
        return self._entries

    @property
    def last_offset(self) -> int:
        """The last entry's marker offset (-1: no entry)."""
        entries = self.entries
        return entries[-1].last_offset if entries else -1

    def _read(self) -> list[AbortedTxn]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self._exists = False
            return []
        try:
            entries = decode_entries(data)
        except ValueError as error:
            # Rebuilt by nobody: the aborts it described are lost to read_committed readers, a
            # loss worth a loud line (Kafka fails the segment's sanity check the same way).
            log.error("%s: unreadable, ignored: %s", self.path, error)
            return []
        whole = len(entries) * TXN_INDEX_ENTRY_BYTES
        if whole != len(data):
            log.warning("%s: dropping a torn entry (%d bytes)", self.path, len(data) - whole)
            os.truncate(self.path, whole)
        return entries

    def append(self, txn: AbortedTxn) -> bool:
        """Add an entry unless the index holds it or a later one already (a replay of markers
        it has seen); True if written."""
        entries = self.entries
        if entries and txn.last_offset <= entries[-1].last_offset:
            return False
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._exists = True
        write_all(self._fd, encode_entry(txn))
        entries.append(txn)
        return True

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or after `offset` (log truncation)."""
        entries = self.entries
        kept = [txn for txn in entries if txn.last_offset < offset]
        if len(kept) == len(entries):
            return
        self._close_fd()
        os.truncate(self.path, len(kept) * TXN_INDEX_ENTRY_BYTES)
        self._entries = kept

    def collect(self, start_offset: int, upper_bound_offset: int) -> tuple[list[AbortedTxn], bool]:
        """The aborted transactions overlapping [start_offset, upper_bound_offset), and whether
        the search is complete (an entry ends at or after the bound: later segments hold only
        later transactions). Kafka's collectAbortedTxns."""
        found = []
        for txn in self.entries:
            if txn.last_offset >= start_offset and txn.first_offset < upper_bound_offset:
                found.append(txn)
            if txn.last_offset >= upper_bound_offset:
                return found, True
        return found, False

    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def dup_fd(self) -> int | None:
        return None if self._fd is None else os.dup(self._fd)

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._close_fd()

    def reset(self) -> None:
        """Empty (an earlier segment's file at this offset describes other data)."""
        self._close_fd()
        self.path.unlink(missing_ok=True)
        self._exists = False
        self._entries = []
