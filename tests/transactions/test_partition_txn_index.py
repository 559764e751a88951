"""The aborted-transaction index (`.txnindex`, Kafka's format), the last stable offset and
`aborted_transactions` of a partition, across rolls, truncation, restarts and crashes."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from riverbed.hot.storage.transactions import AbortedTxn
from riverbed.hot.storage.txn_index import TXN_INDEX_ENTRY_BYTES, TransactionIndex
from riverbed.protocol.control_records import ControlType
from riverbed.protocol.records import iter_batch_headers

from tests.transactions.partition_support import (
    NOW_MS,
    batch,
    close_cleanly,
    open_partition,
    produce,
)

PID = 9000


def test_index_file_is_kafkas_34_byte_format(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "00000000000000000000.txnindex")
    assert index.append(AbortedTxn(PID, 3, 10, 11))
    assert not index.append(AbortedTxn(PID, 3, 10, 11))  # a replay: already there
    index.flush()
    data = index.path.read_bytes()
    assert TXN_INDEX_ENTRY_BYTES == 34
    assert struct.unpack(">hqqqq", data) == (0, PID, 3, 10, 11)


def test_index_truncation_and_torn_entries(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.txnindex"
    index = TransactionIndex(path)
    for last in (5, 9, 14):
        index.append(AbortedTxn(PID, last - 2, last, last + 1))
    index.truncate_to(9)
    assert [t.last_offset for t in index.entries] == [5]
    assert path.stat().st_size == TXN_INDEX_ENTRY_BYTES
    index.close()
    with path.open("ab") as torn:
        torn.write(b"\x00" * 10)  # half an entry, as a crash leaves it
    reread = TransactionIndex(path)
    assert [t.last_offset for t in reread.entries] == [5]
    assert path.stat().st_size == TXN_INDEX_ENTRY_BYTES


def test_collect_is_kafkas_overlap_rule(tmp_path: Path) -> None:
    index = TransactionIndex(tmp_path / "x.txnindex")
    index.append(AbortedTxn(1, 0, 4, 5))
    index.append(AbortedTxn(2, 6, 9, 10))
    index.append(AbortedTxn(3, 11, 20, 21))
    assert index.collect(5, 11) == ([AbortedTxn(2, 6, 9, 10)], True)
    assert index.collect(4, 7) == ([AbortedTxn(1, 0, 4, 5), AbortedTxn(2, 6, 9, 10)], True)
    assert index.collect(21, 30) == ([], False)


def test_lso_stops_at_an_open_transaction_and_moves_with_its_marker(tmp_path: Path) -> None:
    partition = open_partition(tmp_path)
    produce(partition, batch(PID + 1, 0, transactional=False))  # offset 0
    assert partition.last_stable_offset == 1
    produce(partition, batch(PID, 0, count=2))  # offsets 1-2, open
    produce(partition, batch(PID + 1, 1, transactional=False))  # offset 3
    assert partition.log.high_watermark == 4
    assert partition.last_stable_offset == 1
    partition.append_txn_marker(PID, 0, 0, ControlType.COMMIT, NOW_MS)  # offset 4
    assert partition.last_stable_offset == 5 == partition.log.high_watermark
    assert partition.log.aborted_transactions(0, 5) == []


def test_the_lso_waits_for_the_marker_to_be_replicated(tmp_path: Path) -> None:
    partition = open_partition(tmp_path, leader=False)
    partition.become_leader(1, (1, 2), frozenset({1, 2}), 0, NOW_MS)
    produce(partition, batch(PID, 0))  # offset 0
    partition.record_follower_fetch(2, 1, NOW_MS)
    assert partition.log.high_watermark == 1
    partition.append_txn_marker(PID, 0, 0, ControlType.ABORT, NOW_MS)  # offset 1
    assert partition.last_stable_offset == 0  # the marker is not below the HW yet
    partition.record_follower_fetch(2, 2, NOW_MS)
    assert partition.log.high_watermark == 2
    assert partition.last_stable_offset == 2


def test_aborts_go_to_the_txn_index_of_the_marker_segment(tmp_path: Path) -> None:
    partition = open_partition(tmp_path)
    first = produce(partition, batch(PID, 0, count=3, value=b"x" * 100))
    for seq in range(3, 12, 3):  # enough to roll segments
        produce(partition, batch(PID, seq, count=3, value=b"x" * 100))
    result = partition.append_txn_marker(PID, 0, 0, ControlType.ABORT, NOW_MS)
    marker_offset = result.first_offset
    files = sorted(tmp_path.glob("*.txnindex"))
    assert [f.name for f in files] == [f"{result.segment_base_offset:020d}.txnindex"]
    assert result.segment_base_offset > 0  # the transaction spans segments
    expected = AbortedTxn(PID, 0, marker_offset, marker_offset + 1)
    assert partition.log.aborted_transactions(0, marker_offset) == [expected]
    assert partition.log.aborted_transactions(5, 6) == [expected]
    assert partition.log.aborted_transactions(marker_offset + 1, marker_offset + 5) == []
    assert first is not None


def _aborted_then_open(partition_dir: Path) -> tuple[int, int]:
    """Two aborted transactions, one committed and one open; returns (LSO, LEO)."""
    partition = open_partition(partition_dir)
    produce(partition, batch(PID, 0, count=2, value=b"y" * 120))
    partition.append_txn_marker(PID, 0, 0, ControlType.ABORT, NOW_MS)
    produce(partition, batch(PID, 2, value=b"y" * 120))
    partition.append_txn_marker(PID, 0, 0, ControlType.COMMIT, NOW_MS)
    produce(partition, batch(PID, 3, count=2, value=b"y" * 120))
    partition.append_txn_marker(PID, 0, 1, ControlType.ABORT, NOW_MS)
    produce(partition, batch(PID + 1, 0, value=b"y" * 120))  # stays open
    lso, leo = partition.last_stable_offset, partition.log.log_end_offset
    return lso, leo


EXPECTED_ABORTS = [AbortedTxn(PID, 0, 2, 3), AbortedTxn(PID, 5, 7, 8)]


def test_a_clean_restart_keeps_the_index_and_the_open_transaction(tmp_path: Path) -> None:
    lso, leo = _aborted_then_open(tmp_path)
    assert (lso, leo) == (8, 9)
    partition = open_partition(tmp_path)
    close_cleanly(partition)
    reopened = open_partition(tmp_path)
    assert reopened.log.recovered_from is None
    assert reopened.producer_state.ongoing_txns == {8: PID + 1}
    assert reopened.last_stable_offset == 8 or reopened.log.high_watermark < 8
    assert reopened.log.aborted_transactions(0, leo) == EXPECTED_ABORTS
    entry = reopened.producer_state.entry(PID)
    assert entry is not None
    assert entry.coordinator_epoch == 1


@pytest.mark.parametrize("lose_index", [False, True])
def test_an_unclean_restart_rebuilds_the_index_without_duplicates(
    tmp_path: Path, lose_index: bool
) -> None:
    _, leo = _aborted_then_open(tmp_path)
    if lose_index:
        for path in tmp_path.glob("*.txnindex"):
            path.unlink()  # the index writes never reached the disk
    reopened = open_partition(tmp_path)  # recovery_point None: everything re-scanned
    assert reopened.log.recovered_from == 0
    assert reopened.log.aborted_transactions(0, leo) == EXPECTED_ABORTS
    sizes = sum(path.stat().st_size for path in tmp_path.glob("*.txnindex"))
    assert sizes == len(EXPECTED_ABORTS) * TXN_INDEX_ENTRY_BYTES
    assert reopened.producer_state.ongoing_txns == {8: PID + 1}


def test_truncation_drops_index_entries_and_reopens_transactions(tmp_path: Path) -> None:
    _aborted_then_open(tmp_path)
    partition = open_partition(tmp_path, leader=False)
    partition.become_follower(2, 2, (1, 2), frozenset({1, 2}))
    partition.truncate_to(7)  # cuts the second abort marker (offset 7)
    assert partition.log.log_end_offset == 7
    assert partition.log.aborted_transactions(0, 7) == [EXPECTED_ABORTS[0]]
    assert partition.producer_state.ongoing_txns == {5: PID}
    sizes = sum(path.stat().st_size for path in tmp_path.glob("*.txnindex"))
    assert sizes == TXN_INDEX_ENTRY_BYTES


def test_a_follower_indexes_aborts_it_replicates(tmp_path: Path) -> None:
    leader_dir, follower_dir = tmp_path / "leader", tmp_path / "follower"
    _aborted_then_open(leader_dir)
    leader = open_partition(leader_dir)
    follower = open_partition(follower_dir, leader=False)
    follower.become_follower(1, 1, (1, 2), frozenset({1, 2}))
    offset = 0
    while offset < leader.log.log_end_offset:
        read = leader.log.read(offset, 1 << 20, leader.log.log_end_offset, from_replica=True)
        assert read is not None
        data = os.pread(read.region.fd, read.region.size, read.region.position)
        read.region.close()
        headers = [h for _, h in iter_batch_headers(data)]
        follower.append_as_follower(memoryview(bytearray(data)), headers, 9)
        offset = read.next_offset
    assert follower.log.aborted_transactions(0, 9) == EXPECTED_ABORTS
    assert follower.producer_state.ongoing_txns == {8: PID + 1}
    assert follower.log.last_stable_offset == 8


def test_expired_producers_with_open_transactions_survive(tmp_path: Path) -> None:
    partition = open_partition(tmp_path)
    produce(partition, batch(PID, 0))
    assert partition.producer_state.remove_expired(now_ms=NOW_MS * 1_000, expiration_ms=1) == 0
    assert partition.last_stable_offset == 0
