"""DeleteRecords' log start in PartitionLog, on real files: offset-granular, persisted, refused
reads below it, replicas restarting at whole batches, and a cut below it."""

from __future__ import annotations

from pathlib import Path

import pytest
from riverbed.hot.storage.log import LOG_START_FILE, LogConfig, PartitionLog
from riverbed.protocol.errors import ErrorCode, KafkaError

from tests.hot.test_log import append, batch, open_log, read_records

# Batches of 4 records with timestamps 1000 + offset: offsets 0-3, 4-7, ... 36-39.
BATCHES = 10
PER_BATCH = 4


def filled(directory: Path) -> PartitionLog:
    log = open_log(directory, LogConfig(segment_bytes=300, index_interval_bytes=50))
    for b in range(BATCHES):
        first = b * PER_BATCH
        append(
            log,
            batch(
                [f"v{first + i}".encode() for i in range(PER_BATCH)],
                [1_000 + first + i for i in range(PER_BATCH)],
            ),
        )
    log.update_high_watermark(log.log_end_offset)
    return log


def test_log_start_moves_inside_a_batch_and_survives_a_reopen(tmp_path: Path) -> None:
    log = filled(tmp_path / "t-0")
    assert log.advance_log_start_offset(10)
    assert not log.advance_log_start_offset(6)  # never backward
    assert (log.log_start_offset, log.truncated_before) == (10, 10)
    with pytest.raises(KafkaError) as refused:
        log.read(9, 1 << 20, log.high_watermark)
    assert refused.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    # A consumer at the start gets the batch holding it (8-11): it skips 8 and 9 itself.
    assert [r.offset for r in read_records(log, 10, 100, log.high_watermark)][:4] == [8, 9, 10, 11]
    # Time lookups never answer below the start, though offsets 0-9 are older.
    found = log.offset_for_timestamp(0)
    assert found is not None
    assert found.offset == 10
    # A replica copying the log starts at the batch holding the start.
    assert log.replica_start_offset() == 8
    log.read(8, 1 << 20, log.log_end_offset, from_replica=True)
    log.close()

    reopened = open_log(tmp_path / "t-0")
    assert (reopened.log_start_offset, reopened.truncated_before) == (10, 10)
    assert (tmp_path / "t-0" / LOG_START_FILE).read_text() == "10\n"
    reopened.close()


def test_whole_segments_below_the_start_can_go(tmp_path: Path) -> None:
    log = filled(tmp_path / "t-0")
    assert len(log.segment_stats()) > 2
    start = log.segment_stats()[2].base_offset + 1
    log.advance_log_start_offset(start)
    log.delete_segments_below(start, reason="deleted records")
    assert log.segment_stats()[0].base_offset <= start < log.segment_stats()[0].next_offset
    assert log.log_start_offset == start
    log.close()


def test_a_start_past_the_log_end_is_refused(tmp_path: Path) -> None:
    log = filled(tmp_path / "t-0")
    with pytest.raises(ValueError, match="past the log end"):
        log.advance_log_start_offset(log.log_end_offset + 1)
    log.close()


def test_a_cut_below_the_start_restarts_the_log_there(tmp_path: Path) -> None:
    """An unclean election can make a follower cut below a start it had followed."""
    log = filled(tmp_path / "t-0")
    log.advance_log_start_offset(30)
    log.truncate_to(20)
    assert log.log_start_offset == log.log_end_offset == 20
    assert log.truncated_before == 20
    log.close()
    assert open_log(tmp_path / "t-0").log_start_offset == 20


def test_an_unreadable_start_file_opens_at_the_first_segment(tmp_path: Path) -> None:
    log = filled(tmp_path / "t-0")
    log.close()
    (tmp_path / "t-0" / LOG_START_FILE).write_text("garbage")
    reopened = open_log(tmp_path / "t-0")
    assert reopened.log_start_offset == 0
    reopened.close()
