"""PartitionLog as a replica: follower appends (offset gaps, order checks), the leader epoch
cache it keeps through appends, truncation, recovery and reopening, and producer state."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from riverbed.hot.storage.index import RELATIVE_OFFSET_MAX
from riverbed.hot.storage.leader_epoch import EpochEntry, leader_epoch_checkpoint_path
from riverbed.hot.storage.log import AppendResult, LogConfig, OffsetOutOfOrderError, PartitionLog
from riverbed.hot.storage.producer_state import (
    DuplicateBatch,
    ProducerStateManager,
    delete_snapshots_above,
    load_producer_state,
    snapshot_files,
)
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import (
    BatchHeader,
    encode_batch,
    validate_records,
)

from tests.support.batches import records_in

TP = TopicPartition("t", 0)
SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=150)
NOW_MS = 1_000_000


def leader_batch(
    base_offset: int,
    count: int,
    epoch: int,
    *,
    producer_id: int = -1,
    base_sequence: int = -1,
    value_bytes: int = 30,
) -> bytes:
    """A batch as a leader wrote it: its offsets and partition leader epoch are set."""
    records = [(None, b"%d" % (base_offset + i) * value_bytes, (), 1_000) for i in range(count)]
    return encode_batch(
        records,
        base_offset=base_offset,
        partition_leader_epoch=epoch,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
    )


def validated(*batches: bytes) -> tuple[memoryview, list[BatchHeader]]:
    buf = memoryview(bytearray(b"".join(batches)))
    return buf, validate_records(buf, 1 << 20)


def follow(log: PartitionLog, *batches: bytes) -> AppendResult:
    return log.append_as_follower(*validated(*batches))


def open_log(
    directory: Path, recovery_point: int | None = 0, config: LogConfig = SMALL
) -> PartitionLog:
    return PartitionLog.open(
        directory, TP, config, recovery_point=recovery_point, now_ms=lambda: NOW_MS
    )


def read_all(log: PartitionLog) -> list[tuple[int, bytes]]:
    """(offset, value) of every record, read the way fetches read: from each next offset."""
    found: list[tuple[int, bytes]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        result = log.read(offset, 1 << 20, log.log_end_offset)
        assert result is not None, offset
        region = result.region
        try:
            data = os.pread(region.fd, region.size, region.position)
        finally:
            region.close()
        found += [(r.offset, r.value or b"") for r in records_in(log.tp, data)]
        offset = found[-1][0] + 1
    return found


def log_bytes(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def entries(*pairs: tuple[int, int]) -> tuple[EpochEntry, ...]:
    return tuple(EpochEntry(*pair) for pair in pairs)


# -- follower appends --------------------------------------------------------------------------


def test_follower_batches_are_written_as_the_leader_wrote_them_gaps_included(
    tmp_path: Path,
) -> None:
    batches = [leader_batch(0, 3, 1), leader_batch(10, 2, 1), leader_batch(20, 4, 2)]
    log = open_log(tmp_path)
    result = follow(log, *batches)
    assert (result.first_offset, result.last_offset) == (0, 23)
    assert log.log_end_offset == 24
    assert log_bytes(tmp_path) == b"".join(batches), "byte for byte: offsets and epochs kept"
    offsets = [0, 1, 2, 10, 11, 20, 21, 22, 23]
    assert [offset for offset, _ in read_all(log)] == offsets
    in_gap = log.read(5, 1 << 20, log.log_end_offset)
    assert in_gap is not None
    assert in_gap.first_batch_offset == 10
    in_gap.region.close()
    assert log.leader_epochs.entries() == entries((1, 0), (2, 20))
    assert follow(log, leader_batch(30, 1, 2)).first_offset == 30
    assert log.log_end_offset == 31
    expected = read_all(log)
    log.close()

    for recovery_point in (None, 31):  # a full re-scan, and a clean reopen
        reopened = open_log(tmp_path, recovery_point)
        assert reopened.log_end_offset == 31
        assert read_all(reopened) == expected
        assert reopened.leader_epochs.entries() == entries((1, 0), (2, 20))
        reopened.close()


def test_follower_appends_roll_segments_at_their_first_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for i in range(60):
        follow(log, leader_batch(7 * i, 1 + i % 3, 1 + i // 20))
    bases = [int(path.stem) for path in sorted(tmp_path.glob("*.log"))]
    assert len(bases) > 3
    assert all(base % 7 == 0 for base in bases), "each segment starts at a batch's base offset"
    assert all(path.stat().st_size <= SMALL.segment_bytes for path in tmp_path.glob("*.log"))
    expected = [(7 * i + j, b"%d" % (7 * i + j) * 30) for i in range(60) for j in range(1 + i % 3)]
    assert read_all(log) == expected
    assert log.leader_epochs.entries() == entries((1, 0), (2, 140), (3, 280))
    log.close()
    reopened = open_log(tmp_path, recovery_point=None)
    assert read_all(reopened) == expected
    reopened.close()


@pytest.mark.parametrize("existing", [0, 3], ids=["empty log", "log with data"])
def test_a_gap_beyond_a_segments_reach_starts_a_new_segment(tmp_path: Path, existing: int) -> None:
    far = RELATIVE_OFFSET_MAX + 100
    log = open_log(tmp_path)
    if existing:
        follow(log, leader_batch(0, existing, 1))
    follow(log, leader_batch(far, 2, 1), leader_batch(far + 2, 1, 1))
    assert log.log_end_offset == far + 3
    assert sorted(int(path.stem) for path in tmp_path.glob("*.log")) == [0, far]
    expected = [
        (offset, b"%d" % offset * 30) for offset in [*range(existing), far, far + 1, far + 2]
    ]
    assert read_all(log) == expected
    log.close()
    reopened = open_log(tmp_path, recovery_point=None)
    assert read_all(reopened) == expected
    reopened.close()


@pytest.mark.parametrize(
    ("batches", "message"),
    [
        pytest.param([(3, 2)], "offsets 3..4 are out of order: expected offsets from 5", id="old"),
        pytest.param([(5, 3), (7, 1)], "offsets 7..7 are out of order: expected offsets from 8"),
        pytest.param([(9, 2), (6, 1)], "offsets 6..6 are out of order: expected offsets from 11"),
    ],
)
def test_out_of_order_batches_are_refused_and_the_log_is_unchanged(
    tmp_path: Path, batches: list[tuple[int, int]], message: str
) -> None:
    log = open_log(tmp_path)
    follow(log, leader_batch(0, 5, 1))
    before = log_bytes(tmp_path), log.log_end_offset, log.leader_epochs.entries()
    with pytest.raises(OffsetOutOfOrderError, match=message):
        follow(log, *(leader_batch(base, count, 9) for base, count in batches))
    assert (log_bytes(tmp_path), log.log_end_offset, log.leader_epochs.entries()) == before
    assert follow(log, leader_batch(5, 1, 9)).last_offset == 5, "still usable"
    log.close()


def test_the_leader_path_records_each_new_epoch_at_its_first_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for epoch, count in [(0, 2), (0, 3), (2, 1), (5, 4), (5, 1)]:
        buf, headers = validated(leader_batch(0, count, -1))
        log.append(buf, headers, leader_epoch=epoch)
    assert log.leader_epochs.entries() == entries((0, 0), (2, 5), (5, 6))
    assert [h.partition_leader_epoch for h in log.batch_headers(0)] == [0, 0, 2, 5, 5]
    assert log.leader_epochs.end_offset_for(2, log.log_end_offset) == (2, 6)
    log.close()
    reopened = open_log(tmp_path, recovery_point=log.recovery_point)
    assert reopened.leader_epochs.entries() == entries((0, 0), (2, 5), (5, 6))
    assert leader_epoch_checkpoint_path(tmp_path).read_text() == "0\n3\n0 0\n2 5\n5 6\n"
    reopened.close()


def test_reads_at_the_tail_find_the_same_batches_as_the_index_does(tmp_path: Path) -> None:
    """An active segment remembers where its last batches start, so a fetch at the tail needs
    no header scan; every offset must still lead to the batch the index and a scan find (gaps,
    a truncation and a roll included). The reference is a copy opened afresh, which has no
    such memory."""
    live = tmp_path / "live"
    log = open_log(live, config=LogConfig(segment_bytes=4096, index_interval_bytes=400))
    base = 0
    for round_number in range(30):
        count = 1 + round_number % 3
        batches = [leader_batch(base, count, 1), leader_batch(base + count + 2, 1, 1)]
        follow(log, *batches)  # each append leaves a gap of two offsets
        base += count + 3
        if round_number == 20:
            log.truncate_to(base - 4)
            base = log.log_end_offset

    def where(partition_log: PartitionLog, offset: int) -> tuple[int, int, int, int] | None:
        found = partition_log.read(offset, 1 << 20, partition_log.log_end_offset)
        if found is None:
            return None
        found.region.close()
        return (
            found.first_batch_offset,
            found.next_offset,
            found.region.position,
            found.region.size,
        )

    copy = tmp_path / "copy"
    shutil.copytree(live, copy)
    fresh = open_log(copy, recovery_point=None)
    assert len(list(live.glob("*.log"))) >= 3, "several segments: reads cross rolls"
    for offset in range(log.log_start_offset, log.log_end_offset + 1):
        assert where(log, offset) == where(fresh, offset), offset
    fresh.close()
    log.close()


# -- truncation, recovery, rebuilding -----------------------------------------------------------


def test_truncation_drops_the_epochs_it_cuts_and_survives_reopening(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    follow(log, leader_batch(0, 5, 1), leader_batch(5, 5, 2), leader_batch(10, 5, 4))
    log.truncate_to(12)  # the batch holding 12 goes whole
    assert log.log_end_offset == 10
    assert log.leader_epochs.entries() == entries((1, 0), (2, 5))
    log.close()
    log = open_log(tmp_path, recovery_point=10)
    assert log.leader_epochs.entries() == entries((1, 0), (2, 5))
    log.truncate_to(5)
    assert log.leader_epochs.entries() == entries((1, 0))
    follow(log, leader_batch(5, 2, 6))  # a new leader's epoch, where the old tail was
    assert log.leader_epochs.entries() == entries((1, 0), (6, 5))
    log.close()
    reopened = open_log(tmp_path, recovery_point=7)
    assert reopened.leader_epochs.entries() == entries((1, 0), (6, 5))
    assert [offset for offset, _ in read_all(reopened)] == list(range(7))
    reopened.close()


def test_recovery_assigns_again_the_epochs_a_crash_took_from_the_checkpoint(
    tmp_path: Path,
) -> None:
    """A new epoch's checkpoint write is not fsynced on the append path, only before the
    recovery point passes its batches: a crash can lose it (here: the file as it was at the last
    flush), and recovery, which re-scans from the recovery point, must find the epochs again."""
    log = open_log(tmp_path)
    follow(log, leader_batch(0, 5, 1))
    log.flush()
    recovery_point = log.recovery_point
    assert recovery_point == 5
    durable = leader_epoch_checkpoint_path(tmp_path).read_bytes()
    follow(log, leader_batch(5, 5, 3), leader_batch(10, 2, 4))
    assert log.leader_epochs.entries() == entries((1, 0), (3, 5), (4, 10))
    log.close()
    leader_epoch_checkpoint_path(tmp_path).write_bytes(durable)  # the crash lost the rest

    reopened = open_log(tmp_path, recovery_point=recovery_point)
    assert reopened.log_end_offset == 12
    assert reopened.leader_epochs.entries() == entries((1, 0), (3, 5), (4, 10))
    assert reopened.leader_epochs.end_offset_for(3, reopened.log_end_offset) == (3, 10)
    reopened.close()
    # ...and what recovery found is on disk for the next open, which re-scans nothing.
    assert open_log(tmp_path, recovery_point=12).leader_epochs.entries() == entries(
        (1, 0), (3, 5), (4, 10)
    )


def test_truncating_everything_forgets_every_epoch(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    follow(log, leader_batch(100, 5, 1), leader_batch(105, 5, 2))
    log.truncate_to(50)
    assert log.log_end_offset == 0
    assert log.leader_epochs.entries() == ()
    log.close()
    reopened = open_log(tmp_path, recovery_point=0)
    assert reopened.leader_epochs.entries() == ()
    reopened.close()


def test_recovery_that_cuts_a_torn_tail_drops_its_epochs(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    follow(log, leader_batch(0, 5, 1), leader_batch(5, 5, 2))
    log.close()
    segment = sorted(tmp_path.glob("*.log"))[-1]
    os.truncate(segment, segment.stat().st_size - 7)  # a crash mid-write of the second batch
    reopened = open_log(tmp_path, recovery_point=None)
    assert reopened.log_end_offset == 5
    assert reopened.leader_epochs.entries() == entries((1, 0))
    assert leader_epoch_checkpoint_path(tmp_path).read_text() == "0\n1\n1 0\n"
    reopened.close()


@pytest.mark.parametrize("damage", ["missing", "garbled"])
def test_a_lost_checkpoint_is_rebuilt_from_the_batch_headers(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(tmp_path)
    for i in range(40):
        follow(log, leader_batch(3 * i, 3, i // 10 * 2))
    expected = log.leader_epochs.entries()
    assert expected == entries((0, 0), (2, 30), (4, 60), (6, 90))
    assert len(list(tmp_path.glob("*.log"))) > 2
    end_offset = log.log_end_offset
    log.close()
    path = leader_epoch_checkpoint_path(tmp_path)
    if damage == "missing":
        path.unlink()
    else:
        path.write_text("0\n4\n0 0\n")
    with caplog.at_level(logging.WARNING, logger="riverbed.hot.storage.log"):
        reopened = open_log(tmp_path, recovery_point=end_offset)
    assert "rebuilding the leader epoch cache" in caplog.text
    assert reopened.recovered_segments == 0, "headers were read, nothing was recovered"
    assert reopened.leader_epochs.entries() == expected
    assert path.read_text() == "0\n4\n0 0\n2 30\n4 60\n6 90\n"
    reopened.close()


def test_a_new_empty_log_writes_no_checkpoint(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert log.leader_epochs.entries() == ()
    assert not leader_epoch_checkpoint_path(tmp_path).exists()
    log.close()


def test_a_failed_checkpoint_write_fails_the_flush_and_holds_the_recovery_point_back(
    tmp_path: Path,
) -> None:
    """A new epoch is recorded in memory with its batch; its checkpoint file is written by the
    next flush, which must not move the recovery point past the batch while it cannot."""
    log = open_log(tmp_path)
    follow(log, leader_batch(0, 2, 1))
    log.flush()
    assert log.recovery_point == 2
    path = leader_epoch_checkpoint_path(tmp_path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.mkdir()  # the atomic write's temp file cannot be created
    follow(log, leader_batch(2, 2, 2))
    assert log.log_end_offset == 4
    assert log.leader_epochs.entries() == entries((1, 0), (2, 2))
    with pytest.raises(KafkaError) as raised:
        log.flush()
    assert raised.value.code == ErrorCode.KAFKA_STORAGE_ERROR
    assert "leader epoch checkpoint" in str(raised.value)
    assert log.recovery_point == 2
    assert path.read_text() == "0\n1\n1 0\n"
    follow(log, leader_batch(4, 1, 2))  # the log still serves appends
    tmp.rmdir()
    log.flush()
    assert log.recovery_point == 5
    assert path.read_text() == "0\n2\n1 0\n2 2\n"
    log.close()


# -- producer state on a follower ---------------------------------------------------------------

PID = 7000


def idempotent(producer: int, seq: int, count: int = 1) -> bytes:
    return leader_batch(0, count, -1, producer_id=PID + producer, base_sequence=seq)


def produce(log: PartitionLog, state: ProducerStateManager, data: bytes) -> AppendResult:
    buf, headers = validated(data)
    assert state.check(headers) is None
    result = log.append(buf, headers, leader_epoch=3)
    state.on_append(headers, result.first_offset)
    return result


def replicate(leader: PartitionLog, follower: PartitionLog, state: ProducerStateManager) -> None:
    """Copy the leader's log the way a fetcher does: one read at a time from the follower's LEO,
    each appended as it is and replayed into the follower's producer state."""
    while follower.log_end_offset < leader.log_end_offset:
        result = leader.read(follower.log_end_offset, 700, leader.log_end_offset)
        assert result is not None
        region = result.region
        try:
            buf, headers = validated(os.pread(region.fd, region.size, region.position))
        finally:
            region.close()
        follower.append_as_follower(buf, headers)
        state.rebuild((h, None) for h in headers)


def test_a_followers_producer_state_is_the_leaders(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "leader")
    leader_state = ProducerStateManager()
    sequences = [0, 0]
    for i in range(30):
        producer, count = i % 2, 1 + i % 3
        produce(leader, leader_state, idempotent(producer, sequences[producer], count))
        sequences[producer] += count
    follower = open_log(tmp_path / "follower")
    follower_state = ProducerStateManager()
    replicate(leader, follower, follower_state)
    assert follower_state.encode_snapshot() == leader_state.encode_snapshot()
    assert follower.leader_epochs.entries() == entries((3, 0))

    # The follower becomes leader: a retry of the last batch gets its original offsets, and the
    # producer goes on where it was.
    last = next(h for h in reversed(list(leader.batch_headers(0))) if h.producer_id == PID + 1)
    retry = validate_records(idempotent(1, last.base_sequence, last.records_count), 1 << 20)
    assert follower_state.check(retry) == DuplicateBatch(last.base_offset, last.last_offset)
    assert produce(follower, follower_state, idempotent(1, sequences[1])).first_offset == (
        leader.log_end_offset
    )
    leader.close()
    follower.close()


def test_producer_state_reloads_after_a_truncation(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    state = ProducerStateManager()
    states_at: dict[int, bytes] = {}  # log end offset -> the live state there
    for seq in range(0, 40, 2):
        produce(log, state, idempotent(0, seq, 2))
        states_at[log.log_end_offset] = state.encode_snapshot()
        if seq % 10 == 8:
            state.take_snapshot(tmp_path, log.log_end_offset)
    assert [int(path.stem) for path in snapshot_files(tmp_path)] == [30, 40]

    log.truncate_to(25)  # the batch 24..25 goes whole
    assert log.log_end_offset == 24
    reloaded = load_producer_state(tmp_path, log.log_end_offset, log.batches_with_markers)
    assert reloaded.encode_snapshot() == states_at[24]
    assert snapshot_files(tmp_path) == [], "both snapshots described the cut tail"
    assert produce(log, reloaded, idempotent(0, 24, 2)).first_offset == 24
    log.close()


def test_delete_snapshots_above_keeps_those_at_or_below(tmp_path: Path) -> None:
    state = ProducerStateManager()
    for offset in (10, 20):
        state.take_snapshot(tmp_path, offset)
    assert delete_snapshots_above(tmp_path, 20) == 0
    assert delete_snapshots_above(tmp_path, 19) == 1
    assert [int(path.stem) for path in snapshot_files(tmp_path)] == [10]
