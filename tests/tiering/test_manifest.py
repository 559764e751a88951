"""The manifest's lifecycle table, invariants and JSON form (pure: no store)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from riverbed.tiering.manifest import (
    Manifest,
    ManifestError,
    RemoteSegment,
    SegmentState,
    manifest_key,
    segment_key,
)


def segment(
    base: int, last: int, state: SegmentState = SegmentState.COPY_STARTED, epoch: int = 3
) -> RemoteSegment:
    return RemoteSegment(
        key=segment_key("t", 0, base, last, f"tag{base}-{epoch}"),
        base_offset=base,
        last_offset=last,
        size_bytes=1000,
        log_bytes=5000,
        records=last - base + 1,
        min_timestamp_ms=base,
        max_timestamp_ms=last,
        leader_epoch=epoch,
        state=state,
    )


def test_keys_sort_by_offset_and_version() -> None:
    assert segment_key("t", 0, 5, 9, "x") == (
        "t/0/segments/00000000000000000005-00000000000000000009-x.parquet"
    )
    keys = [manifest_key("t", 0, v) for v in (2, 10, 1)]
    assert sorted(keys) == [manifest_key("t", 0, v) for v in (1, 2, 10)]


def test_a_segment_goes_through_its_lifecycle_and_the_end_offset_follows() -> None:
    first = segment(0, 99)
    m = Manifest.empty("t", 0).with_copy_started(first)
    assert (m.end_offset, m.finished_end_offset, m.finished()) == (100, 0, [])
    assert m.segment_for(0) is None  # not readable until finished
    m = m.with_state([first.key], SegmentState.COPY_FINISHED)
    assert m.finished_end_offset == 100
    assert m.segment_for(42) == replace(first, state=SegmentState.COPY_FINISHED)
    second = segment(100, 199)
    m = m.with_copy_started(second).with_state([second.key], SegmentState.COPY_FINISHED)
    found = m.segment_for(150)
    assert found is not None and found.key == second.key
    assert m.segment_for(200) is None

    # retention: the log start moves first, then the segment is deleted and dropped
    m = m.with_log_start_offset(100).with_state([first.key], SegmentState.DELETE_STARTED)
    assert m.segment_for(50) is None and m.end_offset == 200
    m = m.without([first.key])
    assert [s.key for s in m.segments] == [second.key] and m.log_start_offset == 100


def test_retried_steps_are_no_ops() -> None:
    first = segment(0, 99)
    m = Manifest.empty("t", 0).with_copy_started(first)
    assert m.with_copy_started(first) == m
    done = m.with_state([first.key], SegmentState.COPY_FINISHED)
    assert done.with_state([first.key], SegmentState.COPY_FINISHED) == done


def test_a_failed_copy_cleaned_up_is_uploaded_again_from_the_same_offset() -> None:
    orphan = segment(0, 99)
    m = Manifest.empty("t", 0).with_copy_started(orphan)
    m = m.with_state([orphan.key], SegmentState.DELETE_STARTED).without([orphan.key])
    assert m.end_offset == 0
    redo = replace(segment(0, 99), key=segment_key("t", 0, 0, 99, "again"))
    assert m.with_copy_started(redo).end_offset == 100


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (SegmentState.COPY_FINISHED, SegmentState.COPY_STARTED),
        (SegmentState.DELETE_STARTED, SegmentState.COPY_FINISHED),
        (SegmentState.DELETE_STARTED, SegmentState.COPY_STARTED),
    ],
)
def test_transitions_outside_the_lifecycle_are_refused(
    start: SegmentState, to: SegmentState
) -> None:
    s = segment(0, 9, start)
    m = replace(Manifest.empty("t", 0), segments=(s,))
    with pytest.raises(ManifestError, match=f"{start.value} -> {to.value}"):
        m.with_state([s.key], to)


def test_only_deleting_segments_may_be_dropped() -> None:
    s = segment(0, 9, SegmentState.COPY_FINISHED)
    with pytest.raises(ManifestError, match="deleted while COPY_FINISHED"):
        replace(Manifest.empty("t", 0), segments=(s,)).without([s.key])


def test_overlaps_and_uploads_below_the_end_are_refused() -> None:
    m = Manifest.empty("t", 0).with_copy_started(segment(0, 99))
    with pytest.raises(ManifestError, match="below the remote log end 100"):
        m.with_copy_started(segment(50, 149))
    with pytest.raises(ManifestError, match="overlaps"):
        replace(m, segments=(segment(0, 99), segment(99, 120)))
    with pytest.raises(ManifestError, match=r"offsets 9\.\.3"):
        segment(9, 3)


def test_the_log_start_never_moves_back() -> None:
    m = Manifest.empty("t", 0).with_log_start_offset(10)
    assert m.with_log_start_offset(5).log_start_offset == 10


def test_json_round_trip_and_garbage() -> None:
    m = (
        Manifest.empty("t", 0)
        .with_copy_started(segment(0, 99))
        .with_state([segment(0, 99).key], SegmentState.COPY_FINISHED)
        .with_copy_started(segment(100, 149))
        .next_version(7)
    )
    assert Manifest.from_json(m.to_json(), "x") == m
    document = json.loads(m.to_json())
    assert document["segments"][0]["state"] == "COPY_FINISHED"  # readable without Riverbed
    with pytest.raises(ManifestError, match="x: not a manifest"):
        Manifest.from_json(b"{", "x")
    with pytest.raises(ManifestError, match="manifest format 2"):
        Manifest.from_json(json.dumps({**document, "format": 2}).encode(), "x")
    with pytest.raises(ManifestError, match="not a manifest"):
        Manifest.from_json(json.dumps({**document, "segments": [{"key": 1}]}).encode(), "x")
