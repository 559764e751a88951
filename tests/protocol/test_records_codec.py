"""Batch level of v2 (records_codec): encode_batch / decode_batch round trips and malformed
batches. The per-record loops are compiled; tests/protocol/test_records_fast.py holds them to
the tests' oracle."""

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    CompressionType,
    CorruptRecordError,
    Record,
    RecordInput,
    decode_batch,
    encode_batch,
    parse_batch_header,
)
from riverbed.protocol.records_codec import ALL_OFFSETS
from riverbed.protocol.records_header import HEADER_STRUCT, Bytes

TP = TopicPartition("topic", 3)
TIMESTAMP_MS = 1_700_000_000_000

fields = st.none() | st.binary(max_size=200)
headers = st.lists(st.tuples(st.text(max_size=20), fields), max_size=4)
record_inputs = st.lists(
    st.tuples(fields, fields, headers, st.integers(0, 1 << 42)), min_size=1, max_size=40
)


def _expected(
    records: list[RecordInput], base_offset: int, timestamp_type: int = 0
) -> list[Record]:
    return [
        Record(*TP, base_offset + delta, timestamp_ms, timestamp_type, key, value, tuple(headers))
        for delta, (key, value, headers, timestamp_ms) in enumerate(records)
    ]


def _decode(
    buf: Bytes, position: int = 0, *, check_crc: bool = True, skip_below: int = ALL_OFFSETS
) -> tuple[BatchHeader, list[Record]]:
    header = parse_batch_header(buf, position)
    return header, decode_batch(
        TP, buf, position, header, check_crc=check_crc, skip_below=skip_below
    )


@settings(max_examples=150)
@given(
    records=record_inputs,
    compression=st.sampled_from(CompressionType),
    base_offset=st.integers(0, 1 << 62),
)
def test_round_trip(
    records: list[RecordInput], compression: CompressionType, base_offset: int
) -> None:
    batch = encode_batch(records, base_offset=base_offset, compression=compression)
    header, decoded = _decode(batch)
    assert decoded == _expected(records, base_offset)
    assert header.compression is compression
    assert header.size_bytes == len(batch)
    assert header.base_timestamp == records[0][3]
    assert header.max_timestamp == max(timestamp_ms for *_, timestamp_ms in records)


def test_round_trip_of_long_fields_and_many_records() -> None:
    """Varints of three bytes and more: lengths over 8 KiB, offset and timestamp deltas > 8191."""
    records: list[RecordInput] = [
        (b"k" * 70_000, b"v" * 9_000, [("h" * 10_000, b"x" * 20_000)], TIMESTAMP_MS),
        (None, b"", [], TIMESTAMP_MS - (1 << 40)),
    ]
    records += [(None, b"%d" % i, [], TIMESTAMP_MS + i * 1_000) for i in range(9_000)]
    header, decoded = _decode(encode_batch(records, compression=CompressionType.LZ4))
    assert decoded == _expected(records, 0)
    assert header.last_offset_delta == len(records) - 1


def test_log_append_time_gives_every_record_the_batch_max_timestamp() -> None:
    records: list[RecordInput] = [(None, b"a", [], 10), (None, b"b", [], 30), (None, b"c", [], 20)]
    header, decoded = _decode(encode_batch(records, timestamp_type=1))
    assert header.timestamp_type == 1
    assert [record.timestamp_ms for record in decoded] == [30, 30, 30]
    assert {record.timestamp_type for record in decoded} == {1}


def test_decode_at_a_position_inside_a_larger_buffer() -> None:
    batch = encode_batch([(b"k", b"v", [("a", None)], 5)], base_offset=3)
    _, decoded = _decode(memoryview(b"\x00" * 9 + batch + b"tail"), 9)
    assert decoded == [Record(*TP, 3, 5, 0, b"k", b"v", (("a", None),))]


def test_records_below_skip_below_are_left_out() -> None:
    batch = encode_batch([(None, b"%d" % i, [], i) for i in range(5)], base_offset=10)
    _, decoded = _decode(batch, skip_below=13)
    assert [(record.offset, record.value) for record in decoded] == [(13, b"3"), (14, b"4")]


def test_the_crc_is_checked_unless_turned_off() -> None:
    batch = bytearray(encode_batch([(None, b"value", [], 0)]))
    batch[batch.index(b"value") + 4] ^= 1  # the records still decode
    with pytest.raises(CorruptRecordError, match="fails its CRC"):
        _decode(bytes(batch))
    assert [record.value for record in _decode(bytes(batch), check_crc=False)[1]] == [b"valud"]


def test_encode_refuses_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        encode_batch([])


def _raw_batch(section: bytes, records_count: int, compression: int = 0) -> bytes:
    """A batch around an arbitrary records section, with a valid CRC."""
    batch = bytearray(RECORD_BATCH_OVERHEAD)
    HEADER_STRUCT.pack_into(
        batch,
        0,
        0,
        RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(section),
        -1,
        2,
        0,
        compression,
        records_count - 1,
        0,
        0,
        -1,
        -1,
        -1,
        records_count,
    )
    batch += section
    struct.pack_into(">I", batch, CRC_POSITION, crc32c.crc32c(batch[ATTRIBUTES_POSITION:]))
    return bytes(batch)


def _section(batch: bytes) -> bytes:
    return batch[RECORD_BATCH_OVERHEAD:]


GOOD = encode_batch([(b"key", b"value", [("h", b"v")], 0), (None, None, [], 0)])


@pytest.mark.parametrize(
    ("batch", "problem"),
    [
        (GOOD[:-1], "cut short"),
        (GOOD[:-1] + bytes([GOOD[-1] ^ 1]), "fails its CRC"),
        (_raw_batch(_section(GOOD), records_count=3), "record 2 of 3 is cut short"),
        (_raw_batch(_section(GOOD), records_count=1), "records end before the section"),
        (_raw_batch(_section(GOOD), records_count=-1), "recordsCount -1"),
        (_raw_batch(_section(GOOD) + b"\x00", records_count=2), "records end before the section"),
        (_raw_batch(b"\x08\x00\x00\x00\x05", records_count=1), "key length is below -1"),
        (_raw_batch(b"\x10\x00\x00\x00\x01\x01\x02\x01\x00", records_count=1), "header key"),
        (_raw_batch(b"\x18\x00" + b"\xff" * 11, records_count=1), "past 64 bits"),
        (_raw_batch(b"not snappy at all", 1, compression=2), "snappy"),
    ],
)
def test_malformed_batches_raise_corrupt_record_error(batch: bytes, problem: str) -> None:
    with pytest.raises(CorruptRecordError, match=problem) as raised:
        _decode(batch)
    assert raised.value.code == ErrorCode.CORRUPT_MESSAGE


@given(section=st.binary(max_size=200), records_count=st.integers(0, 5))
def test_arbitrary_records_sections_decode_or_raise_corrupt_record_error(
    section: bytes, records_count: int
) -> None:
    try:
        _, decoded = _decode(_raw_batch(section, records_count))
    except CorruptRecordError as error:
        assert error.code == ErrorCode.CORRUPT_MESSAGE  # noqa: PT017 - or it decodes: no pytest.raises
    else:
        assert len(decoded) == records_count
