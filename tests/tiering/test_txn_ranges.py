"""Transactions in tiered objects: what conversion records, and the walk that resolves it."""

from __future__ import annotations

import itertools
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.protocol.control_records import ControlType, encode_marker_batch
from riverbed.protocol.records import assign_offsets, encode_batch, validate_replicated_records
from riverbed.tiering.manifest import Manifest, RemoteSegment, SegmentState
from riverbed.tiering.parquet_codec import read_batches, segment_to_parquet
from riverbed.tiering.txn_ranges import (
    AbortedRange,
    EndedTxn,
    LastMarker,
    ObjectTransactions,
    OpenTxn,
    TxnScanner,
    merged,
    overlapping,
    resolve,
)

# One event per offset: (producer id, "data" | "commit" | "abort" | "plain").
Event = tuple[int, str]


def log_bytes(events: list[Event], base_offset: int = 0) -> bytes:
    """A segment holding one batch per event, at consecutive offsets from `base_offset`."""
    out = bytearray()
    for index, (producer_id, kind) in enumerate(events):
        if kind in ("commit", "abort"):
            control = ControlType.COMMIT if kind == "commit" else ControlType.ABORT
            batch = encode_marker_batch(producer_id, 0, control, 1, 1000)
        elif kind == "data":
            batch = encode_batch(
                [(b"k", b"v", (), 1000)],
                producer_id=producer_id,
                producer_epoch=0,
                base_sequence=index,
                is_transactional=True,
            )
        else:
            batch = encode_batch([(b"k", b"v", (), 1000)])
        out += batch
    view = memoryview(out)
    assign_offsets(view, validate_replicated_records(view), base_offset, 0)
    return bytes(out)


def replay(events: list[Event]) -> tuple[set[AbortedRange], tuple[OpenTxn, ...]]:
    """The slow way, over the whole log: each aborted transaction (from its first record, or
    its marker without one, to its marker) and the transactions open at the end."""
    pending: dict[int, int] = {}  # producer id -> its open transaction's first offset
    aborted: set[AbortedRange] = set()
    for offset, (producer_id, kind) in enumerate(events):
        if kind == "data":
            pending.setdefault(producer_id, offset)
        elif kind in ("commit", "abort"):
            first = pending.pop(producer_id, offset)
            if kind == "abort":
                aborted.add(AbortedRange(producer_id, first, offset))
    return aborted, tuple(sorted((OpenTxn(p, f) for p, f in pending.items()), key=lambda o: o[1]))


def aborted_by_replay(events: list[Event]) -> set[int]:
    """The offsets of aborted records: a transaction's records are aborted when its
    producer's next marker is an ABORT."""
    return covered(tuple(replay(events)[0]), events)


def covered(aborted: tuple[AbortedRange, ...], events: list[Event]) -> set[int]:
    return {
        offset
        for offset, (producer_id, kind) in enumerate(events)
        if kind == "data"
        and any(
            a.producer_id == producer_id and a.first_offset <= offset <= a.last_offset
            for a in aborted
        )
    }


def test_conversion_records_aborts_and_edges(tmp_path: Path) -> None:
    events: list[Event] = [
        (7, "data"),  # 0: 7 starts, commits at 3
        (8, "data"),  # 1: 8 starts, aborts at 4
        (9, "data"),  # 2: 9 starts, still open at the end
        (7, "commit"),
        (8, "abort"),
        (0, "plain"),
    ]
    summary = segment_to_parquet(log_bytes(events), "t", 0, tmp_path / "s.parquet")
    # Each producer's first marker is an edge: its records before it might continue a
    # transaction an older object began. Alone, the object resolves them as starting here.
    assert summary.transactions == ObjectTransactions(
        aborted=(),
        ended=(EndedTxn(7, 3, False, 0), EndedTxn(8, 4, True, 1)),
        last_markers=(LastMarker(7, 3), LastMarker(8, 4)),
        open=(OpenTxn(9, 2),),
    )
    assert resolve([(0, summary.transactions)]).aborted == (AbortedRange(8, 1, 4),)
    # The markers are rows of the object and come back as the same batches.
    assert read_batches(tmp_path / "s.parquet", 0, 1 << 20) == log_bytes(events)


def test_a_marker_of_an_older_object_is_an_ended_edge(tmp_path: Path) -> None:
    events: list[Event] = [(5, "abort"), (5, "data"), (6, "commit")]
    summary = segment_to_parquet(log_bytes(events, 100), "t", 0, tmp_path / "s.parquet")
    assert summary.transactions == ObjectTransactions(
        aborted=(),
        ended=(EndedTxn(5, 100, True, None), EndedTxn(6, 102, False, None)),
        last_markers=(LastMarker(5, 100), LastMarker(6, 102)),
        open=(OpenTxn(5, 101),),
    )


def test_a_transaction_continued_from_an_older_object_starts_there(tmp_path: Path) -> None:
    """The object holding an aborted transaction's last records and marker cannot tell alone
    that it began in an older object; the walk over both can, and the range covers it all."""
    older = [(3, "data"), (3, "commit"), (3, "data"), (3, "data")]  # 2..: open at its end
    newer = [(3, "data"), (3, "abort"), (3, "data"), (3, "abort")]  # 4..5: continues, aborts
    summaries = [
        segment_to_parquet(log_bytes(events, base), "t", 0, tmp_path / f"{base}.parquet")
        for base, events in ((0, older), (4, newer))
    ]
    assert summaries[1].transactions.ended == (EndedTxn(3, 5, True, 4),)
    resolved = resolve([(0, summaries[0].transactions), (4, summaries[1].transactions)])
    assert resolved.aborted == (AbortedRange(3, 2, 5), AbortedRange(3, 6, 7))
    assert resolved.open == ()


def test_the_manifest_keeps_an_objects_transactions() -> None:
    txns = ObjectTransactions(
        (AbortedRange(1, 2, 3),),
        (EndedTxn(4, 5, False, None), EndedTxn(8, 9, True, 8)),
        (LastMarker(4, 5), LastMarker(8, 9)),
        (OpenTxn(6, 7),),
    )
    segment = RemoteSegment("k", 0, 9, 10, 10, 1, 0, 0, 0, SegmentState.COPY_FINISHED, txns)
    manifest = Manifest("t", 0, 1, 0, 0, (segment,))
    assert Manifest.from_json(manifest.to_json(), "test").segments[0].transactions == txns
    # Objects without transactions write nothing for them (older manifests read the same).
    plain = Manifest(
        "t", 0, 1, 0, 0, (RemoteSegment("k", 0, 9, 10, 10, 1, 0, 0, 0, SegmentState.COPY_FINISHED),)
    )
    assert b"transactions" not in plain.to_json()


def test_overlapping_is_kafkas_collect_aborted_txns() -> None:
    aborted = [AbortedRange(1, 0, 10), AbortedRange(2, 5, 6), AbortedRange(3, 20, 30)]
    assert overlapping(aborted, 7, 20) == [AbortedRange(1, 0, 10)]
    assert overlapping(aborted, 6, 21) == aborted


KINDS = st.sampled_from(["data", "data", "data", "commit", "abort", "plain"])


@settings(max_examples=200, deadline=None)
@given(
    events=st.lists(st.tuples(st.integers(1, 3), KINDS), max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=4),
)
def test_resolving_split_objects_finds_every_aborted_record(
    events: list[Event], cuts: list[int]
) -> None:
    """However a log is split into objects, each scanned alone, the walk over them from the
    log's start finds exactly the aborted transactions, each from its first record (as the hot
    log's transaction index has them), and leaves open exactly what has no marker yet; merging
    the objects first, or any run of them, changes nothing."""
    bounds = sorted({0, *(c for c in cuts if c < len(events)), len(events)})
    objects = []
    for start, end in itertools.pairwise(bounds):
        scanner = TxnScanner()
        for offset in range(start, end):
            producer_id, kind = events[offset]
            if kind == "data":
                scanner.data(producer_id, offset)
            elif kind in ("commit", "abort"):
                control = ControlType.COMMIT if kind == "commit" else ControlType.ABORT
                scanner.marker(producer_id, offset, control)
        objects.append((start, scanner.result()))
    resolved = resolve(objects)
    expected_aborted, expected_open = replay(events)
    assert set(resolved.aborted) == expected_aborted
    assert len(resolved.aborted) == len(expected_aborted)
    assert resolved.open == expected_open
    if objects:
        whole = resolve([(0, merged(objects))])
        assert whole == resolved
        # A cold compaction merges a run of objects in the middle of the walk.
        middle = len(objects) // 2
        regrouped = [*objects[:middle], (objects[middle][0], merged(objects[middle:]))]
        assert resolve(regrouped) == resolved
