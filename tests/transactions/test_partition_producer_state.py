"""The producer state's transaction rules (Kafka's ProducerAppendInfo), its snapshots (v2, and v1
still read) and expiry."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest
from riverbed.hot.storage.producer_state import (
    SNAPSHOT_VERSION,
    ProducerStateManager,
    load_producer_state,
    snapshot_path,
)
from riverbed.hot.storage.transactions import NO_TXN_OFFSET, AbortedTxn, AppendOrigin
from riverbed.protocol.control_records import ControlType
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records import BatchHeader

PID = 7000
TRANSACTIONAL = 0x10
CONTROL = 0x20


def header(
    producer_id: int = PID,
    *,
    offset: int = 0,
    epoch: int = 0,
    seq: int = 0,
    count: int = 1,
    transactional: bool = True,
    control: bool = False,
    timestamp_ms: int = 1_000,
) -> BatchHeader:
    attributes = (TRANSACTIONAL if transactional or control else 0) | (CONTROL if control else 0)
    return BatchHeader(
        base_offset=offset,
        batch_length=100,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=attributes,
        last_offset_delta=count - 1,
        base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=-1 if control else seq,
        records_count=count,
    )


def marker(
    state: ProducerStateManager,
    offset: int,
    control_type: ControlType,
    *,
    producer_id: int = PID,
    epoch: int = 0,
    coordinator_epoch: int = 0,
) -> AbortedTxn | None:
    state.check_marker(producer_id, epoch, coordinator_epoch)
    placed = header(producer_id, offset=offset, epoch=epoch, control=True)
    return state.on_marker(placed, control_type, coordinator_epoch)


def code_of(call: object) -> ErrorCode:
    assert callable(call)
    with pytest.raises(KafkaError) as raised:
        call()
    return ErrorCode(raised.value.code)


def test_a_transactional_batch_opens_a_transaction_at_its_offset() -> None:
    state = ProducerStateManager()
    state.check([header(count=3)])
    state.on_append([header(count=3)], 10)
    entry = state.entry(PID)
    assert entry is not None
    assert entry.current_txn_first_offset == 10
    assert state.ongoing_txns == {10: PID}
    assert state.first_unstable_offset(high_watermark=5) == 10
    # The next batch of the same transaction does not move its start.
    state.on_append([header(seq=3)], 13)
    assert state.ongoing_txns == {10: PID}


def test_a_plain_batch_while_a_transaction_is_open_is_invalid_txn_state() -> None:
    state = ProducerStateManager()
    state.on_append([header()], 0)
    assert code_of(lambda: state.check([header(seq=1, transactional=False)])) == (
        ErrorCode.INVALID_TXN_STATE
    )
    # Also within one request: the first batch opens the transaction for the second.
    fresh = ProducerStateManager()
    batches = [header(), header(seq=1, transactional=False)]
    assert code_of(lambda: fresh.check(batches)) == ErrorCode.INVALID_TXN_STATE


def test_an_abort_marker_completes_the_transaction_and_yields_its_index_entry() -> None:
    state = ProducerStateManager()
    state.on_append([header(count=2)], 4)
    aborted = marker(state, 6, ControlType.ABORT, coordinator_epoch=3)
    assert aborted == AbortedTxn(PID, 4, 6, 7)
    entry = state.entry(PID)
    assert entry is not None
    assert (entry.current_txn_first_offset, entry.coordinator_epoch) == (NO_TXN_OFFSET, 3)
    assert state.ongoing_txns == {}
    # Completed, but its marker is not below the HW yet: still unstable.
    assert state.first_unstable_offset(high_watermark=6) == 4
    assert state.first_unstable_offset(high_watermark=7) is None


def test_a_commit_marker_yields_no_index_entry() -> None:
    state = ProducerStateManager()
    state.on_append([header()], 0)
    assert marker(state, 1, ControlType.COMMIT) is None
    assert state.first_unstable_offset(high_watermark=2) is None


def test_the_index_entry_lso_is_the_next_open_transaction_of_another_producer() -> None:
    state = ProducerStateManager()
    state.on_append([header(PID)], 0)
    state.on_append([header(PID + 1)], 1)
    assert marker(state, 2, ControlType.ABORT) == AbortedTxn(PID, 0, 2, 1)
    assert state.first_unstable_offset(high_watermark=3) == 1


def test_a_marker_with_an_older_producer_epoch_is_invalid_producer_epoch() -> None:
    state = ProducerStateManager()
    state.on_append([header(epoch=2)], 0)
    assert code_of(lambda: state.check_marker(PID, 1, 0)) == ErrorCode.INVALID_PRODUCER_EPOCH
    # A newer epoch (the coordinator bumped it to abort on a timeout) is accepted.
    state.check_marker(PID, 3, 0)


def test_a_marker_from_an_older_coordinator_epoch_is_fenced() -> None:
    state = ProducerStateManager()
    state.on_append([header()], 0)
    marker(state, 1, ControlType.COMMIT, coordinator_epoch=5)
    assert code_of(lambda: state.check_marker(PID, 0, 4)) == (
        ErrorCode.TRANSACTION_COORDINATOR_FENCED
    )
    state.check_marker(PID, 0, 5)


def test_a_marker_without_data_changes_no_transaction() -> None:
    state = ProducerStateManager()
    assert marker(state, 0, ControlType.ABORT) is None
    assert state.first_unstable_offset(high_watermark=0) is None


def test_coordinator_appends_skip_sequences_but_not_epochs() -> None:
    state = ProducerStateManager()
    state.on_append([header(epoch=1, seq=0, count=3)], 0)
    # Sequence 0 again: a duplicate or out of order for a client, fine for a coordinator.
    state.check([header(epoch=1, seq=0, transactional=True)], AppendOrigin.COORDINATOR)
    assert state.check([header(epoch=1, seq=0, count=3)]) is not None  # a client's duplicate
    assert code_of(lambda: state.check([header(epoch=0)], AppendOrigin.COORDINATOR)) == (
        ErrorCode.INVALID_PRODUCER_EPOCH
    )


def test_a_producer_with_an_open_transaction_never_expires() -> None:
    state = ProducerStateManager()
    state.on_append([header(PID, timestamp_ms=1_000)], 0)
    state.on_append([header(PID + 1, transactional=False, timestamp_ms=1_000)], 1)
    assert state.remove_expired(now_ms=100_000, expiration_ms=10) == 1
    assert state.entry(PID) is not None
    assert state.entry(PID + 1) is None


def test_rebuild_from_headers_and_markers_matches_the_live_state() -> None:
    live = ProducerStateManager()
    live.on_append([header(PID, count=2)], 0)
    live.on_append([header(PID + 1, count=1)], 2)
    aborted_live = marker(live, 3, ControlType.ABORT)
    marker(live, 4, ControlType.COMMIT, producer_id=PID + 1)
    live.on_append([header(PID, epoch=0, seq=2)], 5)
    replayed = ProducerStateManager()
    aborted = replayed.rebuild(
        [
            (header(PID, offset=0, count=2), None),
            (header(PID + 1, offset=2), None),
            (header(PID, offset=3, control=True), (ControlType.ABORT, 0)),
            (header(PID + 1, offset=4, control=True), (ControlType.COMMIT, 0)),
            (header(PID, offset=5, seq=2), None),
        ]
    )
    assert aborted == [aborted_live]
    assert replayed.encode_snapshot() == live.encode_snapshot()
    assert replayed.ongoing_txns == live.ongoing_txns == {5: PID}


def test_snapshots_carry_open_transactions_and_coordinator_epochs(tmp_path: Path) -> None:
    state = ProducerStateManager()
    state.on_append([header(PID)], 0)
    marker(state, 1, ControlType.COMMIT, coordinator_epoch=9)
    state.on_append([header(PID, seq=1)], 2)
    state.take_snapshot(tmp_path, 3)
    assert struct.unpack_from(">h", snapshot_path(tmp_path, 3).read_bytes())[0] == 2
    assert SNAPSHOT_VERSION == 2
    loaded = load_producer_state(tmp_path, 3, lambda offset: [])
    entry = loaded.entry(PID)
    assert entry is not None
    assert (entry.current_txn_first_offset, entry.coordinator_epoch) == (2, 9)
    assert loaded.ongoing_txns == {2: PID}
    assert loaded.first_unstable_offset(high_watermark=3) == 2


def test_a_version_1_snapshot_is_still_read(tmp_path: Path) -> None:
    # v1: per producer id, epoch, last timestamp, batch count; per batch seqs and offsets.
    body = struct.pack(">i", 1) + struct.pack(">qhqb", PID, 4, 1_000, 1)
    body += struct.pack(">iiqq", 0, 2, 10, 12)
    data = struct.pack(">hI", 1, crc32c.crc32c(body)) + body
    snapshot_path(tmp_path, 13).write_bytes(data)
    loaded = load_producer_state(tmp_path, 13, lambda offset: [])
    entry = loaded.entry(PID)
    assert entry is not None
    assert (entry.epoch, entry.last_seq, entry.current_txn_first_offset) == (4, 2, NO_TXN_OFFSET)
    assert loaded.snapshot_offset == 13
    # Written again as v2.
    assert struct.unpack_from(">h", loaded.encode_snapshot())[0] == 2
