"""Arrow rows (arrow_schema.SCHEMA) -> the Kafka record batches they were made of.

Every header field comes back from the `batch_*` columns and every record from its row, with
its own timestamp delta (`record_timestamp_delta`) and offset delta (`offset -
batch_base_offset`), so an uncompressed batch is rebuilt byte for byte and a compressed one
differs only in the compressor's output (the records section is compressed again with the
batch's codec). The CRC is computed over the rebuilt bytes.

Records are written by the compiled riverbed.tiering.records_columns straight from the Arrow
columns' buffers, each with its own offset delta (`offset - batch_base_offset`), so batches
that compaction thinned out keep their gaps.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import struct
from collections.abc import Sequence

import crc32c
import pyarrow as pa
import pyarrow.compute as pc
from riverbed.protocol.compression import CompressionType, compress
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
from riverbed.tiering.records_columns import (
    BinaryColumn,
    Int32Column,
    Int64Column,
    RowGroupColumns,
)

_CRC = struct.Struct(">I")


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


# _batches_of fills a _Batch's fields from the batch columns by position.
_FIELD_COLUMNS = [f"batch_{field.name}" for field in dataclasses.fields(_Batch)]
if _FIELD_COLUMNS[: len(BATCH_COLUMNS)] != list(BATCH_COLUMNS):
    raise ImportError("_Batch's fields no longer follow arrow_schema.BATCH_COLUMNS")


class RowGroupBatches:
    """The rows of whole batches (one row group, sorted by offset), to rebuild from any offset:
    a sequential reader rebuilds one row group over several fetches."""

    def __init__(self, rows: pa.Table) -> None:
        rows = rows.combine_chunks()
        self._batches = _batches_of(rows)
        self._last_record_offsets = [batch.last_record_offset for batch in self._batches]
        self._columns = _columns(rows) if rows.num_rows else None

    def append_to(self, out: bytearray, start_offset: int, max_bytes: int) -> bool:
        """Append to `out` the rebuilt batches holding records at or above `start_offset`,
        while `out` stays within `max_bytes`; the first batch put into an empty `out` goes in
        whatever its size (KIP-74), as on a hot read. Returns True when a batch was left out
        for lack of room: the read is complete.

        A batch whose records compaction removed from `start_offset` on is left out although
        its last offset reaches it: a consumer would skip it anyway."""
        first = bisect.bisect_left(self._last_record_offsets, start_offset)
        chosen = _within(self._batches[first:], max_bytes - len(out), at_least_one=not out)
        if not chosen or self._columns is None:
            return first < len(self._batches)
        for batch in chosen:
            rebuilt = _encode(batch, self._columns)
            # A recompressed batch may come out a few bytes larger than it was in the log.
            if out and len(out) + len(rebuilt) > max_bytes:
                return True
            out += rebuilt
        return first + len(chosen) < len(self._batches)


def rebuilt_sizes(rows: pa.Table) -> dict[int, int]:
    """base offset -> size in bytes of each batch of `rows` (whole batches, sorted by offset)
    as a cold read rebuilds it: what a thinned batch's `batch_size_bytes` becomes."""
    rows = rows.combine_chunks()
    if rows.num_rows == 0:
        return {}
    columns = _columns(rows)
    return {batch.base_offset: len(_encode(batch, columns)) for batch in _batches_of(rows)}


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


def _columns(rows: pa.Table) -> RowGroupColumns:
    """The rebuild's columns of `rows` (one chunk each), for the compiled encoder to read in
    place."""
    headers = rows.column("headers").chunk(0)
    pairs = headers.values
    return RowGroupColumns(
        _int64(rows.column("offset").chunk(0)),
        _int64(rows.column("record_timestamp_delta").chunk(0)),
        _binary(rows.column("key").chunk(0)),
        _binary(rows.column("value").chunk(0)),
        _int32(headers.offsets),
        _binary(pairs.field("key")),
        _binary(pairs.field("value")),
    )


def _int64(array: pa.Array) -> Int64Column:
    return Int64Column(array.buffers()[1], array.offset, len(array))


def _int32(array: pa.Array) -> Int32Column:
    return Int32Column(array.buffers()[1], array.offset, len(array))


def _binary(array: pa.Array) -> BinaryColumn:
    validity, offsets, data = array.buffers()
    return BinaryColumn(validity if array.null_count else None, offsets, data, array.offset)


def _encode(batch: _Batch, columns: RowGroupColumns) -> bytearray:
    """The batch, rebuilt from its rows."""
    records = batch.end_row - batch.first_row
    body = bytearray(RECORD_BATCH_OVERHEAD)
    columns.append_records(body, batch.base_offset, batch.first_row, records)
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
        records,
    )
    _CRC.pack_into(out, CRC_POSITION, crc32c.crc32c(memoryview(out)[ATTRIBUTES_POSITION:]))
    return out
