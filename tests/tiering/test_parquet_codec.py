"""Segment batches -> Parquet -> Kafka batches: what comes back, byte for byte where promised."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.records import decode_batch, encode_batch, iter_batch_headers
from riverbed.protocol.records_header import CorruptRecordError
from riverbed.tiering import parquet_codec
from riverbed.tiering.parquet_codec import (
    first_offset_at_or_after,
    read_batches,
    row_groups_from,
    segment_to_parquet,
)


def segment(compression: CompressionType, batches: int = 20, per_batch: int = 5) -> bytes:
    out = b""
    for b in range(batches):
        base = b * per_batch
        out += encode_batch(
            [
                (
                    None if i % 7 == 0 else f"k{base + i}".encode(),
                    None if i % 11 == 3 else f"value-{base + i}".encode() * (1 + i % 3),
                    [("h", b"1"), ("ünï", None)] if i % 2 else [],
                    1_700_000_000_000 + base + i,
                )
                for i in range(per_batch)
            ],
            base_offset=base,
            compression=compression,
            producer_id=42,
            producer_epoch=3,
            base_sequence=base,
            partition_leader_epoch=7,
        )
    return out


def records_of(data: bytes) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for position, _ in iter_batch_headers(data):
        header, records = decode_batch(data, position)
        fields = (header.producer_id, header.producer_epoch, header.partition_leader_epoch)
        out += [(*r, *fields) for r in records]
    return out


def test_uncompressed_batches_come_back_byte_for_byte(tmp_path: Path) -> None:
    original = segment(CompressionType.NONE)
    summary = segment_to_parquet(original, "t", 3, tmp_path / "s.parquet")
    assert (summary.base_offset, summary.last_offset, summary.records) == (0, 99, 100)
    assert read_batches(tmp_path / "s.parquet", 0, 1 << 30) == original


@pytest.mark.parametrize(
    "codec",
    [CompressionType.GZIP, CompressionType.SNAPPY, CompressionType.LZ4, CompressionType.ZSTD],
)
def test_compressed_batches_keep_their_records_and_codec(
    tmp_path: Path, codec: CompressionType
) -> None:
    original = segment(codec)
    segment_to_parquet(original, "t", 0, tmp_path / "s.parquet")
    rebuilt = read_batches(tmp_path / "s.parquet", 0, 1 << 30)
    assert records_of(rebuilt) == records_of(original)
    assert {h.compression for _, h in iter_batch_headers(rebuilt)} == {codec}


def test_a_read_starts_with_the_batch_holding_the_offset_and_stops_near_max_bytes(
    tmp_path: Path,
) -> None:
    original = segment(CompressionType.NONE)
    segment_to_parquet(original, "t", 0, tmp_path / "s.parquet")
    one = read_batches(tmp_path / "s.parquet", 52, 1)  # at least one whole batch
    headers = [h for _, h in iter_batch_headers(one)]
    assert [(h.base_offset, h.last_offset) for h in headers] == [(50, 54)]
    assert read_batches(tmp_path / "s.parquet", 1_000, 1 << 20) == b""


def test_the_file_is_plain_parquet_with_sparks_kafka_columns(tmp_path: Path) -> None:
    segment_to_parquet(segment(CompressionType.ZSTD), "orders", 3, tmp_path / "s.parquet")
    table = pq.read_table(tmp_path / "s.parquet")
    assert table.column_names[:8] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert set(table.column("topic").to_pylist()) == {"orders"}
    assert set(table.column("partition").to_pylist()) == {3}
    assert table.column("offset").to_pylist() == list(range(100))
    assert table.column("headers").to_pylist()[1] == [
        {"key": "h", "value": b"1"},
        {"key": "ünï", "value": None},
    ]
    metadata = pq.ParquetFile(tmp_path / "s.parquet").metadata
    assert metadata.row_group(0).column(0).compression == "ZSTD"


def test_row_group_statistics_prune_offsets_and_timestamps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parquet_codec, "ROW_GROUP_ROWS_MAX", 10)
    segment_to_parquet(segment(CompressionType.NONE), "t", 0, tmp_path / "s.parquet")
    parquet = pq.ParquetFile(tmp_path / "s.parquet")
    assert parquet.num_row_groups == 10
    assert row_groups_from(parquet, "offset", 95) == [9]
    assert row_groups_from(parquet, "offset", 41) == [4, 5, 6, 7, 8, 9]
    assert first_offset_at_or_after(tmp_path / "s.parquet", 1_700_000_000_063) == 63
    assert first_offset_at_or_after(tmp_path / "s.parquet", 1_800_000_000_000) is None
    # a batch split across row groups still comes back whole
    original = segment(CompressionType.NONE, batches=10, per_batch=7)
    segment_to_parquet(original, "t", 0, tmp_path / "split.parquet")
    assert read_batches(tmp_path / "split.parquet", 0, 1 << 30) == original


def test_a_corrupt_batch_is_refused_naming_its_offset(tmp_path: Path) -> None:
    data = bytearray(segment(CompressionType.NONE))
    data[len(data) - 3] ^= 0xFF  # inside the last batch (offsets 95..99)
    with pytest.raises(CorruptRecordError, match="batch at offset 95"):
        segment_to_parquet(bytes(data), "t", 0, tmp_path / "s.parquet")
