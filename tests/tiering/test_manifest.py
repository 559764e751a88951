"""The manifest's lifecycle table, invariants and JSON form (pure: no store)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from riverbed.tiering.manifest import (
    CompactionGroup,
    Manifest,
    ManifestError,
    PendingCompaction,
    RemoteSegment,
    RetiredSegment,
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
    assert found is not None
    assert found.key == second.key
    assert m.segment_for(200) is None

    # retention: the log start moves first, then the segment is deleted and dropped
    m = m.with_log_start_offset(100).with_state([first.key], SegmentState.DELETE_STARTED)
    assert m.segment_for(50) is None
    assert m.end_offset == 200
    m = m.without([first.key])
    assert [s.key for s in m.segments] == [second.key]
    assert m.log_start_offset == 100


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


def test_a_copy_recorded_before_its_object_finishes_with_the_objects_facts() -> None:
    started = replace(
        segment(0, 99), size_bytes=0, records=0, min_timestamp_ms=0, max_timestamp_ms=0
    )
    after = segment(100, 199)
    m = Manifest.empty("t", 0).with_copy_started(started).with_copy_started(after)
    assert m.end_offset == 200
    assert m.finished() == []
    done = replace(segment(0, 99), state=SegmentState.COPY_FINISHED)
    finished = m.with_copy_finished(done)
    assert finished.finished() == [done]  # size, records and timestamps from the object
    assert finished.segments[1] == after  # the next copy, still started, untouched
    assert finished.with_copy_finished(done) == finished  # a retried step
    assert Manifest.from_json(finished.to_json(), "test") == finished
    with pytest.raises(ManifestError, match="finished without a COPY_STARTED"):
        m.with_copy_finished(replace(segment(200, 299), state=SegmentState.COPY_FINISHED))
    with pytest.raises(ManifestError, match=r"started as 0\.\.99, finished as 0\.\.98"):
        m.with_copy_finished(replace(done, last_offset=98))
    with pytest.raises(ManifestError, match="a copy finishes in COPY_FINISHED"):
        m.with_copy_finished(started)
    deleting = m.with_state([started.key], SegmentState.DELETE_STARTED)
    with pytest.raises(ManifestError, match="DELETE_STARTED -> COPY_FINISHED"):
        deleting.with_copy_finished(done)


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


# -- cold compaction --------------------------------------------------------------------------


def finished_run(*ranges: tuple[int, int]) -> Manifest:
    m = Manifest.empty("t", 0)
    for base, last in ranges:
        s = segment(base, last)
        m = m.with_copy_started(s).with_state([s.key], SegmentState.COPY_FINISHED)
    return m


def pending_of(m: Manifest, *groups: tuple[int, int], owner: str = "broker-1") -> PendingCompaction:
    """A compaction of the manifest's segments [first, end) slots per group."""
    planned = []
    for first, end in groups:
        run = m.segments[first:end]
        planned.append(
            CompactionGroup(
                replaces=tuple(s.key for s in run),
                output=segment_key("t", 0, run[0].base_offset, run[-1].last_offset, f"c{first}"),
                base_offset=run[0].base_offset,
                last_offset=run[-1].last_offset,
            )
        )
    return PendingCompaction("id1", owner, 3, 1_000, 0, tuple(planned))


def compacted_output(group: CompactionGroup, records: int) -> RemoteSegment:
    return replace(
        segment(group.base_offset, group.last_offset, SegmentState.COPY_FINISHED),
        key=group.output,
        records=records,
    )


def test_a_compaction_swaps_its_groups_in_one_version_and_retires_what_they_replace() -> None:
    m = finished_run((0, 99), (100, 199), (200, 299), (300, 399))
    pending = pending_of(m, (0, 2), (2, 3), (3, 4))
    claimed = m.with_compaction_claimed(pending)
    assert claimed.with_compaction_claimed(pending) == claimed  # a retried step
    assert claimed.finished() == m.finished()  # readers see nothing new until the swap
    assert set(pending.outputs()) <= claimed.referenced_keys()
    first, _unchanged, third = pending.groups
    written = {first.output: compacted_output(first, 7), third.output: compacted_output(third, 0)}
    swapped = claimed.with_compaction_swapped("id1", written, 400, now_ms=5_000)

    # One version: the first group's two segments and the third's one are replaced; the
    # second group (nothing in it changed) keeps its segment; the offsets covered are the same.
    assert [s.key for s in swapped.finished()] == [first.output, m.segments[2].key, third.output]
    assert (swapped.end_offset, swapped.finished_end_offset) == (m.end_offset, 400)
    assert [r.segment.key for r in swapped.retired] == [
        m.segments[0].key,
        m.segments[1].key,
        m.segments[3].key,
    ]
    assert all(r.retired_ms == 5_000 for r in swapped.retired)
    assert swapped.compaction is None
    assert swapped.compacted_end_offset == 400
    assert Manifest.from_json(swapped.to_json(), "x") == swapped
    # The swap cannot happen twice, nor after an abort.
    with pytest.raises(ManifestError, match="not pending"):
        swapped.with_compaction_swapped("id1", written, 400, now_ms=5_000)
    with pytest.raises(ManifestError, match="not pending"):
        claimed.with_compaction_aborted("id1").with_compaction_swapped("id1", {}, 400, 0)

    # Retired segments go through the end of the lifecycle.
    keys = [r.segment.key for r in swapped.retired]
    with pytest.raises(ManifestError, match="deleted while"):
        swapped.without_retired(keys)
    gone = swapped.with_retired_state(keys, SegmentState.DELETE_STARTED).without_retired(keys)
    assert gone.retired == ()
    assert gone.finished() == swapped.finished()


def test_one_compaction_at_a_time_and_never_over_changed_segments() -> None:
    m = finished_run((0, 99), (100, 199))
    claimed = m.with_compaction_claimed(pending_of(m, (0, 2)))
    other = replace(pending_of(m, (0, 1), owner="spark-app"), id="id2")
    with pytest.raises(ManifestError, match="compaction id1 of broker-1 is in progress"):
        claimed.with_compaction_claimed(other)
    # Retention deleted the first segment while the compaction ran: the swap is refused.
    first_key = m.segments[0].key
    trimmed = (
        claimed.with_log_start_offset(100)
        .with_state([first_key], SegmentState.DELETE_STARTED)
        .without([first_key])
    )
    (group,) = claimed.compaction.groups if claimed.compaction else ()
    with pytest.raises(ManifestError, match="no longer finished segments as planned"):
        trimmed.with_compaction_swapped("id1", {group.output: compacted_output(group, 1)}, 0, 0)
    # An output that does not cover its group's offsets is refused too.
    with pytest.raises(ManifestError, match="not the finished object of its group"):
        claimed.with_compaction_swapped(
            "id1", {group.output: replace(compacted_output(group, 1), last_offset=150)}, 0, 0
        )


def test_a_key_is_named_once_and_a_manifest_without_compaction_keeps_its_form() -> None:
    m = finished_run((0, 99))
    document = json.loads(m.to_json())
    assert set(document) == {
        "format",
        "topic",
        "partition",
        "version",
        "leader_epoch",
        "log_start_offset",
        "segments",
    }
    retired = RetiredSegment(m.segments[0], 1)
    with pytest.raises(ManifestError, match="named twice"):
        replace(m, retired=(retired,))
