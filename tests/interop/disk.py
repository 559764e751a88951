"""Read a partition's segment files the way an outside tool would.

Batches are parsed with kafka-python's record reader rather than Riverbed's own, so a test of what
the broker wrote does not depend on the code that wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kafka.record import MemoryRecords

LOG_OVERHEAD = 12  # baseOffset int64 + batchLength int32, before every batch on disk


@dataclass(frozen=True)
class StoredBatch:
    segment: Path
    position: int  # byte position of the batch in its segment file
    size_bytes: int  # LOG_OVERHEAD + batchLength
    base_offset: int
    last_offset: int
    compression: int  # attributes & 0x7: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd
    crc_ok: bool
    values: tuple[bytes | None, ...]


def read_batches(segment: Path) -> tuple[list[StoredBatch], int]:
    """Every whole batch in the file and the number of bytes after the last whole one."""
    data = segment.read_bytes()
    records = MemoryRecords(data)
    batches = []
    position = 0
    while (batch := records.next_batch()) is not None:
        size_bytes = LOG_OVERHEAD + int.from_bytes(data[position + 8 : position + 12], "big")
        batches.append(
            StoredBatch(
                segment=segment,
                position=position,
                size_bytes=size_bytes,
                base_offset=batch.base_offset,
                last_offset=batch.last_offset,
                compression=batch.compression_type,
                crc_ok=batch.validate_crc(),
                values=tuple(record.value for record in batch),
            )
        )
        position += size_bytes
    return batches, len(data) - position


def read_partition(segments: list[Path]) -> list[StoredBatch]:
    """All whole batches of a partition, oldest first; a torn tail is ignored."""
    return [batch for segment in segments for batch in read_batches(segment)[0]]
