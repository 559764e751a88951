"""Kafka record batches -> Arrow rows (arrow_schema.SCHEMA), one row group's worth at a time.

Records are decoded by the protocol's compiled decoder; every column is then built in one call
from a list or by run-length expansion of per-batch values, so the Python work per record is a
handful of attribute reads. The checks the decoder leaves to its caller (record offsets inside
their batch and strictly increasing) are done here, vectorised, so a corrupt segment is refused
rather than tiered.
"""

from __future__ import annotations

import dataclasses
import itertools
from operator import attrgetter

import pyarrow as pa
import pyarrow.compute as pc
from riverbed.protocol.compression import DecompressionError, decompress
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import Headers, Record, TopicPartition
from riverbed.protocol.records_fast import decode_records
from riverbed.protocol.records_header import (
    RECORDS_POSITION,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    Bytes,
    CorruptRecordError,
)
from riverbed.tiering.arrow_schema import HEADER_TYPE, HEADERS_TYPE, SCHEMA, TIMESTAMP_TYPE

# decode_records leaves out records below this offset: keep them all.
_KEEP_ALL_OFFSETS = -(2**63)
_KEY = attrgetter("key")
_VALUE = attrgetter("value")
_OFFSET = attrgetter("offset")
_TIMESTAMP_MS = attrgetter("timestamp_ms")
_HEADERS = attrgetter("headers")


class RowGroupRows:
    """The rows of whole batches added one by one, turned into one Arrow table by `table()`."""

    def __init__(self, topic: str, partition: int) -> None:
        self._tp = TopicPartition(topic, partition)
        self._headers: list[BatchHeader] = []
        self._records: list[Record] = []
        self.section_bytes = 0  # uncompressed records sections added so far

    @property
    def rows(self) -> int:
        return len(self._records)

    def add(self, buf: Bytes, position: int, header: BatchHeader) -> None:
        """Decode the batch at `position` (its CRC already checked) and keep its records.
        Raises CorruptRecordError if its records are malformed or not what the header says."""
        compressed = memoryview(buf)[position + RECORDS_POSITION : position + header.size_bytes]
        try:
            section = decompress(header.compression, compressed)
        except DecompressionError as error:
            raise CorruptRecordError(ErrorCode.CORRUPT_MESSAGE, str(error)) from error
        as_written = header
        if header.attributes & TIMESTAMP_TYPE_MASK:
            # Decoded as CreateTime, every record carries its own timestamp (base + delta),
            # which a LogAppendTime batch still holds and the rebuild needs; what consumers see
            # is derived in table().
            as_written = dataclasses.replace(
                header, attributes=header.attributes & ~TIMESTAMP_TYPE_MASK
            )
        records = decode_records(self._tp, as_written, section, _KEEP_ALL_OFFSETS)
        self._headers.append(header)
        self._records += records
        self.section_bytes += len(section)

    def table(self) -> pa.Table:
        """The rows added so far, as SCHEMA; raises CorruptRecordError if a record's offset is
        outside its batch or not above the record before it."""
        records = self._records
        rows = len(records)
        run_ends = pa.array(
            list(itertools.accumulate(h.records_count for h in self._headers)), pa.int32()
        )
        batch_columns = {
            name: _per_row(run_ends, name, values) for name, values in _batch_values(self._headers)
        }
        offsets = pa.array(list(map(_OFFSET, records)), pa.int64())
        _check_offsets(
            offsets, batch_columns["batch_base_offset"], batch_columns["batch_last_offset_delta"]
        )
        own_timestamps = pa.array(list(map(_TIMESTAMP_MS, records)), pa.int64())
        timestamp_types = pc.shift_right(
            pc.bit_wise_and(batch_columns["batch_attributes"], TIMESTAMP_TYPE_MASK), 3
        ).cast(pa.int32())
        timestamps = pc.if_else(
            pc.equal(timestamp_types, TIMESTAMP_TYPE_LOG_APPEND_TIME),
            batch_columns["batch_max_timestamp"],
            own_timestamps,
        )
        columns = {
            "key": pa.array(list(map(_KEY, records)), pa.binary()),
            "value": pa.array(list(map(_VALUE, records)), pa.binary()),
            "topic": pa.repeat(self._tp.topic, rows),
            "partition": pa.repeat(pa.scalar(self._tp.partition, pa.int32()), rows),
            "offset": offsets,
            "timestamp": timestamps.cast(TIMESTAMP_TYPE),
            "timestampType": timestamp_types,
            "headers": _headers_column(list(map(_HEADERS, records))),
            "record_timestamp_delta": pc.subtract(
                own_timestamps, batch_columns["batch_base_timestamp"]
            ),
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


def _headers_column(headers: list[Headers]) -> pa.Array:
    if not any(headers):  # the common case: no record has a header
        return pa.ListArray.from_arrays(
            pa.repeat(pa.scalar(0, pa.int32()), len(headers) + 1),
            pa.array([], HEADER_TYPE),
            type=HEADERS_TYPE,
        )
    ends = itertools.accumulate(map(len, headers), initial=0)
    keys = [key for pairs in headers for key, _ in pairs]
    values = [value for pairs in headers for _, value in pairs]
    pairs = pa.StructArray.from_arrays(
        [pa.array(keys, pa.string()), pa.array(values, pa.binary())], fields=list(HEADER_TYPE)
    )
    return pa.ListArray.from_arrays(pa.array(list(ends), pa.int32()), pairs, type=HEADERS_TYPE)


def _check_offsets(offsets: pa.Array, base_offsets: pa.Array, last_offset_deltas: pa.Array) -> None:
    last_offsets = pc.add(base_offsets, last_offset_deltas)
    outside = pc.or_(pc.less(offsets, base_offsets), pc.greater(offsets, last_offsets))
    _refuse_first(outside, offsets, base_offsets, "is outside its batch")
    if len(offsets) > 1:
        not_increasing = pc.less_equal(offsets[1:], offsets[:-1])
        _refuse_first(not_increasing, offsets[1:], base_offsets[1:], "is not above the one before")


def _refuse_first(bad: pa.Array, offsets: pa.Array, base_offsets: pa.Array, problem: str) -> None:
    index = pc.index(bad, True).as_py()
    if index >= 0:
        raise CorruptRecordError(
            ErrorCode.CORRUPT_MESSAGE,
            f"batch at offset {base_offsets[index].as_py()}: record offset "
            f"{offsets[index].as_py()} {problem}",
        )
