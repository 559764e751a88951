"""A group coordinator in this process on a real local log: loading, unloading, expiry.

A real `PartitionLog` led by this broker holds `__consumer_offsets`, and leadership changes are
applied to it the way the broker applies them. For expiry the clock is a variable:
`offsets.retention.minutes` is at least one minute, too slow for a broker test, so an expiry round
is called directly (the broker runs one every `offsets.retention.check.interval.ms`). A second
coordinator loading the same log must see what the first one left: expired offsets are gone from
the log too (tombstones).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest
from riverbed.broker.groups.coordinator import GroupCoordinator
from riverbed.broker.groups.log_store import CommittedOffset
from riverbed.broker.groups.offsets_topic import OFFSETS_TOPIC
from riverbed.configs import CONFIG_RULES, BrokerConfig
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.metadata_cache import MetadataCache, PartitionMetadata, TopicMetadata
from riverbed.coordination.zk import AsyncZooKeeper
from riverbed.hot.replication.partitions import PartitionManager
from riverbed.hot.storage.log import LogConfig
from riverbed.hot.storage.log_manager import LogManager
from riverbed.protocol import messages as m
from riverbed.protocol.data_messages import ConsumerProtocolSubscription
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.versioned import encode_versioned

from tests.support.waiting import eventually

BROKER_ID: Final = 1
MINUTE_MS: Final = 60_000
START_MS: Final = 1_700_000_000_000
RETENTION_MINUTES: Final = 10
ORDERS_0: Final = TopicPartition("orders", 0)
OTHER_0: Final = TopicPartition("other", 0)
SESSION_TIMEOUT_MS: Final = 10_000
LOAD_TIMEOUT_S: Final = 10.0


@dataclass
class Clock:
    now_ms: int = START_MS

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, minutes: int) -> None:
        self.now_ms += minutes * MINUTE_MS


@dataclass
class Node:
    """One broker's worth of state for a coordinator: logs, metadata, clock."""

    partitions: PartitionManager
    cache: MetadataCache
    store: ClusterMetadataStore
    config: BrokerConfig
    clock: Clock = field(default_factory=Clock)

    async def coordinator(self) -> GroupCoordinator:
        """A started coordinator that leads (and has loaded) __consumer_offsets-0."""
        coordinator = GroupCoordinator(
            self.config, self.cache, self.store, self.partitions, self.clock
        )
        coordinator.start()
        topic = self.cache.topic(OFFSETS_TOPIC)
        assert topic is not None
        partition = self.partitions.ensure(OFFSETS_TOPIC, 0, LogConfig(), topic.topic_id)
        if not partition.is_leader:
            partition.become_leader(0, (BROKER_ID,), frozenset({BROKER_ID}), 0, self.clock())
        coordinator.on_partition_role(partition)
        await loaded(coordinator)
        return coordinator


async def loaded(coordinator: GroupCoordinator) -> None:
    """Return once the coordinator's load ends (it answers instead of LOAD_IN_PROGRESS)."""

    def answers() -> bool:
        try:
            coordinator.fetch_offsets("any", [])
        except KafkaError as error:
            if error.code != ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                raise
            return False
        return True

    await eventually(answers, LOAD_TIMEOUT_S)


@pytest.fixture
def node(tmp_path: Path, zk_connect: str) -> Iterator[Node]:
    config = BrokerConfig.from_mapping(
        {
            "zookeeper.connect": zk_connect,
            "offsets.topic.num.partitions": "1",
            "offsets.retention.minutes": str(RETENTION_MINUTES),
            "group.initial.rebalance.delay.ms": "0",
        }
    )
    cache = MetadataCache()
    state = PartitionMetadata(replicas=(BROKER_ID,), leader=BROKER_ID, leader_epoch=0, isr=(1,))
    for name in (OFFSETS_TOPIC, "orders", "other"):
        cache.apply_topic(TopicMetadata(name, uuid.uuid4(), {0: state}, {}))
    logs = LogManager(tmp_path, LogConfig())
    # The store is only used to create __consumer_offsets, which exists here already.
    store = ClusterMetadataStore(AsyncZooKeeper(zk_connect), CONFIG_RULES)
    yield Node(PartitionManager(logs, BROKER_ID), cache, store, config)
    logs.close()


@pytest.fixture
async def coordinator(node: Node) -> AsyncIterator[GroupCoordinator]:
    coordinator = await node.coordinator()
    yield coordinator
    await coordinator.close()


def committed(offset: int, now_ms: int) -> dict[TopicPartition, CommittedOffset]:
    return {ORDERS_0: CommittedOffset(offset, -1, "", now_ms)}


async def simple_commit(
    coordinator: GroupCoordinator, group_id: str, offset: int, now_ms: int
) -> None:
    codes = await coordinator.commit_offsets(group_id, -1, "", None, committed(offset, now_ms))
    assert codes == {ORDERS_0: ErrorCode.NONE}


async def test_simple_offsets_expire_by_commit_time_and_stay_expired(
    node: Node, coordinator: GroupCoordinator
) -> None:
    await simple_commit(coordinator, "old", 1, node.clock())
    node.clock.advance(RETENTION_MINUTES - 4)
    await simple_commit(coordinator, "new", 2, node.clock())
    node.clock.advance(3)  # "old" is 9 minutes old: not yet
    assert await coordinator.expire_offsets() == 0
    node.clock.advance(1)  # 10 minutes: expired; "new" is 4 minutes old

    assert await coordinator.expire_offsets() == 1

    assert coordinator.fetch_offsets("old", [ORDERS_0]) == {ORDERS_0: None}
    assert coordinator.fetch_offsets("new", [ORDERS_0])[ORDERS_0] is not None
    assert [g.group_id for g in coordinator.list_groups([])] == ["new"]
    await coordinator.close()
    # Another coordinator of the same log finds the tombstone, not the old commit.
    reloaded = await node.coordinator()
    try:
        assert reloaded.fetch_offsets("old", [ORDERS_0]) == {ORDERS_0: None}
        kept = reloaded.fetch_offsets("new", [ORDERS_0])[ORDERS_0]
        assert kept is not None
        assert kept.offset == 2
    finally:
        await reloaded.close()


async def join(
    coordinator: GroupCoordinator, group_id: str, topics: list[str]
) -> m.JoinGroupResponse:
    """A new consumer member's JoinGroup (v3: no KIP-394 round trip for its member id)."""
    subscription = encode_versioned(ConsumerProtocolSubscription(topics=topics), 0)
    return await coordinator.join(
        m.JoinGroupRequest(
            group_id=group_id,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            rebalance_timeout_ms=SESSION_TIMEOUT_MS,
            protocol_type="consumer",
            protocols=[m.JoinGroupRequest.JoinGroupRequestProtocol("range", subscription)],
        ),
        3,
        "client",
        "/127.0.0.1",
    )


async def join_and_sync(
    coordinator: GroupCoordinator, group_id: str, topics: list[str]
) -> tuple[str, int]:
    """One consumer member through JoinGroup and SyncGroup: its member id and generation."""
    joined = await join(coordinator, group_id, topics)
    assert joined.error_code == ErrorCode.NONE
    synced = await coordinator.sync(
        m.SyncGroupRequest(
            group_id=group_id,
            generation_id=joined.generation_id,
            member_id=joined.member_id,
            assignments=[m.SyncGroupRequest.SyncGroupRequestAssignment(joined.member_id, b"")],
        ),
        3,
    )
    assert synced.error_code == ErrorCode.NONE
    return joined.member_id, joined.generation_id


async def test_an_empty_groups_offsets_expire_after_it_emptied_then_it_goes(
    node: Node, coordinator: GroupCoordinator
) -> None:
    member_id, generation_id = await join_and_sync(coordinator, "g", ["orders"])
    codes = await coordinator.commit_offsets(
        "g", generation_id, member_id, None, committed(7, node.clock())
    )
    assert codes == {ORDERS_0: ErrorCode.NONE}
    # The commit is old long before the group empties: the retention counts from emptying.
    node.clock.advance(2 * RETENTION_MINUTES)
    left = await coordinator.leave(m.LeaveGroupRequest(group_id="g", member_id=member_id), 2)
    assert left.error_code == ErrorCode.NONE
    assert coordinator.describe("g").group_state == "Empty"
    node.clock.advance(RETENTION_MINUTES - 1)
    assert await coordinator.expire_offsets() == 0

    node.clock.advance(1)
    assert await coordinator.expire_offsets() == 1

    assert coordinator.fetch_offsets("g", [ORDERS_0]) == {ORDERS_0: None}
    # Empty and without offsets: the group is deleted (and its tombstone written).
    assert coordinator.describe("g").group_state == "Dead"
    await coordinator.close()
    reloaded = await node.coordinator()
    try:
        assert reloaded.describe("g").group_state == "Dead"
        assert reloaded.list_groups([]) == []
    finally:
        await reloaded.close()


async def test_a_stable_group_keeps_the_offsets_of_topics_it_subscribes_to(
    node: Node, coordinator: GroupCoordinator
) -> None:
    member_id, generation_id = await join_and_sync(coordinator, "g", ["orders"])
    offsets = {
        ORDERS_0: CommittedOffset(1, -1, "", node.clock()),
        OTHER_0: CommittedOffset(2, -1, "", node.clock()),
    }
    codes = await coordinator.commit_offsets("g", generation_id, member_id, None, offsets)
    assert codes == {ORDERS_0: ErrorCode.NONE, OTHER_0: ErrorCode.NONE}
    node.clock.advance(RETENTION_MINUTES)
    # Heartbeats keep the member (the clock jumped past its session).
    beat = coordinator.heartbeat(
        m.HeartbeatRequest(group_id="g", generation_id=generation_id, member_id=member_id)
    )
    assert beat.error_code == ErrorCode.NONE

    assert await coordinator.expire_offsets() == 1

    fetched = coordinator.fetch_offsets("g", [ORDERS_0, OTHER_0])
    assert fetched[OTHER_0] is None  # no longer subscribed: expired by commit time
    orders = fetched[ORDERS_0]
    assert orders is not None
    assert orders.offset == 1
    assert coordinator.describe("g").group_state == "Stable"


async def test_requests_wait_for_the_load_and_stop_at_the_resignation(node: Node) -> None:
    coordinator = GroupCoordinator(node.config, node.cache, node.store, node.partitions, node.clock)
    coordinator.start()
    try:
        with pytest.raises(KafkaError) as not_leading:
            coordinator.fetch_offsets("g", [ORDERS_0])
        assert not_leading.value.code == ErrorCode.NOT_COORDINATOR

        topic = node.cache.topic(OFFSETS_TOPIC)
        assert topic is not None
        partition = node.partitions.ensure(OFFSETS_TOPIC, 0, LogConfig(), topic.topic_id)
        partition.become_leader(0, (BROKER_ID, 2), frozenset({BROKER_ID}), 0, node.clock())
        coordinator.on_partition_role(partition)
        with pytest.raises(KafkaError) as loading:
            coordinator.fetch_offsets("g", [ORDERS_0])
        assert loading.value.code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        await loaded(coordinator)

        # Member A is stable; B's join waits for A to rejoin (a rebalance in progress).
        await join_and_sync(coordinator, "g", ["orders"])
        parked = asyncio.create_task(join(coordinator, "g", ["orders"]))
        await eventually(lambda: coordinator.describe("g").group_state == "PreparingRebalance")
        assert not parked.done()

        # Broker 2 takes over: the parked join is answered, and the group is no longer here.
        partition.become_follower(2, 1, (BROKER_ID, 2), frozenset({BROKER_ID, 2}))
        coordinator.on_partition_role(partition)
        async with asyncio.timeout(LOAD_TIMEOUT_S):
            assert (await parked).error_code == ErrorCode.NOT_COORDINATOR
        with pytest.raises(KafkaError) as moved:
            coordinator.describe("g")
        assert moved.value.code == ErrorCode.NOT_COORDINATOR
    finally:
        await coordinator.close()
