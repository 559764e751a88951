"""Kafka record batches -> Arrow rows (arrow_schema.SCHEMA), one row group's worth at a time.

Records are decoded by the compiled riverbed.tiering.records_columns straight into Arrow's
column buffers (no Python object per record, offsets checked there: inside their batch and
strictly increasing); the per-batch columns are expanded by run length in C and the derived
ones (`timestamp`, `timestampType`) computed with Arrow's kernels.
"""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from riverbed.protocol.compression import CompressionType, DecompressionError, decompress
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records_header import (
    RECORDS_POSITION,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    Bytes,
    CorruptRecordError,
)
from riverbed.tiering.arrow_schema import HEADER_TYPE, HEADERS_TYPE, SCHEMA, TIMESTAMP_TYPE
from riverbed.tiering.records_columns import RecordColumns


class RowGroupRows:
    """The rows of whole batches added one by one, turned into one Arrow table by `table()`."""

    def __init__(self, topic: str, partition: int, value_bytes_hint: int = 0) -> None:
        self._topic = topic
        self._partition = partition
        self._headers: list[BatchHeader] = []
        self._columns = RecordColumns(value_bytes_hint)
        self.section_bytes = 0  # uncompressed records sections added so far

    @property
    def rows(self) -> int:
        return self._columns.rows

    def add(self, buf: Bytes, position: int, header: BatchHeader) -> None:
        """Decode the batch at `position` (its CRC already checked) and keep its records.
        Raises CorruptRecordError if its records are malformed or not what the header says
        (then drop this RowGroupRows: it holds part of the batch)."""
        # Unsigned bytes, as the decoder takes them (a mapped segment's view is signed).
        view = memoryview(buf).cast("B")
        section: Bytes = view[position + RECORDS_POSITION : position + header.size_bytes]
        if header.compression != CompressionType.NONE:
            try:
                section = decompress(header.compression, section)
            except DecompressionError as error:
                raise CorruptRecordError(ErrorCode.CORRUPT_MESSAGE, str(error)) from error
        self._columns.add(
            section,
            header.base_offset,
            header.last_offset_delta,
            header.base_timestamp,
            header.records_count,
        )
        self._headers.append(header)
        self.section_bytes += len(section)

    def table(self) -> pa.Table:
        """The rows added so far, as SCHEMA (this RowGroupRows is then empty of records).
        Raises CorruptRecordError if a header key is not UTF-8."""
        rows = self._columns.rows
        decoded = self._columns.take()
        run_ends = pa.array(
            list(itertools.accumulate(h.records_count for h in self._headers)), pa.int32()
        )
        batch_columns = {
            name: _per_row(run_ends, name, values) for name, values in _batch_values(self._headers)
        }
        timestamp_deltas = _int64(rows, decoded["record_timestamp_delta"])
        own_timestamps = pc.add(batch_columns["batch_base_timestamp"], timestamp_deltas)
        timestamp_types = pc.shift_right(
            pc.bit_wise_and(batch_columns["batch_attributes"], TIMESTAMP_TYPE_MASK), 3
        ).cast(pa.int32())
        # What consumers see: a LogAppendTime batch's records all carry its max timestamp.
        timestamps = pc.if_else(
            pc.equal(timestamp_types, TIMESTAMP_TYPE_LOG_APPEND_TIME),
            batch_columns["batch_max_timestamp"],
            own_timestamps,
        )
        columns = {
            "key": _binary(pa.binary(), rows, decoded["key"]),
            "value": _binary(pa.binary(), rows, decoded["value"]),
            "topic": pa.repeat(self._topic, rows),
            "partition": pa.repeat(pa.scalar(self._partition, pa.int32()), rows),
            "offset": _int64(rows, decoded["offset"]),
            "timestamp": timestamps.cast(TIMESTAMP_TYPE),
            "timestampType": timestamp_types,
            "headers": _headers_column(rows, decoded),
            "record_timestamp_delta": timestamp_deltas,
            **batch_columns,
        }
        return pa.table(columns, schema=SCHEMA)


def _batch_values(headers: list[BatchHeader]) -> list[tuple[str, list[int]]]:
    return [
        ("batch_base_offset", [h.base_offset for h in headers]),
        ("batch_last_offset_delta", [h.last_offset_delta for h in headers]),
        ("batch_base_timestamp", [h.base_timestamp for h in headers]),
        ("batch_max_timestamp", [h.max_timestamp for h in headers]),
        ("batch_partition_leader_epoch", [h.partition_leader_epoch for h in headers]),
        ("batch_attributes", [h.attributes for h in headers]),
        ("batch_producer_id", [h.producer_id for h in headers]),
        ("batch_producer_epoch", [h.producer_epoch for h in headers]),
        ("batch_base_sequence", [h.base_sequence for h in headers]),
        ("batch_size_bytes", [h.size_bytes for h in headers]),
    ]


def _per_row(run_ends: pa.Array, name: str, values: list[int]) -> pa.Array:
    """One value per batch -> one per row of the batch (run-length expansion, in C)."""
    per_batch = pa.array(values, SCHEMA.field(name).type)
    return pc.run_end_decode(pa.RunEndEncodedArray.from_arrays(run_ends, per_batch))


def _int64(rows: int, data: bytearray) -> pa.Array:
    return pa.Array.from_buffers(pa.int64(), rows, [None, pa.py_buffer(data)])


def _binary(type_: pa.DataType, rows: int, parts: tuple[Any, ...]) -> pa.Array:
    """A binary or string array from RecordColumns' (validity, offsets, data, null count)."""
    validity, offsets, data, null_count = parts
    buffers = [None if validity is None else pa.py_buffer(validity)]
    buffers += [pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(type_, rows, buffers, null_count=null_count)


def _headers_column(rows: int, decoded: dict[str, Any]) -> pa.Array:
    header_count = len(decoded["header_key"][1]) // 4 - 1  # int32 offsets: one more than keys
    keys = _binary(pa.string(), header_count, decoded["header_key"])
    try:
        keys.validate(full=True)  # UTF-8, which Kafka requires of header keys
    except pa.ArrowInvalid as error:
        raise CorruptRecordError(
            ErrorCode.CORRUPT_MESSAGE, f"a record header key is not UTF-8 ({error})"
        ) from error
    pairs = pa.StructArray.from_arrays(
        [keys, _binary(pa.binary(), header_count, decoded["header_value"])],
        fields=list(HEADER_TYPE),
    )
    ends = pa.Array.from_buffers(pa.int32(), rows + 1, [None, pa.py_buffer(decoded["header_ends"])])
    return pa.ListArray.from_arrays(ends, pairs, type=HEADERS_TYPE)
