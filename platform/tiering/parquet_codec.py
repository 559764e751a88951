"""One sealed segment's batches as one Parquet file, and Kafka batches rebuilt from it.

Columns: those of Spark's Kafka source (`key`, `value`, `topic`, `partition`, `offset`,
`timestamp`, `timestampType`, `headers`), so a Spark or DuckDB job reads the objects as they
are, then the batch-level fields a rebuild needs (`batch_*`). Rows are sorted by offset, row
groups are bounded (`ROW_GROUP_BYTES_MAX`) and carry statistics, so a reader looking for an
offset or a timestamp reads only the row groups that can hold it.

This is per-record Python work, which the broker never does on its hot path: conversion runs
in the tiering threads, rebuilding in a cold fetch's worker thread.

Rebuild contract: the batches covering an offset come back with their original offsets,
timestamps (as consumers see them), keys, values, headers, producer fields, leader epoch and
attributes, and a valid CRC. An uncompressed CreateTime batch is rebuilt byte for byte. A
compressed batch is recompressed with its codec (compressor output may differ in bytes). In a
LogAppendTime batch every record carries the batch's timestamp, as consumers read it.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import crc32c
import pyarrow as pa
import pyarrow.parquet as pq
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import decode_batch, encode_batch, iter_batch_headers
from riverbed.protocol.records_header import (
    ATTRIBUTES_POSITION,
    CONTROL_MASK,
    CRC_POSITION,
    MAX_TIMESTAMP_POSITION,
    TRANSACTIONAL_MASK,
    CorruptRecordError,
)

# Bounded row groups: a cold read of one offset fetches about this much, not the whole object.
ROW_GROUP_BYTES_MAX = 8 * 1024 * 1024
ROW_GROUP_ROWS_MAX = 200_000
PARQUET_COMPRESSION = "zstd"

HEADER_TYPE = pa.struct([("key", pa.string()), ("value", pa.binary())])
SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", pa.list_(HEADER_TYPE)),
        ("batch_base_offset", pa.int64()),
        ("batch_max_timestamp", pa.int64()),
        ("batch_partition_leader_epoch", pa.int32()),
        ("batch_attributes", pa.int16()),
        ("batch_producer_id", pa.int64()),
        ("batch_producer_epoch", pa.int16()),
        ("batch_base_sequence", pa.int32()),
    ]
)
_CRC = struct.Struct(">I")
_INT64 = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    base_offset: int  # of the first batch
    last_offset: int  # of the last record
    records: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    row_groups: int


def segment_to_parquet(
    batches: bytes | memoryview, topic: str, partition: int, path: Path
) -> SegmentSummary:
    """Write the whole batches in `batches` to `path` as Parquet. Every batch's CRC is checked
    first: a corrupt batch raises CorruptRecordError naming its offset, never a silent skip."""
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    payload_bytes = 0
    for position, header in iter_batch_headers(batches):
        try:
            _, records = decode_batch(batches, position)
        except CorruptRecordError as error:
            raise CorruptRecordError(
                ErrorCode.CORRUPT_MESSAGE,
                f"{topic}-{partition}: batch at offset {header.base_offset}: {error}",
            ) from error
        for record in records:
            columns["key"].append(record.key)
            columns["value"].append(record.value)
            columns["offset"].append(record.offset)
            columns["timestamp"].append(record.timestamp_ms)
            columns["headers"].append([{"key": k, "value": v} for k, v in record.headers])
            payload_bytes += len(record.key or b"") + len(record.value or b"")
        count = len(records)
        columns["timestampType"] += [header.timestamp_type] * count
        columns["batch_base_offset"] += [header.base_offset] * count
        columns["batch_max_timestamp"] += [header.max_timestamp] * count
        columns["batch_partition_leader_epoch"] += [header.partition_leader_epoch] * count
        columns["batch_attributes"] += [header.attributes] * count
        columns["batch_producer_id"] += [header.producer_id] * count
        columns["batch_producer_epoch"] += [header.producer_epoch] * count
        columns["batch_base_sequence"] += [header.base_sequence] * count
    rows = len(columns["offset"])
    if rows == 0:
        raise ValueError(f"{topic}-{partition}: no records to tier")
    columns["topic"] = [topic] * rows
    columns["partition"] = [partition] * rows
    table = pa.table(columns, schema=SCHEMA)
    row_bytes = max(1, payload_bytes // rows)
    pq.write_table(
        table,
        path,
        compression=PARQUET_COMPRESSION,
        row_group_size=max(1, min(ROW_GROUP_ROWS_MAX, ROW_GROUP_BYTES_MAX // row_bytes)),
        write_statistics=True,
    )
    timestamps = columns["timestamp"]
    return SegmentSummary(
        base_offset=columns["batch_base_offset"][0],
        last_offset=columns["offset"][-1],
        records=rows,
        min_timestamp_ms=min(timestamps),
        max_timestamp_ms=max(timestamps),
        row_groups=pq.ParquetFile(path).num_row_groups,
    )


def row_groups_from(parquet: pq.ParquetFile, column: str, value: int) -> list[int]:
    """The row groups that may hold rows with `column` >= `value`, by their statistics."""
    index = parquet.schema_arrow.get_field_index(column)
    wanted = []
    for group in range(parquet.num_row_groups):
        statistics = parquet.metadata.row_group(group).column(index).statistics
        if statistics is None or not statistics.has_min_max:
            wanted.append(group)
            continue
        maximum = statistics.max
        if hasattr(maximum, "timestamp"):  # a timestamp column's statistics are datetimes
            maximum = int(maximum.timestamp() * 1000)
        if maximum >= value:
            wanted.append(group)
    return wanted


Source = str | Path | BinaryIO | io.RawIOBase


def read_batches(source: Source, start_offset: int, max_bytes: int) -> bytes:
    """The Kafka batches holding `start_offset` and after, about `max_bytes` of them (at least
    one whole batch), reading only the row groups needed."""
    parquet = pq.ParquetFile(source)
    out = bytearray()
    for rows in _batches_from(parquet, start_offset):
        out += _encode(rows)
        if len(out) >= max_bytes:
            break
    return bytes(out)


def first_offset_at_or_after(
    source: Source, timestamp_ms: int, min_offset: int = 0
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first record at or above `min_offset` whose timestamp is
    >= `timestamp_ms` (ListOffsets by time), or None."""
    parquet = pq.ParquetFile(source)
    for group in row_groups_from(parquet, "timestamp", timestamp_ms):
        table = parquet.read_row_group(group, columns=["offset", "timestamp"])
        offsets = table.column("offset").to_pylist()
        times = table.column("timestamp").cast(pa.int64()).to_pylist()
        for offset, timestamp in zip(offsets, times, strict=True):
            if timestamp >= timestamp_ms and offset >= min_offset:
                return int(offset), int(timestamp)
    return None


def _batches_from(parquet: pq.ParquetFile, start_offset: int) -> Iterator[list[dict[str, Any]]]:
    """Rows grouped by batch, from the batch holding `start_offset`; a batch may span row
    groups, so the last group of one row group waits for the next."""
    groups = row_groups_from(parquet, "offset", start_offset)
    pending: list[dict[str, Any]] = []
    for group in groups:
        table = parquet.read_row_group(group)
        table = table.set_column(
            table.schema.get_field_index("timestamp"),
            "timestamp",
            table.column("timestamp").cast(pa.int64()),
        )
        for row in table.to_pylist():
            if pending and row["batch_base_offset"] != pending[0]["batch_base_offset"]:
                if pending[-1]["offset"] >= start_offset:
                    yield pending
                pending = []
            pending.append(row)
    if pending and pending[-1]["offset"] >= start_offset:
        yield pending


def _encode(rows: list[dict[str, Any]]) -> bytes:
    first = rows[0]
    base_offset = first["batch_base_offset"]
    for delta, row in enumerate(rows):
        if row["offset"] != base_offset + delta:
            raise CorruptRecordError(
                ErrorCode.CORRUPT_MESSAGE,
                f"batch at {base_offset}: offsets with gaps are not rebuilt yet "
                f"(offset {row['offset']} at position {delta})",
            )
    attributes = first["batch_attributes"]
    batch = bytearray(
        encode_batch(
            [
                (
                    row["key"],
                    row["value"],
                    [(h["key"], h["value"]) for h in row["headers"]],
                    row["timestamp"],
                )
                for row in rows
            ],
            base_offset=base_offset,
            compression=CompressionType(attributes & 0x07),
            producer_id=first["batch_producer_id"],
            producer_epoch=first["batch_producer_epoch"],
            base_sequence=first["batch_base_sequence"],
            partition_leader_epoch=first["batch_partition_leader_epoch"],
            timestamp_type=first["timestampType"],
            is_transactional=bool(attributes & TRANSACTIONAL_MASK),
        )
    )
    # What encode_batch derives differently from the original: the control flag, and the max
    # timestamp of a LogAppendTime batch (the broker's clock, not the records').
    batch[ATTRIBUTES_POSITION + 1] |= attributes & CONTROL_MASK
    _INT64.pack_into(batch, MAX_TIMESTAMP_POSITION, first["batch_max_timestamp"])
    _CRC.pack_into(batch, CRC_POSITION, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_POSITION:]))
    return bytes(batch)
