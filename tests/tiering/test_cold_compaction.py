"""Cold compaction's parts, pure (riverbed.tiering.cold_compaction): the offset map against a
dict and its memory bound, the plan (cleanable range, groups, dirty ratio), and a group's
objects rewritten: kept rows exactly, thinned batches rebuilt into valid Kafka batches whose
recorded size is what a cold read sends, control batches whole, and a group left with no row."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.configs import MAP_ENTRY_OVERHEAD_BYTES, BrokerConfig, topic_config
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import (
    batch_crc_ok,
    decode_batch,
    encode_batch,
    iter_batch_headers,
    parse_batch_header,
)
from riverbed.tiering.cold_compaction import (
    ColdOffsetMap,
    KeepRule,
    compacted_segment,
    plan_cold_compaction,
    rewrite_group,
)
from riverbed.tiering.manifest import Manifest, RemoteSegment, SegmentState, segment_key
from riverbed.tiering.parquet_codec import read_batches, segment_to_parquet

from tests.tiering.test_parquet_codec import control_batch

NOW_MS = 10_000_000
HORIZON_MS = NOW_MS - 100_000
BROKER = BrokerConfig.from_mapping({"zookeeper.connect": "127.0.0.1:1"})


def no_pace(_size: int) -> None:
    pass


# -- the offset map ---------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.sampled_from([b"a", b"bb", b"ccc", b"d" * 20, b"e" * 7]), max_size=60),
    chunk=st.integers(1, 9),
    capacity_keys=st.integers(1, 6),
    start=st.integers(0, 5),
)
def test_the_offset_map_holds_the_latest_offset_of_each_key_up_to_where_it_filled(
    keys: list[bytes], chunk: int, capacity_keys: int, start: int
) -> None:
    capacity = capacity_keys * (MAP_ENTRY_OVERHEAD_BYTES + 20)
    offsets = ColdOffsetMap(capacity, start)
    rows = list(enumerate(keys, start))
    for first in range(0, len(rows), chunk):
        part = rows[first : first + chunk]
        end = part[-1][0] + 1
        taken = offsets.add(
            pa.array([k for _, k in part], pa.binary()), pa.array([o for o, _ in part]), end
        )
        if not taken:
            break
    offsets.finish()
    end = offsets.end_offset
    # The map covers [start, end): every key seen there, with its latest offset there.
    model: dict[bytes, int] = {}
    for offset, key in rows:
        if offset < end:
            model[key] = offset
    looked_up = offsets.latest(pa.array([*model, b"never"], pa.binary())).to_pylist()
    assert looked_up == [*model.values(), None]
    assert len(offsets) == len(model)
    assert offsets.size_bytes == sum(len(k) + MAP_ENTRY_OVERHEAD_BYTES for k in model)
    assert offsets.size_bytes <= capacity
    if offsets.full:
        # It stopped at the first offset of the first key that did not fit.
        stopped = dict(rows)[end]
        assert stopped not in model
        assert offsets.size_bytes + len(stopped) + MAP_ENTRY_OVERHEAD_BYTES > capacity
    else:
        assert end == (rows[-1][0] + 1 if rows else start)


def test_an_offset_map_that_cannot_hold_one_key_is_an_error() -> None:
    offsets = ColdOffsetMap(10, 0)
    offsets.add(pa.array([b"key"]), pa.array([0]), 1)
    with pytest.raises(ValueError, match="cannot hold a single key"):
        offsets.finish()


def test_the_map_of_100k_keys_stays_below_its_bound_in_real_memory() -> None:
    """The bound is an estimate (key + MAP_ENTRY_OVERHEAD_BYTES per entry, as on the hot tier):
    the Arrow arrays really allocated while building it stay well under it."""
    keys = [b"key-%06d" % (i % 100_000) for i in range(1_000_000)]
    capacity = 100_000 * (10 + MAP_ENTRY_OVERHEAD_BYTES)
    before = pa.total_allocated_bytes()
    offsets = ColdOffsetMap(capacity, 0)
    peak = 0
    for first in range(0, len(keys), 100_000):
        offsets.add(
            pa.array(keys[first : first + 100_000], pa.binary()),
            pa.array(range(first, first + 100_000), pa.int64()),
            first + 100_000,
        )
        peak = max(peak, pa.total_allocated_bytes() - before)
    offsets.finish()
    assert not offsets.full
    assert len(offsets) == 100_000
    assert peak < capacity / 2, (peak, capacity)


# -- the plan ---------------------------------------------------------------------------------


def remote(
    base: int, last: int, log_bytes: int = 400, max_ts: int = NOW_MS - 1_000
) -> RemoteSegment:
    return RemoteSegment(
        key=segment_key("t", 0, base, last, f"s{base}"),
        base_offset=base,
        last_offset=last,
        size_bytes=100,
        log_bytes=log_bytes,
        records=last - base + 1,
        min_timestamp_ms=0,
        max_timestamp_ms=max_ts,
        leader_epoch=1,
        state=SegmentState.COPY_FINISHED,
    )


def test_the_plan_covers_the_cleanable_range_in_groups_and_measures_what_is_dirty() -> None:
    config = topic_config(
        BROKER,
        {"cleanup.policy": "compact", "segment.bytes": "1000", "min.compaction.lag.ms": "50"},
    )
    segments = (
        remote(0, 9),
        remote(10, 19),
        remote(20, 29),
        remote(30, 39, log_bytes=900),
        remote(40, 49, max_ts=NOW_MS - 10),  # too young: ends the cleanable range
        remote(50, 59),
    )
    manifest = replace(Manifest.empty("t", 0), segments=segments, compacted_end_offset=20)
    plan = plan_cold_compaction(manifest, config, NOW_MS)
    assert plan is not None
    assert [[s.base_offset for s in group] for group in plan.groups] == [[0, 10], [20], [30]]
    assert plan.end_offset == 40
    assert plan.cold_end_offset == 60
    # The map reads every segment from the first dirty offset on, the young ones too.
    assert [s.base_offset for s in plan.map_segments] == [20, 30, 40, 50]
    assert (plan.first_dirty_offset, plan.dirty_bytes, plan.log_bytes) == (20, 1300, 2100)
    assert plan.due  # 1300 / 2100 >= 0.5
    # Nothing dirty: no plan. Below the log start: not cleaned.
    assert plan_cold_compaction(replace(manifest, compacted_end_offset=40), config, NOW_MS) is None
    trimmed = plan_cold_compaction(replace(manifest, log_start_offset=15), config, NOW_MS)
    assert trimmed is not None
    assert trimmed.groups[0][0].base_offset == 10
    strict = replace(config, min_cleanable_dirty_ratio=0.9)
    strict_plan = plan_cold_compaction(manifest, strict, NOW_MS)
    assert strict_plan is not None
    assert not strict_plan.due


# -- rewriting a group ------------------------------------------------------------------------


def segment_file(tmp_path: Path, name: str, batches: list[bytes]) -> pq.ParquetFile:
    path = tmp_path / f"{name}.parquet"
    segment_to_parquet(b"".join(batches), "t", 0, path)
    return pq.ParquetFile(path)


def with_offset(batch: bytes, base_offset: int) -> bytes:
    out = bytearray(batch)
    out[0:8] = base_offset.to_bytes(8, "big")
    return bytes(out)


@pytest.mark.parametrize(
    "codec", [CompressionType.NONE, CompressionType.ZSTD, CompressionType.GZIP]
)
def test_a_rewritten_group_keeps_exactly_the_rows_that_stay_in_valid_batches(
    tmp_path: Path, codec: CompressionType
) -> None:
    old = NOW_MS - 200_000
    first = with_offset(
        encode_batch(
            [
                (b"a", b"1", (), NOW_MS),
                (b"b", b"2", (("h", b"v"),), NOW_MS),
                (None, b"x", (), NOW_MS),
            ],
            compression=codec,
            producer_id=7,
            producer_epoch=2,
            base_sequence=40,
        ),
        0,
    )
    second = with_offset(
        encode_batch(
            [(b"a", b"3", (), NOW_MS), (b"c", None, (), old), (b"d", None, (), NOW_MS)],
            compression=codec,
        ),
        3,
    )
    third = with_offset(encode_batch([(b"b", b"4", (), NOW_MS)], compression=codec), 6)
    sources = [
        segment_file(tmp_path, "one", [first, second]),
        segment_file(tmp_path, "two", [third]),
    ]
    # "a" and "b" were written again later (offsets 3 and 6, and 9 for "b" in the hot tier).
    latest = {b"a": 3, b"b": 9, b"c": 4, b"d": 5}

    def latest_for(rows: pa.Table) -> pa.Array:
        return pa.array([latest.get(k) for k in rows.column("key").to_pylist()], pa.int64())

    out = tmp_path / "out.parquet"
    rewrite = rewrite_group(sources, latest_for, KeepRule(HORIZON_MS, 10), out, no_pace)
    assert (rewrite.rows_in, rewrite.rows_out, rewrite.changed) == (7, 2, True)

    data = read_batches(out, 0, 1 << 20)
    batches = list(iter_batch_headers(data))
    # The first and third batches lost every record and are gone; the second kept "a" at 3 and
    # the young tombstone of "d" at 5; the keyless record, "b" (written again) and the expired
    # tombstone of "c" went.
    assert [h.base_offset for _, h in batches] == [3]
    position, header = batches[0]
    assert (header.last_offset_delta, header.records_count) == (2, 2)
    assert batch_crc_ok(data, position, header)
    assert parse_batch_header(second).base_timestamp == header.base_timestamp
    records = decode_batch(TopicPartition("k", 0), data, position, header)
    assert [(r.offset, r.key, r.value) for r in records] == [(3, b"a", b"3"), (5, b"d", None)]
    # What the object records as the batch's size is what a cold read sends.
    table = pq.read_table(out)
    assert set(table.column("batch_size_bytes").to_pylist()) == {header.size_bytes}
    assert rewrite.log_bytes == header.size_bytes
    group = (remote(0, 5), remote(6, 6))
    entry = compacted_segment(group, rewrite, "k", out.stat().st_size, 3)
    assert (entry.base_offset, entry.last_offset, entry.records, entry.log_bytes) == (
        0,
        6,
        2,
        header.size_bytes,
    )


def test_a_batch_left_whole_is_rebuilt_byte_for_byte_and_a_group_with_nothing_to_drop_is_unchanged(
    tmp_path: Path,
) -> None:
    batch = with_offset(encode_batch([(b"a", b"1", (), NOW_MS), (b"b", b"2", (), NOW_MS)]), 0)
    sources = [segment_file(tmp_path, "one", [batch])]
    out = tmp_path / "out.parquet"
    rewrite = rewrite_group(
        sources,
        lambda rows: pa.nulls(rows.num_rows, pa.int64()),
        KeepRule(HORIZON_MS, 2),
        out,
        no_pace,
    )
    assert not rewrite.changed
    assert read_batches(out, 0, 1 << 20) == batch


def test_control_batches_stay_whole_and_a_group_with_no_row_left_is_an_empty_object(
    tmp_path: Path,
) -> None:
    control = control_batch(1, commit=True)
    data_batch = with_offset(encode_batch([(b"a", b"1", (), NOW_MS)]), 0)
    sources = [segment_file(tmp_path, "one", [data_batch, control])]
    out = tmp_path / "out.parquet"

    def everything_superseded(rows: pa.Table) -> pa.Array:
        return pa.array([100] * rows.num_rows, pa.int64())

    rewrite = rewrite_group(sources, everything_superseded, KeepRule(HORIZON_MS, 100), out, no_pace)
    assert read_batches(out, 0, 1 << 20) == control
    assert rewrite.rows_out == 1

    only_data = [segment_file(tmp_path, "two", [data_batch])]
    empty = tmp_path / "empty.parquet"
    rewrite = rewrite_group(
        only_data, everything_superseded, KeepRule(HORIZON_MS, 100), empty, no_pace
    )
    assert rewrite.rows_out == 0
    assert pq.read_table(empty).num_rows == 0
    assert read_batches(empty, 0, 1 << 20) == b""
    entry = compacted_segment((remote(0, 0, max_ts=123),), rewrite, "k", 1, 3)
    assert (entry.records, entry.log_bytes, entry.min_timestamp_ms, entry.max_timestamp_ms) == (
        0,
        0,
        123,
        123,
    )


# -- deletion retention does not apply to compacted topics ---------------------------------


@pytest.mark.parametrize(("policy", "kept"), [("compact", True), ("compact,delete", False)])
async def test_total_retention_leaves_the_cold_tier_of_a_compact_only_topic_alone(
    tmp_path: Path, policy: str, kept: bool
) -> None:
    from tests.tiering.cold_harness import Model, TieredPartition

    overrides = {"cleanup.policy": policy, "retention.ms": "1000", "local.retention.bytes": "1"}
    tiered = await TieredPartition.open(tmp_path, topic_overrides=overrides)
    try:
        model = Model()
        old = NOW_MS - 10_000  # older than retention.ms
        for i in range(20):
            tiered.write(model, [(b"k%d" % i, b"v" * 50, old)], CompressionType.NONE)
        tiered.seal(model)
        await tiered.tier()
        await tiered.tier()
        first = (await tiered.read_from(0))[0].offset if kept else None
        assert (tiered.manifest().log_start_offset == 0) is kept
        assert first == (0 if kept else None)
    finally:
        await tiered.close()
