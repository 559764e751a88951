"""The compiled record loops: decode_records agrees with the tests' oracle and refuses bad bytes
without crashing; append_records writes what the oracle reads back.

The oracle is tests/support/reference_decoder.py (pure Python, independent code). The compiled
decoder reads bytes from the network in C, so besides agreeing on well-formed batches it must
answer every truncation, corruption and random buffer with CorruptRecordError or records, never
a crash, another exception or a leak.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import random
import struct
import tracemalloc

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.client.types import Record, TopicPartition
from riverbed.protocol.compression import decompress
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import (
    ATTRIBUTES_POSITION,
    BASE_TIMESTAMP_POSITION,
    BATCH_LENGTH_POSITION,
    CRC_POSITION,
    LAST_OFFSET_DELTA_POSITION,
    LOG_OVERHEAD,
    MAX_TIMESTAMP_POSITION,
    RECORDS_COUNT_POSITION,
    RECORDS_POSITION,
    BatchHeader,
    CompressionType,
    CorruptRecordError,
    RecordInput,
    encode_batch,
    parse_batch_header,
)
from riverbed.protocol.records_fast import append_records, decode_records
from riverbed.protocol.records_header import TIMESTAMP_TYPE_MASK

from tests.support.guarded_buffer import GuardedBuffer
from tests.support.reference_decoder import reference_decode

TP = TopicPartition("topic", 7)
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
NO_SKIP = INT64_MIN
TIMESTAMP_MS = 1_700_000_000_000

# Lengths around the one-, two- and three-byte varint boundaries (zigzag doubles them).
boundary_sizes = st.sampled_from([0, 1, 63, 64, 65, 8191, 8192, 8193])
fields = st.none() | st.binary(max_size=120) | boundary_sizes.map(bytes)
header_lists = st.lists(st.tuples(st.text(max_size=12), fields), max_size=3)
base_timestamps = st.sampled_from([-1, 0, TIMESTAMP_MS]) | st.integers(-1, 1 << 61)
# Deltas up to 2**60 either way: varlongs of up to nine bytes, never past int64.
timestamp_deltas = st.integers(-(1 << 60), 1 << 60) | st.integers(-300, 300)
record_lists = st.lists(st.tuples(fields, fields, header_lists, timestamp_deltas), max_size=25)


GUARDED = GuardedBuffer(size_bytes_max=1 << 20)


def _section(header: BatchHeader, batch: bytes) -> bytes:
    return decompress(header.compression, memoryview(batch)[RECORDS_POSITION : header.size_bytes])


def _compiled(batch: bytes, skip_below: int = NO_SKIP) -> list[Record]:
    header = parse_batch_header(batch)
    return decode_records(TP, header, _section(header, batch), skip_below)


def _reference(batch: bytes) -> list[Record]:
    return reference_decode(TP, batch)


def _rebatch(batch: bytes, section: bytes, records_count: int | None = None) -> bytes:
    """`batch` (uncompressed) with its records section replaced, its length and CRC fixed."""
    out = bytearray(batch[:RECORDS_POSITION] + section)
    struct.pack_into(">i", out, BATCH_LENGTH_POSITION, len(out) - LOG_OVERHEAD)
    if records_count is not None:
        struct.pack_into(">i", out, RECORDS_COUNT_POSITION, records_count)
    struct.pack_into(">I", out, CRC_POSITION, crc32c.crc32c(bytes(out[ATTRIBUTES_POSITION:])))
    return bytes(out)


def _inputs(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    base_timestamp: int,
) -> list[RecordInput]:
    return [(key, value, headers, base_timestamp + delta) for key, value, headers, delta in records]


def _agree(batch: bytes) -> None:
    """Compiled and reference decoders accept the same batches and agree on their records: both
    refuse an offsetDelta outside int32, an int64 overflow and a varint past 64 bits."""
    try:
        expected = _reference(batch)
    except CorruptRecordError:
        with pytest.raises(CorruptRecordError) as raised:
            _compiled(batch)
        assert raised.value.code == ErrorCode.CORRUPT_MESSAGE
        return
    assert _compiled(batch) == expected


@settings(max_examples=200, deadline=None)
@given(
    records=record_lists,
    base_timestamp=base_timestamps,
    base_offset=st.integers(0, 1 << 62),
    compression=st.sampled_from(CompressionType),
    timestamp_type=st.sampled_from([0, 1]),
)
def test_agrees_with_the_oracle(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    base_timestamp: int,
    base_offset: int,
    compression: CompressionType,
    timestamp_type: int,
) -> None:
    records = records or [(None, None, [], 0)]
    batch = encode_batch(
        _inputs(records, base_timestamp),
        base_offset=base_offset,
        compression=compression,
        timestamp_type=timestamp_type,
    )
    decoded = _compiled(batch)
    assert decoded == _reference(batch)
    for record in decoded:
        assert type(record) is Record
        assert (record.topic, record.partition) == TP
        assert record.timestamp_type == timestamp_type
    if timestamp_type == 1:
        assert {record.timestamp_ms for record in decoded} == {
            parse_batch_header(batch).max_timestamp
        }


@settings(max_examples=100, deadline=None)
@given(records=record_lists, base_offset=st.integers(0, 1000), skip=st.integers(-5, 1030))
def test_records_below_skip_below_are_left_out(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    base_offset: int,
    skip: int,
) -> None:
    batch = encode_batch(_inputs(records or [(None, b"", [], 0)], 0), base_offset=base_offset)
    expected = [record for record in _reference(batch) if record.offset >= skip]
    assert _compiled(batch, skip_below=skip) == expected


def test_records_are_frozen_untracked_dataclasses_equal_to_built_ones() -> None:
    batch = encode_batch([(b"k", b"v", [("h", None)], 5), (None, None, [], 6)], base_offset=9)
    first, second = _compiled(batch)
    assert first == Record("topic", 7, 9, 5, 0, b"k", b"v", (("h", None),))
    assert second == Record("topic", 7, 10, 6, 0, None, None, ())
    assert hash(first) == hash(Record("topic", 7, 9, 5, 0, b"k", b"v", (("h", None),)))
    assert repr(second) == repr(Record("topic", 7, 10, 6, 0, None, None, ()))
    assert dataclasses.replace(first, offset=1).offset == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.key = b"x"  # type: ignore[misc]
    assert not gc.is_tracked(first)


# A hand-written record encoder, independent of encode_batch: for values it never writes.
def _varint(value: int) -> bytes:
    unsigned = (value << 1) ^ (value >> 63)
    out = bytearray()
    while unsigned > 0x7F:
        out.append(unsigned & 0x7F | 0x80)
        unsigned >>= 7
    return bytes(out + bytes([unsigned]))


def _record(offset_delta: int, timestamp_delta: int = 0, value: bytes = b"v") -> bytes:
    body = b"\x00" + _varint(timestamp_delta) + _varint(offset_delta) + b"\x01"
    body += _varint(len(value)) + value + b"\x00"
    return _varint(len(body)) + body


def _batch_of(
    section: bytes, records_count: int, base_offset: int = 0, last_offset_delta: int = 0
) -> bytes:
    template = bytearray(encode_batch([(None, b"", [], 0)], base_offset=base_offset))
    struct.pack_into(">i", template, LAST_OFFSET_DELTA_POSITION, last_offset_delta)
    return _rebatch(bytes(template), section, records_count)


@pytest.mark.parametrize("offset_delta", [0, 1, 1 << 20, INT32_MAX])
def test_offset_deltas_across_int32(offset_delta: int) -> None:
    batch = _batch_of(_record(offset_delta), 1, base_offset=1 << 40, last_offset_delta=INT32_MAX)
    assert _compiled(batch) == _reference(batch)


@pytest.mark.parametrize(
    ("deltas", "last_offset_delta"),
    [
        ([1], 0),  # past the batch's last offset
        ([-1], 0),  # before the batch
        ([INT32_MIN], INT32_MAX),
        ([0, 0], 1),  # a repeated offset
        ([1, 0], 1),  # out of order
        ([0, 2], 1),
    ],
)
def test_offsets_must_increase_within_their_batch(
    deltas: list[int], last_offset_delta: int
) -> None:
    section = b"".join(_record(delta) for delta in deltas)
    batch = _batch_of(section, len(deltas), last_offset_delta=last_offset_delta)
    _agree(batch)
    with pytest.raises(CorruptRecordError, match="offset delta"):
        _compiled(batch)


def test_offsets_may_have_gaps_as_after_compaction() -> None:
    batch = _batch_of(_record(0) + _record(5) + _record(9), 3, base_offset=7, last_offset_delta=9)
    assert [record.offset for record in _compiled(batch)] == [7, 12, 16]
    _agree(batch)


@pytest.mark.parametrize(
    ("section", "base_offset"),
    [
        (_record(INT32_MAX + 1), 0),  # offsetDelta is an int32 varint
        (_record(INT32_MIN - 1), 0),
        (_record(1), INT64_MAX),  # the offset overflows int64
        (_record(0, timestamp_delta=INT64_MAX), 0),  # base timestamp 0 + delta: fits
    ],
)
def test_values_past_their_type(section: bytes, base_offset: int) -> None:
    batch = _batch_of(section, 1, base_offset=base_offset)
    _agree(batch)


def test_timestamp_overflow_is_refused() -> None:
    batch = _batch_of(_record(0, timestamp_delta=INT64_MAX), 1)
    header = parse_batch_header(batch)
    section = _section(header, batch)
    with pytest.raises(CorruptRecordError):
        decode_records(TP, dataclasses.replace(header, base_timestamp=1), section, 0)


def test_a_record_left_out_by_skip_below_is_still_checked() -> None:
    """A timestamp past int64 refuses the batch whatever offset the reader starts from, as the
    oracle (which has no skip_below) refuses it: it used to be checked on kept records only."""
    section = _record(0, timestamp_delta=INT64_MAX) + _record(1)
    header = parse_batch_header(_batch_of(section, 2, last_offset_delta=1))
    header = dataclasses.replace(header, base_timestamp=1)
    with pytest.raises(CorruptRecordError, match="timestamp overflows"):
        decode_records(TP, header, section, 1)
    # Under LogAppendTime every record's timestamp is the batch's: the delta is not used.
    appended = dataclasses.replace(header, attributes=TIMESTAMP_TYPE_MASK)
    assert [r.offset for r in decode_records(TP, appended, section, 1)] == [1]


@pytest.mark.parametrize(
    "varint",
    [
        b"\xff" * 9 + b"\x01",  # ten bytes, bit 63 set: the largest value there is
        b"\xff" * 9 + b"\x02",  # a 65th bit
        b"\xff" * 10 + b"\x00",  # eleven bytes
        b"\x80" * 9 + b"\x00",  # ten bytes for zero: accepted, as the reference does
    ],
)
def test_long_varints(varint: bytes) -> None:
    body = b"\x00" + varint + b"\x00\x01\x01\x00"
    _agree(_batch_of(_varint(len(body)) + body, 1))


def test_header_key_must_be_utf8_and_counts_must_fit() -> None:
    batch = encode_batch([(None, b"v", [("é", b"x")], 0)])
    section = _section(parse_batch_header(batch), batch)
    position = section.index("é".encode())
    bad_key = section[:position] + b"\xff\xfe" + section[position + 2 :]
    huge_count = section.replace(b"\x02\x04", b"\xfe\xff\xff\xff\x0f", 1)  # 1 header -> 2**31-1
    for bad in (bad_key, huge_count):
        with pytest.raises(CorruptRecordError):
            decode_records(TP, parse_batch_header(batch), bad, NO_SKIP)


def test_a_record_that_ends_before_its_header_count_is_refused() -> None:
    for body in (b"\x00\x00\x00\x01\x01", b"\x00\x00\x00\x01\x02v"):  # no header count
        section = _varint(len(body)) + body
        with pytest.raises(CorruptRecordError):
            decode_records(TP, parse_batch_header(_batch_of(section, 1)), GUARDED.hold(section), 0)


def test_a_header_count_past_the_record_allocates_nothing() -> None:
    body = b"\x00\x00\x00\x01\x01" + _varint(INT32_MAX) + b"\x02a\x01"
    section = _varint(len(body)) + body
    header = parse_batch_header(_batch_of(section, 1))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError):
            decode_records(TP, header, section, NO_SKIP)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_bytes < 64 * 1024


def test_every_truncation_and_extension_is_refused() -> None:
    records: list[RecordInput] = [
        (b"key", b"v" * 300, [("a", b"b"), ("c", None)], TIMESTAMP_MS),
        (None, None, [], TIMESTAMP_MS - 5),
        (b"", b"", [("", b"")], TIMESTAMP_MS + (1 << 40)),
    ]
    batch = encode_batch(records)
    header = parse_batch_header(batch)
    section = _section(header, batch)
    for cut in range(len(section)):
        with pytest.raises(CorruptRecordError):
            decode_records(TP, header, GUARDED.hold(section[:cut]), NO_SKIP)
    for count in (0, 2, 4, INT32_MAX):
        with pytest.raises(CorruptRecordError):
            decode_records(TP, dataclasses.replace(header, records_count=count), section, 0)
    with pytest.raises(CorruptRecordError):
        decode_records(TP, dataclasses.replace(header, records_count=-1), b"", 0)
    with pytest.raises(CorruptRecordError):
        decode_records(TP, header, section + b"\x00", NO_SKIP)


@settings(max_examples=300, deadline=None)
@given(
    records=record_lists,
    edits=st.lists(
        st.tuples(st.integers(0, 1 << 16), st.integers(0, 255), st.sampled_from("sid")),
        min_size=1,
        max_size=4,
    ),
)
def test_corrupted_sections_agree_with_the_reference_or_are_refused(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    edits: list[tuple[int, int, str]],
) -> None:
    batch = encode_batch(_inputs(records or [(b"k", b"v", [("h", b"x")], 1)], TIMESTAMP_MS))
    section = bytearray(_section(parse_batch_header(batch), batch))
    for at, byte, kind in edits:
        position = at % (len(section) + 1)
        if kind == "s" and position < len(section):
            section[position] = byte
        elif kind == "i":
            section.insert(position, byte)
        elif position < len(section):
            del section[position]
    _agree(_rebatch(batch, bytes(section)))
    with contextlib.suppress(CorruptRecordError):
        decode_records(TP, parse_batch_header(batch), GUARDED.hold(bytes(section)), NO_SKIP)


def test_random_bytes_never_crash() -> None:
    template = parse_batch_header(encode_batch([(None, b"", [], 0)]))
    generator = random.Random(20240607)
    # Mostly small bytes, so that varints end and lengths fit often enough to get far.
    alphabet = bytes(range(0, 12)) + b"\x00\x01\x02\x7f\x80\xff"
    for _ in range(20_000):
        size = generator.randrange(0, 64)
        if generator.random() < 0.5:
            data = bytes(generator.choice(alphabet) for _ in range(size))
        else:
            data = generator.randbytes(size)
        header = dataclasses.replace(
            template,
            records_count=generator.randrange(-2, 6),
            base_offset=generator.choice([0, INT64_MAX, INT64_MIN, 5]),
            base_timestamp=generator.choice([0, INT64_MAX, INT64_MIN, -1]),
            attributes=generator.choice([0, 8]),
        )
        try:
            records = decode_records(TP, header, GUARDED.hold(data), generator.randrange(-3, 3))
        except CorruptRecordError as error:
            assert error.code == ErrorCode.CORRUPT_MESSAGE  # noqa: PT017 - or it decodes: no pytest.raises
        else:
            assert all(type(record) is Record for record in records)


def test_takes_bytes_bytearray_and_memoryview() -> None:
    batch = encode_batch([(b"k", b"v", [], 1)] * 3)
    header = parse_batch_header(batch)
    section = batch[RECORDS_POSITION:]
    expected = decode_records(TP, header, section, NO_SKIP)
    assert decode_records(TP, header, bytearray(section), NO_SKIP) == expected
    assert decode_records(TP, header, memoryview(batch)[RECORDS_POSITION:], NO_SKIP) == expected


def test_no_memory_is_leaked_by_records_or_by_errors() -> None:
    batch = encode_batch([(b"key", b"v" * 100, [("h", b"x"), ("n", None)], 1)] * 50)
    header = parse_batch_header(batch)
    section = batch[RECORDS_POSITION:]
    cut = section[: len(section) - 3]

    def run() -> None:
        for _ in range(200):
            decode_records(TP, header, section, NO_SKIP)
            with pytest.raises(CorruptRecordError):
                decode_records(TP, header, cut, NO_SKIP)

    run()  # warm up caches (interned strings, small ints, exception machinery)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run()
        gc.collect()
        grown_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown_bytes < 64 * 1024


def _appended_batch(records: list[RecordInput]) -> tuple[bytes, int]:
    """A batch whose records section append_records wrote (header from a template)."""
    body = bytearray(b"prefix")
    max_timestamp = append_records(body, records, records[0][3])
    assert body[:6] == b"prefix"
    template = encode_batch([(None, b"", [], 0)])
    batch = bytearray(_rebatch(template, bytes(body[6:]), len(records)))
    struct.pack_into(">qq", batch, BASE_TIMESTAMP_POSITION, records[0][3], max_timestamp)
    assert MAX_TIMESTAMP_POSITION == BASE_TIMESTAMP_POSITION + 8
    struct.pack_into(">i", batch, LAST_OFFSET_DELTA_POSITION, len(records) - 1)
    return _rebatch(bytes(batch), bytes(body[6:])), max_timestamp


@settings(max_examples=200, deadline=None)
@given(records=record_lists, base_timestamp=base_timestamps)
def test_append_records_round_trips_through_the_oracle(
    records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    base_timestamp: int,
) -> None:
    inputs = _inputs(records or [(None, None, [], 0)], base_timestamp)
    batch, max_timestamp = _appended_batch(inputs)
    assert max_timestamp == max(timestamp_ms for *_, timestamp_ms in inputs)
    assert _reference(batch) == [
        Record(*TP, delta, timestamp_ms, 0, key, value, tuple(headers))
        for delta, (key, value, headers, timestamp_ms) in enumerate(inputs)
    ]


def test_append_records_writes_the_wire_format_byte_for_byte() -> None:
    body = bytearray()
    append_records(body, [(None, b"v", [], 10), (None, b"v", (), 9)], 10)
    assert bytes(body) == _record(0) + _record(1, timestamp_delta=-1)


def test_append_records_takes_any_bytes_like_key_and_value() -> None:
    as_bytes, as_views = bytearray(), bytearray()
    append_records(as_bytes, [(b"key", b"value", [("h", b"x")], 0)], 0)
    append_records(as_views, [(bytearray(b"key"), memoryview(b"value"), [("h", b"x")], 0)], 0)
    assert as_bytes == as_views


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ((5, b"", [], 0), TypeError),
        ("key", ValueError),  # not four fields
        ((None, b"", [(b"bytes key", None)], 0), TypeError),
        ((None, b"", [("\ud800", None)], 0), UnicodeEncodeError),
        ((None, b"", [], 1 << 63), OverflowError),
        ((None, b"", [], INT64_MIN), ValueError),  # more than int64 below the base timestamp
    ],
)
def test_append_records_refuses_bad_records_and_keeps_what_it_wrote(
    bad: object, error: type[Exception]
) -> None:
    body = bytearray(b"kept")
    with pytest.raises(error):
        append_records(body, [(b"k", b"v", [], 1), bad], 1)  # type: ignore[list-item]
    assert body == b"kept" + _record_with_key(b"k", b"v")


def _record_with_key(key: bytes, value: bytes) -> bytes:
    body = b"\x00\x00\x00" + _varint(len(key)) + key + _varint(len(value)) + value + b"\x00"
    return _varint(len(body)) + body
