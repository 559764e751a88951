"""ProducerStateManager: Kafka's idempotence rules, snapshots, and rebuilding from a real log."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.hot.storage.log import LogConfig, PartitionLog
from riverbed.hot.storage.producer_state import (
    BATCHES_RETAINED_MAX,
    SEQUENCE_MAX,
    SNAPSHOTS_KEPT_MAX,
    DuplicateBatch,
    ProducerStateManager,
    load_producer_state,
    snapshot_files,
    snapshot_path,
)
from riverbed.protocol.control_records import ControlType
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import BatchHeader, encode_batch, validate_records

PID = 4000
TRANSACTIONAL = 0x10
SMALL = LogConfig(segment_bytes=1024, index_interval_bytes=100)


def header(
    producer_id: int = PID,
    epoch: int = 0,
    seq: int = 0,
    count: int = 1,
    *,
    attributes: int = 0,
    timestamp_ms: int = 1_000,
) -> BatchHeader:
    return BatchHeader(
        base_offset=0,
        batch_length=100,
        partition_leader_epoch=-1,
        magic=2,
        crc=0,
        attributes=attributes,
        last_offset_delta=count - 1,
        base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=seq if producer_id >= 0 else -1,
        records_count=count,
    )


class Log:
    """A manager driven like the produce path, with a fake log end offset."""

    def __init__(self) -> None:
        self.state = ProducerStateManager()
        self.end_offset = 0

    def produce(self, *headers: BatchHeader) -> int | DuplicateBatch:
        duplicate = self.state.check(headers)
        if duplicate is not None:
            return duplicate
        first_offset = self.end_offset
        self.state.on_append(headers, first_offset)
        self.end_offset += sum(h.last_offset_delta + 1 for h in headers)
        return first_offset


def error_of(log: Log, *headers: BatchHeader) -> ErrorCode:
    with pytest.raises(KafkaError) as raised:
        log.produce(*headers)
    return raised.value.code


def test_batches_without_producer_id_pass_straight_through() -> None:
    log = Log()
    assert log.produce(header(-1, -1, count=3), header(-1, -1)) == 0
    assert log.produce(header(-1, -1)) == 4
    assert len(log.state) == 0


def test_in_sequence_batches_are_appended() -> None:
    log = Log()
    assert log.produce(header(seq=0, count=3)) == 0
    assert log.produce(header(seq=3, count=2)) == 3
    entry = log.state.entry(PID)
    assert entry is not None
    assert (entry.epoch, entry.last_seq) == (0, 4)


def test_a_retried_batch_gets_its_original_offsets_and_is_not_appended() -> None:
    log = Log()
    log.produce(header(seq=0, count=3))
    log.produce(header(seq=3, count=2))
    assert log.produce(header(seq=0, count=3)) == DuplicateBatch(0, 2)
    assert log.produce(header(seq=3, count=2)) == DuplicateBatch(3, 4)
    assert log.end_offset == 5


def test_only_the_last_five_batches_are_recognised_as_duplicates() -> None:
    log = Log()
    for seq in range(BATCHES_RETAINED_MAX + 1):
        log.produce(header(seq=seq))
    assert log.produce(header(seq=1)) == DuplicateBatch(1, 1)
    assert error_of(log, header(seq=0)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_same_first_sequence_with_another_length_is_not_a_duplicate() -> None:
    log = Log()
    log.produce(header(seq=0, count=2))
    assert error_of(log, header(seq=0, count=3)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_sequence_gap_is_out_of_order() -> None:
    log = Log()
    log.produce(header(seq=0, count=2))
    assert error_of(log, header(seq=3)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.end_offset == 2


def test_an_unknown_producer_may_start_at_any_sequence() -> None:
    # Kafka since KIP-360: its state may have been expired or removed by retention.
    log = Log()
    assert log.produce(header(seq=42)) == 0
    assert log.produce(header(seq=43)) == 1


def test_sequences_wrap_from_int32_max_to_zero() -> None:
    log = Log()
    log.produce(header(seq=SEQUENCE_MAX - 1, count=2))
    entry = log.state.entry(PID)
    assert entry is not None
    assert entry.last_seq == SEQUENCE_MAX
    assert log.produce(header(seq=0)) == 2
    # A batch that straddles the wrap ends at a small sequence.
    log2 = Log()
    log2.produce(header(seq=SEQUENCE_MAX, count=3))
    entry = log2.state.entry(PID)
    assert entry is not None
    assert entry.last_seq == 1
    assert log2.produce(header(seq=SEQUENCE_MAX, count=3)) == DuplicateBatch(0, 2)
    assert log2.produce(header(seq=2)) == 3


def test_an_older_epoch_is_fenced() -> None:
    log = Log()
    log.produce(header(epoch=2, seq=0))
    assert error_of(log, header(epoch=1, seq=1)) == ErrorCode.INVALID_PRODUCER_EPOCH


def test_a_new_epoch_must_restart_at_sequence_zero() -> None:
    log = Log()
    log.produce(header(epoch=0, seq=0, count=5))
    assert error_of(log, header(epoch=1, seq=5)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.produce(header(epoch=1, seq=0)) == 5
    # The old epoch's batches are forgotten: they are no duplicates now, and fenced.
    assert error_of(log, header(epoch=0, seq=0, count=5)) == ErrorCode.INVALID_PRODUCER_EPOCH


def test_batches_of_one_request_are_checked_against_each_other() -> None:
    log = Log()
    log.produce(header(seq=0))
    assert log.produce(header(seq=1), header(seq=2, count=2)) == 1
    assert error_of(log, header(seq=4), header(seq=6)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert error_of(log, header(seq=4), header(epoch=1, seq=3)) == (
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    assert log.end_offset == 4
    # As in Kafka, a duplicate anywhere in the request answers for all of it.
    assert log.produce(header(seq=4), header(seq=1)) == DuplicateBatch(1, 1)
    assert log.end_offset == 4


def test_producers_are_independent() -> None:
    log = Log()
    log.produce(header(PID, seq=0), header(PID + 1, seq=7))
    assert log.produce(header(PID + 1, seq=8), header(PID, seq=1)) == 2
    assert error_of(log, header(PID + 1, seq=10)) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_a_plain_batch_inside_an_open_transaction_is_refused() -> None:
    log = Log()
    log.produce(header(attributes=TRANSACTIONAL))
    code = error_of(log, header(seq=1))
    assert code == ErrorCode.INVALID_TXN_STATE


def test_idle_producers_expire() -> None:
    log = Log()
    log.produce(header(PID, timestamp_ms=1_000), header(PID + 1, timestamp_ms=5_000))
    assert log.state.remove_expired(now_ms=10_000, expiration_ms=6_000) == 1
    assert log.state.entry(PID) is None
    assert log.state.entry(PID + 1) is not None


def test_snapshots_round_trip_and_refuse_damage() -> None:
    log = Log()
    for seq in range(7):
        log.produce(header(PID, seq=2 * seq, count=2, timestamp_ms=seq))
    log.produce(header(PID + 1, epoch=3, seq=9))
    data = log.state.encode_snapshot()
    copy = ProducerStateManager.decode_snapshot(data)
    assert copy.encode_snapshot() == data
    assert copy.entry(PID) == log.state.entry(PID)
    assert copy.entry(PID + 1) == log.state.entry(PID + 1)
    for damaged in (data[:-1], data + b"\0", data[:10] + bytes([data[10] ^ 1]) + data[11:]):
        with pytest.raises(ValueError, match="fails its CRC"):
            ProducerStateManager.decode_snapshot(damaged)
    with pytest.raises(ValueError, match="version"):
        ProducerStateManager.decode_snapshot(b"\0\x09" + data[2:])


# -- with a real log ---------------------------------------------------------------------------


def idempotent_batch(seq: int, count: int = 1, producer_id: int = PID) -> bytes:
    records = [(None, b"x" * 40, (), 1_000) for _ in range(count)]
    return encode_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=seq)


def produce(log: PartitionLog, state: ProducerStateManager, data: bytes) -> int | DuplicateBatch:
    buf = memoryview(bytearray(data))
    headers = validate_records(buf, 1 << 20)
    duplicate = state.check(headers)
    if duplicate is not None:
        return duplicate
    result = log.append(buf, headers, leader_epoch=0)
    state.on_append(headers, result.first_offset)
    return result.first_offset


def open_log(directory: Path) -> PartitionLog:
    return PartitionLog.open(
        directory, TopicPartition("t", 0), SMALL, recovery_point=None, now_ms=lambda: 1_000
    )


def test_batch_headers_reads_every_segment_from_an_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    state = ProducerStateManager()
    for seq in range(0, 40, 2):
        produce(log, state, idempotent_batch(seq, count=2))
    assert len(list(tmp_path.glob("*.log"))) > 2
    assert [h.base_offset for h in log.batch_headers(0)] == list(range(0, 40, 2))
    assert [h.base_offset for h in log.batch_headers(21)] == list(range(20, 40, 2))
    assert list(log.batch_headers(40)) == []
    log.close()


def test_reopening_recovers_the_state_from_snapshot_and_tail(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    state = ProducerStateManager()
    for seq in range(10):
        produce(log, state, idempotent_batch(seq))
    state.take_snapshot(tmp_path, log.log_end_offset)
    for seq in range(10, 14):
        produce(log, state, idempotent_batch(seq))
    expected = state.encode_snapshot()
    log.close()

    reopened = open_log(tmp_path)
    scanned_from: list[int] = []

    def batches_from(offset: int) -> list[tuple[BatchHeader, tuple[ControlType, int] | None]]:
        scanned_from.append(offset)
        return list(reopened.batches_with_markers(offset))

    loaded = load_producer_state(tmp_path, reopened.log_end_offset, batches_from)
    assert scanned_from == [10]  # only the batches after the snapshot were read
    assert loaded.encode_snapshot() == expected
    assert produce(reopened, loaded, idempotent_batch(13)) == DuplicateBatch(13, 13)
    assert produce(reopened, loaded, idempotent_batch(14)) == 14
    reopened.close()


def test_a_snapshot_is_not_written_again_until_the_state_changes(tmp_path: Path) -> None:
    """Kafka's takeSnapshot rule: nothing appended since the snapshot the state was written to
    or read from, no new file (a broker's shutdown then writes none for idle partitions); an
    append, even to the same end offset after a truncation, makes it write again."""
    log = open_log(tmp_path)
    state = ProducerStateManager()
    for seq in range(5):
        produce(log, state, idempotent_batch(seq))
    end = log.log_end_offset
    assert state.take_snapshot(tmp_path, end)
    path = snapshot_path(tmp_path, end)
    written = path.stat()
    assert state.take_snapshot(tmp_path, end)  # no change: the same file stays
    assert path.stat().st_ino == written.st_ino
    log.close()

    reopened = open_log(tmp_path)
    loaded = load_producer_state(tmp_path, reopened.log_end_offset, reopened.batches_with_markers)
    assert loaded.take_snapshot(tmp_path, end)  # read from it and unchanged: not rewritten
    assert path.stat().st_ino == written.st_ino
    produce(reopened, loaded, idempotent_batch(5))
    assert loaded.take_snapshot(tmp_path, end)  # the state changed: written again
    assert path.stat().st_ino != written.st_ino
    reopened.close()


def test_without_snapshots_the_whole_log_is_scanned(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    state = ProducerStateManager()
    for seq in range(0, 30, 3):
        produce(log, state, idempotent_batch(seq, count=3))
    loaded = load_producer_state(tmp_path, log.log_end_offset, log.batches_with_markers)
    assert loaded.encode_snapshot() == state.encode_snapshot()
    log.close()


def test_snapshots_above_the_log_end_and_unreadable_ones_are_dropped(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    state = ProducerStateManager()
    for seq in range(4):
        produce(log, state, idempotent_batch(seq))
        state.take_snapshot(tmp_path, log.log_end_offset)
    assert [int(p.stem) for p in snapshot_files(tmp_path)] == [3, 4][-SNAPSHOTS_KEPT_MAX:]
    beyond = snapshot_path(tmp_path, 99)
    beyond.write_bytes(state.encode_snapshot())
    snapshot_path(tmp_path, 4).write_bytes(b"garbage")
    loaded = load_producer_state(tmp_path, log.log_end_offset, log.batches_with_markers)
    assert not beyond.exists()
    assert not snapshot_path(tmp_path, 4).exists()
    assert loaded.encode_snapshot() == state.encode_snapshot()  # snapshot 3 + batch at 3
    log.close()


def test_a_failed_snapshot_write_is_not_an_error(tmp_path: Path) -> None:
    state = ProducerStateManager()
    assert not state.take_snapshot(tmp_path / "missing", 0)


# (producer, epoch bump, sequence skip: -2 retries an earlier batch, 1 leaves a gap, count)
batch_steps = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 1), st.integers(-2, 1), st.integers(1, 4)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=40, deadline=None)
@given(steps=batch_steps)
def test_rebuilding_from_the_log_equals_the_live_state(
    steps: list[tuple[int, int, int, int]],
) -> None:
    """Whatever the producers send (valid or not), replaying the log's headers reproduces the
    state the produce path built, and so does a snapshot."""
    live = Log()
    written: list[BatchHeader] = []
    next_seq: dict[int, int] = {}
    for producer, bump, skip, count in steps:
        producer_id = PID + producer
        entry = live.state.entry(producer_id)
        epoch = (0 if entry is None else entry.epoch) + bump
        seq = 0 if bump else next_seq.get(producer_id, 0) + skip
        candidate = header(producer_id, epoch, seq, count)
        try:
            outcome = live.produce(candidate)
        except KafkaError:
            continue
        if isinstance(outcome, int):
            written.append(dataclasses.replace(candidate, base_offset=outcome))
            next_seq[producer_id] = seq + count
    rebuilt = ProducerStateManager()
    rebuilt.rebuild((h, None) for h in written)
    assert rebuilt.encode_snapshot() == live.state.encode_snapshot()
    snapshot = live.state.encode_snapshot()
    assert ProducerStateManager.decode_snapshot(snapshot).encode_snapshot() == snapshot
