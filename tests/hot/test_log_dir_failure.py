"""A log on a disk that fails: it goes offline and reports it once (Kafka's LogDirFailureChannel),
from the owner's thread or from the flush thread; a full disk reports nothing.

The faults are real (tests/faults/disks.py): fsync() returns EIO from an ext4 whose block device
refuses writes, and ENOSPC comes from a full tmpfs.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import pytest
from riverbed.hot.storage.log import LogConfig, PartitionLog
from riverbed.hot.storage.log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import encode_batch, validate_records

from tests.faults.disks import FailingDisk, FullDisk

pytestmark = pytest.mark.processes  # mount(8), losetup(8), mkfs.ext4(8)

TP: Final = TopicPartition("orders", 0)
CONFIG: Final = LogConfig(segment_bytes=4096, index_interval_bytes=200)
FAILING_DISK_SIZE_BYTES: Final = 16 << 20
FULL_DISK_SIZE_BYTES: Final = 256 << 10
# More than a page: a batch that needs a new page of the full tmpfs, which it cannot get.
BIG_VALUE: Final = b"x" * 8192


class Reports:
    """What `on_offline` was told, and on which threads."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.threads: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)
        self.threads.append(threading.current_thread().name)


def now_ms() -> int:
    return 1_000_000


def open_log(
    directory: Path, reports: Reports, executor: ThreadPoolExecutor | None = None
) -> PartitionLog:
    return PartitionLog.open(
        directory / "orders-0",
        TP,
        CONFIG,
        recovery_point=0,
        now_ms=now_ms,
        flush_executor=executor,
        on_offline=reports,
    )


def append(log: PartitionLog, value: bytes, leader_epoch: int = 0) -> None:
    buf = memoryview(bytearray(encode_batch([(None, value, (), 1_000)])))
    log.append(buf, validate_records(buf, 1 << 20), leader_epoch=leader_epoch)


def assert_storage_error(error: pytest.ExceptionInfo[KafkaError]) -> None:
    assert error.value.code == ErrorCode.KAFKA_STORAGE_ERROR


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[FailingDisk]:
    with FailingDisk(tmp_path / "disk", FAILING_DISK_SIZE_BYTES) as failing_disk:
        yield failing_disk


def test_a_failed_fsync_takes_the_log_offline_and_reports_it_once(disk: FailingDisk) -> None:
    reports = Reports()
    log = open_log(disk.directory, reports)
    append(log, b"durable")
    log.flush()  # the leader epoch checkpoint is written: the next flush fsyncs only segments
    append(log, b"written, never synced")
    disk.fail()
    with pytest.raises(KafkaError) as failed:
        log.flush()
    assert_storage_error(failed)
    assert len(reports.reasons) == 1
    assert "fsync failed" in reports.reasons[0]
    assert "Input/output error" in reports.reasons[0]
    assert log.recovery_point == 1, "the recovery point stays below what did not reach the disk"

    disk.heal()  # the log stays offline: its files cannot be trusted whatever the disk does now
    calls: list[Callable[[], object]] = [
        log.flush,
        lambda: append(log, b"refused"),
        lambda: log.read(0, 1 << 20, log.log_end_offset),
    ]
    for call in calls:
        with pytest.raises(KafkaError) as refused:
            call()
        assert_storage_error(refused)
        assert "offline" in str(refused.value)
    assert len(reports.reasons) == 1, "reported once, however often it is asked"
    log.close()


def test_a_background_fsync_of_a_sealed_segment_reports_from_the_flush_thread(
    disk: FailingDisk,
) -> None:
    reports = Reports()
    with ThreadPoolExecutor(1, thread_name_prefix="log-flush") as executor:
        log = open_log(disk.directory, reports, executor)
        append(log, b"first")
        log.flush()
        disk.fail()
        while len(log.segment_stats()) == 1:  # until a roll hands the sealed segment's fsync over
            append(log, b"y" * 500)
        executor.submit(lambda: None).result()  # after the fsync: one thread, jobs in order
        assert len(reports.reasons) == 1
        assert "fsync of the segment at 0 failed" in reports.reasons[0]
        assert reports.threads[0].startswith("log-flush")
        assert log.recovery_point == 1
        with pytest.raises(KafkaError) as refused:
            append(log, b"refused")
        assert_storage_error(refused)
        disk.heal()
        log.close()
    assert len(reports.reasons) == 1


def test_an_unwritable_leader_epoch_checkpoint_on_a_failed_disk_takes_the_log_offline(
    disk: FailingDisk,
) -> None:
    """EIO from the epoch checkpoint is the disk failing: staying online would fail every later
    flush and roll the same way while the broker kept its leaderships."""
    reports = Reports()
    log = open_log(disk.directory, reports)
    append(log, b"epoch 0")
    log.flush()
    append(log, b"epoch 1", leader_epoch=1)  # a new leadership: its entry is not written yet
    disk.fail()
    with pytest.raises(KafkaError) as failed:
        log.flush()
    assert_storage_error(failed)
    assert len(reports.reasons) == 1
    assert "leader epoch checkpoint" in reports.reasons[0]
    disk.heal()
    log.close()


def test_the_log_manager_reports_once_and_leaves_no_clean_shutdown_marker(
    tmp_path: Path,
) -> None:
    """Two logs fail; the data dir is reported once, and a close that works otherwise writes no
    marker. Each log's directory is a failing disk of its own, so that the data dir's file
    system, which `close` syncs, stays healthy."""
    reports: list[tuple[Path, str]] = []
    data_dir = tmp_path / "data"
    with contextlib.ExitStack() as disks:
        failing = [
            disks.enter_context(FailingDisk(data_dir / f"orders-{p}", FAILING_DISK_SIZE_BYTES))
            for p in range(2)
        ]
        manager = LogManager(
            data_dir, CONFIG, now_ms=now_ms, on_dir_failure=lambda d, r: reports.append((d, r))
        )
        logs = [manager.get("orders", p) for p in range(2)]
        for log in logs:
            assert log is not None
            append(log, b"durable")
            log.flush()
            append(log, b"written, never synced")
        for disk in failing:
            disk.fail()
        for log in logs:
            assert log is not None
            with pytest.raises(KafkaError) as failed:
                log.flush()
            assert_storage_error(failed)
        assert len(reports) == 1, "one data dir, one report: the first log to fail names it"
        assert reports[0][0] == data_dir
        assert reports[0][1].startswith("the log of orders-0 went offline: fsync failed")

        for disk in failing:
            disk.heal()
        manager.close()  # the sync and checkpoints work, but the offline logs were not flushed
        assert not (data_dir / CLEAN_SHUTDOWN_FILE).exists()
        reopened = LogManager(data_dir, CONFIG, now_ms=now_ms)
        assert not reopened.had_clean_shutdown
        reopened.close()


def test_a_full_disk_refuses_the_append_and_reports_nothing(tmp_path: Path) -> None:
    """ENOSPC is rolled back: the log stays usable, the data dir has not failed."""
    reports = Reports()
    with FullDisk(tmp_path / "full", FULL_DISK_SIZE_BYTES) as full:
        log = open_log(full.directory, reports)
        append(log, b"before")
        log.flush()
        full.fill()
        with pytest.raises(KafkaError) as refused:
            append(log, BIG_VALUE)
        assert_storage_error(refused)
        assert "offline" not in str(refused.value)
        full.free()
        append(log, b"after")
        log.flush()
        assert log.log_end_offset == 2
        log.close()
    assert reports.reasons == []
