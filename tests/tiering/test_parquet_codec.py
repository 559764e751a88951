"""Segment batches -> Parquet -> Kafka batches: what comes back, byte for byte where promised,
which row groups a read touches, and what a corrupt segment gets.

Batches come from three writers that share no code with the rebuild: Riverbed's encode_batch
(every codec), kafka-python's DefaultRecordBatchBuilder (explicit offset deltas, so compacted
batches with gaps), and a real broker's segment files written from confluent-kafka (at the
end).
"""

from __future__ import annotations

import dataclasses
import io
import random
import re
import struct
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import confluent_kafka
import crc32c
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.record_types import Headers, TopicPartition
from riverbed.protocol.records import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    CorruptRecordError,
    RecordInput,
    encode_batch,
    iter_batch_headers,
    parse_batch_header,
    stamp_log_append_time,
)
from riverbed.protocol.records_header import CONTROL_MASK, HEADER_STRUCT, TRANSACTIONAL_MASK
from riverbed.tiering.arrow_schema import SCHEMA
from riverbed.tiering.parquet_codec import (
    SegmentReader,
    first_offset_at_or_after,
    read_batches,
    row_groups_for_offset,
    row_groups_for_timestamp,
    segment_to_parquet,
)

from tests.support.batches import records_in
from tests.support.broker import BrokerFactory

TP = TopicPartition("tiered", 0)
BASE_TIMESTAMP_MS = 1_700_000_000_000
EVERYTHING = 1 << 40  # a max_bytes no test segment reaches
CODECS = list(CompressionType)


def records(first: int, count: int) -> list[RecordInput]:
    """Null keys and values (tombstones), headers with null values and non-ASCII keys."""
    return [
        (
            None if i % 7 == 0 else f"key-{i}".encode(),
            None if i % 11 == 3 else f"value-{i}-".encode() * (1 + i % 4),
            [("trace", f"{i}".encode()), ("ünïcødé-ключ", None)] if i % 2 else [],
            timestamp_of(i),
        )
        for i in range(first, first + count)
    ]


def timestamp_of(i: int) -> int:
    """Timestamps that go back and forth, as with several producers' clocks."""
    return BASE_TIMESTAMP_MS + i + (500 if i % 5 == 0 else 0)


def incompressible_segment(batches: int, per_batch: int) -> bytes:
    """Random values: the Parquet file is as big as the data, so its row groups lie far from
    its footer and reading one is told apart from opening the file."""
    rng = random.Random(batches)  # the same bytes every run
    return b"".join(
        encode_batch(
            [(None, rng.randbytes(1_000), [], timestamp_of(i)) for i in range(b, b + per_batch)],
            base_offset=b,
        )
        for b in range(0, batches * per_batch, per_batch)
    )


def segment(
    codec: CompressionType = CompressionType.NONE, batches: int = 20, per_batch: int = 5
) -> bytes:
    return b"".join(
        encode_batch(
            records(b * per_batch, per_batch),
            base_offset=b * per_batch,
            compression=codec,
            producer_id=42,
            producer_epoch=3,
            base_sequence=b * per_batch,
            partition_leader_epoch=7,
        )
        for b in range(batches)
    )


def headers_of(data: bytes) -> list[BatchHeader]:
    return [header for _, header in iter_batch_headers(data)]


def records_of(data: bytes) -> list[tuple[int, int, bytes | None, bytes | None, Headers]]:
    """(offset, timestamp, key, value, headers) of each record of `data`'s whole batches."""
    return [
        (record.offset, record.timestamp_ms, record.key, record.value, record.headers)
        for record in records_in(TP, data)
    ]


def same_but_compression_output(header: BatchHeader) -> BatchHeader:
    """The header without the two fields a recompressed records section changes."""
    return dataclasses.replace(header, batch_length=0, crc=0)


def restamp(batch: bytes, **fields: int) -> bytes:
    """`batch` with header fields replaced and its CRC recomputed (what a broker or the log
    cleaner does to a batch, with no record re-encoded)."""
    header = dataclasses.replace(parse_batch_header(batch), **fields)
    out = bytearray(batch)
    HEADER_STRUCT.pack_into(out, 0, *dataclasses.astuple(header))
    struct.pack_into(">I", out, CRC_POSITION, crc32c.crc32c(memoryview(out)[ATTRIBUTES_POSITION:]))
    return bytes(out)


def convert(tmp_path: Path, data: bytes, **limits: int) -> Path:
    path = tmp_path / "segment.parquet"
    segment_to_parquet(data, "orders", 3, path, **limits)
    return path


# -- the rebuild contract ---------------------------------------------------------------------


def test_uncompressed_batches_come_back_byte_for_byte(tmp_path: Path) -> None:
    original = segment()
    summary = segment_to_parquet(original, "orders", 3, tmp_path / "s.parquet")
    assert (summary.base_offset, summary.last_offset) == (0, 99)
    assert (summary.records, summary.batches, summary.row_groups) == (100, 20, 1)
    assert summary.min_timestamp_ms == BASE_TIMESTAMP_MS + 1
    assert summary.max_timestamp_ms == BASE_TIMESTAMP_MS + 95 + 500
    assert summary.size_bytes == (tmp_path / "s.parquet").stat().st_size
    assert read_batches(tmp_path / "s.parquet", 0, EVERYTHING) == original


@pytest.mark.parametrize("codec", CODECS[1:], ids=lambda c: c.name)
def test_compressed_batches_keep_records_header_fields_and_codec(
    tmp_path: Path, codec: CompressionType
) -> None:
    original = segment(codec)
    rebuilt = read_batches(convert(tmp_path, original), 0, EVERYTHING)
    assert records_of(rebuilt) == records_of(original)
    assert [same_but_compression_output(h) for h in headers_of(rebuilt)] == [
        same_but_compression_output(h) for h in headers_of(original)
    ]
    assert {h.compression for h in headers_of(rebuilt)} == {codec}


@pytest.mark.parametrize(
    "codec", [CompressionType.NONE, CompressionType.ZSTD], ids=lambda c: c.name
)
def test_log_append_time_batches_keep_the_producers_timestamps_for_the_rebuild(
    tmp_path: Path, codec: CompressionType
) -> None:
    append_time_ms = BASE_TIMESTAMP_MS + 10_000
    data = bytearray(segment(codec, batches=4))
    stamp_log_append_time(memoryview(data), headers_of(bytes(data)), append_time_ms)
    path = convert(tmp_path, bytes(data))
    rebuilt = read_batches(path, 0, EVERYTHING)
    if codec == CompressionType.NONE:
        assert rebuilt == data
    assert records_of(rebuilt) == records_of(bytes(data))
    table = pq.read_table(path)
    assert set(table.column("timestampType").to_pylist()) == {1}
    assert set(table.column("timestamp").cast(pa.int64()).to_pylist()) == {append_time_ms}
    producer_times = [r[3] for r in records(0, 20)]
    assert [
        base + delta
        for base, delta in zip(
            table.column("batch_base_timestamp").to_pylist(),
            table.column("record_timestamp_delta").to_pylist(),
            strict=True,
        )
    ] == producer_times


def kafka_python_batch(
    offset_deltas: Sequence[int], codec: int, *, base_offset: int, last_offset_delta: int
) -> bytes:
    """A batch as kafka-python writes it, with the offset deltas compaction leaves: gaps, a
    first delta above 0, and a lastOffsetDelta past the last record kept."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=9,
        producer_epoch=1,
        base_sequence=0,
        batch_size=1 << 20,
    )
    for delta in offset_deltas:
        key = None if delta % 3 == 0 else b"k%d" % delta
        headers = [("h", b"x"), ("ñ", None)] if delta % 2 else []
        builder.append(delta, BASE_TIMESTAMP_MS + 3 * delta, key, b"v" * delta, headers)
    return restamp(
        bytes(builder.build()), base_offset=base_offset, last_offset_delta=last_offset_delta
    )


@pytest.mark.parametrize("codec", [0, 1], ids=["none", "gzip"])
def test_compacted_batches_keep_their_offset_gaps(tmp_path: Path, codec: int) -> None:
    original = kafka_python_batch(
        [2, 3, 7, 40], codec, base_offset=100, last_offset_delta=45
    ) + kafka_python_batch([0, 5], codec, base_offset=146, last_offset_delta=5)
    path = convert(tmp_path, original)
    rebuilt = read_batches(path, 0, EVERYTHING)
    if codec == 0:
        assert rebuilt == original
    assert records_of(rebuilt) == records_of(original)
    assert [r[0] for r in records_of(rebuilt)] == [102, 103, 107, 140, 146, 151]
    assert [(h.base_offset, h.last_offset) for h in headers_of(rebuilt)] == [(100, 145), (146, 151)]
    # From an offset compaction removed: the first batch holding a record at or after it.
    assert headers_of(read_batches(path, 104, EVERYTHING))[0].base_offset == 100
    assert headers_of(read_batches(path, 141, EVERYTHING))[0].base_offset == 146
    assert read_batches(path, 152, EVERYTHING) == b""


def control_batch(base_offset: int, commit: bool) -> bytes:
    """A transaction marker as a transaction coordinator writes it: one control record, key
    (version 0, type 0 abort / 1 commit), value (version 0, coordinator epoch 5)."""
    batch = encode_batch(
        [(struct.pack(">hh", 0, int(commit)), struct.pack(">hi", 0, 5), [], BASE_TIMESTAMP_MS)],
        base_offset=base_offset,
        producer_id=77,
        producer_epoch=2,
        is_transactional=True,
    )
    attributes = parse_batch_header(batch).attributes | CONTROL_MASK
    return restamp(batch, attributes=attributes)


def test_transactional_and_control_batches_survive(tmp_path: Path) -> None:
    data = encode_batch(
        records(0, 3),
        base_offset=0,
        producer_id=77,
        producer_epoch=2,
        base_sequence=0,
        is_transactional=True,
    )
    original = data + control_batch(3, commit=True) + control_batch(4, commit=False)
    path = convert(tmp_path, original)
    assert read_batches(path, 0, EVERYTHING) == original
    rebuilt = headers_of(read_batches(path, 3, EVERYTHING))
    assert [(h.base_offset, h.is_control, h.is_transactional) for h in rebuilt] == [
        (3, True, True),
        (4, True, True),
    ]
    attributes = pq.read_table(path).column("batch_attributes").to_pylist()
    assert [bool(a & CONTROL_MASK) for a in attributes] == [False] * 3 + [True] * 2
    assert all(a & TRANSACTIONAL_MASK for a in attributes)


record_inputs = st.tuples(
    st.none() | st.binary(max_size=30),
    st.none() | st.binary(max_size=300),
    st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3),
    st.integers(BASE_TIMESTAMP_MS - 10**9, BASE_TIMESTAMP_MS + 10**9),
)
batch_inputs = st.tuples(
    st.lists(record_inputs, min_size=1, max_size=8),
    st.integers(0, 3),  # offsets skipped before the batch
    st.booleans(),  # stamped LogAppendTime by the broker
    st.integers(-1, 2**40),  # producer id
)


@settings(max_examples=60, deadline=None)
@given(st.lists(batch_inputs, min_size=1, max_size=6), st.integers(0, 60))
def test_any_uncompressed_segment_comes_back_byte_for_byte_from_any_offset(
    batches: list[tuple[list[RecordInput], int, bool, int]], start_offset: int
) -> None:
    data = bytearray()
    next_offset = 0
    for batch_records, skipped, log_append_time, producer_id in batches:
        batch = bytearray(
            encode_batch(
                batch_records,
                base_offset=next_offset + skipped,
                producer_id=producer_id,
                producer_epoch=producer_id % 7,
                base_sequence=producer_id % 1000,
                partition_leader_epoch=skipped,
            )
        )
        if log_append_time:
            stamp_log_append_time(memoryview(batch), headers_of(bytes(batch)), 2**41)
        data += batch
        next_offset = parse_batch_header(batch).last_offset + 1
    with tempfile.TemporaryDirectory() as directory:
        path = convert(Path(directory), bytes(data))
        expected = b"".join(
            data[position : position + header.size_bytes]
            for position, header in iter_batch_headers(data)
            if header.last_offset >= start_offset
        )
        assert read_batches(path, start_offset, EVERYTHING) == expected


compacted_records = st.lists(
    st.tuples(
        st.integers(0, 2_000),  # offset delta
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=100),
        st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=2),
        st.integers(-(10**9), 10**9),  # timestamp, from BASE_TIMESTAMP_MS
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda record: record[0],
)


@settings(max_examples=60, deadline=None)
@given(compacted_records, st.integers(0, 5), st.integers(0, 2_100))
def test_any_compacted_batch_comes_back_byte_for_byte(
    kept: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]], int]],
    last_offset_past_records: int,
    start_offset: int,
) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for delta, key, value, headers, timestamp in sorted(kept, key=lambda record: record[0]):
        builder.append(delta, BASE_TIMESTAMP_MS + timestamp, key, value, headers)
    last_offset_delta = max(record[0] for record in kept) + last_offset_past_records
    batch = restamp(bytes(builder.build()), last_offset_delta=last_offset_delta)
    with tempfile.TemporaryDirectory() as directory:
        path = convert(Path(directory), batch)
        rebuilt = read_batches(path, start_offset, EVERYTHING)
    assert rebuilt == (batch if start_offset <= max(r[0] for r in kept) else b"")


# -- reads: where they start, where they stop, what they touch --------------------------------


def test_a_read_starts_at_the_batch_holding_the_offset_and_stays_within_max_bytes(
    tmp_path: Path,
) -> None:
    original = segment()
    sizes = [h.size_bytes for h in headers_of(original)]
    reader = SegmentReader(convert(tmp_path, original))
    # At least one whole batch, however small max_bytes (KIP-74).
    assert [(h.base_offset, h.last_offset) for h in headers_of(reader.read_batches(52, 1))] == [
        (50, 54)
    ]
    two = reader.read_batches(52, sizes[10] + sizes[11] + sizes[12] - 1)
    assert [h.base_offset for h in headers_of(two)] == [50, 55]
    assert len(two) == sizes[10] + sizes[11]
    assert reader.read_batches(99, EVERYTHING) == original[-sizes[-1] :]
    assert reader.read_batches(100, EVERYTHING) == b""


SEVEN_RECORDS_BYTES_MAX = 1_000  # a batch of seven records() is smaller


@pytest.mark.parametrize(
    ("limits", "bound"),
    [
        # rows: at most the limit plus the rest of the batch that reached it
        ({"row_group_rows_max": 50}, lambda rows, section_bytes: rows < 50 + 7),
        # uncompressed records: likewise
        (
            {"row_group_bytes_max": 2_000},
            lambda rows, section_bytes: section_bytes < 2_000 + SEVEN_RECORDS_BYTES_MAX,
        ),
    ],
    ids=["rows", "bytes"],
)
def test_row_groups_hold_whole_batches_and_stay_within_their_limits(
    tmp_path: Path, limits: dict[str, int], bound: Callable[[int, int], bool]
) -> None:
    original = segment(batches=30, per_batch=7)
    assert all(h.size_bytes < SEVEN_RECORDS_BYTES_MAX for h in headers_of(original))
    path = convert(tmp_path, original, **limits)
    parquet = pq.ParquetFile(path)
    assert parquet.num_row_groups > 3
    seen: set[int] = set()
    for group in range(parquet.num_row_groups):
        table = parquet.read_row_group(group)
        base_offsets = table.column("batch_base_offset").to_pylist()
        assert not set(base_offsets) & seen
        seen |= set(base_offsets)
        assert all(base_offsets.count(base) == 7 for base in set(base_offsets))  # whole
        sizes = dict(zip(base_offsets, table.column("batch_size_bytes").to_pylist(), strict=True))
        section_bytes = sum(size - RECORD_BATCH_OVERHEAD for size in sizes.values())
        assert bound(table.num_rows, section_bytes)
    assert read_batches(path, 0, EVERYTHING) == original


class RecordingFile(io.RawIOBase):
    """An in-memory file that records the byte ranges read from it (as a range GET would)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._position = 0
        self.reads: list[range] = []

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._data)}
        self._position = base[whence] + offset
        return self._position

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        chunk = self._data[self._position : self._position + len(buffer)]
        buffer[: len(chunk)] = chunk
        self.reads.append(range(self._position, self._position + len(chunk)))
        self._position += len(chunk)
        return len(chunk)


def row_group_bytes(path: Path) -> list[range]:
    """Where each row group's column chunks lie in the file."""
    metadata = pq.ParquetFile(path).metadata
    spans = []
    for group in range(metadata.num_row_groups):
        chunks = [metadata.row_group(group).column(c) for c in range(metadata.num_columns)]
        starts = [min(filter(None, (c.dictionary_page_offset, c.data_page_offset))) for c in chunks]
        ends = [s + c.total_compressed_size for s, c in zip(starts, chunks, strict=True)]
        spans.append(range(min(starts), max(ends)))
    return spans


def touched(reads: list[range], spans: list[range]) -> set[int]:
    """The row groups `reads` overlap; no read may stray outside them."""
    groups: set[int] = set()
    for read in reads:
        inside = {
            group
            for group, span in enumerate(spans)
            if read.start < span.stop and span.start < read.stop
        }
        assert inside, f"read {read} touches no row group"
        first, last = spans[min(inside)], spans[max(inside)]
        assert first.start <= read.start, f"read {read} strays out"
        assert read.stop <= last.stop, f"read {read} strays out"
        groups |= inside
    return groups


def test_a_read_at_a_high_offset_touches_only_the_row_groups_it_needs(tmp_path: Path) -> None:
    original = incompressible_segment(batches=200, per_batch=10)
    path = convert(tmp_path, original, row_group_rows_max=100)
    spans = row_group_bytes(path)
    assert len(spans) == 20
    file = RecordingFile(path.read_bytes())
    reader = SegmentReader(file)
    # Opening reads the file's tail: the footer (and the end of the last row group with it).
    assert len(file.reads) == 1
    assert file.reads[0].stop == path.stat().st_size
    file.reads.clear()
    assert headers_of(reader.read_batches(1_955, 1))[0].base_offset == 1_950
    assert touched(file.reads, spans) == {19}
    assert row_groups_for_offset(pq.ParquetFile(path).metadata, 1_955) == range(19, 20)
    # A second read in the same row group decodes nothing again; the next one reads on.
    file.reads.clear()
    assert reader.read_batches(1_960, 1)
    assert file.reads == []
    file.reads.clear()
    assert len(headers_of(reader.read_batches(1_890, 1_000_000))) == 11
    assert touched(file.reads, spans) == {18, 19}


def test_a_timestamp_search_touches_only_row_groups_that_can_hold_it(tmp_path: Path) -> None:
    original = incompressible_segment(batches=200, per_batch=10)
    path = convert(tmp_path, original, row_group_rows_max=100)
    spans = row_group_bytes(path)
    file = RecordingFile(path.read_bytes())
    reader = SegmentReader(file)
    file.reads.clear()
    # Record i has timestamp BASE + i, or BASE + i + 500 when i % 5 == 0.
    assert reader.first_offset_at_or_after(BASE_TIMESTAMP_MS + 1_801) == (
        1_305,
        BASE_TIMESTAMP_MS + 1_805,
    )
    assert touched(file.reads, spans) == {13}
    metadata = pq.ParquetFile(path).metadata
    assert row_groups_for_timestamp(metadata, BASE_TIMESTAMP_MS + 1_801) == list(range(13, 20))
    assert row_groups_for_timestamp(metadata, BASE_TIMESTAMP_MS + 1_801, 1_700) == [17, 18, 19]
    assert first_offset_at_or_after(path, BASE_TIMESTAMP_MS + 1_801, 1_400) == (
        1_400,
        BASE_TIMESTAMP_MS + 1_900,
    )
    assert first_offset_at_or_after(path, BASE_TIMESTAMP_MS + 2_500) is None


def test_a_read_from_bytes_or_an_open_file_is_the_same(tmp_path: Path) -> None:
    original = segment(CompressionType.LZ4)
    path = convert(tmp_path, original)
    from_path = read_batches(path, 40, EVERYTHING)
    assert read_batches(path.read_bytes(), 40, EVERYTHING) == from_path
    assert read_batches(pq.ParquetFile(path), 40, EVERYTHING) == from_path
    assert read_batches(str(path), 40, EVERYTHING) == from_path


# -- the file as analytics see it -------------------------------------------------------------


def test_the_file_is_plain_parquet_with_sparks_kafka_columns(tmp_path: Path) -> None:
    path = convert(tmp_path, segment(CompressionType.ZSTD))
    parquet = pq.ParquetFile(path)
    assert parquet.schema_arrow == SCHEMA
    assert SCHEMA.names[:8] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert str(SCHEMA.field("timestamp").type) == "timestamp[ms, tz=UTC]"
    assert str(SCHEMA.field("headers").type) == (
        "list<element: struct<key: string not null, value: binary> not null>"
    )
    row = pq.read_table(path).slice(1, 1).to_pylist()[0]
    assert row["topic"] == "orders"
    assert row["partition"] == 3
    assert row["offset"] == 1
    assert (row["key"], row["value"]) == (b"key-1", b"value-1-" * 2)
    assert row["headers"] == [
        {"key": "trace", "value": b"1"},
        {"key": "ünïcødé-ключ", "value": None},
    ]
    assert int(row["timestamp"].timestamp() * 1000) == BASE_TIMESTAMP_MS + 1
    assert row["timestampType"] == 0
    metadata = parquet.metadata
    offset_column = SCHEMA.get_field_index("offset")
    chunk = metadata.row_group(0).column(offset_column)
    assert chunk.path_in_schema == "offset"
    assert chunk.compression == "ZSTD"
    assert (chunk.statistics.min, chunk.statistics.max) == (0, 99)
    assert metadata.row_group(0).sorting_columns[0].column_index == offset_column
    # What readers prune by (Spark's reader: offset and batch_attributes) has statistics; the
    # per-object columns are dictionary-encoded (one value, not one per row).
    leaves = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    for name in ("partition", "offset", "timestamp", "timestampType", "batch_attributes"):
        assert metadata.row_group(0).column(leaves[name]).statistics.has_min_max, name
    for name in ("topic", "partition"):
        assert "RLE_DICTIONARY" in metadata.row_group(0).column(leaves[name]).encodings, name


# -- refused input ----------------------------------------------------------------------------


def test_a_flipped_byte_is_refused_naming_the_batch(tmp_path: Path) -> None:
    data = bytearray(segment())
    last_batch = len(data) - headers_of(bytes(data))[-1].size_bytes
    data[len(data) - 3] ^= 0x01  # inside the last record of the last batch (offsets 95..99)
    expected = f"orders-3: batch at offset 95 (byte {last_batch}) is truncated or fails its CRC"
    with pytest.raises(CorruptRecordError, match=re.escape(expected)):
        convert(tmp_path, bytes(data))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[:-3], r"orders-3: batch at offset 95 \(byte \d+\) is truncated"),
        (lambda data: data + b"\x00" * 10, r"orders-3: after offset 99, byte \d+: .*truncated"),
        (
            lambda data: (
                encode_batch(records(0, 3), base_offset=5)
                + restamp(encode_batch(records(0, 3)), base_offset=6)
            ),
            r"batch at offset 6 \(byte \d+\) does not follow the batch ending at offset 7",
        ),
        (
            lambda data: restamp(encode_batch(records(0, 3)), last_offset_delta=1),
            r"batch at offset 0 .*record offset delta 2 is not .* within the batch \(0\.\.1\)",
        ),
        (
            lambda data: kafka_python_batch([0, 4, 4], 0, base_offset=10, last_offset_delta=5),
            r"batch at offset 10 .*record offset delta 4 is not above the record before \(4\)",
        ),
        (
            lambda data: restamp(encode_batch(records(0, 3)), records_count=0),
            "holds 0 records",
        ),
        (
            lambda data: restamp(encode_batch(records(0, 3)), records_count=4),
            "batch at offset 0 .*record 3 of 4 is cut short",
        ),
    ],
    ids=[
        "cut",
        "trailing-bytes",
        "overlap",
        "record-outside",
        "record-repeated",
        "no-records",
        "count-wrong",
    ],
)
def test_a_damaged_segment_is_refused(
    tmp_path: Path, damage: Callable[[bytes], bytes], message: str
) -> None:
    log_file = tmp_path / "00000000000000000000.log"
    log_file.write_bytes(damage(segment()))
    with pytest.raises(CorruptRecordError, match=message):
        segment_to_parquet(log_file, "orders", 3, tmp_path / "segment.parquet")
    assert not (tmp_path / "segment.parquet").exists()  # no file that looks whole


# -- segments a real broker wrote, from a real third-party producer --------------------------

BROKER_RECORDS = 1_500
BROKER_TIMEOUT_S = 30.0
# Small segments and batches: several sealed segments of several batches each.
BROKER_TOPICS = {
    # topic: (topic configs, the producer's compression.type)
    "plain": ({}, "none"),
    "zstd": ({}, "zstd"),
    "append-time": ({"message.timestamp.type": "LogAppendTime"}, "lz4"),
    "append-time-plain": ({"message.timestamp.type": "LogAppendTime"}, "none"),
}


def produced(
    i: int, now_ms: int
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]:
    """Record i as confluent-kafka sends it: key, value, headers, timestamp. Recent timestamps:
    retention.ms must not delete the segments under the test."""
    rng = random.Random(i)
    key = None if i % 7 == 0 else f"user-{i % 97}".encode()
    value = None if i % 13 == 5 else rng.randbytes(40).hex().encode()
    headers = [("trace", f"{i}".encode()), ("ünïcødé-ключ", None)] if i % 3 == 0 else []
    return key, value, headers, now_ms - 60_000 + i


def test_segments_a_real_broker_wrote_from_confluent_kafka_come_back(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    broker = broker_factory()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    new_topics = [
        NewTopic(topic, 1, 1, config={"segment.bytes": "16384", **configs})
        for topic, (configs, _) in BROKER_TOPICS.items()
    ]
    for future in admin.create_topics(new_topics).values():
        future.result(BROKER_TIMEOUT_S)
    now_ms = int(time.time() * 1000)
    before_ms = now_ms
    for topic, (_, compression) in BROKER_TOPICS.items():
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "compression.type": compression,
                "enable.idempotence": True,
                "linger.ms": 5,
                "batch.size": 4096,
            }
        )
        for i in range(BROKER_RECORDS):
            key, value, headers, timestamp_ms = produced(i, now_ms)
            producer.produce(
                topic, value, key, partition=0, headers=list(headers), timestamp=timestamp_ms
            )
        assert producer.flush(BROKER_TIMEOUT_S) == 0
    after_ms = int(time.time() * 1000)

    for topic, (configs, compression) in BROKER_TOPICS.items():
        sealed = broker.segment_files(topic, 0)[:-1]  # the last one is still being written
        assert len(sealed) >= 3, f"{topic}: {len(sealed)} sealed segments"
        rebuilt_records = []
        for number, log_file in enumerate(sealed):
            original = log_file.read_bytes()
            parquet_path = tmp_path / f"{topic}-{number}.parquet"
            summary = segment_to_parquet(log_file, topic, 0, parquet_path)
            assert summary.base_offset == int(log_file.stem)
            rebuilt = read_batches(parquet_path, summary.base_offset, EVERYTHING)
            if compression == "none":
                assert rebuilt == original, f"{log_file} differs once rebuilt"
            assert [same_but_compression_output(h) for h in headers_of(rebuilt)] == [
                same_but_compression_output(h) for h in headers_of(original)
            ]
            assert records_of(rebuilt) == records_of(original)
            rebuilt_records += records_of(rebuilt)
            table = pq.read_table(parquet_path)
            assert table.column("offset").to_pylist() == [r[0] for r in records_of(original)]

        assert [r[0] for r in rebuilt_records] == list(range(len(rebuilt_records)))
        batch_headers = headers_of(b"".join(p.read_bytes() for p in sealed))
        assert all(h.producer_id >= 0 and h.base_sequence >= 0 for h in batch_headers)
        assert {h.compression.name.lower() for h in batch_headers} == {compression}
        for offset, timestamp_ms, key, value, record_headers in rebuilt_records:
            sent_key, sent_value, sent_headers, sent_timestamp_ms = produced(offset, now_ms)
            assert (key, value, list(record_headers)) == (sent_key, sent_value, sent_headers)
            if configs:  # LogAppendTime: the broker's clock
                assert before_ms <= timestamp_ms <= after_ms
            else:
                assert timestamp_ms == sent_timestamp_ms
