"""Transactional offsets (TxnOffsetCommit) in the offset store and in a load's replay.

A real `PartitionLog` led by this (only) replica holds `__consumer_offsets`, as in
test_offsets_store. The store writes a TxnOffsetCommit's records as one transactional batch;
markers are appended as the WriteTxnMarkers handler appends them (`Partition.append_txn_marker`)
or, for the replay, as raw batches built with Kafka's layout, so the load is checked against
bytes it did not write itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from riverbed.broker.groups import log_store
from riverbed.broker.groups.log_store import CommittedOffset, Entry, TransactionalProducer
from riverbed.broker.groups.offset_store import ExpiryBase
from riverbed.hot.replication.partitions import Partition, PartitionManager
from riverbed.protocol.control_records import ControlType, encode_marker_batch
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import (
    encode_batch,
    validate_replicated_records,
)

from tests.groups.test_offsets_store import (
    MINUTE_MS,
    NOW_MS,
    TP0,
    TP1,
    committed,
    lead,
    logs,  # noqa: F401 - the fixture, by its name
    offset_store,
)

PRODUCER: Final = TransactionalProducer(producer_id=7, producer_epoch=2)
OTHER_PRODUCER: Final = TransactionalProducer(producer_id=8, producer_epoch=0)
COORDINATOR_EPOCH: Final = 1


def at(offset: CommittedOffset, record_offset: int) -> CommittedOffset:
    """`offset` as the log holds it at `record_offset`."""
    return replace(offset, record_offset=record_offset)


def marker(partition: Partition, producer: TransactionalProducer, control: ControlType) -> None:
    partition.append_txn_marker(
        producer.producer_id, producer.producer_epoch, COORDINATOR_EPOCH, control, NOW_MS
    )


async def test_pending_offsets_apply_on_commit_and_vanish_on_abort(
    logs: PartitionManager,  # noqa: F811 - the fixture
) -> None:
    partition = lead(logs)
    store = offset_store(partition)
    await store.commit("g", {TP1: committed(1)})  # record offset 0

    codes = await store.commit_transactional("g", PRODUCER, {TP0: committed(5), TP1: committed(6)})

    assert codes == {TP0: ErrorCode.NONE, TP1: ErrorCode.NONE}
    # Pending: not fetched (the previous commit still is), but unstable and "existing".
    assert store.fetch("g", [TP0, TP1]) == {TP0: None, TP1: at(committed(1), 0)}
    assert store.unstable("g", [TP0, TP1]) == {TP0, TP1}
    assert store.has_offsets("g")
    await store.commit_transactional("h", OTHER_PRODUCER, {TP0: committed(9)})
    assert store.has_offsets("h")
    assert store.fetch("h", None) == {}

    marker(partition, PRODUCER, ControlType.COMMIT)
    store.complete_transaction(PRODUCER.producer_id, ["g"], committed=True)
    marker(partition, OTHER_PRODUCER, ControlType.ABORT)
    store.complete_transaction(OTHER_PRODUCER.producer_id, ["h"], committed=False)

    assert store.fetch("g", None) == {
        TP0: at(committed(5), 1),
        TP1: at(committed(6), 2),
    }
    assert store.unstable("g", [TP0, TP1]) == set()
    assert not store.has_offsets("h")
    # A reload of the log agrees with memory.
    loaded = await log_store.load(partition)
    assert loaded.offsets == {"g": store.fetch("g", None)}
    assert not loaded.transactional


async def test_the_later_record_wins_between_transactional_and_plain_commits(
    logs: PartitionManager,  # noqa: F811 - the fixture
) -> None:
    partition = lead(logs)
    store = offset_store(partition)
    await store.commit_transactional("g", PRODUCER, {TP0: committed(5), TP1: committed(6)})
    await store.commit("g", {TP0: committed(7)})  # after the transactional record: it stays

    marker(partition, PRODUCER, ControlType.COMMIT)
    store.complete_transaction(PRODUCER.producer_id, ["g"], committed=True)

    fetched = store.fetch("g", None)
    assert fetched == {TP0: at(committed(7), 2), TP1: at(committed(6), 1)}
    loaded = await log_store.load(partition)
    assert loaded.offsets["g"] == fetched


async def test_completion_only_decides_the_groups_named(
    logs: PartitionManager,  # noqa: F811 - the fixture
) -> None:
    store = offset_store(lead(logs))
    await store.commit_transactional("g", PRODUCER, {TP0: committed(5)})
    await store.commit_transactional("elsewhere", PRODUCER, {TP0: committed(6)})
    assert store.transactional_groups(PRODUCER.producer_id) == {"g", "elsewhere"}

    store.complete_transaction(PRODUCER.producer_id, ["g"], committed=True)

    assert store.fetch("g", [TP0])[TP0] is not None
    assert store.fetch("elsewhere", [TP0]) == {TP0: None}
    assert store.unstable("elsewhere", [TP0]) == {TP0}


async def test_deleting_a_group_tombstones_its_pending_offsets(
    logs: PartitionManager,  # noqa: F811 - the fixture
) -> None:
    partition = lead(logs)
    store = offset_store(partition)
    await store.commit_transactional("g", PRODUCER, {TP0: committed(5)})

    await store.remove_group("g")  # only pending offsets: still tombstoned, as Kafka does
    marker(partition, PRODUCER, ControlType.COMMIT)
    store.complete_transaction(PRODUCER.producer_id, ["g"], committed=True)

    assert not store.has_offsets("g")
    loaded = await log_store.load(partition)
    assert loaded.offsets == {}
    assert not loaded.transactional


async def test_a_partition_with_pending_offsets_does_not_expire(
    logs: PartitionManager,  # noqa: F811 - the fixture
) -> None:
    store = offset_store(lead(logs))
    old = NOW_MS - 20 * MINUTE_MS
    store.load("g", {TP0: committed(1, at_ms=old), TP1: committed(2, at_ms=old)})
    await store.commit_transactional("g", PRODUCER, {TP0: committed(3)})

    assert store.expired("g", ExpiryBase(), NOW_MS, 10 * MINUTE_MS) == [TP1]


async def test_metadata_too_large_is_refused_per_partition(
    logs: PartitionManager,  # noqa: F811 - the fixture
) -> None:
    store = offset_store(lead(logs), metadata_max_bytes=3)
    codes = await store.commit_transactional(
        "g", PRODUCER, {TP0: committed(1, metadata="abcd"), TP1: committed(2, metadata="abc")}
    )
    assert codes == {TP0: ErrorCode.OFFSET_METADATA_TOO_LARGE, TP1: ErrorCode.NONE}
    assert store.pending_transactional(PRODUCER.producer_id, "g").keys() == {TP1}


# -- replay ---------------------------------------------------------------------------------


def append_raw(partition: Partition, batch: bytes) -> int:
    """Append a batch as bytes, below the producer state (a log written by anyone)."""
    records = memoryview(bytearray(batch))
    headers = validate_replicated_records(records)  # markers included
    return partition.log.append(records, headers, partition.leader_epoch).first_offset


def txn_batch(producer_id: int, entries: Sequence[Entry]) -> bytes:
    return encode_batch(
        [(key, value, (), NOW_MS) for key, value in entries],
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )


def plain_batch(entries: Sequence[Entry]) -> bytes:
    return encode_batch([(key, value, (), NOW_MS) for key, value in entries])


def raw_marker(producer_id: int, control: ControlType) -> bytes:
    return encode_marker_batch(producer_id, 0, control, COORDINATOR_EPOCH, NOW_MS)


def entry(group_id: str, tp: TopicPartition, offset: int) -> Entry:
    return log_store.offset_commit_entry(group_id, tp, committed(offset))


async def test_load_replays_transactions_and_their_markers(
    logs: PartitionManager,  # noqa: F811 - the fixture
) -> None:
    partition = lead(logs)
    writes = [
        txn_batch(7, [entry("g", TP0, 10), entry("g", TP1, 11)]),  # 0-1: committed below
        plain_batch([entry("g", TP1, 20)]),  # 2: later than producer 7's TP1, so it stays
        txn_batch(8, [entry("g", TP0, 30)]),  # 3: aborted below
        txn_batch(9, [entry("h", TP0, 40)]),  # 4: no marker yet
        raw_marker(7, ControlType.COMMIT),  # 5
        raw_marker(8, ControlType.ABORT),  # 6
        txn_batch(10, [entry("g", TP1, 50)]),  # 7: removed by the tombstone before its commit
        plain_batch([log_store.offset_tombstone("g", TP1)]),  # 8
        raw_marker(10, ControlType.COMMIT),  # 9
        raw_marker(11, ControlType.COMMIT),  # 10: a producer with nothing pending here
    ]
    assert [append_raw(partition, batch) for batch in writes] == [0, 2, 3, 4, 5, 6, 7, 8, 9, 10]

    loaded = await log_store.load(partition)

    assert loaded.offsets == {"g": {TP0: at(committed(10), 0)}}
    assert loaded.transactional.group_ids() == {"h"}
    assert loaded.transactional.get(9, "h") == {TP0: at(committed(40), 4)}
    # A store that takes the load decides producer 9 when its marker comes.
    store = offset_store(partition)
    for group_id, offsets in loaded.offsets.items():
        store.load(group_id, offsets)
    store.load_transactional(loaded.transactional)
    assert store.unstable("h", [TP0]) == {TP0}
    store.complete_transaction(9, ["h"], committed=True)
    assert store.fetch("h", [TP0]) == {TP0: at(committed(40), 4)}
