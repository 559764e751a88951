"""Arrow rows (arrow_schema.SCHEMA) -> the Kafka record batches they were made of.

Every header field comes back from the `batch_*` columns and every record from its row, with
its own timestamp delta (`record_timestamp_delta`) and offset delta (`offset -
batch_base_offset`), so an uncompressed batch is rebuilt byte for byte and a compressed one
differs only in the compressor's output (the records section is compressed again with the
batch's codec). The CRC is computed over the rebuilt bytes.

Records are written by the protocol's compiled encoder (records_fast.append_records), which
numbers offset deltas 0, 1, ...: that is every batch but those compaction thinned out, whose
records keep their original, gapped deltas and are written here, in Python (a path only
compacted topics take).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import struct
from collections.abc import Iterator, Sequence

import crc32c
import pyarrow as pa
import pyarrow.compute as pc
from riverbed.protocol.compression import CompressionType, compress
from riverbed.protocol.record_types import Headers
from riverbed.protocol.records_fast import append_records
from riverbed.protocol.records_header import (
    ATTRIBUTES_POSITION,
    COMPRESSION_CODEC_MASK,
    CRC_POSITION,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
)
from riverbed.tiering.arrow_schema import BATCH_COLUMNS

# key, value, headers, timestamp_ms: what append_records takes per record.
RecordRow = tuple[bytes | None, bytes | None, Headers, int]

_NO_HEADERS: Headers = ()
_CRC = struct.Struct(">I")
# A record's attributes byte: unused in v2, always written as 0.
_RECORD_ATTRIBUTES = b"\x00"


@dataclasses.dataclass(frozen=True, slots=True)
class _Batch:
    """One batch's header fields (the `batch_*` columns of its rows) and its rows' span."""

    base_offset: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    partition_leader_epoch: int
    attributes: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    size_bytes: int
    first_row: int
    end_row: int
    last_record_offset: int

    @property
    def gapped(self) -> bool:
        """Compaction removed some of its records. Otherwise its offsets are all there: they
        are strictly increasing within [base offset, last offset] (checked when tiered)."""
        return self.last_offset_delta != self.end_row - self.first_row - 1


# _batches_of fills a _Batch's fields from the batch columns by position.
_FIELD_COLUMNS = [f"batch_{field.name}" for field in dataclasses.fields(_Batch)]
if _FIELD_COLUMNS[: len(BATCH_COLUMNS)] != list(BATCH_COLUMNS):
    raise ImportError("_Batch's fields no longer follow arrow_schema.BATCH_COLUMNS")


class RowGroupBatches:
    """The rows of whole batches (one row group, sorted by offset), to rebuild from any offset:
    a sequential reader rebuilds one row group over several fetches."""

    def __init__(self, rows: pa.Table) -> None:
        self._rows = rows
        self._batches = _batches_of(rows)
        self._last_record_offsets = [batch.last_record_offset for batch in self._batches]

    def append_to(self, out: bytearray, start_offset: int, max_bytes: int) -> bool:
        """Append to `out` the rebuilt batches holding records at or above `start_offset`,
        while `out` stays within `max_bytes`; the first batch put into an empty `out` goes in
        whatever its size (KIP-74), as on a hot read. Returns True when a batch was left out
        for lack of room: the read is complete.

        A batch whose records compaction removed from `start_offset` on is left out although
        its last offset reaches it: a consumer would skip it anyway."""
        first = bisect.bisect_left(self._last_record_offsets, start_offset)
        chosen = _within(self._batches[first:], max_bytes - len(out), at_least_one=not out)
        if not chosen:
            return first < len(self._batches)
        window = self._rows.slice(chosen[0].first_row, chosen[-1].end_row - chosen[0].first_row)
        records = _records(window)
        offsets = window.column("offset").to_pylist() if any(b.gapped for b in chosen) else []
        shift = chosen[0].first_row
        for batch in chosen:
            span = slice(batch.first_row - shift, batch.end_row - shift)
            rebuilt = _encode(batch, records[span], offsets[span])
            # A recompressed batch may come out a few bytes larger than it was in the log.
            if out and len(out) + len(rebuilt) > max_bytes:
                return True
            out += rebuilt
        return first + len(chosen) < len(self._batches)


def _batches_of(rows: pa.Table) -> list[_Batch]:
    """The batches of `rows`: runs of rows with the same base offset (no two batches share
    one)."""
    if rows.num_rows == 0:
        return []
    runs = pc.run_end_encode(rows.column("batch_base_offset").combine_chunks())
    ends = runs.run_ends.to_pylist()
    starts = [0, *ends[:-1]]
    fields = [rows.column(name).take(pa.array(starts)).to_pylist() for name in BATCH_COLUMNS]
    last_record_offsets = rows.column("offset").take(pc.subtract(runs.run_ends, 1)).to_pylist()
    return [
        _Batch(*values) for values in zip(*fields, starts, ends, last_record_offsets, strict=True)
    ]


def _within(batches: Sequence[_Batch], room_bytes: int, *, at_least_one: bool) -> list[_Batch]:
    """The leading batches whose sizes in the log add up to at most `room_bytes`."""
    sizes = itertools.accumulate(batch.size_bytes for batch in batches)
    count = sum(1 for _ in itertools.takewhile(lambda total: total <= room_bytes, sizes))
    if count == 0 and at_least_one and batches:
        count = 1
    return list(batches[:count])


def _records(window: pa.Table) -> list[RecordRow]:
    """The rows of `window` as append_records takes them, with each record's own timestamp."""
    timestamps = pc.add(
        window.column("batch_base_timestamp"), window.column("record_timestamp_delta")
    )
    return list(
        zip(
            window.column("key").to_pylist(),
            window.column("value").to_pylist(),
            _headers(window.column("headers").combine_chunks()),
            timestamps.to_pylist(),
            strict=True,
        )
    )


def _headers(column: pa.ListArray) -> Iterator[Headers]:
    pairs = column.flatten()
    if len(pairs) == 0:  # the common case: no record has a header
        return itertools.repeat(_NO_HEADERS, len(column))
    keys = pairs.field("key").to_pylist()
    values = pairs.field("value").to_pylist()
    ends = list(itertools.accumulate(pc.list_value_length(column).to_pylist()))
    starts = [0, *ends[:-1]]
    return (
        tuple(zip(keys[start:end], values[start:end], strict=True)) if end > start else _NO_HEADERS
        for start, end in zip(starts, ends, strict=True)
    )


def _encode(batch: _Batch, records: list[RecordRow], offsets: list[int]) -> bytes:
    """The batch with these records; `offsets` (theirs) are only read if it is gapped."""
    body = bytearray(RECORD_BATCH_OVERHEAD)
    if batch.gapped:
        _append_gapped_records(body, records, batch, offsets)
    else:
        append_records(body, records, batch.base_timestamp)
    codec = CompressionType(batch.attributes & COMPRESSION_CODEC_MASK)
    if codec == CompressionType.NONE:
        out = body
    else:
        out = bytearray(RECORD_BATCH_OVERHEAD)
        out += compress(codec, memoryview(body)[RECORD_BATCH_OVERHEAD:])
    HEADER_STRUCT.pack_into(
        out,
        0,
        batch.base_offset,
        len(out) - LOG_OVERHEAD,
        batch.partition_leader_epoch,
        MAGIC_V2,
        0,  # crc: computed below over the final bytes
        batch.attributes,
        batch.last_offset_delta,
        batch.base_timestamp,
        batch.max_timestamp,
        batch.producer_id,
        batch.producer_epoch,
        batch.base_sequence,
        len(records),
    )
    _CRC.pack_into(out, CRC_POSITION, crc32c.crc32c(memoryview(out)[ATTRIBUTES_POSITION:]))
    return bytes(out)


def _append_gapped_records(
    body: bytearray, records: list[RecordRow], batch: _Batch, offsets: list[int]
) -> None:
    """The records section of a compacted batch: each record keeps its offset delta."""
    for (key, value, headers, timestamp_ms), offset in zip(records, offsets, strict=True):
        record = bytearray(_RECORD_ATTRIBUTES)
        _append_varint(record, timestamp_ms - batch.base_timestamp)
        _append_varint(record, offset - batch.base_offset)
        _append_field(record, key)
        _append_field(record, value)
        _append_varint(record, len(headers))
        for header_key, header_value in headers:
            _append_field(record, header_key.encode())
            _append_field(record, header_value)
        _append_varint(body, len(record))
        body += record


def _append_field(out: bytearray, data: bytes | None) -> None:
    """A length-prefixed field; length -1 for null."""
    if data is None:
        _append_varint(out, -1)
    else:
        _append_varint(out, len(data))
        out += data


def _append_varint(out: bytearray, value: int) -> None:
    """Kafka's zigzag varint (varlong for 64-bit fields): 7 bits a byte, low bits first."""
    unsigned = ((value << 1) ^ (value >> 63)) & 0xFFFF_FFFF_FFFF_FFFF
    while unsigned > 0x7F:
        out.append(unsigned & 0x7F | 0x80)
        unsigned >>= 7
    out.append(unsigned)
