"""PartitionLog on real files: appends, reads, rolls, timestamps, truncation, disk-full."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from riverbed.hot.storage.leader_epoch import leader_epoch_checkpoint_path
from riverbed.hot.storage.log import AppendResult, LogConfig, PartitionLog
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import Record, TopicPartition
from riverbed.protocol.records import (
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
    encode_batch,
    iter_batch_headers,
    validate_records,
)

from tests.support.batches import records_in

TP = TopicPartition("orders", 0)
SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=150)


class Clock:
    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def batch(
    values: list[bytes], timestamps_ms: list[int] | None = None, timestamp_type: int = 0
) -> bytes:
    timestamps = timestamps_ms or [1_000] * len(values)
    return encode_batch(
        [(None, value, (), ts) for value, ts in zip(values, timestamps, strict=True)],
        timestamp_type=timestamp_type,
    )


def append(log: PartitionLog, *batches: bytes) -> AppendResult:
    buf = memoryview(bytearray(b"".join(batches)))
    return log.append(buf, validate_records(buf, 1 << 20), leader_epoch=3)


def read_records(log: PartitionLog, offset: int, max_bytes: int, max_offset: int) -> list[Record]:
    result = log.read(offset, max_bytes, max_offset)
    if result is None:
        return []
    region = result.region
    try:
        data = os.pread(region.fd, region.size, region.position)
    finally:
        region.close()
    assert len(data) == region.size
    assert sum(h.size_bytes for _, h in iter_batch_headers(data)) == len(data), "whole batches"
    return records_in(log.tp, data)


def open_log(
    directory: Path, config: LogConfig = SMALL, clock: Clock | None = None
) -> PartitionLog:
    return PartitionLog.open(directory, TP, config, recovery_point=0, now_ms=clock or Clock())


@pytest.fixture
def log(tmp_path: Path) -> Iterator[PartitionLog]:
    partition_log = open_log(tmp_path / "orders-0")
    yield partition_log
    partition_log.close()


def fill(log: PartitionLog, batches: int) -> list[bytes]:
    """Append `batches` batches of 1-3 records; return every value in offset order."""
    values = []
    for i in range(batches):
        batch_values = [f"v{i}-{j}-".encode() * (1 + i % 7) for j in range(1 + i % 3)]
        append(log, batch(batch_values))
        values += batch_values
    return values


def test_round_trip_across_many_segments(log: PartitionLog) -> None:
    values = fill(log, 200)
    assert log.log_end_offset == len(values)
    assert len(list(log.directory.glob("*.log"))) > 5
    assert sorted(p.name for p in log.directory.glob("*.log"))[0] == f"{0:020d}.log"
    collected: list[Record] = []
    while len(collected) < len(values):
        collected += read_records(log, len(collected), 1000, log.log_end_offset)
    assert [r.value for r in collected] == values
    assert [r.offset for r in collected] == list(range(len(values)))


def test_every_offset_reads_the_batch_that_holds_it(log: PartitionLog) -> None:
    values = fill(log, 120)
    for offset in range(len(values)):
        result = log.read(offset, 300, log.log_end_offset)
        assert result is not None
        result.region.close()
        records = read_records(log, offset, 300, log.log_end_offset)
        assert records[0].offset <= offset <= records[-1].offset
        assert records[0].offset == result.first_batch_offset
        first_batch = [r for r in records if r.offset <= offset]
        assert len(first_batch) <= 3, "starts at the batch holding the offset, not before"


def test_a_read_says_where_the_reader_goes_on(log: PartitionLog) -> None:
    """next_offset is the offset after the region's last record, whether the region ends inside
    a segment, at a segment's end, at the high watermark or at the log's end."""
    values = fill(log, 120)
    assert len(log.segment_stats()) > 2  # several segments, so reads end at segment ends too
    for offset in range(len(values)):
        for max_bytes, max_offset in ((300, log.log_end_offset), (5000, 70)):
            result = log.read(offset, max_bytes, max_offset)
            if result is None:
                continue
            result.region.close()
            records = read_records(log, offset, max_bytes, max_offset)
            assert result.next_offset == records[-1].offset + 1


def test_first_offsets_and_leader_epoch_are_assigned(log: PartitionLog) -> None:
    first = append(log, batch([b"a", b"b"]), batch([b"c"]))
    second = append(log, batch([b"d"]))
    assert (first.first_offset, first.last_offset) == (0, 2)
    assert (second.first_offset, second.last_offset) == (3, 3)
    data = (log.directory / f"{0:020d}.log").read_bytes()
    headers = [h for _, h in iter_batch_headers(data)]
    assert [h.base_offset for h in headers] == [0, 2, 3]
    assert {h.partition_leader_epoch for h in headers} == {3}


def test_roll_by_bytes_keeps_segments_under_segment_bytes(log: PartitionLog) -> None:
    fill(log, 100)
    segments = sorted(log.directory.glob("*.log"))
    assert all(p.stat().st_size <= SMALL.segment_bytes for p in segments)
    assert sum(p.stat().st_size for p in segments) == log.size_bytes


def test_roll_by_ms_uses_the_injected_clock(tmp_path: Path) -> None:
    clock = Clock(0)
    log = open_log(tmp_path / "t-0", LogConfig(segment_ms=1_000), clock)
    append(log, batch([b"a"]))
    clock.now_ms = 1_000
    append(log, batch([b"b"]))
    assert len(list(log.directory.glob("*.log"))) == 1
    clock.now_ms = 1_001
    rolled = append(log, batch([b"c"]))
    assert rolled.segment_base_offset == 2
    assert rolled.position == 0
    assert len(list(log.directory.glob("*.log"))) == 2
    log.close()


def test_a_batch_larger_than_max_bytes_is_returned_whole(log: PartitionLog) -> None:
    append(log, batch([b"x" * 5000]))
    append(log, batch([b"small"]))
    result = log.read(0, 100, log.log_end_offset)
    assert result is not None
    assert result.region.size > 5000
    result.region.close()
    assert log.read(0, 100, log.log_end_offset, min_one_batch=False) is None


def test_max_bytes_is_respected_with_whole_batches(log: PartitionLog) -> None:
    fill(log, 60)
    for max_bytes in (100, 333, 1000):
        result = log.read(5, max_bytes, log.log_end_offset)
        assert result is not None
        region = result.region
        batches = list(iter_batch_headers(os.pread(region.fd, region.size, region.position)))
        # The region is as long as max_bytes allows: the next batch would not have fitted.
        after = os.pread(region.fd, 1 << 20, region.position + region.size)
        region.close()
        assert region.size <= max_bytes or len(batches) == 1
        next_batch = next(iter_batch_headers(after), None)
        assert next_batch is None or region.size + next_batch[1].size_bytes > max_bytes


def test_reads_stop_below_max_offset(log: PartitionLog) -> None:
    fill(log, 30)  # batches of 1, 2, 3, 1, 2, 3... records
    high_watermark = 9  # offsets 0..5 in batches [0], [1,2], [3,4,5]; 6 | 7,8 | 9,10,11
    log.update_high_watermark(high_watermark)
    records = read_records(log, 0, 1 << 20, log.high_watermark)
    assert [r.offset for r in records] == list(range(9))
    assert log.read(9, 1 << 20, log.high_watermark) is None
    log.update_high_watermark(10)
    # The batch 9..11 straddles the HW: it is not readable yet.
    assert read_records(log, 9, 1 << 20, log.high_watermark) == []
    assert [r.offset for r in read_records(log, 7, 1 << 20, log.high_watermark)] == [7, 8]


def test_fetch_offset_outside_the_log_is_out_of_range(log: PartitionLog) -> None:
    fill(log, 3)
    for offset in (-1, log.log_end_offset + 1):
        with pytest.raises(KafkaError) as raised:
            log.read(offset, 100, log.log_end_offset)
        assert raised.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert log.read(log.log_end_offset, 100, log.log_end_offset) is None


def test_high_watermark_only_moves_forward_up_to_the_log_end(log: PartitionLog) -> None:
    fill(log, 3)
    log.update_high_watermark(2)
    with pytest.raises(ValueError, match="high watermark 1 must lie in"):
        log.update_high_watermark(1)
    with pytest.raises(ValueError, match=f"high watermark {log.log_end_offset + 1} must lie in"):
        log.update_high_watermark(log.log_end_offset + 1)
    log.update_high_watermark(log.log_end_offset)
    assert log.high_watermark == log.log_end_offset


def test_offset_for_timestamp_matches_a_brute_force_search(log: PartitionLog) -> None:
    timestamps_seen: list[tuple[int, int]] = []
    for i in range(80):
        # Timestamps go up and down inside and across batches, as producers' clocks do.
        timestamps = [10_000 + (i * 37 + j * 101) % 900 + i * 5 for j in range(1 + i % 3)]
        result = append(log, batch([b"v" * 40] * len(timestamps), timestamps))
        timestamps_seen += [(result.first_offset + j, ts) for j, ts in enumerate(timestamps)]
    assert len(list(log.directory.glob("*.log"))) > 2
    for target in range(9_900, 11_400, 7):
        expected = next(((o, ts) for o, ts in timestamps_seen if ts >= target), None)
        assert log.offset_for_timestamp(target) == expected, target
    best = max(ts for _, ts in timestamps_seen)
    expected_max = next((o, ts) for o, ts in timestamps_seen if ts == best)
    assert log.max_timestamp_offset() == expected_max


def test_timestamps_of_log_append_time_batches(log: PartitionLog) -> None:
    append(log, batch([b"a", b"b"], [5, 6], timestamp_type=TIMESTAMP_TYPE_LOG_APPEND_TIME))
    assert log.offset_for_timestamp(0) == (0, 6)
    assert log.max_timestamp_offset() == (0, 6)


def test_an_empty_log_has_no_timestamps(log: PartitionLog) -> None:
    assert log.offset_for_timestamp(0) is None
    assert log.max_timestamp_offset() is None
    assert log.read(0, 100, 0) is None


def test_truncate_to_an_offset_then_append_again(log: PartitionLog) -> None:
    values = fill(log, 100)
    log.update_high_watermark(log.log_end_offset)
    log.truncate_to(50)
    assert log.log_end_offset <= 50
    assert log.high_watermark == log.log_end_offset
    kept = log.log_end_offset
    records: list[Record] = []
    assert all(int(p.stem) < kept or p.stat().st_size == 0 for p in log.directory.glob("*.log"))
    append(log, batch([b"new"]))
    while len(records) < kept + 1:
        records += read_records(log, len(records), 1000, log.log_end_offset)
    assert [r.value for r in records] == [*values[:kept], b"new"]


def test_truncate_below_the_log_start_restarts_the_log(log: PartitionLog) -> None:
    fill(log, 10)
    log.truncate_to(0)
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    assert [p.name for p in log.directory.glob("*.log")] == [f"{0:020d}.log"]


def test_flush_messages_advances_the_recovery_point(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0", LogConfig(flush_messages=3))
    append(log, batch([b"a", b"b"]))
    assert log.recovery_point == 0
    append(log, batch([b"c"]))
    assert log.recovery_point == 3
    log.close()


def test_flush_ms_flushes_when_due(tmp_path: Path) -> None:
    clock = Clock(0)
    log = open_log(tmp_path / "t-0", LogConfig(flush_ms=100), clock)
    append(log, batch([b"a"]))
    assert not log.flush_if_due()
    clock.now_ms = 100
    assert log.flush_if_due()
    assert log.recovery_point == 1
    log.close()


def test_a_roll_makes_the_sealed_segment_durable_in_the_background(tmp_path: Path) -> None:
    with ThreadPoolExecutor(1) as executor:
        log = PartitionLog.open(
            tmp_path / "t-0", TP, SMALL, recovery_point=0, now_ms=Clock(), flush_executor=executor
        )
        fill(log, 40)
        executor.submit(lambda: None).result()  # runs after every queued segment fsync
        active_base = int(sorted(log.directory.glob("*.log"))[-1].stem)
        assert log.recovery_point == active_base > 0
        log.close()
        assert log.recovery_point == log.log_end_offset


def test_log_config_from_kafka_names() -> None:
    config = LogConfig.from_topic_config(
        {
            "segment.bytes": "1000",
            "segment.ms": "60000",
            "index.interval.bytes": "10",
            "flush.messages": str(2**63 - 1),
            "flush.ms": "500",
            "max.message.bytes": "2000",
            "cleanup.policy": "delete",
        }
    )
    assert config == LogConfig(1000, 60000, 10, None, 500, 2000)
    assert LogConfig.from_topic_config({}) == LogConfig()


def assert_consistent(log: PartitionLog, values: list[bytes]) -> None:
    """Disk and memory agree on exactly `values`, and a reopen finds nothing to cut."""
    assert log.log_end_offset == len(values)
    assert log.size_bytes == sum(p.stat().st_size for p in log.directory.glob("*.log"))
    records = read_records(log, 0, 1 << 20, log.log_end_offset)
    assert [r.value for r in records] == values


def test_a_failed_write_is_undone_and_the_log_stays_usable(
    log: PartitionLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = fill(log, 3)
    real_write = os.write

    def half_then_disk_full(fd: int, data: bytes | memoryview) -> int:
        if len(data) > 8:
            return real_write(fd, memoryview(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_disk_full)  # what fileio.write_all calls
    with pytest.raises(KafkaError) as raised:
        append(log, batch([b"lost" * 10]))
    assert raised.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    monkeypatch.undo()
    assert_consistent(log, values)
    append(log, batch([b"kept"]))
    assert_consistent(log, [*values, b"kept"])


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 256 KiB filesystem to fill up. Mounting needs root, which `make test` has (it
    installs Debian packages); only a non-root run skips, and a failed mount as root fails."""
    if os.geteuid() != 0:
        pytest.skip("a real full disk needs a tmpfs mount, which needs root")
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
        capture_output=True,
        check=True,
    )
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_a_full_disk_leaves_the_log_consistent(tiny_tmpfs: Path) -> None:
    log = open_log(tiny_tmpfs / "t-0", LogConfig(index_interval_bytes=100))
    values: list[bytes] = []

    def fill_the_disk() -> None:
        for i in range(10_000):
            value = f"{i:08d}".encode() * 100
            append(log, batch([value]))
            values.append(value)

    with pytest.raises(KafkaError) as raised:
        fill_the_disk()
    assert raised.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert_consistent(log, values)
    # Room again (the operator deleted something; here, 20 records: some pages of the
    # filesystem): appends go on from the same offset.
    log.truncate_to(len(values) - 20)
    values = values[: len(values) - 20]
    append(log, batch([b"after"]))
    assert_consistent(log, [*values, b"after"])
    log.close()  # writes the leader epoch checkpoint the full disk left in memory
    assert leader_epoch_checkpoint_path(log.directory).read_text() == "0\n1\n3 0\n"
    reopened = PartitionLog.open(
        log.directory, log.tp, LogConfig(), recovery_point=None, now_ms=Clock()
    )
    assert_consistent(reopened, [*values, b"after"])
    reopened.close()
