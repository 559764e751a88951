"""Compaction on the hot tier: the batch rule (riverbed.hot.storage.compaction), the cleanable range
(plan_cleaning), and whole passes of the cleaner over real PartitionLogs on disk, checked by
hypothesis against a model: for any sequence of keyed writes and tombstones, the compacted log
keeps exactly the latest record of each key (minus tombstones past delete.retention.ms), with
the offsets and bytes they were written with, and every position a consumer held stays
readable."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from riverbed.configs import BrokerConfig, TopicConfig, topic_config
from riverbed.hot.storage.cleaner import CleanablePlan, CleanerSettings, clean_log, plan_cleaning
from riverbed.hot.storage.cleaner_swap import load_first_dirty_offset
from riverbed.hot.storage.compaction import OffsetMap, thin_batch
from riverbed.hot.storage.log import LogConfig, PartitionLog, SegmentStats
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.record_types import Record, TopicPartition
from riverbed.protocol.records import (
    encode_batch,
    iter_batch_headers,
    parse_batch_header,
    validate_records,
)

from tests.support.batches import records_in

NOW_MS = 10_000_000
DELETE_RETENTION_MS = 100_000
BROKER = BrokerConfig.from_mapping({"zookeeper.connect": "127.0.0.1:1"})
UNLIMITED = CleanerSettings(dedupe_buffer_bytes=64 << 20, io_max_bytes_per_second=1e300)
TP = TopicPartition("compacted", 0)


def compacted(**overrides: str) -> TopicConfig:
    return topic_config(
        BROKER,
        {
            "cleanup.policy": "compact",
            "segment.bytes": "600",
            "delete.retention.ms": str(DELETE_RETENTION_MS),
            **overrides,
        },
    )


KeyedRecord = tuple[bytes | None, bytes | None, int]  # key, value (None: tombstone), timestamp


def keyed_batch(
    records: list[KeyedRecord], compression: CompressionType = CompressionType.NONE
) -> bytes:
    return encode_batch([(k, v, (), ts) for k, v, ts in records], compression=compression)


# -- the batch rule ---------------------------------------------------------------------------


def offsets_of(batch: bytes) -> list[int]:
    return [record.offset for record in records_in(TP, batch)]


@pytest.mark.parametrize("codec", list(CompressionType))
def test_a_thinned_batch_keeps_its_header_offsets_and_record_bytes(codec: CompressionType) -> None:
    original = keyed_batch(
        [(b"a", b"1", 100), (b"b", b"2", 101), (b"a", b"3", 102), (b"c", b"4", 103)], codec
    )
    offsets = OffsetMap(1 << 20)
    for key, offset in ((b"a", 2), (b"b", 1), (b"c", 3)):
        offsets.add(key, offset)
    header = parse_batch_header(original)
    thinned = thin_batch(original, header, offsets, delete_horizon_ms=0)
    assert thinned.batch is not None
    assert (thinned.records_in, thinned.records_out) == (4, 3)
    new_header = parse_batch_header(thinned.batch)
    records = records_in(TP, thinned.batch)  # checks the new CRC
    assert [(r.offset, r.key, r.value, r.timestamp_ms) for r in records] == [
        (1, b"b", b"2", 101),
        (2, b"a", b"3", 102),
        (3, b"c", b"4", 103),
    ]
    assert new_header.records_count == 3
    assert (new_header.base_offset, new_header.last_offset_delta) == (0, 3)
    assert (new_header.base_timestamp, new_header.max_timestamp) == (100, 103)
    assert new_header.compression == codec


def test_a_batch_all_of_whose_records_stay_is_returned_as_it_is_and_one_with_none_is_dropped() -> (
    None
):
    batch = keyed_batch([(b"a", b"1", 1), (b"b", b"2", 2)])
    header = parse_batch_header(batch)
    offsets = OffsetMap(1 << 20)
    assert thin_batch(batch, header, offsets, 0).batch is batch
    offsets.add(b"a", 5)
    offsets.add(b"b", 6)
    assert thin_batch(batch, header, offsets, 0).batch is None


def test_tombstones_go_only_past_the_delete_horizon_and_records_without_keys_always_go() -> None:
    batch = keyed_batch([(b"a", None, 1_000), (None, b"x", 1_000), (b"b", b"2", 1_000)])
    header = parse_batch_header(batch)
    offsets = OffsetMap(1 << 20)
    offsets.end_offset = 3
    kept = thin_batch(batch, header, offsets, delete_horizon_ms=1_000).batch
    assert kept is not None
    assert offsets_of(kept) == [0, 2]
    expired = thin_batch(batch, header, offsets, delete_horizon_ms=1_001).batch
    assert expired is not None
    assert offsets_of(expired) == [2]
    # Past what the map covered, an older record of the key may still be there: it stays.
    offsets.end_offset = 0
    uncovered = thin_batch(batch, header, offsets, delete_horizon_ms=1_001).batch
    assert uncovered is not None
    assert offsets_of(uncovered) == [0, 2]


def test_the_offset_map_refuses_new_keys_past_its_capacity_but_updates_known_ones() -> None:
    offsets = OffsetMap(capacity_bytes=300)
    assert offsets.add(b"a", 1)
    assert offsets.add(b"b", 2)
    assert not offsets.add(b"c", 3)
    assert offsets.add(b"a", 4)
    assert (offsets.latest(b"a"), offsets.latest(b"c"), len(offsets)) == (4, -1, 2)


# -- the cleanable range ----------------------------------------------------------------------


def stats(*spec: tuple[int, int, int]) -> list[SegmentStats]:
    """(base offset, size bytes, max timestamp) per segment, the last one active."""
    return [
        SegmentStats(
            base, spec[i + 1][0] if i + 1 < len(spec) else base + 10, size, ts, i + 1 < len(spec)
        )
        for i, (base, size, ts) in enumerate(spec)
    ]


LOG = stats((0, 100, 1_000), (10, 100, 2_000), (20, 100, 3_000), (30, 100, 9_000), (40, 50, 9_500))


def plan(
    first_dirty: int, hw: int = 10**9, now_ms: int = 10_000, config: dict[str, str] | None = None
) -> CleanablePlan | None:
    return plan_cleaning(
        LOG,
        first_dirty_offset=first_dirty,
        high_watermark=hw,
        now_ms=now_ms,
        config=compacted(**(config or {})),
    )


def test_the_range_ends_at_the_active_segment_the_high_watermark_and_the_compaction_lag() -> None:
    whole = plan(0)
    assert whole is not None
    assert (whole.end_offset, whole.dirty_ratio, whole.due) == (40, 1.0, True)
    below_hw = plan(0, hw=25)
    assert below_hw is not None
    assert below_hw.end_offset == 20
    lagged = plan(0, config={"min.compaction.lag.ms": "5000"})  # the segment at 30 is 1 s old
    assert lagged is not None
    assert lagged.end_offset == 30


def test_a_pass_is_due_from_the_dirty_ratio_or_once_the_oldest_dirty_segment_is_too_old() -> None:
    quarter = plan(30)  # 100 dirty of 400 bytes
    assert quarter is not None
    assert (quarter.dirty_ratio, quarter.due) == (0.25, False)
    by_ratio = plan(30, config={"min.cleanable.dirty.ratio": "0.2"})
    assert by_ratio is not None
    assert by_ratio.due
    by_age = plan(30, config={"max.compaction.lag.ms": "500"})
    assert by_age is not None
    assert by_age.due
    assert plan(40) is None  # nothing dirty below the active segment


# -- whole passes over real logs, against a model ---------------------------------------------


class Model:
    """Every record written (and not truncated away), by offset; what a compacted log must
    hold."""

    def __init__(self) -> None:
        self.records: dict[int, KeyedRecord] = {}

    def latest(self, delete_horizon_ms: int) -> dict[int, KeyedRecord]:
        """The latest record of each key, by offset, minus tombstones older than the horizon."""
        last: dict[bytes, int] = {}
        for offset, (key, _, _) in sorted(self.records.items()):
            if key is not None:
                last[key] = offset
        return {
            offset: self.records[offset]
            for offset in sorted(last.values())
            if not (self.records[offset][1] is None and self.records[offset][2] < delete_horizon_ms)
        }

    def folded(self) -> dict[bytes, bytes]:
        return fold(self.records)


def fold(records: dict[int, KeyedRecord]) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for _, (key, value, _) in sorted(records.items()):
        if key is None:
            continue
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def open_log(directory: Path) -> PartitionLog:
    """Opened as a broker opens it: with recovery, and everything in it committed (the broker
    restores the high watermark from its checkpoint)."""
    config = LogConfig(segment_bytes=600, index_interval_bytes=100)
    log = PartitionLog.open(directory, TP, config, recovery_point=None, now_ms=lambda: NOW_MS)
    log.update_high_watermark(log.log_end_offset)
    return log


def write(
    log: PartitionLog, model: Model, records: list[KeyedRecord], codec: CompressionType
) -> None:
    buf = memoryview(bytearray(keyed_batch(records, codec)))
    result = log.append(buf, validate_records(buf, 1 << 20), leader_epoch=1)
    for offset, record in zip(
        range(result.first_offset, result.last_offset + 1), records, strict=True
    ):
        model.records[offset] = record
    log.update_high_watermark(log.log_end_offset)


def read_all(log: PartitionLog, start: int | None = None) -> list[Record]:
    """Every record from `start` (the log start) to the end, as a consumer reads them."""
    offset = log.log_start_offset if start is None else start
    records: list[Record] = []
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20, log.log_end_offset)
        if result is None:
            break
        region = result.region
        try:
            data = os.pread(region.fd, region.size, region.position)
        finally:
            region.close()
        last_offsets = [h.last_offset for _, h in iter_batch_headers(data)]
        records += [r for r in records_in(log.tp, data) if r.offset >= offset]
        offset = last_offsets[-1] + 1
    return records


def as_model(records: list[Record]) -> dict[int, KeyedRecord]:
    return {r.offset: (r.key, r.value, r.timestamp_ms) for r in records}


def seal_everything(log: PartitionLog, model: Model) -> None:
    """A record big enough to roll the log: everything before it becomes cleanable."""
    write(log, model, [(b"~seal", b"x" * 700, NOW_MS)], CompressionType.NONE)


RECORD = st.tuples(
    st.sampled_from([b"k0", b"k1", b"k2", b"k3", b"k4", b"k5", None]),
    st.one_of(st.none(), st.binary(min_size=1, max_size=40)),
    # Timestamps on both sides of the delete horizon (NOW_MS - DELETE_RETENTION_MS).
    st.sampled_from([NOW_MS - 2 * DELETE_RETENTION_MS, NOW_MS - 1_000]),
)
STEP: st.SearchStrategy[tuple[str, list[KeyedRecord], CompressionType]] = st.one_of(
    st.tuples(
        st.just("write"),
        st.lists(RECORD, min_size=1, max_size=5),
        st.sampled_from([CompressionType.NONE, CompressionType.GZIP, CompressionType.ZSTD]),
    ),
    st.tuples(st.just("clean"), st.just([]), st.just(CompressionType.NONE)),
    # A follower's truncation back to where an earlier write began (which one: drawn below).
    st.tuples(st.just("truncate"), st.just([]), st.just(CompressionType.NONE)),
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(STEP, min_size=1, max_size=40),
    map_bytes=st.sampled_from([300, 64 << 20]),
    data=st.data(),
)
def test_any_history_compacts_to_the_latest_record_per_key(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[str, list[KeyedRecord], CompressionType]],
    map_bytes: int,
    data: st.DataObject,
) -> None:
    directory = tmp_path_factory.mktemp("compacted") / "topic-0"
    log = open_log(directory)
    model = Model()
    config = compacted()
    cleaner = CleanerSettings(dedupe_buffer_bytes=map_bytes, io_max_bytes_per_second=1e300)
    positions: list[int] = []
    try:
        for action, records, codec in steps:
            if action == "write":
                positions.append(log.log_end_offset)
                write(log, model, records, codec)
            elif action == "truncate" and (
                # Only where nothing was cleaned yet: a cleaned range is committed, and only an
                # unclean election truncates committed records. That loses data on Kafka too (a
                # value dropped for a later tombstone stays dropped when the tombstone goes), so
                # there is no model to check it against. A truncation below the checkpoint is
                # its own test below.
                truncatable := [p for p in positions if p >= load_first_dirty_offset(directory)]
            ):
                offset = data.draw(st.sampled_from(truncatable), label="truncate to")
                log.truncate_to(offset)
                positions = [p for p in positions if p < offset]
                model.records = {o: r for o, r in model.records.items() if o < offset}
            else:
                clean_log(log, config, cleaner, now_ms=NOW_MS, force=True)
            # Folding the log as a consumer would always gives the model's state, and every
            # record there is the one written at that offset.
            survivors = read_all(log)
            assert [r.offset for r in survivors] == sorted({r.offset for r in survivors})
            assert all(
                model.records[r.offset] == (r.key, r.value, r.timestamp_ms) for r in survivors
            )
            assert fold(as_model(survivors)) == model.folded()
            # Positions consumers held stay readable, and read on from there.
            for position in positions:
                assert read_all(log, position) == [r for r in survivors if r.offset >= position]

        seal_everything(log, model)
        while clean_log(log, config, cleaner, now_ms=NOW_MS, force=True) is not None:
            pass  # a small offset map takes several passes
        expected = model.latest(NOW_MS - DELETE_RETENTION_MS)
        assert as_model(read_all(log)) == expected
        log.close()
        reopened = open_log(directory)
        assert as_model(read_all(reopened)) == expected
        reopened.close()
    finally:
        log.close()


@pytest.fixture
def overwritten_log(tmp_path: Path) -> Iterator[tuple[PartitionLog, Model]]:
    log = open_log(tmp_path / "topic-0")
    model = Model()
    for round_ in range(30):
        write(
            log,
            model,
            [(b"k%d" % (i % 4), b"v%d-%d" % (round_, i), NOW_MS) for i in range(4)],
            CompressionType.NONE,
        )
    yield log, model
    log.close()


def test_a_pass_shrinks_the_log_keeps_the_active_segment_and_moves_the_first_dirty_offset(
    overwritten_log: tuple[PartitionLog, Model],
) -> None:
    log, model = overwritten_log
    before = log.segment_stats()
    active_bytes = before[-1].size_bytes
    result = clean_log(log, compacted(), UNLIMITED, now_ms=NOW_MS)
    assert result is not None
    assert result.records_kept < result.records_read
    after = log.segment_stats()
    assert sum(s.size_bytes for s in after) < sum(s.size_bytes for s in before)
    assert after[-1].size_bytes == active_bytes
    assert after[0].base_offset == before[0].base_offset
    assert fold(as_model(read_all(log))) == model.folded()
    # The whole log below the active segment is clean now: nothing is due until more is written.
    assert clean_log(log, compacted(), UNLIMITED, now_ms=NOW_MS, force=True) is None
    assert (log.directory / "cleaner-offset-checkpoint").read_text().strip() == str(
        after[-1].base_offset
    )


def test_the_throttle_holds_a_pass_to_the_configured_rate(
    overwritten_log: tuple[PartitionLog, Model],
) -> None:
    import time

    log, _ = overwritten_log
    slow = CleanerSettings(dedupe_buffer_bytes=64 << 20, io_max_bytes_per_second=20_000)
    started = time.monotonic()
    result = clean_log(log, compacted(), slow, now_ms=NOW_MS)
    assert result is not None
    io_bytes = 2 * result.bytes_read + result.bytes_written  # the map pass reads the dirty part too
    assert time.monotonic() - started >= 0.8 * (io_bytes - result.bytes_read) / 20_000


def test_a_truncation_below_the_cleaned_part_makes_the_rewritten_offsets_dirty_again(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "topic-0")
    model = Model()
    for i in range(40):
        write(log, model, [(b"first-%d" % i, b"v" * 30, NOW_MS)], CompressionType.NONE)
    assert clean_log(log, compacted(), UNLIMITED, now_ms=NOW_MS, force=True) is not None
    # A follower truncated back (say, to a new leader's end), then fetches other records in
    # the offsets the cleaner had already covered.
    log.truncate_to(5)
    model.records = {o: r for o, r in model.records.items() if o < 5}
    for i in range(40):
        key = b"again" if i in (0, 1) else b"second-%d" % i
        write(log, model, [(key, b"w" * 30, NOW_MS)], CompressionType.NONE)
    seal_everything(log, model)
    while clean_log(log, compacted(), UNLIMITED, now_ms=NOW_MS, force=True) is not None:
        pass
    assert as_model(read_all(log)) == model.latest(NOW_MS - DELETE_RETENTION_MS)
    log.close()


async def test_the_broker_cleaner_leaves_a_log_with_a_corrupt_batch_alone_and_cleans_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from riverbed.hot.storage.cleaner import LogCleaner

    logs = {}
    for name in ("damaged", "healthy"):
        log = open_log(tmp_path / f"{name}-0")
        for round_ in range(20):
            write(log, Model(), [(b"k", b"round %d" % round_, NOW_MS)], CompressionType.NONE)
        logs[name] = log
    # A flipped byte inside a record of the damaged log's first (sealed) segment.
    first = sorted((tmp_path / "damaged-0").glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[-5] ^= 0xFF
    first.write_bytes(bytes(data))
    before = (first.stat().st_size, sorted(p.name for p in (tmp_path / "damaged-0").iterdir()))
    cleaner = LogCleaner(UNLIMITED, lambda: NOW_MS)
    config = compacted(**{"min.cleanable.dirty.ratio": "0.01"})

    results = []
    for _ in range(3):
        results.append(
            await cleaner.clean_filthiest(logs.items(), lambda _: config, lambda _: False)
        )
    assert "damaged-0" in caplog.text
    assert "cannot be cleaned" in caplog.text
    assert (
        first.stat().st_size,
        sorted(p.name for p in (tmp_path / "damaged-0").iterdir()),
    ) == before
    # The healthy log was cleaned; the damaged one is not tried again (no error every pass).
    assert [r is not None for r in results].count(True) == 1
    assert caplog.text.count("cannot be cleaned") == 1
    assert len(read_all(logs["healthy"])) < 20
    for log in logs.values():
        log.close()


def test_on_a_tiered_topic_expired_tombstones_stay(tmp_path: Path) -> None:
    """The cold tier may hold older values of a deleted key: the hot cleaner keeps its tombstone
    (the broker passes keep_tombstones for topics it tiers)."""
    results = {}
    for keep in (False, True):
        log = open_log(tmp_path / f"tiered-{keep}-0")
        model = Model()
        old = NOW_MS - 2 * DELETE_RETENTION_MS
        write(log, model, [(b"gone", b"v", old), (b"gone", None, old)], CompressionType.NONE)
        seal_everything(log, model)
        clean_log(log, compacted(), UNLIMITED, now_ms=NOW_MS, keep_tombstones=keep)
        results[keep] = [(r.key, r.value) for r in read_all(log)]
        log.close()
    assert results[False] == [(b"~seal", b"x" * 700)]
    assert results[True] == [(b"gone", None), (b"~seal", b"x" * 700)]
