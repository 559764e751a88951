"""Which records compaction keeps, and batches rebuilt with only those: pure (bytes in, bytes
out), used by the log cleaner's worker thread (riverbed.hot.storage.cleaner).

Kafka's rules, with a tombstone's age taken from its own timestamp (Kafka < 3.1 used the
segment's time; KIP-534's delete horizon stamped into batch headers is not adopted, so the bytes
a consumer reads are never altered beyond dropping records):
- a keyed record stays while no later record of the partition has the same key (`OffsetMap`
  holds the latest offset of each key in the range it covered; a key it does not hold has no
  later record there);
- a tombstone (null value) that is the latest of its key stays until `delete_horizon_ms`;
- a record without a key is dropped (Kafka refuses them on compacted topics; they can only be
  left from before the topic's policy changed);
- control batches stay whole.

A thinned batch keeps its header's base offset, last offset delta, timestamps and producer
fields (so offsets and idempotent producers' sequence numbers keep meaning what they meant) and
its records keep their bytes: only the record count, the length, the compressed section and the
CRC change. A batch losing every record is dropped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
from riverbed.configs import MAP_ENTRY_OVERHEAD_BYTES
from riverbed.protocol.compression import CompressionType, compress, decompress
from riverbed.protocol.records_fast import record_keys
from riverbed.protocol.records_header import (
    ATTRIBUTES_POSITION,
    BATCH_LENGTH_POSITION,
    CRC_POSITION,
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    RECORDS_COUNT_POSITION,
    BatchHeader,
)

_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")


class OffsetMap:
    """key -> offset of its latest record, over a range of the log read oldest first; bounded
    by `capacity_bytes` (log.cleaner.dedupe.buffer.size): `add` refuses a new key once the map's
    estimated size would pass it."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        # Set by the builder once done: every record below it was offered to the map (or was
        # compacted in an earlier pass).
        self.end_offset = 0
        self._latest: dict[bytes, int] = {}

    def add(self, key: bytes, offset: int) -> bool:
        """Record `offset` as the latest of `key`; False (nothing recorded) if the map is full."""
        latest = self._latest
        if key not in latest:
            entry_bytes = len(key) + MAP_ENTRY_OVERHEAD_BYTES
            if self.size_bytes + entry_bytes > self.capacity_bytes:
                return False
            self.size_bytes += entry_bytes
        latest[key] = offset
        return True

    def latest(self, key: bytes) -> int:
        """The latest offset of `key`, -1 if the map never saw it."""
        return self._latest.get(key, -1)

    def __len__(self) -> int:
        return len(self._latest)


@dataclass(frozen=True, slots=True)
class Thinned:
    """What compaction made of one batch: `batch` is the original bytes object when every
    record stayed, a rebuilt batch when some did, None when none did."""

    batch: bytes | None
    records_in: int
    records_out: int


def batch_keys(batch: bytes, header: BatchHeader) -> list[tuple[int, int, bytes | None, bool, int]]:
    """(end position in the section, offset, key, is tombstone, create time) of each record."""
    return _record_keys(_section(batch, header), header)


def thin_batch(
    batch: bytes, header: BatchHeader, offsets: OffsetMap, delete_horizon_ms: int
) -> Thinned:
    """`batch` without the records compaction removes (module docstring). Tombstones stay if
    their timestamp is at or after `delete_horizon_ms`, and if `offsets` did not cover them
    (offset at or past `offsets.end_offset`): older records of their key may then still be
    there, and would come back."""
    if header.is_control:
        return Thinned(batch, header.records_count, header.records_count)
    section = _section(batch, header)
    spans = _record_keys(section, header)
    # LogAppendTime: every record's time is the batch's (the broker's clock at the append).
    append_time = header.max_timestamp if header.timestamp_type else None
    kept: list[tuple[int, int]] = []
    start = 0
    for end, offset, key, tombstone, create_time in spans:
        if (
            key is not None
            and offset >= offsets.latest(key)
            and not (
                tombstone
                and (append_time or create_time) < delete_horizon_ms
                and offset < offsets.end_offset
            )
        ):
            kept.append((start, end))
        start = end
    if len(kept) == len(spans):
        return Thinned(batch, len(spans), len(spans))
    if not kept:
        return Thinned(None, len(spans), 0)
    return Thinned(_rebuild(batch, header, section, kept), len(spans), len(kept))


def _record_keys(
    section: bytes, header: BatchHeader
) -> list[tuple[int, int, bytes | None, bool, int]]:
    return record_keys(
        section,
        header.base_offset,
        header.base_timestamp,
        header.records_count,
        header.last_offset_delta,
    )


def _section(batch: bytes, header: BatchHeader) -> bytes:
    return decompress(header.compression, memoryview(batch)[RECORD_BATCH_OVERHEAD:])


def _rebuild(
    batch: bytes, header: BatchHeader, section: bytes, kept: list[tuple[int, int]]
) -> bytes:
    records = b"".join(section[start:end] for start, end in kept)
    if header.compression != CompressionType.NONE:
        records = compress(header.compression, records)
    out = bytearray(batch[:RECORD_BATCH_OVERHEAD])
    out += records
    _INT32.pack_into(out, BATCH_LENGTH_POSITION, len(out) - LOG_OVERHEAD)
    _INT32.pack_into(out, RECORDS_COUNT_POSITION, len(kept))
    _UINT32.pack_into(out, CRC_POSITION, crc32c.crc32c(memoryview(out)[ATTRIBUTES_POSITION:]))
    return bytes(out)
