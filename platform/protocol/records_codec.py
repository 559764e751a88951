"""Batch level of v2 around the compiled record loops: build a whole batch for the client,
decode one into records for the consumer and the broker.

The per-record loops are in riverbed.protocol.records_fast (Cython, no pure-Python twin: the
tests keep an independent Python decoder as their oracle, tests/support/reference_decoder.py).
This module adds what is per batch: the header, compression and the CRC. Decoding yields
`riverbed.protocol.record_types.Record`, the one record type (the client's `riverbed.Record`).
"""

import struct
from collections.abc import Sequence
from typing import Final

import crc32c
from riverbed.protocol.compression import CompressionType, DecompressionError, compress, decompress
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import Record, TopicPartition
from riverbed.protocol.records_fast import append_records, decode_records
from riverbed.protocol.records_header import (
    ATTRIBUTES_POSITION,
    CONTROL_MASK,
    CRC_POSITION,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    RECORDS_POSITION,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Bytes,
    CorruptRecordError,
    batch_crc_ok,
)

Headers = Sequence[tuple[str, bytes | None]]
# What the client hands to encode_batch per record: key, value, headers, timestamp_ms.
RecordInput = tuple[bytes | None, bytes | None, Headers, int]
# decode_batch's skip_below that keeps every record of the batch.
ALL_OFFSETS: Final = -(1 << 63)

_CRC = struct.Struct(">I")


def encode_batch(
    records: Sequence[RecordInput],
    *,
    base_offset: int = 0,
    compression: CompressionType = CompressionType.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    timestamp_type: int = 0,
    is_transactional: bool = False,
    is_control: bool = False,
) -> bytes:
    """Build one v2 batch holding `records` (key, value, headers, timestamp_ms) at offsets
    base_offset, base_offset + 1, ...; the records section is compressed as `compression`."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    base_timestamp = records[0][3]
    # The header's bytes are reserved up front so an uncompressed batch is built in place; the
    # per-record loop is compiled (riverbed.protocol.records_fast).
    body = bytearray(RECORD_BATCH_OVERHEAD)
    max_timestamp = append_records(body, records, base_timestamp)
    if compression == CompressionType.NONE:
        out = body
    else:
        out = bytearray(RECORD_BATCH_OVERHEAD)
        out += compress(compression, memoryview(body)[RECORD_BATCH_OVERHEAD:])
    attributes = compression | (timestamp_type << 3 & TIMESTAMP_TYPE_MASK)
    if is_transactional:
        attributes |= TRANSACTIONAL_MASK
    if is_control:
        attributes |= CONTROL_MASK
    HEADER_STRUCT.pack_into(
        out,
        0,
        base_offset,
        len(out) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC_V2,
        0,  # crc: computed below over the final bytes
        attributes,
        len(records) - 1,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    _CRC.pack_into(out, CRC_POSITION, crc32c.crc32c(memoryview(out)[ATTRIBUTES_POSITION:]))
    return bytes(out)


def decode_batch(
    tp: TopicPartition,
    buf: Bytes,
    position: int,
    header: BatchHeader,
    *,
    check_crc: bool = True,
    skip_below: int = ALL_OFFSETS,
) -> list[Record]:
    """The records of partition `tp`'s batch at `position` of `buf` (`header` is its parsed
    header), leaving out those whose offset is below `skip_below`: the first batch a fetch
    answers with can start before the offset asked for. An uncompressed records section is
    decoded in place, without a copy.

    Raises CorruptRecordError (CORRUPT_MESSAGE) if the batch is not all in `buf`, fails its CRC
    (unless `check_crc` is off: the consumer's check.crcs), cannot be decompressed or does not
    hold exactly its recordsCount well-formed records.
    """
    end = position + header.size_bytes
    if end > len(buf):
        raise _corrupt(tp, header, f"cut short: {len(buf) - position} of {header.size_bytes} bytes")
    if check_crc and not batch_crc_ok(buf, position, header):
        raise _corrupt(tp, header, "fails its CRC")
    section = memoryview(buf)[position + RECORDS_POSITION : end]
    compression = header.compression
    if compression is not CompressionType.NONE:
        try:
            section = memoryview(decompress(compression, section))
        except DecompressionError as error:
            raise _corrupt(tp, header, str(error)) from error
    try:
        return decode_records(tp, header, section, skip_below)
    except CorruptRecordError as error:
        raise _corrupt(tp, header, error.message) from error


def _corrupt(tp: TopicPartition, header: BatchHeader, problem: str) -> CorruptRecordError:
    return CorruptRecordError(
        ErrorCode.CORRUPT_MESSAGE,
        f"{tp.topic}-{tp.partition}: batch at offset {header.base_offset}: {problem}",
    )
