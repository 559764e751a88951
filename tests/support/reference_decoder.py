"""The tests' oracle for record batches v2: a plain Python reading of the record format,
independent of the compiled decoder production uses (riverbed.protocol.records_fast).

Differential tests (tests/protocol/test_records_fast.py, tools/fuzz's records target) hand the
same bytes to both and require the same records, or a CorruptRecordError from both. It is
written to be obviously right, not fast: one reader method per field kind, every limit checked
where the format states it. It shares with production only what is per batch (the header
parser, the CRC check, decompression); everything per record is its own.

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

Varints are zigzag-encoded base-128, least significant group first.
"""

from __future__ import annotations

from riverbed.protocol.compression import DecompressionError, decompress
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import Headers, Record, TopicPartition
from riverbed.protocol.records_header import (
    RECORDS_POSITION,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
    BatchHeader,
    Bytes,
    CorruptRecordError,
    batch_crc_ok,
    parse_batch_header,
)

# A 64-bit value needs at most ten 7-bit groups; the tenth, at shift 63, may only hold bit 63.
VARINT_SHIFT_LAST = 63
# Offsets and timestamps are int64 on the wire: a delta may not carry one past its type.
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
NULL_LENGTH = -1


def reference_decode(tp: TopicPartition, buf: Bytes, position: int = 0) -> list[Record]:
    """The records of the batch at `position` of `buf`, as partition `tp`'s.

    Raises CorruptRecordError if the batch is truncated, fails its CRC or is malformed.
    """
    header = parse_batch_header(buf, position)
    if not batch_crc_ok(buf, position, header):
        raise _corrupt(f"record batch at position {position} is truncated or fails its CRC")
    if header.records_count < 0:
        raise _corrupt(f"record batch has recordsCount {header.records_count}")
    section = memoryview(buf)[position + RECORDS_POSITION : position + header.size_bytes]
    try:
        data = decompress(header.compression, section)
    except DecompressionError as error:
        raise _corrupt(str(error)) from error
    reader = _Reader(data)
    records = _read_records(reader, header, tp)
    if reader.position != len(data):
        raise _corrupt(
            f"{header.records_count} records end at {reader.position} of {len(data)} bytes"
        )
    return records


def _read_records(reader: _Reader, header: BatchHeader, tp: TopicPartition) -> list[Record]:
    log_append_time = header.timestamp_type == TIMESTAMP_TYPE_LOG_APPEND_TIME
    records = []
    previous_delta = -1  # offsets increase within their batch, up to its lastOffsetDelta
    for _ in range(header.records_count):
        length = reader.varint()
        record_end = reader.position + length
        reader.take(1)  # attributes: unused in v2
        timestamp_delta = reader.varint()
        offset_delta = reader.varint()
        if not previous_delta < offset_delta <= header.last_offset_delta:
            raise _corrupt(
                f"record offsetDelta {offset_delta} is not above the record before "
                f"({previous_delta}) and within the batch (0..{header.last_offset_delta})"
            )
        previous_delta = offset_delta
        key = reader.nullable("key")
        value = reader.nullable("value")
        headers = _read_headers(reader)
        if reader.position != record_end:
            raise _corrupt(f"record ends at {reader.position}, its length says {record_end}")
        offset = header.base_offset + offset_delta
        timestamp_ms = (
            header.max_timestamp if log_append_time else header.base_timestamp + timestamp_delta
        )
        if not (INT64_MIN <= offset <= INT64_MAX and INT64_MIN <= timestamp_ms <= INT64_MAX):
            raise _corrupt("record offset or timestamp overflows int64")
        records.append(
            Record(
                tp.topic,
                tp.partition,
                offset,
                timestamp_ms,
                header.timestamp_type,
                key,
                value,
                headers,
            )
        )
    return records


def _read_headers(reader: _Reader) -> Headers:
    count = reader.varint()
    if count < 0:
        raise _corrupt(f"record has {count} headers")
    headers = []
    for _ in range(count):
        key_length = reader.varint()
        if key_length < 0:
            raise _corrupt(f"record header key has length {key_length}")
        try:
            key = reader.take(key_length).decode()
        except UnicodeDecodeError as error:
            raise _corrupt(f"record header key is not UTF-8: {error}") from error
        headers.append((key, reader.nullable("header value")))
    return tuple(headers)


class _Reader:
    """Reads fields from the front of a records section; CorruptRecordError past its end."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.position = 0

    def take(self, length: int) -> bytes:
        end = self.position + length
        if end > len(self.data):
            raise _corrupt(f"a field of {length} bytes at {self.position} is past the section")
        field = self.data[self.position : end]
        self.position = end
        return field

    def varint(self) -> int:
        """A zigzag varint of at most 64 bits."""
        unsigned = 0
        shift = 0
        while True:
            (byte,) = self.take(1)
            if shift == VARINT_SHIFT_LAST and byte > 1:
                raise _corrupt("varint does not fit 64 bits")
            unsigned |= (byte & 0x7F) << shift
            if byte < 0x80:
                return (unsigned >> 1) ^ -(unsigned & 1)
            shift += 7

    def nullable(self, name: str) -> bytes | None:
        """A length-prefixed field; length -1 is null, any other negative length corrupt."""
        length = self.varint()
        if length == NULL_LENGTH:
            return None
        if length < 0:
            raise _corrupt(f"record {name} has length {length}")
        return self.take(length)


def _corrupt(problem: str) -> CorruptRecordError:
    return CorruptRecordError(ErrorCode.CORRUPT_MESSAGE, problem)
