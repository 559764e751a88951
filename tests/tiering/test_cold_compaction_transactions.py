"""Cold compaction and transactions: an aborted record never decides which record of its key
survives (Kafka's cleaner rule), so compaction cannot take a committed value away from
read_committed readers."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from riverbed.protocol.control_records import ControlType, encode_marker_batch
from riverbed.protocol.records import assign_offsets, encode_batch, validate_replicated_records
from riverbed.tiering.cold_compaction import KeepRule, keep_mask, map_rows
from riverbed.tiering.parquet_codec import segment_to_parquet
from riverbed.tiering.txn_ranges import AbortedRange, resolve

PRODUCER = 9


def rows_of(tmp_path: Path) -> tuple[pa.Table, tuple[AbortedRange, ...]]:
    """Offset 0: key k committed (a plain record); 1: key k in a transaction of PRODUCER;
    2: its ABORT marker; 3: key j, plain. Converted as the offloader converts a segment."""
    batches = [
        encode_batch([(b"k", b"committed", (), 1000)]),
        encode_batch(
            [(b"k", b"aborted", (), 1000)],
            producer_id=PRODUCER,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        ),
        encode_marker_batch(PRODUCER, 0, ControlType.ABORT, 0, 1000),
        encode_batch([(b"j", b"plain", (), 1000)]),
    ]
    log = bytearray(b"".join(batches))
    view = memoryview(log)
    assign_offsets(view, validate_replicated_records(view), 0, 0)
    path = tmp_path / "segment.parquet"
    summary = segment_to_parquet(bytes(log), "t", 0, path)
    aborted = resolve([(0, summary.transactions)]).aborted
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in aborted] == [(PRODUCER, 1, 2)]
    return pq.read_table(path), aborted


def latest_offsets(keys: pa.Array, offsets: pa.Array) -> dict[bytes, int]:
    latest: dict[bytes, int] = {}
    for key, offset in zip(keys.to_pylist(), offsets.to_pylist(), strict=True):
        latest[key] = max(offset, latest.get(key, -1))
    return latest


def test_an_aborted_record_stays_out_of_the_offset_map(tmp_path: Path) -> None:
    rows, aborted = rows_of(tmp_path)
    assert latest_offsets(*map_rows(rows, 0, aborted)) == {b"k": 0, b"j": 3}
    # Without the transactions the aborted record would win key k, as the map did before.
    assert latest_offsets(*map_rows(rows, 0)) == {b"k": 1, b"j": 3}


def test_the_committed_value_survives_compaction(tmp_path: Path) -> None:
    rows, aborted = rows_of(tmp_path)
    latest = latest_offsets(*map_rows(rows, 0, aborted))
    looked_up = pa.array([latest.get(key) for key in rows.column("key").to_pylist()], pa.int64())
    kept = rows.filter(keep_mask(rows, looked_up, KeepRule(delete_horizon_ms=0, map_end_offset=4)))
    values = dict(
        zip(kept.column("offset").to_pylist(), kept.column("value").to_pylist(), strict=True)
    )
    assert values[0] == b"committed"
    # The aborted record and the marker stay too: read_committed readers skip them by the
    # object's aborted ranges, read_uncommitted readers see what the hot log showed.
    assert set(values) == {0, 1, 2, 3}
    assert pc.sum(pc.is_null(kept.column("key"))).as_py() == 0
