"""Crash recovery on real files: torn tails, corrupt batches, lost indexes, the data dir."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.hot.storage.checkpoint import CheckpointError, read_offset_checkpoint
from riverbed.hot.storage.log import LogConfig, PartitionLog
from riverbed.hot.storage.log_manager import (
    CLEAN_SHUTDOWN_FILE,
    HIGH_WATERMARK_CHECKPOINT_FILE,
    RECOVERY_POINT_CHECKPOINT_FILE,
    DataDirLockedError,
    LogManager,
    parse_partition_dir,
)
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import encode_batch, iter_batch_headers, validate_records

from tests.support.batches import records_in

TP = TopicPartition("t", 0)
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=200)


def now_ms() -> int:
    return 1_000_000


def append_values(log: PartitionLog, values: list[bytes]) -> None:
    buf = memoryview(
        bytearray(encode_batch([(None, v, (), 1_000 + i) for i, v in enumerate(values)]))
    )
    log.append(buf, validate_records(buf, 1 << 20), leader_epoch=0)


def write_log(directory: Path, batches: int) -> list[bytes]:
    """A closed log of `batches` batches (several segments); returns its values in order."""
    log = PartitionLog.open(directory, TP, CONFIG, recovery_point=0, now_ms=now_ms)
    values: list[bytes] = []
    for i in range(batches):
        batch_values = [f"{i}:{j}".encode() * 20 for j in range(1 + i % 4)]
        append_values(log, batch_values)
        values += batch_values
    log.close()
    return values


def all_values(log: PartitionLog) -> list[bytes]:
    values: list[bytes] = []
    while len(values) < log.log_end_offset:
        result = log.read(len(values), 1 << 20, log.log_end_offset)
        assert result is not None
        region = result.region
        data = os.pread(region.fd, region.size, region.position)
        region.close()
        values += [record.value or b"" for record in records_in(log.tp, data)]
    return values


def active_segment(directory: Path) -> Path:
    return sorted(directory.glob("*.log"))[-1]


def reopen(directory: Path, recovery_point: int | None) -> PartitionLog:
    return PartitionLog.open(directory, TP, CONFIG, recovery_point=recovery_point, now_ms=now_ms)


def assert_recovered_to(log: PartitionLog, values: list[bytes]) -> None:
    assert log.log_end_offset == len(values)
    assert all_values(log) == values
    append_values(log, [b"after recovery"])
    assert all_values(log) == [*values, b"after recovery"]


@settings(max_examples=40, deadline=None)
@given(cut=st.floats(min_value=0.0, max_value=1.0, exclude_max=True))
def test_a_torn_tail_is_cut_at_the_last_whole_batch(cut: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "t-0"
        values = write_log(directory, 40)
        segment = active_segment(directory)
        size = segment.stat().st_size
        cut_at = int(size * cut)
        os.truncate(segment, cut_at)
        kept_bytes = kept_records = 0
        for _, header in iter_batch_headers(segment.read_bytes()):
            kept_bytes += header.size_bytes
            kept_records += header.records_count
        base = int(segment.stem)
        log = reopen(directory, recovery_point=base)
        assert log.recovered_segments == 1
        assert segment.stat().st_size == kept_bytes
        assert_recovered_to(log, values[: base + kept_records])
        log.close()


def test_a_corrupt_byte_in_the_tail_batch_fails_its_crc_and_is_cut(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    values = write_log(directory, 40)
    segment = active_segment(directory)
    data = bytearray(segment.read_bytes())
    last_position, last_header = list(iter_batch_headers(data))[-1]
    data[last_position + last_header.size_bytes - 3] ^= 0xFF  # inside the last record
    segment.write_bytes(bytes(data))
    log = reopen(directory, recovery_point=None)
    assert log.recovered_segments == len(list(directory.glob("*.log")))
    assert_recovered_to(log, values[: len(values) - last_header.records_count])
    log.close()


def test_segments_after_a_corrupt_batch_are_dropped(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    values = write_log(directory, 40)
    segments = sorted(directory.glob("*.log"))
    assert len(segments) >= 3
    middle = segments[1]
    data = bytearray(middle.read_bytes())
    data[100] ^= 0xFF
    middle.write_bytes(bytes(data))
    log = reopen(directory, recovery_point=int(middle.stem))
    assert sorted(directory.glob("*.log")) == segments[:2]
    kept = int(middle.stem) + sum(
        header.records_count
        for position, header in iter_batch_headers(bytes(data))
        if position + header.size_bytes <= 100
    )
    assert_recovered_to(log, values[:kept])
    log.close()


def test_a_clean_reopen_scans_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    values = write_log(directory, 40)
    log = reopen(directory, recovery_point=len(values))
    assert log.recovered_segments == 0
    assert log.recovery_point == len(values)
    assert_recovered_to(log, values)
    log.close()


@pytest.mark.parametrize("damage", ["delete", "garbage", "torn"])
def test_damaged_index_files_are_rebuilt(tmp_path: Path, damage: str) -> None:
    directory = tmp_path / "t-0"
    values = write_log(directory, 40)
    for index in sorted(directory.glob("*.index"))[:-1] + sorted(directory.glob("*.timeindex")):
        if damage == "delete":
            index.unlink()
        elif damage == "garbage":
            index.write_bytes(b"\xff" * 24 + b"\x00" * 24)  # entries out of order
        else:
            index.write_bytes(index.read_bytes()[:-3])
    log = reopen(directory, recovery_point=len(values))
    assert all_values(log) == values
    log.update_high_watermark(log.log_end_offset)
    assert log.offset_for_timestamp(1_000) == (0, 1_000)
    assert log.max_timestamp_offset() is not None
    log.close()
    for segment in directory.glob("*.log"):
        assert segment.with_suffix(".index").exists()
        assert segment.with_suffix(".timeindex").stat().st_size % 12 == 0


def test_orphan_index_files_are_removed(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    values = write_log(directory, 5)
    orphan = directory / f"{999:020d}.index"
    orphan.write_bytes(b"")
    log = reopen(directory, recovery_point=len(values))
    assert not orphan.exists()
    log.close()


# -- the data directory ------------------------------------------------------------------------


def fill_manager(manager: LogManager, topic: str, partition: int, batches: int) -> PartitionLog:
    log = manager.get_or_create(topic, partition, CONFIG, uuid.uuid4())
    for i in range(batches):
        append_values(log, [f"{topic}{i}".encode() * 30])
    log.update_high_watermark(log.log_end_offset)
    return log


def test_clean_shutdown_trusts_checkpoints_and_scans_nothing(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, CONFIG)
    fill_manager(manager, "orders", 0, 50)
    fill_manager(manager, "my.topic-with-dashes", 3, 10)
    manager.close()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert read_offset_checkpoint(tmp_path / RECOVERY_POINT_CHECKPOINT_FILE) == {
        ("my.topic-with-dashes", 3): 10,
        ("orders", 0): 50,
    }
    lines = (tmp_path / HIGH_WATERMARK_CHECKPOINT_FILE).read_text().splitlines()
    assert lines == ["0", "2", "my.topic-with-dashes 3 10", "orders 0 50"]

    manager = LogManager(tmp_path, CONFIG)
    assert manager.had_clean_shutdown
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert manager.partitions() == [("my.topic-with-dashes", 3), ("orders", 0)]
    for topic, partition in manager.partitions():
        log = manager.get(topic, partition)
        assert log is not None
        assert log.recovered_segments == 0
        assert log.high_watermark == log.log_end_offset
    manager.close()


def test_after_a_crash_only_the_unflushed_tail_is_scanned(tmp_path: Path) -> None:
    live = tmp_path / "live"
    manager = LogManager(live, CONFIG)
    log = fill_manager(manager, "orders", 0, 60)
    manager.flush_all()
    flushed = log.log_end_offset
    for i in range(3):
        append_values(log, [b"unflushed %d" % i])
    # A copy of a running broker's directory is what a crash leaves: no marker, open files.
    crashed = tmp_path / "crashed"
    shutil.copytree(live, crashed)
    manager.close()
    (crashed / ".lock").unlink()
    segments = len(list((crashed / "orders-0").glob("*.log")))
    assert segments > 3

    manager = LogManager(crashed, CONFIG)
    assert not manager.had_clean_shutdown
    recovered = manager.get("orders", 0)
    assert recovered is not None
    assert recovered.recovered_segments == 1
    assert recovered.log_end_offset == flushed + 3
    assert recovered.recovery_point == recovered.log_end_offset
    manager.close()


def test_a_second_manager_on_the_same_dir_is_refused(tmp_path: Path) -> None:
    manager = LogManager(tmp_path, CONFIG)
    with pytest.raises(DataDirLockedError) as raised:
        LogManager(tmp_path, CONFIG)
    assert "in use by another broker" in str(raised.value)
    assert "\n" not in str(raised.value)
    manager.close()
    LogManager(tmp_path, CONFIG).close()


def test_delete_removes_the_partition_and_leftovers_of_an_interrupted_delete(
    tmp_path: Path,
) -> None:
    manager = LogManager(tmp_path, CONFIG)
    fill_manager(manager, "a-b", 0, 5)
    fill_manager(manager, "a-b", 1, 5)
    manager.delete("a-b", 0)
    assert not (tmp_path / "a-b-0").exists()
    assert manager.partitions() == [("a-b", 1)]
    manager.close()
    leftover = tmp_path / "a-b-1.0123456789abcdef-delete"
    shutil.copytree(tmp_path / "a-b-1", leftover)
    manager = LogManager(tmp_path, CONFIG)
    assert not leftover.exists()
    assert manager.partitions() == [("a-b", 1)]
    manager.close()


def test_partition_dir_names_split_on_the_last_dash() -> None:
    assert parse_partition_dir("my-topic.v2-12") == ("my-topic.v2", 12)
    assert parse_partition_dir("orders-0.abc-delete") is None
    assert parse_partition_dir("nodash") is None


def test_invalid_topic_names_never_become_paths(tmp_path: Path) -> None:
    manager = LogManager(tmp_path / "data", CONFIG)
    for topic in ("../escape", "a/b", "..", ""):
        with pytest.raises(ValueError, match="invalid topic partition"):
            manager.get_or_create(topic, 0, CONFIG, uuid.uuid4())
    manager.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


@pytest.mark.parametrize(
    "text", ["", "1\n0\n", "0\n2\norders 0 5\n", "0\n1\norders zero 5\n", "0\n1\no 0 x\n"]
)
def test_a_damaged_checkpoint_file_is_reported(tmp_path: Path, text: str) -> None:
    path = tmp_path / RECOVERY_POINT_CHECKPOINT_FILE
    path.write_text(text)
    with pytest.raises(CheckpointError):
        read_offset_checkpoint(path)
