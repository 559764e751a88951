"""The group coordinator's transactional offsets in this process, on a real local log.

As in test_coordinator_local: a real `PartitionLog` led by this broker holds `__consumer_offsets`
(one partition), and a real ZooKeeper backs the metadata store. Markers are appended as the
WriteTxnMarkers handler appends them (`Partition.append_txn_marker`), then it calls
`complete_transaction`, as the broker does.
"""

from __future__ import annotations

from typing import Final

from riverbed.broker.groups.coordinator import GroupCoordinator
from riverbed.broker.groups.log_store import CommittedOffset, TransactionalProducer
from riverbed.broker.groups.offsets_topic import OFFSETS_TOPIC
from riverbed.protocol import messages as m
from riverbed.protocol.control_records import ControlType
from riverbed.protocol.data_messages import ConsumerProtocolSubscription
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.versioned import encode_versioned

from tests.groups.test_coordinator_local import (
    ORDERS_0,
    SESSION_TIMEOUT_MS,
    Node,
    coordinator,  # noqa: F401 - the fixture, by its name
    join_and_sync,
    loaded,
    node,  # noqa: F401 - the fixture, by its name
)

PRODUCER: Final = TransactionalProducer(producer_id=42, producer_epoch=0)
COORDINATOR_EPOCH: Final = 0
NO_GENERATION: Final = -1
INDEX: Final = 0  # the only __consumer_offsets partition


def offsets(offset: int, now_ms: int) -> dict[TopicPartition, CommittedOffset]:
    return {ORDERS_0: CommittedOffset(offset, -1, "", now_ms)}


async def txn_commit(
    coordinator: GroupCoordinator,  # noqa: F811 - the fixture's type
    group_id: str,
    offset: int,
    now_ms: int,
    *,
    generation_id: int = NO_GENERATION,
    member_id: str = "",
    group_instance_id: str | None = None,
) -> ErrorCode:
    codes = await coordinator.commit_transactional_offsets(
        group_id,
        PRODUCER,
        generation_id,
        member_id,
        group_instance_id,
        offsets(offset, now_ms),
    )
    return codes[ORDERS_0]


def write_marker(node: Node, control: ControlType) -> None:  # noqa: F811 - the fixture's type
    partition = node.partitions.get(OFFSETS_TOPIC, INDEX)
    assert partition is not None
    partition.append_txn_marker(
        PRODUCER.producer_id, PRODUCER.producer_epoch, COORDINATOR_EPOCH, control, node.clock()
    )


def fetched_offset(coordinator: GroupCoordinator, group_id: str) -> int | None:  # noqa: F811
    committed = coordinator.fetch_offsets(group_id, [ORDERS_0])[ORDERS_0]
    return None if committed is None else committed.offset


async def test_a_commit_marker_makes_pending_offsets_committed(
    node: Node,  # noqa: F811 - the fixture
    coordinator: GroupCoordinator,  # noqa: F811 - the fixture
) -> None:
    assert await txn_commit(coordinator, "g", 5, node.clock()) == ErrorCode.NONE
    assert fetched_offset(coordinator, "g") is None
    assert coordinator.unstable_offsets("g", [ORDERS_0]) == {ORDERS_0}
    # A group known by pending offsets only is there (Empty), as in Kafka.
    assert coordinator.describe("g").group_state == "Empty"
    assert [g.group_id for g in coordinator.list_groups([])] == ["g"]

    coordinator.complete_transaction(INDEX + 1, PRODUCER.producer_id, committed=True)
    assert fetched_offset(coordinator, "g") is None  # another partition's marker: not ours

    write_marker(node, ControlType.COMMIT)
    coordinator.complete_transaction(INDEX, PRODUCER.producer_id, committed=True)
    assert fetched_offset(coordinator, "g") == 5
    assert coordinator.unstable_offsets("g", [ORDERS_0]) == set()


async def test_an_abort_marker_drops_them_and_the_group_can_go(
    node: Node,  # noqa: F811 - the fixture
    coordinator: GroupCoordinator,  # noqa: F811 - the fixture
) -> None:
    assert await txn_commit(coordinator, "g", 5, node.clock()) == ErrorCode.NONE
    write_marker(node, ControlType.ABORT)
    coordinator.complete_transaction(INDEX, PRODUCER.producer_id, committed=False)

    assert fetched_offset(coordinator, "g") is None
    assert coordinator.unstable_offsets("g", [ORDERS_0]) == set()
    assert coordinator.list_groups([]) == []


async def test_pending_offsets_survive_a_reload_and_a_marker_written_during_the_load(
    node: Node,  # noqa: F811 - the fixture
    coordinator: GroupCoordinator,  # noqa: F811 - the fixture
) -> None:
    assert await txn_commit(coordinator, "g", 5, node.clock()) == ErrorCode.NONE
    await coordinator.close()
    reloaded = GroupCoordinator(node.config, node.cache, node.store, node.partitions, node.clock)
    reloaded.start()
    try:
        partition = node.partitions.get(OFFSETS_TOPIC, INDEX)
        assert partition is not None
        reloaded.on_partition_role(partition)
        # The marker lands before the load has read anything: it is applied once loaded.
        write_marker(node, ControlType.COMMIT)
        reloaded.complete_transaction(INDEX, PRODUCER.producer_id, committed=True)
        await loaded(reloaded)
        assert fetched_offset(reloaded, "g") == 5
        assert reloaded.unstable_offsets("g", [ORDERS_0]) == set()
    finally:
        await reloaded.close()
    # A later load replays the marker from the log.
    again = await node.coordinator()
    try:
        assert fetched_offset(again, "g") == 5
    finally:
        await again.close()


async def test_deleting_a_group_with_pending_offsets_removes_them(
    node: Node,  # noqa: F811 - the fixture
    coordinator: GroupCoordinator,  # noqa: F811 - the fixture
) -> None:
    assert await txn_commit(coordinator, "g", 5, node.clock()) == ErrorCode.NONE
    assert await coordinator.delete_groups(["g"]) == {"g": ErrorCode.NONE}
    write_marker(node, ControlType.COMMIT)
    coordinator.complete_transaction(INDEX, PRODUCER.producer_id, committed=True)
    assert fetched_offset(coordinator, "g") is None
    assert coordinator.list_groups([]) == []


async def test_fencing_by_generation_member_and_instance(
    node: Node,  # noqa: F811 - the fixture
    coordinator: GroupCoordinator,  # noqa: F811 - the fixture
) -> None:
    now_ms = node.clock()

    async def code(
        group_id: str, generation_id: int, member_id: str, instance_id: str | None = None
    ) -> ErrorCode:
        return await txn_commit(
            coordinator,
            group_id,
            1,
            now_ms,
            generation_id=generation_id,
            member_id=member_id,
            group_instance_id=instance_id,
        )

    member_id, generation_id = await join_and_sync(coordinator, "g", ["orders"])
    # KIP-447 (v3): the member's generation and id.
    assert await code("g", generation_id, member_id) == ErrorCode.NONE
    assert await code("g", generation_id - 1, member_id) == ErrorCode.ILLEGAL_GENERATION
    assert await code("g", generation_id, "stranger") == ErrorCode.UNKNOWN_MEMBER_ID
    # v0-2 carry no member: accepted in a group with members (OffsetCommit would not be).
    assert await code("g", NO_GENERATION, "") == ErrorCode.NONE
    plain = await coordinator.commit_offsets("g", NO_GENERATION, "", None, offsets(1, now_ms))
    assert plain == {ORDERS_0: ErrorCode.UNKNOWN_MEMBER_ID}
    # A generation for a group the coordinator does not know names no member of it.
    assert await code("new", 3, "m") == ErrorCode.UNKNOWN_MEMBER_ID
    assert await code("", NO_GENERATION, "") == ErrorCode.INVALID_GROUP_ID

    static_id, static_generation = await join_static(coordinator, "s", "instance-1")
    assert await code("s", static_generation, static_id, "instance-1") == ErrorCode.NONE
    assert await code("s", static_generation, "old", "instance-1") == ErrorCode.FENCED_INSTANCE_ID


async def join_static(
    coordinator: GroupCoordinator,  # noqa: F811 - the fixture's type
    group_id: str,
    instance_id: str,
) -> tuple[str, int]:
    """A static member (KIP-345, JoinGroup v5) through JoinGroup and SyncGroup."""
    subscription = encode_versioned(ConsumerProtocolSubscription(topics=["orders"]), 0)
    joined = await coordinator.join(
        m.JoinGroupRequest(
            group_id=group_id,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            rebalance_timeout_ms=SESSION_TIMEOUT_MS,
            group_instance_id=instance_id,
            protocol_type="consumer",
            protocols=[m.JoinGroupRequest.JoinGroupRequestProtocol("range", subscription)],
        ),
        5,
        "client",
        "/127.0.0.1",
    )
    assert joined.error_code == ErrorCode.NONE
    synced = await coordinator.sync(
        m.SyncGroupRequest(
            group_id=group_id,
            generation_id=joined.generation_id,
            member_id=joined.member_id,
            group_instance_id=instance_id,
            assignments=[m.SyncGroupRequest.SyncGroupRequestAssignment(joined.member_id, b"")],
        ),
        3,  # v3: the instance id, without v5's protocol type and name
    )
    assert synced.error_code == ErrorCode.NONE
    return joined.member_id, joined.generation_id
