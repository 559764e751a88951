"""Record level of batch v2: build a whole batch for the client, decode one into records.

A record inside the (possibly compressed) records section of a batch:

    length varint            bytes after this field
    attributes int8          unused, 0
    timestampDelta varlong   from the batch's baseTimestamp
    offsetDelta varint       from the batch's baseOffset
    keyLength varint, key    -1: null key
    valueLength varint, value  -1: null value
    headerCount varint, then per header:
        keyLength varint, key (UTF-8, never null)
        valueLength varint, value  -1: null value

Varints are zigzag-encoded base-128, least significant group first. These loops run once per
record on the client's hot path, so they are written flat: varints of up to two bytes come from
a precomputed table when encoding and are decoded inline, so no helper is called in the common
case.
"""

import struct
from collections.abc import Sequence
from typing import NamedTuple

import crc32c
from riverbed.protocol.compression import CompressionType, DecompressionError, compress, decompress
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records_fast import append_records
from riverbed.protocol.records_header import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC_V2,
    RECORD_BATCH_OVERHEAD,
    RECORDS_POSITION,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Bytes,
    CorruptRecordError,
    batch_crc_ok,
    parse_batch_header,
)

Headers = Sequence[tuple[str, bytes | None]]
# What the client hands to encode_batch per record: key, value, headers, timestamp_ms.
RecordInput = tuple[bytes | None, bytes | None, Headers, int]


class Record(NamedTuple):
    """One decoded record. A NamedTuple rather than a frozen dataclass: it is as immutable and
    typed, and building one costs ~100 ns against ~550 ns, per record of every fetch."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


# A 64-bit value needs at most ten 7-bit groups; the tenth, at shift 63, may only hold bit 63.
VARINT_BITS_MAX = 63
# The values a record may carry, as the compiled decoder (records_fast) checks them: the broker
# decodes with this module what clients produced (ListOffsets by time, the group log), so a
# value past its type would otherwise reach a response it cannot be encoded into.
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
_EMPTY_HEADERS: tuple[tuple[str, bytes | None], ...] = ()
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


def decode_batch(buf: Bytes, position: int = 0) -> tuple[BatchHeader, list[Record]]:
    """Decode the whole batch at `position`: check its CRC, decompress, read every record.

    Raises CorruptRecordError if the batch is truncated, fails its CRC or is malformed.
    """
    header = parse_batch_header(buf, position)
    if not batch_crc_ok(buf, position, header):
        raise CorruptRecordError(
            ErrorCode.CORRUPT_MESSAGE,
            f"record batch at position {position} is truncated or fails its CRC",
        )
    if header.records_count < 0:
        raise CorruptRecordError(
            ErrorCode.CORRUPT_MESSAGE, f"record batch has recordsCount {header.records_count}"
        )
    section = memoryview(buf)[position + RECORDS_POSITION : position + header.size_bytes]
    try:
        # One copy of the section into bytes: indexing and slicing bytes is faster than a
        # memoryview, and every key and value must become bytes anyway.
        data = decompress(header.compression, section)
    except DecompressionError as error:
        raise CorruptRecordError(ErrorCode.CORRUPT_MESSAGE, str(error)) from error
    try:
        return header, _decode_records(header, data)
    except (IndexError, UnicodeDecodeError) as error:
        raise CorruptRecordError(
            ErrorCode.CORRUPT_MESSAGE, f"record batch has a record cut short: {error}"
        ) from error


def _read_unsigned_varint(data: bytes, position: int) -> tuple[int, int]:
    """Decode the base-128 varint at `position`; return (unsigned value, position after it)."""
    shift = 0
    unsigned = 0
    while True:
        byte = data[position]
        position += 1
        if shift == VARINT_BITS_MAX and byte > 1:
            raise CorruptRecordError(ErrorCode.CORRUPT_MESSAGE, "varint does not fit 64 bits")
        unsigned |= (byte & 0x7F) << shift
        if byte < 0x80:
            return unsigned, position
        shift += 7


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """Decode the zigzag varint at `position`; return (value, position after it)."""
    unsigned, position = _read_unsigned_varint(data, position)
    return (unsigned >> 1) ^ -(unsigned & 1), position


def _decode_records(header: BatchHeader, data: bytes) -> list[Record]:
    # Each varint is decoded inline, with one- and two-byte fast paths, and records are built
    # with tuple.__new__: a function call per field or record would double the cost of a fetch.
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    max_timestamp = header.max_timestamp
    log_append_time = header.timestamp_type == TIMESTAMP_TYPE_LOG_APPEND_TIME
    last_offset_delta = header.last_offset_delta
    previous_delta = -1  # offsets increase within their batch, up to its lastOffsetDelta
    records: list[Record] = []
    append = records.append
    new_tuple = tuple.__new__
    read_unsigned_varint = _read_unsigned_varint
    position = 0
    for _ in range(header.records_count):
        unsigned = data[position]
        if unsigned < 0x80:
            position += 1
        elif (high := data[position + 1]) < 0x80:
            unsigned = (unsigned & 0x7F) | high << 7
            position += 2
        else:
            unsigned, position = read_unsigned_varint(data, position)
        length = (unsigned >> 1) ^ -(unsigned & 1)
        record_end = position + length
        position += 1  # record attributes: unused in v2
        unsigned = data[position]
        if unsigned < 0x80:
            position += 1
        elif (high := data[position + 1]) < 0x80:
            unsigned = (unsigned & 0x7F) | high << 7
            position += 2
        else:
            unsigned, position = read_unsigned_varint(data, position)
        timestamp_delta = (unsigned >> 1) ^ -(unsigned & 1)
        unsigned = data[position]
        if unsigned < 0x80:
            position += 1
        elif (high := data[position + 1]) < 0x80:
            unsigned = (unsigned & 0x7F) | high << 7
            position += 2
        else:
            unsigned, position = read_unsigned_varint(data, position)
        offset_delta = (unsigned >> 1) ^ -(unsigned & 1)
        if not previous_delta < offset_delta <= last_offset_delta:
            raise CorruptRecordError(
                ErrorCode.CORRUPT_MESSAGE,
                f"record offsetDelta {offset_delta} is not above the record before "
                f"({previous_delta}) and within the batch (0..{last_offset_delta})",
            )
        previous_delta = offset_delta
        unsigned = data[position]
        if unsigned < 0x80:
            position += 1
        elif (high := data[position + 1]) < 0x80:
            unsigned = (unsigned & 0x7F) | high << 7
            position += 2
        else:
            unsigned, position = read_unsigned_varint(data, position)
        key_length = (unsigned >> 1) ^ -(unsigned & 1)
        if key_length >= 0:
            key: bytes | None = data[position : position + key_length]
            position += key_length
        else:
            _check_null_length(key_length, "key")
            key = None
        unsigned = data[position]
        if unsigned < 0x80:
            position += 1
        elif (high := data[position + 1]) < 0x80:
            unsigned = (unsigned & 0x7F) | high << 7
            position += 2
        else:
            unsigned, position = read_unsigned_varint(data, position)
        value_length = (unsigned >> 1) ^ -(unsigned & 1)
        if value_length >= 0:
            value: bytes | None = data[position : position + value_length]
            position += value_length
        else:
            _check_null_length(value_length, "value")
            value = None
        if data[position] == 0:
            headers = _EMPTY_HEADERS
            position += 1
        else:
            headers, position = _decode_headers(data, position)
        if position != record_end:
            raise CorruptRecordError(
                ErrorCode.CORRUPT_MESSAGE,
                f"record ends at {position} of the records section, its length says {record_end}",
            )
        timestamp_ms = max_timestamp if log_append_time else base_timestamp + timestamp_delta
        offset = base_offset + offset_delta
        if not (INT64_MIN <= offset <= INT64_MAX and INT64_MIN <= timestamp_ms <= INT64_MAX):
            raise CorruptRecordError(
                ErrorCode.CORRUPT_MESSAGE, "record offset or timestamp overflows int64"
            )
        append(new_tuple(Record, (offset, timestamp_ms, key, value, headers)))
    if position != len(data):
        raise CorruptRecordError(
            ErrorCode.CORRUPT_MESSAGE,
            f"{header.records_count} records end at {position} of a {len(data)}-byte section",
        )
    return records


def _check_null_length(length: int, name: str) -> None:
    """-1 marks a null field; any other negative length is corrupt."""
    if length != -1:
        raise CorruptRecordError(ErrorCode.CORRUPT_MESSAGE, f"record {name} has length {length}")


def _decode_headers(data: bytes, position: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    count, position = _read_varint(data, position)
    if count < 0:
        raise CorruptRecordError(ErrorCode.CORRUPT_MESSAGE, f"record has {count} headers")
    headers = []
    for _ in range(count):
        key_length, position = _read_varint(data, position)
        if key_length < 0:
            raise CorruptRecordError(
                ErrorCode.CORRUPT_MESSAGE, f"record header key has length {key_length}"
            )
        key = data[position : position + key_length].decode()
        position += key_length
        value_length, position = _read_varint(data, position)
        if value_length >= 0:
            value: bytes | None = data[position : position + value_length]
            position += value_length
        else:
            _check_null_length(value_length, "header value")
            value = None
        headers.append((key, value))
    return tuple(headers), position
