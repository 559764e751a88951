"""The consumer's sans-IO parts on crafted fetch data: batch filtering (control batches,
read_committed per KIP-98, records below the fetch offset), lazy decoding, and the position state
machine. No broker: Riverbed cannot write transactional data or control batches."""

from __future__ import annotations

import struct

import crc32c
import pytest
from riverbed.client.fetched_records import PartitionFetch
from riverbed.client.positions import (
    EARLIEST_TIMESTAMP,
    TRANSITIONS,
    FetchState,
    IllegalTransitionError,
    PositionEvent,
    Positions,
)
from riverbed.client.types import Record, TopicPartition
from riverbed.errors import OffsetOutOfRangeError
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import (
    ATTRIBUTES_POSITION,
    CRC_POSITION,
    CompressionType,
    CorruptRecordError,
    encode_batch,
)

TP = TopicPartition("t", 0)
CONTROL_BIT = 0x20
ABORT, COMMIT = 0, 1


def batch(
    base_offset: int,
    count: int,
    *,
    producer_id: int = -1,
    transactional: bool = False,
    compression: CompressionType = CompressionType.NONE,
) -> bytes:
    records = [(None, f"v{base_offset + i}".encode(), (), 1_000 + i) for i in range(count)]
    return encode_batch(
        records,
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1,
        is_transactional=transactional,
        compression=compression,
    )


def control_batch(offset: int, producer_id: int, marker: int) -> bytes:
    """A transaction marker as a broker writes it: one control record, key (version, type)."""
    key = struct.pack(">hh", 0, marker)
    value = struct.pack(">hi", 0, 0)  # version, coordinator epoch
    raw = bytearray(
        encode_batch(
            [(key, value, (), 2_000)],
            base_offset=offset,
            producer_id=producer_id,
            producer_epoch=0,
            base_sequence=-1,
            is_transactional=True,
        )
    )
    raw[ATTRIBUTES_POSITION + 1] |= CONTROL_BIT
    struct.pack_into(">I", raw, CRC_POSITION, crc32c.crc32c(bytes(raw[ATTRIBUTES_POSITION:])))
    return bytes(raw)


def values(records: list[Record]) -> list[bytes | None]:
    return [record.value for record in records]


def drain(fetch: PartitionFetch, step: int = 1000) -> list[Record]:
    out: list[Record] = []
    while records := fetch.take(step):
        out += records
    return out


def transactional_log() -> tuple[bytes, list[tuple[int, int]]]:
    """Offsets 0-1 plain; 2-3 producer 7 (aborted, marker at 4); 5-6 producer 8 (committed,
    marker at 7); 8 plain. The broker reports producer 7's transaction as aborted from 2."""
    data = b"".join(
        [
            batch(0, 2),
            batch(2, 2, producer_id=7, transactional=True),
            control_batch(4, 7, ABORT),
            batch(5, 2, producer_id=8, transactional=True),
            control_batch(7, 8, COMMIT),
            batch(8, 1),
        ]
    )
    return data, [(7, 2)]


def test_read_committed_drops_aborted_transactions_and_every_marker() -> None:
    data, aborted = transactional_log()
    fetch = PartitionFetch(TP, data, 0, 0, read_committed=True, aborted_transactions=aborted)

    records = drain(fetch)

    assert [r.offset for r in records] == [0, 1, 5, 6, 8]
    assert fetch.next_offset == fetch.end_offset == 9


def test_read_uncommitted_keeps_aborted_records_but_never_control_records() -> None:
    data, aborted = transactional_log()
    fetch = PartitionFetch(TP, data, 0, 0, read_committed=False, aborted_transactions=aborted)

    records = drain(fetch)

    assert [r.offset for r in records] == [0, 1, 2, 3, 5, 6, 8]


def test_abort_marker_ends_the_aborted_range_for_later_batches_of_that_producer() -> None:
    # Producer 7 aborts at 2-3 (marker 4), then commits 5-6 (marker 7).
    data = b"".join(
        [
            batch(2, 2, producer_id=7, transactional=True),
            control_batch(4, 7, ABORT),
            batch(5, 2, producer_id=7, transactional=True),
            control_batch(7, 7, COMMIT),
        ]
    )
    fetch = PartitionFetch(TP, data, 2, 0, read_committed=True, aborted_transactions=[(7, 2)])

    assert [r.offset for r in drain(fetch)] == [5, 6]
    assert fetch.next_offset == 8


def test_records_below_the_fetch_offset_are_skipped_inside_the_first_batch() -> None:
    data = batch(0, 10) + batch(10, 10)
    fetch = PartitionFetch(TP, data, 7, 0)

    assert values(fetch.take(4)) == [b"v7", b"v8", b"v9", b"v10"]
    assert fetch.next_offset == 11
    assert [r.offset for r in drain(fetch)] == list(range(11, 20))


def test_batches_wholly_below_the_fetch_offset_are_not_decoded() -> None:
    corrupt_old = bytearray(batch(0, 5))
    corrupt_old[-1] ^= 0xFF  # fails its CRC, but lies below the fetch offset
    fetch = PartitionFetch(TP, bytes(corrupt_old) + batch(5, 2), 5, 0)

    assert [r.offset for r in drain(fetch)] == [5, 6]


def test_take_decodes_lazily_and_respects_max_records() -> None:
    data = batch(0, 3) + batch(3, 3, compression=CompressionType.ZSTD)
    fetch = PartitionFetch(TP, data, 0, 0)

    assert [r.offset for r in fetch.take(2)] == [0, 1]
    assert fetch.next_offset == 2
    assert [r.offset for r in fetch.take(2)] == [2, 3]
    exhausted_early = fetch.exhausted
    assert [r.offset for r in fetch.take(10)] == [4, 5]
    assert (exhausted_early, fetch.exhausted) == (False, True)
    assert not fetch.take(10)


def test_a_partial_last_batch_is_left_for_the_next_fetch() -> None:
    data = batch(0, 2) + batch(2, 2)[:-5]
    fetch = PartitionFetch(TP, data, 0, 0)

    assert fetch.end_offset == 2
    assert [r.offset for r in drain(fetch)] == [0, 1]


def test_records_are_plain_frozen_records_with_every_field() -> None:
    data = encode_batch([(b"k", b"v", [("h", b"1"), ("n", None)], 1234)], base_offset=41)
    (record,) = drain(PartitionFetch(TopicPartition("orders", 3), data, 41, 0))

    assert type(record) is Record
    assert record == Record("orders", 3, 41, 1234, 0, b"k", b"v", (("h", b"1"), ("n", None)))
    with pytest.raises(AttributeError):
        record.value = b"x"  # type: ignore[misc]


def test_a_batch_failing_its_crc_raises_corrupt_record_unless_crcs_are_not_checked() -> None:
    data = bytearray(batch(0, 3))
    data[-2] ^= 0x01  # flips a byte of the last value
    with pytest.raises(CorruptRecordError) as raised:
        PartitionFetch(TP, bytes(data), 0, 0).take(10)
    assert raised.value.code == ErrorCode.CORRUPT_MESSAGE

    records = PartitionFetch(TP, bytes(data), 0, 0, check_crcs=False).take(10)
    assert len(records) == 3


# -- positions --------------------------------------------------------------------------------
def test_every_state_event_pair_is_either_in_the_table_or_refused() -> None:
    for state in FetchState:
        for event in PositionEvent:
            positions = Positions(EARLIEST_TIMESTAMP)
            positions.assign([TP])
            partition = positions.get(TP)
            partition.state = state
            if (state, event) in TRANSITIONS:
                partition.apply(event)
                assert partition.state is TRANSITIONS[(state, event)]
            else:
                with pytest.raises(IllegalTransitionError):
                    partition.apply(event)


def test_seek_discards_buffered_data_and_bumps_the_generation() -> None:
    positions = Positions(EARLIEST_TIMESTAMP)
    positions.assign([TP])
    positions.seek(TP, 5)
    partition = positions.get(TP)
    partition.buffered.append(PartitionFetch(TP, batch(5, 2), 5, partition.generation))
    generation = partition.generation

    positions.seek(TP, 0)

    assert partition.generation == generation + 1
    assert not partition.buffered
    assert (partition.position, partition.fetch_offset) == (0, 0)
    # A lookup answered for the old generation is dropped.
    assert not positions.reset_done(TP, generation, 99)


def test_out_of_range_without_a_policy_fails_until_seeked() -> None:
    positions = Positions(None)
    positions.assign([TP])
    positions.seek(TP, 100)
    error = OffsetOutOfRangeError(ErrorCode.OFFSET_OUT_OF_RANGE, "out")

    positions.out_of_range(TP, positions.get(TP).generation, error)

    assert positions.get(TP).state is FetchState.FAILED
    assert positions.get(TP).error is error
    positions.seek(TP, 0)
    assert positions.get(TP).state is FetchState.FETCHING
    assert positions.get(TP).error is None


def test_assign_keeps_positions_of_partitions_still_assigned() -> None:
    other = TopicPartition("t", 1)
    positions = Positions(EARLIEST_TIMESTAMP)
    positions.assign([TP])
    positions.seek(TP, 42)

    positions.assign([TP, other])

    assert positions.get(TP).position == 42
    assert positions.get(other).state is FetchState.AWAITING_RESET
    positions.assign([other])
    assert positions.assignment() == frozenset({other})


def test_the_position_ends_past_a_batch_taken_in_several_parts() -> None:
    """A batch larger than one take: the position follows each part and, after the last part,
    is past the batch (it once stayed at the last part's first offset, so the next fetch read
    that part again and position() never reached the end)."""
    fetch = PartitionFetch(TP, batch(0, 10) + batch(10, 3), 0, 0)

    positions = []
    while not fetch.exhausted:
        taken = fetch.take(4)
        positions.append((taken[0].offset, taken[-1].offset, fetch.next_offset))
    assert positions == [(0, 3, 4), (4, 7, 8), (8, 11, 12), (12, 12, 13)]
