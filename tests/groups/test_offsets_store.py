"""`__consumer_offsets` records on a real local log, and the offsets kept in memory.

A real `PartitionLog` in a temporary directory, led by this (only) replica, stands in for the
coordinator's partition: writes commit at once (or, with a follower that never fetches, never),
and loading replays what the log holds. Expiry runs on an injected clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from riverbed.broker.groups import log_store
from riverbed.broker.groups.log_store import (
    CommittedOffset,
    Entry,
    OnAppended,
    TransactionalProducer,
)
from riverbed.broker.groups.offset_store import ExpiryBase, OffsetStore
from riverbed.broker.groups.offsets_topic import OFFSETS_TOPIC
from riverbed.coordination.metadata_cache import MetadataCache, PartitionMetadata, TopicMetadata
from riverbed.hot.replication.partitions import Partition, PartitionManager
from riverbed.hot.storage.log import LogConfig
from riverbed.hot.storage.log_manager import LogManager
from riverbed.protocol.data_messages import GroupMetadataValue
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition

BROKER_ID = 1
NOW_MS = 1_700_000_000_000
MINUTE_MS = 60_000
TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[PartitionManager]:
    manager = LogManager(tmp_path, LogConfig())
    yield PartitionManager(manager, BROKER_ID)
    manager.close()


def lead(partitions: PartitionManager, *, replicas: Sequence[int] = (BROKER_ID,)) -> Partition:
    partition = partitions.ensure(OFFSETS_TOPIC, 0, LogConfig(), uuid.uuid4())
    partition.become_leader(0, tuple(replicas), frozenset(replicas), 0, NOW_MS)
    return partition


def committed(offset: int, *, at_ms: int = NOW_MS, metadata: str = "") -> CommittedOffset:
    return CommittedOffset(
        offset=offset, leader_epoch=3, metadata=metadata, commit_timestamp_ms=at_ms
    )


def test_keys_and_values_are_kafkas_bytes() -> None:
    key, value = log_store.offset_commit_entry("g", TopicPartition("t", 2), committed(7))
    # OffsetCommitKey v1: int16 version, group and topic as int16-prefixed strings, int32.
    assert key == b"\x00\x01" + b"\x00\x01g" + b"\x00\x01t" + b"\x00\x00\x00\x02"
    # OffsetCommitValue v3: offset int64, leader epoch int32, metadata, commit timestamp int64.
    assert value == (
        b"\x00\x03"
        + (7).to_bytes(8, "big")
        + (3).to_bytes(4, "big")
        + b"\x00\x00"
        + NOW_MS.to_bytes(8, "big")
    )
    group_key, tombstone = log_store.group_metadata_entry("g", None)
    assert (group_key, tombstone) == (b"\x00\x02\x00\x01g", None)  # GroupMetadataKey v2


async def test_load_replays_latest_values_and_tombstones(logs: PartitionManager) -> None:
    partition = lead(logs)
    group_value = GroupMetadataValue(protocol_type="consumer", generation=4, protocol="range")
    writes: list[list[Entry]] = [
        [
            log_store.offset_commit_entry("a", TP0, committed(10)),
            log_store.offset_commit_entry("a", TP1, committed(20)),
            log_store.offset_commit_entry("b", TP0, committed(5)),
        ],
        [log_store.group_metadata_entry("a", group_value)],
        [log_store.group_metadata_entry("gone", group_value)],
        [
            log_store.offset_commit_entry("a", TP0, committed(11, metadata="m")),
            log_store.offset_tombstone("a", TP1),
            log_store.offset_tombstone("b", TP0),
            log_store.group_metadata_entry("gone", None),
        ],
    ]
    first_offsets = [await log_store.append(partition, w, NOW_MS, 1_000) for w in writes]
    assert first_offsets == [0, 3, 4, 5]

    loaded = await log_store.load(partition)

    assert loaded.offsets == {"a": {TP0: CommittedOffset(11, 3, "m", NOW_MS, record_offset=5)}}
    assert loaded.groups == {"a": group_value}


async def test_a_write_that_the_isr_does_not_take_times_out(logs: PartitionManager) -> None:
    # Broker 2 is in the ISR but never fetches: the high watermark cannot pass the write.
    partition = lead(logs, replicas=(BROKER_ID, 2))
    entry = log_store.offset_commit_entry("a", TP0, committed(1))
    with pytest.raises(KafkaError) as raised:
        await log_store.append(partition, [entry], NOW_MS, timeout_ms=50)
    assert raised.value.code == ErrorCode.REQUEST_TIMED_OUT
    mapped = log_store.coordinator_error(raised.value, commit=True)
    assert mapped.code == ErrorCode.COORDINATOR_NOT_AVAILABLE


async def test_write_errors_map_to_what_group_clients_understand(logs: PartitionManager) -> None:
    partition = lead(logs)
    partition.log.update_config(LogConfig(max_message_bytes=100))
    huge = log_store.offset_commit_entry("a", TP0, committed(1, metadata="x" * 200))
    with pytest.raises(KafkaError) as too_large:
        await log_store.append(partition, [huge], NOW_MS, 1_000)
    assert too_large.value.code == ErrorCode.MESSAGE_TOO_LARGE
    commit_code = log_store.coordinator_error(too_large.value, commit=True).code
    assert commit_code == ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    group_code = log_store.coordinator_error(too_large.value, commit=False).code
    assert group_code == ErrorCode.UNKNOWN_SERVER_ERROR

    partition.become_follower(2, 1, (BROKER_ID, 2), frozenset({BROKER_ID, 2}))
    with pytest.raises(KafkaError) as not_leader:
        await log_store.append(partition, [log_store.offset_tombstone("a", TP0)], NOW_MS, 1_000)
    assert not_leader.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    mapped = log_store.coordinator_error(not_leader.value, commit=True)
    assert mapped.code == ErrorCode.NOT_COORDINATOR


# -- OffsetStore -----------------------------------------------------------------------------


def data_topic_cache() -> MetadataCache:
    cache = MetadataCache()
    state = PartitionMetadata(replicas=(BROKER_ID,), leader=BROKER_ID, leader_epoch=0, isr=(1,))
    cache.apply_topic(TopicMetadata("orders", uuid.uuid4(), {0: state, 1: state}, {}))
    return cache


def offset_store(partition: Partition, metadata_max_bytes: int = 4096) -> OffsetStore:
    async def write(
        _group_id: str,
        entries: Sequence[Entry],
        *,
        producer: TransactionalProducer | None = None,
        on_appended: OnAppended | None = None,
    ) -> int:
        return await log_store.append(
            partition, entries, NOW_MS, 1_000, producer=producer, on_appended=on_appended
        )

    return OffsetStore(data_topic_cache(), write, metadata_max_bytes)


async def test_commits_apply_once_written_and_match_a_reload(logs: PartitionManager) -> None:
    partition = lead(logs)
    store = offset_store(partition, metadata_max_bytes=3)

    offsets = {TP0: committed(5, metadata="abc"), TP1: committed(6, metadata="abcd")}
    codes = await store.commit("g", offsets)

    assert codes == {TP0: ErrorCode.NONE, TP1: ErrorCode.OFFSET_METADATA_TOO_LARGE}
    written = CommittedOffset(5, 3, "abc", NOW_MS, record_offset=0)
    assert store.fetch("g", [TP0, TP1]) == {TP0: written, TP1: None}
    unknown = [TopicPartition("orders", 2), TopicPartition("x", 0)]
    assert store.unknown_partitions([TP0, *unknown]) == unknown
    loaded = await log_store.load(partition)
    assert loaded.offsets["g"] == store.fetch("g", None)


def test_expiry_rules_per_group_kind(logs: PartitionManager) -> None:
    store = offset_store(lead(logs))
    retention_ms = 10 * MINUTE_MS
    old = NOW_MS - 20 * MINUTE_MS
    store.load("g", {TP0: committed(1, at_ms=old), TP1: committed(2, at_ms=NOW_MS)})
    explicit = CommittedOffset(3, -1, "", old, expire_timestamp_ms=NOW_MS + 1)
    store.load("v2", {TP0: explicit})

    # By commit time (simple consumers): only the old commit.
    assert store.expired("g", ExpiryBase(), NOW_MS, retention_ms) == [TP0]
    # Empty since 5 minutes: nothing yet; since 10 minutes: everything.
    recently_empty = ExpiryBase(since_ms=NOW_MS - 5 * MINUTE_MS)
    assert store.expired("g", recently_empty, NOW_MS, retention_ms) == []
    long_empty = ExpiryBase(since_ms=NOW_MS - 10 * MINUTE_MS)
    assert store.expired("g", long_empty, NOW_MS, retention_ms) == [TP0, TP1]
    # A stable group keeps the topics it subscribes to.
    subscribed = ExpiryBase(kept_topics=frozenset({"orders"}))
    assert store.expired("g", subscribed, NOW_MS, retention_ms) == []
    # An explicit retention (OffsetCommit v2-4) wins over the broker's.
    assert store.expired("v2", ExpiryBase(), NOW_MS, retention_ms) == []
    assert store.expired("v2", ExpiryBase(), NOW_MS + 1, retention_ms) == [TP0]


async def test_removal_writes_tombstones_that_a_reload_honours(logs: PartitionManager) -> None:
    partition = lead(logs)
    store = offset_store(partition)
    await store.commit("g", {TP0: committed(1), TP1: committed(2)})
    await store.commit("h", {TP0: committed(3)})

    await store.remove("g", [TP0])
    assert store.fetch("g", None) == {TP1: CommittedOffset(2, 3, "", NOW_MS, record_offset=1)}
    await store.remove_group("g")
    assert not store.has_offsets("g")

    loaded = await log_store.load(partition)
    assert set(loaded.offsets) == {"h"}
    assert loaded.offsets["h"][TP0].offset == 3
