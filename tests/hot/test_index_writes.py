"""Index rows reach their files in groups: what the files hold, and what a crash leaves."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from riverbed.hot.storage.index import INDEX_ROWS_UNWRITTEN_MAX, OffsetIndex, TimeIndex
from riverbed.hot.storage.log import LogConfig, PartitionLog
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import encode_batch, validate_records

TP = TopicPartition("live", 0)
ROW_BYTES = OffsetIndex.ROW.size
BASE_OFFSET = 1000


def file_rows(path: Path) -> int:
    size = path.stat().st_size
    assert size % ROW_BYTES == 0
    return size // ROW_BYTES


def append_entries(index: OffsetIndex, start: int, count: int) -> None:
    """`count` entries: batch i at offset BASE_OFFSET + 10 i, position 100 i."""
    index.append([(BASE_OFFSET + 10 * i, 100 * i) for i in range(start, start + count)])


def test_rows_reach_the_file_in_groups_and_lookups_see_them_at_once(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    index = OffsetIndex(path, BASE_OFFSET)
    append_entries(index, 0, INDEX_ROWS_UNWRITTEN_MAX - 1)
    assert file_rows(path) == 0
    last = INDEX_ROWS_UNWRITTEN_MAX - 2
    assert index.lookup(BASE_OFFSET + 10 * last + 5) == (BASE_OFFSET + 10 * last, 100 * last)
    assert index.last_entry() == (BASE_OFFSET + 10 * last, 100 * last)
    append_entries(index, INDEX_ROWS_UNWRITTEN_MAX - 1, 1)
    assert file_rows(path) == INDEX_ROWS_UNWRITTEN_MAX
    append_entries(index, INDEX_ROWS_UNWRITTEN_MAX, 3)
    assert file_rows(path) == INDEX_ROWS_UNWRITTEN_MAX
    index.flush()
    assert file_rows(path) == INDEX_ROWS_UNWRITTEN_MAX + 3
    append_entries(index, INDEX_ROWS_UNWRITTEN_MAX + 3, 2)
    index.close()
    reopened = OffsetIndex(path, BASE_OFFSET)
    assert reopened.entries_count == INDEX_ROWS_UNWRITTEN_MAX + 5
    relatives, positions = reopened.columns()
    assert list(relatives) == [10 * i for i in range(INDEX_ROWS_UNWRITTEN_MAX + 5)]
    assert list(positions) == [100 * i for i in range(INDEX_ROWS_UNWRITTEN_MAX + 5)]
    reopened.close()


def test_the_last_entry_of_an_unloaded_index_includes_unwritten_rows(tmp_path: Path) -> None:
    path = tmp_path / "x.timeindex"
    index = TimeIndex(path, BASE_OFFSET)
    index.append([(5_000, BASE_OFFSET), (6_000, BASE_OFFSET + 7)])
    assert file_rows(path) == 0
    assert index.last_entry() == (6_000, BASE_OFFSET + 7)  # columns never loaded
    index.close()


def test_a_failed_group_write_drops_only_the_rows_that_triggered_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.index"
    index = OffsetIndex(path, BASE_OFFSET)
    append_entries(index, 0, INDEX_ROWS_UNWRITTEN_MAX - 1)

    def disk_full(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)  # what fileio.write_all calls
    with pytest.raises(OSError, match="No space left on device"):
        append_entries(index, INDEX_ROWS_UNWRITTEN_MAX - 1, 2)
    monkeypatch.undo()
    # The segment undoes its append; the rows before it are still there, not yet on file.
    assert index.entries_count == INDEX_ROWS_UNWRITTEN_MAX - 1
    assert file_rows(path) == 0
    index.flush()
    assert file_rows(path) == INDEX_ROWS_UNWRITTEN_MAX - 1
    index.close()


def test_truncation_on_either_side_of_the_written_rows(tmp_path: Path) -> None:
    path = tmp_path / "x.index"
    index = OffsetIndex(path, BASE_OFFSET)
    total = INDEX_ROWS_UNWRITTEN_MAX + 6
    append_entries(index, 0, INDEX_ROWS_UNWRITTEN_MAX)
    append_entries(index, INDEX_ROWS_UNWRITTEN_MAX, 6)
    assert file_rows(path) == INDEX_ROWS_UNWRITTEN_MAX
    # Among the unwritten rows: the file is untouched.
    index.truncate_from(BASE_OFFSET + 10 * (total - 2))
    assert index.entries_count == total - 2
    assert file_rows(path) == INDEX_ROWS_UNWRITTEN_MAX
    # Below them: the file is cut and nothing stays unwritten.
    index.truncate_from(BASE_OFFSET + 10 * 10)
    assert index.entries_count == 10
    assert file_rows(path) == 10
    append_entries(index, 10, 3)
    index.flush()
    assert file_rows(path) == 13
    index.close()
    reopened = OffsetIndex(path, BASE_OFFSET)
    assert list(reopened.columns()[0]) == [10 * i for i in range(13)]
    reopened.close()


def test_a_crash_loses_only_unwritten_rows_and_the_log_reopens_whole(tmp_path: Path) -> None:
    """A copy of the files of an open log is what a killed broker leaves: its writes are in the
    page cache, its unwritten index rows are not. The copy opens with every batch readable."""
    config = LogConfig(segment_bytes=1 << 30, index_interval_bytes=1)  # a row per batch
    log = PartitionLog.open(tmp_path / "live", TP, config, recovery_point=0, now_ms=lambda: 0)
    batches = INDEX_ROWS_UNWRITTEN_MAX + 20
    for i in range(batches):
        buf = memoryview(bytearray(encode_batch([(None, f"v{i}".encode(), (), i)])))
        log.append(buf, validate_records(buf, 1 << 20), leader_epoch=0)
    shutil.copytree(tmp_path / "live", tmp_path / "crashed")
    log.close()
    crashed = tmp_path / "crashed"
    (index_path,) = crashed.glob("*.index")
    # Every batch after the first got a row; only the first group of them reached the file.
    assert file_rows(index_path) == INDEX_ROWS_UNWRITTEN_MAX
    reopened = PartitionLog.open(crashed, TP, config, recovery_point=batches, now_ms=lambda: 0)
    assert reopened.log_end_offset == batches
    for offset in (0, INDEX_ROWS_UNWRITTEN_MAX - 1, INDEX_ROWS_UNWRITTEN_MAX + 5, batches - 1):
        result = reopened.read(offset, 1, batches)
        assert result is not None
        assert result.next_offset == offset + 1
        result.region.close()
    buf = memoryview(bytearray(encode_batch([(None, b"after", (), 0)])))
    reopened.append(buf, validate_records(buf, 1 << 20), leader_epoch=0)
    assert reopened.log_end_offset == batches + 1
    reopened.close()
