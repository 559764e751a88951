"""read_committed filtering (KIP-98) on fetch data built as a broker would hold it: transactional
batches from riverbed.protocol.records.encode_batch and the markers of
riverbed.protocol.control_records.encode_marker_batch, placed at their log offsets. The filter is
Kafka's (CompletedFetch): a transactional batch of a producer is skipped from the first offset
of that producer's aborted transaction (the response's `aborted_transactions`) until the
producer's ABORT marker; control batches never surface."""

from __future__ import annotations

import struct

import pytest
from riverbed.client.fetched_records import PartitionFetch
from riverbed.client.types import TopicPartition
from riverbed.protocol.control_records import ControlType, encode_marker_batch
from riverbed.protocol.records import encode_batch

TP = TopicPartition("t", 0)
P1, P2 = 1001, 1002


def txn_batch(base_offset: int, count: int, producer_id: int, sequence: int = 0) -> bytes:
    records = [(None, f"v{base_offset + i}".encode(), (), 1_000 + i) for i in range(count)]
    return encode_batch(
        records,
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=sequence,
        is_transactional=True,
    )


def plain_batch(base_offset: int, count: int) -> bytes:
    records = [(None, f"v{base_offset + i}".encode(), (), 1_000 + i) for i in range(count)]
    return encode_batch(records, base_offset=base_offset)


def marker(offset: int, producer_id: int, control_type: ControlType) -> bytes:
    """A marker batch at `offset` (the base offset is outside the CRC, as the log places it)."""
    data = encode_marker_batch(producer_id, 0, control_type, 0, 5_000)
    return struct.pack(">q", offset) + data[8:]


def offsets(fetch: PartitionFetch) -> list[int]:
    return [record.offset for record in fetch.take(1_000)]


# Offsets: P1 aborted 0-1, P2 committed 2-3, P1's ABORT 4, P2's COMMIT 5, P1 committed 6,
# non-transactional 7, P1's COMMIT 8.
LOG = b"".join(
    [
        txn_batch(0, 2, P1),
        txn_batch(2, 2, P2),
        marker(4, P1, ControlType.ABORT),
        marker(5, P2, ControlType.COMMIT),
        txn_batch(6, 1, P1, sequence=2),
        plain_batch(7, 1),
        marker(8, P1, ControlType.COMMIT),
    ]
)


def test_read_committed_drops_the_aborted_transaction_and_every_marker() -> None:
    fetch = PartitionFetch(TP, LOG, 0, 0, read_committed=True, aborted_transactions=[(P1, 0)])
    assert offsets(fetch) == [2, 3, 6, 7]
    # Past the last marker: the markers and the aborted batch count as read.
    assert fetch.next_offset == 9
    assert fetch.exhausted


def test_read_uncommitted_keeps_aborted_records_but_never_markers() -> None:
    fetch = PartitionFetch(TP, LOG, 0, 0, read_committed=False, aborted_transactions=[(P1, 0)])
    assert offsets(fetch) == [0, 1, 2, 3, 6, 7]
    assert fetch.next_offset == 9


def test_an_aborted_range_applies_only_from_its_first_offset() -> None:
    # P1 committed 0-1 (COMMIT at 2), then aborted 3-4 (ABORT at 5), then committed 6.
    data = b"".join(
        [
            txn_batch(0, 2, P1),
            marker(2, P1, ControlType.COMMIT),
            txn_batch(3, 2, P1, sequence=2),
            marker(5, P1, ControlType.ABORT),
            txn_batch(6, 1, P1, sequence=4),
        ]
    )
    fetch = PartitionFetch(TP, data, 0, 0, read_committed=True, aborted_transactions=[(P1, 3)])
    assert offsets(fetch) == [0, 1, 6]


def test_two_aborted_transactions_of_one_producer_in_one_response() -> None:
    data = b"".join(
        [
            txn_batch(0, 1, P1),
            marker(1, P1, ControlType.ABORT),
            txn_batch(2, 1, P2),
            txn_batch(3, 1, P1, sequence=1),
            marker(4, P1, ControlType.ABORT),
            marker(5, P2, ControlType.COMMIT),
        ]
    )
    fetch = PartitionFetch(
        TP, data, 0, 0, read_committed=True, aborted_transactions=[(P1, 3), (P1, 0)]
    )
    assert offsets(fetch) == [2]


def test_an_open_abort_from_before_the_fetch_offset_still_hides_the_batch() -> None:
    # The fetch starts at 2 inside P1's aborted transaction (first offset 0): its batch at 2
    # is skipped although the range began before this response.
    data = b"".join([txn_batch(2, 2, P1, sequence=2), marker(4, P1, ControlType.ABORT)])
    fetch = PartitionFetch(TP, data, 2, 0, read_committed=True, aborted_transactions=[(P1, 0)])
    assert offsets(fetch) == []
    assert fetch.next_offset == 5


@pytest.mark.parametrize("max_records", [1, 2, 3])
def test_taking_in_small_steps_filters_the_same(max_records: int) -> None:
    fetch = PartitionFetch(TP, LOG, 0, 0, read_committed=True, aborted_transactions=[(P1, 0)])
    taken: list[int] = []
    while not fetch.exhausted:
        taken += [record.offset for record in fetch.take(max_records)]
    assert taken == [2, 3, 6, 7]
