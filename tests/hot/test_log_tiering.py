"""PartitionLog's hooks for tiering, on real files: which sealed batches are uploadable, segment
stats for local retention, and deleting what the remote tier holds."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import pytest
from riverbed.hot.storage.log import PartitionLog, SealedBatches
from riverbed.hot.storage.segment import DELETED_SUFFIX, SEGMENT_SUFFIXES
from riverbed.hot.storage.txn_index import TXN_INDEX_SUFFIX
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records import iter_batch_headers

from tests.hot.test_log import SMALL, TP, Clock, append, batch, fill, open_log, read_records
from tests.support.batches import records_in


@pytest.fixture
def log(tmp_path: Path) -> Iterator[PartitionLog]:
    partition_log = open_log(tmp_path / "orders-0")
    yield partition_log
    partition_log.close()


def read_sealed(found: SealedBatches) -> bytes:
    try:
        return os.pread(found.fd, found.size_bytes, found.position)
    finally:
        os.close(found.fd)


def test_sealed_batches_walk_the_sealed_segments_without_gap_up_to_the_high_watermark(
    log: PartitionLog,
) -> None:
    values = fill(log, 200)
    log.update_high_watermark(log.log_end_offset)
    stats = log.segment_stats()
    assert [s.sealed for s in stats] == [True] * (len(stats) - 1) + [False]
    offset, values_seen = 0, []
    while (found := log.sealed_batches_from(offset, log.high_watermark)) is not None:
        assert found.base_offset == offset  # each upload starts where the last ended
        data = read_sealed(found)
        headers = [h for _, h in iter_batch_headers(data)]
        assert sum(h.size_bytes for h in headers) == len(data)  # whole batches
        assert headers[-1].last_offset <= found.last_offset
        values_seen += [r.value for r in records_in(log.tp, data)]
        offset = found.last_offset + 1
    # everything but the active segment was handed out, in order
    assert offset == stats[-1].base_offset
    assert values_seen == values[:offset]


def test_segments_reaching_the_high_watermark_are_not_uploadable(log: PartitionLog) -> None:
    fill(log, 200)
    second = log.segment_stats()[1]
    log.update_high_watermark(second.next_offset - 1)  # the second segment is not all committed
    found = log.sealed_batches_from(0, log.high_watermark)
    assert found is not None
    assert found.last_offset + 1 == second.base_offset
    os.close(found.fd)
    assert log.sealed_batches_from(second.base_offset, log.high_watermark) is None


def test_an_upload_may_start_inside_a_segment_at_a_batch_boundary(log: PartitionLog) -> None:
    fill(log, 200)
    log.update_high_watermark(log.log_end_offset)
    first = log.segment_stats()[0]
    sealed = log.sealed_batches_from(0, log.high_watermark)
    assert sealed is not None
    data = read_sealed(sealed)
    boundary = [h.base_offset for _, h in iter_batch_headers(data)][2]
    found = log.sealed_batches_from(boundary, log.high_watermark)
    assert found is not None
    assert (found.base_offset, found.last_offset + 1) == (boundary, first.next_offset)
    assert read_sealed(found) == data[len(data) - found.size_bytes :]


def test_deleting_below_an_offset_removes_whole_sealed_segments_only(log: PartitionLog) -> None:
    values = fill(log, 200)
    log.update_high_watermark(log.log_end_offset)
    stats = log.segment_stats()
    files_before = len(list(log.directory.glob("*.log")))
    # Mid-way into the third segment: only the first two are wholly below it.
    freed = log.delete_segments_below(stats[2].base_offset + 1)
    assert freed == stats[0].size_bytes + stats[1].size_bytes
    assert log.log_start_offset == stats[2].base_offset
    assert len(list(log.directory.glob("*.log"))) == files_before - 2
    with pytest.raises(KafkaError) as gone:
        log.read(0, 1000, log.high_watermark)
    assert gone.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    start = log.log_start_offset
    kept = read_records(log, start, 100_000, log.high_watermark)
    assert kept
    assert [r.value for r in kept] == values[start : start + len(kept)]
    # The active segment stays whatever the offset.
    log.delete_segments_below(log.log_end_offset + 10)
    assert len(log.segment_stats()) == 1
    assert log.log_start_offset == stats[-1].base_offset
    append(log, batch([b"after"]))
    assert read_records(log, log.log_end_offset - 1, 1000, log.log_end_offset)[0].value == b"after"


def test_deletion_survives_a_reopen(tmp_path: Path) -> None:
    log = open_log(tmp_path / "t-0")
    fill(log, 100)
    log.update_high_watermark(log.log_end_offset)
    start = log.segment_stats()[1].base_offset
    log.delete_segments_below(start)
    end = log.log_end_offset
    log.close()
    reopened = open_log(tmp_path / "t-0")
    try:
        assert (reopened.log_start_offset, reopened.log_end_offset) == (start, end)
    finally:
        reopened.close()


class HeldLog(NamedTuple):
    log: PartitionLog
    values: list[bytes]  # by offset
    release: threading.Event  # the log's background executor runs nothing until it is set


@pytest.fixture
def held(tmp_path: Path) -> Iterator[HeldLog]:
    """A filled log whose background executor is held by a first job until `release`."""
    executor, release = ThreadPoolExecutor(1), threading.Event()
    executor.submit(release.wait)
    log = PartitionLog.open(
        tmp_path / "t-0", TP, SMALL, recovery_point=0, now_ms=Clock(), flush_executor=executor
    )
    values = fill(log, 100)
    log.update_high_watermark(log.log_end_offset)
    yield HeldLog(log, values, release)
    release.set()
    log.close()
    executor.shutdown()


def test_deleted_segments_are_renamed_at_once_and_unlinked_in_the_background(
    held: HeldLog,
) -> None:
    log = held.log
    doomed = [s.base_offset for s in log.segment_stats()[:2]]
    log.delete_segments_below(log.segment_stats()[2].base_offset)
    # Out of the log at once: their files carry `.deleted`, and nothing is unlinked yet.
    names = {path.name for path in log.directory.iterdir()}
    for base_offset in doomed:
        # A .txnindex exists only once a transaction aborted in the segment.
        for suffix in (s for s in SEGMENT_SUFFIXES if s != TXN_INDEX_SUFFIX):
            assert f"{base_offset:020d}{suffix}" not in names
            assert f"{base_offset:020d}{suffix}{DELETED_SUFFIX}" in names
    assert log.log_start_offset == log.segment_stats()[0].base_offset
    held.release.set()
    log.close()  # waits for the background work
    assert not list(log.directory.glob(f"*{DELETED_SUFFIX}"))


def test_files_of_deleted_segments_left_by_a_crash_are_removed_when_the_log_opens(
    tmp_path: Path, held: HeldLog
) -> None:
    log, values = held.log, held.values
    start = log.segment_stats()[2].base_offset
    log.delete_segments_below(start)
    # The disk as a crash would leave it: renamed, never unlinked.
    crashed = tmp_path / "crashed-0"
    shutil.copytree(log.directory, crashed)
    assert list(crashed.glob(f"*{DELETED_SUFFIX}"))
    reopened = open_log(crashed)
    try:
        assert not list(crashed.glob(f"*{DELETED_SUFFIX}"))
        assert (reopened.log_start_offset, reopened.log_end_offset) == (start, len(values))
        kept: list[bytes | None] = []
        while start + len(kept) < reopened.log_end_offset:  # a read stops at a segment's end
            read = read_records(reopened, start + len(kept), 1_000_000, reopened.log_end_offset)
            kept += [r.value for r in read]
        assert kept == values[start:]
    finally:
        reopened.close()


def test_a_follower_restarts_empty_above_its_log_end_and_appends_from_there(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "t-0")
    fill(log, 20)
    log.update_high_watermark(log.log_end_offset)
    log.restart_at(5_000)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (5_000,) * 3
    assert log.leader_epochs.entries() == ()
    append(log, batch([b"next"]))
    assert [r.offset for r in read_records(log, 5_000, 1000, log.log_end_offset)] == [5_000]
    log.close()
    reopened = open_log(tmp_path / "t-0")
    try:
        assert (reopened.log_start_offset, reopened.log_end_offset) == (5_000, 5_001)
    finally:
        reopened.close()
