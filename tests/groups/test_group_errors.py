"""Bad group requests get Kafka's error codes, and the broker keeps serving.

Requests are built with kafka-python's protocol classes (Kafka's own JSON schemas), not Riverbed's
codec, and sent over a raw connection (group_support.KafkaWire) at the highest version both sides
know unless a test pins one. Each case follows Kafka's GroupCoordinator (the classic protocol):
which check comes first decides which error a request that is wrong in two ways gets, so every
request here is wrong in exactly one way. After each, the same connection and the group's
legitimate member still get normal answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pytest
from kafka.protocol.admin.groups import DeleteGroupsRequest, DescribeGroupsRequest
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)
from riverbed.protocol.errors import ErrorCode

from tests.groups.group_support import (
    BROKER_SETTINGS,
    OFFSET_FETCH_VERSION_MAX,
    KafkaWire,
    committed_offsets,
    create_topic,
    fetch_committed,
    group_name,
    wait_for_coordinator,
)
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.cluster import wait_for

SESSION_TIMEOUT_MS: Final = 5_000
REBALANCE_TIMEOUT_MS: Final = 10_000
GROUP_MAX_SESSION_TIMEOUT_MS: Final = 30_000
SETTINGS: Final = {
    **BROKER_SETTINGS,
    "group.max.session.timeout.ms": str(GROUP_MAX_SESSION_TIMEOUT_MS),
}
PARTITIONS: Final = 2
WAIT_S: Final = 30.0
# OffsetCommit v10 names topics by id; these tests name them.
OFFSET_COMMIT_VERSION_MAX: Final = 9


def subscription(topic: str) -> bytes:
    return bytes(ConsumerProtocolSubscription(version=0, topics=[topic], user_data=None).encode())


def assignment(topic: str, partitions: list[int]) -> bytes:
    entry = ConsumerProtocolAssignment.TopicPartition(topic=topic, partitions=partitions)
    encoded = ConsumerProtocolAssignment(version=0, assigned_partitions=[entry], user_data=None)
    return bytes(encoded.encode())


@dataclass
class RawMember:
    """One member speaking the classic group protocol by hand, on its own connection (a parked
    JoinGroup holds its connection, as Kafka answers a connection's requests in order)."""

    wire: KafkaWire
    group: str
    topic: str
    member_id: str = ""
    generation: int = -1
    instance_id: str | None = None  # group.instance.id: a static member (KIP-345)

    async def join(
        self,
        *,
        version: int | None = None,
        protocol_type: str = "consumer",
        protocols: Mapping[str, bytes] | None = None,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
    ) -> Any:
        """One JoinGroup; on success the member takes its id and generation from the answer."""
        offered = {"range": subscription(self.topic)} if protocols is None else protocols
        response = await self.wire.call(
            JoinGroupRequest,
            version=version,
            group_id=self.group,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
            protocol_type=protocol_type,
            protocols=[
                JoinGroupRequest.JoinGroupRequestProtocol(name=name, metadata=metadata)
                for name, metadata in offered.items()
            ],
        )
        if response.error_code == ErrorCode.NONE:
            self.member_id, self.generation = response.member_id, response.generation_id
        return response

    async def join_new(self) -> Any:
        """Join as a new member: KIP-394's MEMBER_ID_REQUIRED round first on v4+."""
        response = await self.join()
        if response.error_code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = response.member_id
            response = await self.join()
        assert response.error_code == ErrorCode.NONE, response
        return response

    async def sync(self, assignments: Mapping[str, bytes] | None = None) -> Any:
        return await self.wire.call(
            SyncGroupRequest,
            group_id=self.group,
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
            protocol_type="consumer",
            protocol_name="range",
            assignments=[
                SyncGroupRequest.SyncGroupRequestAssignment(member_id=member, assignment=data)
                for member, data in (assignments or {}).items()
            ],
        )

    async def heartbeat(
        self, *, generation: int | None = None, member_id: str | None = None
    ) -> int:
        response = await self.wire.call(
            HeartbeatRequest,
            group_id=self.group,
            generation_id=self.generation if generation is None else generation,
            member_id=self.member_id if member_id is None else member_id,
            group_instance_id=self.instance_id,
        )
        code: int = response.error_code
        return code

    async def commit(
        self,
        offsets: Mapping[tuple[str, int], int],
        *,
        generation: int | None = None,
        member_id: str | None = None,
    ) -> dict[tuple[str, int], int]:
        """OffsetCommit; the error code of each (topic, partition)."""
        topics: dict[str, list[Any]] = {}
        for (topic, partition), offset in offsets.items():
            topics.setdefault(topic, []).append(
                OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                    partition_index=partition, committed_offset=offset, committed_metadata=""
                )
            )
        response = await self.wire.call(
            OffsetCommitRequest,
            version=min(self.wire.version(OffsetCommitRequest), OFFSET_COMMIT_VERSION_MAX),
            group_id=self.group,
            generation_id_or_member_epoch=self.generation if generation is None else generation,
            member_id=self.member_id if member_id is None else member_id,
            group_instance_id=self.instance_id,
            topics=[
                OffsetCommitRequest.OffsetCommitRequestTopic(name=name, partitions=partitions)
                for name, partitions in topics.items()
            ],
        )
        return {
            (topic.name, partition.partition_index): partition.error_code
            for topic in response.topics
            for partition in topic.partitions
        }

    async def leave(self) -> tuple[int, list[int]]:
        """LeaveGroup: (the top-level error, the per-member errors from v3 on)."""
        version = self.wire.version(LeaveGroupRequest)
        response = await self.wire.call(
            LeaveGroupRequest,
            group_id=self.group,
            member_id=self.member_id,
            members=[
                LeaveGroupRequest.MemberIdentity(
                    member_id=self.member_id, group_instance_id=self.instance_id
                )
            ],
        )
        members = [m.error_code for m in response.members] if version >= 3 else []
        return response.error_code, members


class Coordinator:
    """The broker coordinating this test's groups, and connections to it."""

    def __init__(self, broker: BrokerProcess, topic: str) -> None:
        self.broker = broker
        self.topic = topic
        self.wires: list[KafkaWire] = []

    async def connect(self, address: str | None = None) -> KafkaWire:
        wire = await KafkaWire.open(address or self.broker.bootstrap)
        self.wires.append(wire)
        return wire

    async def member(self, group: str) -> RawMember:
        return RawMember(await self.connect(), group, self.topic)

    async def stable_member(self, group: str) -> RawMember:
        """A member alone in a new group, past its SyncGroup (group Stable, generation 1)."""
        member = await self.member(group)
        joined = await member.join_new()
        assert joined.leader == member.member_id, joined
        synced = await member.sync({member.member_id: assignment(self.topic, [0, 1])})
        assert synced.error_code == ErrorCode.NONE, synced
        return member

    async def close(self) -> None:
        for wire in self.wires:
            await wire.close()


@pytest.fixture
async def coordinator(broker_factory: BrokerFactory) -> AsyncIterator[Coordinator]:
    broker = broker_factory(SETTINGS)
    topic = group_name("topic")
    await create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    await wait_for_coordinator(broker.bootstrap, group_name())  # creates __consumer_offsets
    found = Coordinator(broker, topic)
    try:
        yield found
    finally:
        await found.close()


async def describe_state(wire: KafkaWire, group: str) -> str:
    response = await wire.call(DescribeGroupsRequest, groups=[group])
    (described,) = response.groups
    assert described.error_code == ErrorCode.NONE, described
    state: str = described.group_state
    return state


async def fetch_offset(wire: KafkaWire, group: str, topic: str, partition: int) -> int:
    return (await fetch_committed(wire, group, topic, [partition]))[partition]


async def test_commit_for_unknown_topic_or_partition(coordinator: Coordinator) -> None:
    group, topic = group_name(), coordinator.topic
    simple = await coordinator.member(group)  # generation -1, no member id: a "simple" commit

    errors = await simple.commit({("no-such-topic", 0): 5, (topic, PARTITIONS): 5, (topic, 0): 7})

    assert errors == {
        ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        (topic, PARTITIONS): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        (topic, 0): ErrorCode.NONE,
    }
    assert await fetch_offset(simple.wire, group, topic, 0) == 7


async def test_stale_generation_is_illegal(coordinator: Coordinator) -> None:
    group, topic = group_name(), coordinator.topic
    member = await coordinator.stable_member(group)
    current = member.generation

    for stale in (current - 1, current + 1):
        assert await member.commit({(topic, 0): 3}, generation=stale) == {
            (topic, 0): ErrorCode.ILLEGAL_GENERATION
        }
        assert await member.heartbeat(generation=stale) == ErrorCode.ILLEGAL_GENERATION
    # A generation for a group the coordinator does not know: a commit from an older life.
    ghost_group = await coordinator.member(group_name())
    assert await ghost_group.commit({(topic, 0): 3}, generation=4, member_id="m") == {
        (topic, 0): ErrorCode.ILLEGAL_GENERATION
    }

    assert await member.heartbeat() == ErrorCode.NONE
    assert await member.commit({(topic, 0): 3}) == {(topic, 0): ErrorCode.NONE}
    assert await fetch_offset(member.wire, group, topic, 0) == 3


async def test_unknown_member_id(coordinator: Coordinator) -> None:
    group, topic = group_name(), coordinator.topic
    member = await coordinator.stable_member(group)
    ghost = RawMember(await coordinator.connect(), group, topic, "ghost", member.generation)

    assert await ghost.commit({(topic, 0): 3}) == {(topic, 0): ErrorCode.UNKNOWN_MEMBER_ID}
    assert await ghost.heartbeat() == ErrorCode.UNKNOWN_MEMBER_ID
    assert (await ghost.sync()).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert (await ghost.join()).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    top_level, per_member = await ghost.leave()
    if ghost.wire.version(LeaveGroupRequest) >= 3:
        assert (top_level, per_member) == (ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID])
    else:
        assert top_level == ErrorCode.UNKNOWN_MEMBER_ID
    # Only members may commit while the group has members: not a "simple" (generation -1) commit.
    simple = await coordinator.member(group)
    assert await simple.commit({(topic, 0): 3}) == {(topic, 0): ErrorCode.UNKNOWN_MEMBER_ID}
    # A group that does not exist has no members.
    stranger = RawMember(await coordinator.connect(), group_name(), topic, "ghost", 1)
    assert await stranger.heartbeat() == ErrorCode.UNKNOWN_MEMBER_ID

    assert await member.heartbeat() == ErrorCode.NONE
    assert await describe_state(member.wire, group) == "Stable"


async def test_heartbeat_and_commit_during_a_rebalance(coordinator: Coordinator) -> None:
    group, topic = group_name(), coordinator.topic
    first = await coordinator.stable_member(group)
    second = await coordinator.member(group)
    required = await second.join()
    if required.error_code == ErrorCode.MEMBER_ID_REQUIRED:
        second.member_id = required.member_id
    # The second member's JoinGroup parks until every known member rejoined: PreparingRebalance.
    second_joins = asyncio.create_task(second.join())
    try:

        async def rebalancing() -> bool:
            return await describe_state(first.wire, group) == "PreparingRebalance"

        await wait_for(rebalancing, WAIT_S, what="the group to prepare a rebalance")
        assert await first.heartbeat() == ErrorCode.REBALANCE_IN_PROGRESS
        # Kafka still takes commits of the current generation while preparing a rebalance.
        assert await first.commit({(topic, 0): 2}) == {(topic, 0): ErrorCode.NONE}

        rejoined = await first.join()
        joined = await second_joins
    finally:
        second_joins.cancel()
    assert (rejoined.error_code, joined.error_code) == (ErrorCode.NONE, ErrorCode.NONE)
    assert rejoined.generation_id == joined.generation_id == 2
    # Joined, not yet synced: CompletingRebalance. Heartbeats are fine, commits are not.
    assert await describe_state(first.wire, group) == "CompletingRebalance"
    assert await second.heartbeat() == ErrorCode.NONE
    assert await second.commit({(topic, 1): 4}) == {(topic, 1): ErrorCode.REBALANCE_IN_PROGRESS}

    leader, follower = (first, second) if rejoined.leader == first.member_id else (second, first)
    follower_syncs = asyncio.create_task(follower.sync())
    try:
        led = await leader.sync(
            {
                leader.member_id: assignment(topic, [0]),
                follower.member_id: assignment(topic, [1]),
            }
        )
        followed = await follower_syncs
    finally:
        follower_syncs.cancel()
    assert (led.error_code, followed.error_code) == (ErrorCode.NONE, ErrorCode.NONE)
    assert await second.heartbeat() == ErrorCode.NONE
    assert await second.commit({(topic, 1): 4}) == {(topic, 1): ErrorCode.NONE}
    assert await fetch_offset(first.wire, group, topic, 0) == 2


async def test_join_without_member_id_needs_one_from_v4(coordinator: Coordinator) -> None:
    group = group_name()
    member = await coordinator.member(group)
    if member.wire.version(JoinGroupRequest) < 4:
        raise AssertionError("the broker does not offer JoinGroup v4+ (KIP-394)")

    required = await member.join(version=4)
    assert required.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert required.member_id.startswith("riverbed-group-tests-"), required.member_id
    member.member_id = required.member_id
    joined = await member.join(version=4)
    assert joined.error_code == ErrorCode.NONE
    assert (joined.member_id, joined.leader, joined.generation_id) == (
        required.member_id,
        required.member_id,
        1,
    )
    # Before v4 a member id is handed out at once.
    old = await coordinator.member(group_name())
    answered = await old.join(version=3)
    assert answered.error_code == ErrorCode.NONE
    assert answered.member_id
    assert answered.leader == answered.member_id


async def test_session_timeout_out_of_bounds(coordinator: Coordinator) -> None:
    group = group_name()
    member = await coordinator.member(group)
    minimum = int(SETTINGS["group.min.session.timeout.ms"])

    for session_timeout_ms in (minimum - 1, GROUP_MAX_SESSION_TIMEOUT_MS + 1):
        response = await member.join(session_timeout_ms=session_timeout_ms)
        assert response.error_code == ErrorCode.INVALID_SESSION_TIMEOUT, session_timeout_ms

    assert await describe_state(member.wire, group) == "Dead"  # never created
    await member.join_new()  # inside the bounds
    assert await describe_state(member.wire, group) == "CompletingRebalance"


async def test_inconsistent_group_protocol(coordinator: Coordinator) -> None:
    group, topic = group_name(), coordinator.topic
    member = await coordinator.stable_member(group)

    other_type = await coordinator.member(group)
    assert (await other_type.join(protocol_type="connect")).error_code == (
        ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    )
    no_common_assignor = await coordinator.member(group)
    response = await no_common_assignor.join(protocols={"roundrobin": subscription(topic)})
    assert response.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    # A new group needs a protocol type and at least one protocol.
    empty = await coordinator.member(group_name())
    assert (await empty.join(protocols={})).error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert (await empty.join(protocol_type="")).error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL

    assert await member.heartbeat() == ErrorCode.NONE
    assert await describe_state(member.wire, group) == "Stable"


async def test_delete_groups_only_when_empty(coordinator: Coordinator) -> None:
    group, topic = group_name(), coordinator.topic
    member = await coordinator.stable_member(group)
    assert await member.commit({(topic, 0): 9}) == {(topic, 0): ErrorCode.NONE}
    admin = await coordinator.connect()

    async def delete() -> int:
        response = await admin.call(DeleteGroupsRequest, groups_names=[group])
        (result,) = response.results
        code: int = result.error_code
        return code

    assert await delete() == ErrorCode.NON_EMPTY_GROUP
    assert await member.heartbeat() == ErrorCode.NONE
    assert await member.leave() in ((ErrorCode.NONE, [ErrorCode.NONE]), (ErrorCode.NONE, []))
    assert await describe_state(admin, group) == "Empty"
    assert await fetch_offset(admin, group, topic, 0) == 9

    assert await delete() == ErrorCode.NONE
    assert await describe_state(admin, group) == "Dead"
    assert await fetch_offset(admin, group, topic, 0) == -1  # its offsets went with it
    assert await delete() == ErrorCode.GROUP_ID_NOT_FOUND


async def test_static_member_replaced_by_a_new_member_id_is_fenced(
    coordinator: Coordinator,
) -> None:
    group, topic = group_name(), coordinator.topic
    old = await coordinator.member(group)
    old.instance_id = "instance-1"
    joined = await old.join()  # a static member needs no MEMBER_ID_REQUIRED round
    assert joined.error_code == ErrorCode.NONE, joined
    synced = await old.sync({old.member_id: assignment(topic, [0, 1])})
    assert synced.error_code == ErrorCode.NONE, synced

    # The same instance restarts: a new member id takes its place, the group stays Stable.
    new = await coordinator.member(group)
    new.instance_id = old.instance_id
    rejoined = await new.join()
    assert rejoined.error_code == ErrorCode.NONE, rejoined
    assert new.member_id != old.member_id
    assert new.generation == old.generation
    if new.wire.version(JoinGroupRequest) >= 9:
        # KIP-814: the replaced leader's successor is told it leads, but not to reassign.
        assert (rejoined.leader, rejoined.skip_assignment) == (new.member_id, True), rejoined

    assert await old.heartbeat() == ErrorCode.FENCED_INSTANCE_ID
    assert await old.commit({(topic, 0): 1}) == {(topic, 0): ErrorCode.FENCED_INSTANCE_ID}
    assert (await old.sync()).error_code == ErrorCode.FENCED_INSTANCE_ID
    assert await new.heartbeat() == ErrorCode.NONE
    assert await new.commit({(topic, 0): 1}) == {(topic, 0): ErrorCode.NONE}
    assert await describe_state(new.wire, group) == "Stable"


async def test_empty_group_id_is_invalid(coordinator: Coordinator) -> None:
    member = await coordinator.member("")
    assert (await member.join()).error_code == ErrorCode.INVALID_GROUP_ID
    assert await member.heartbeat(generation=1, member_id="m") == ErrorCode.INVALID_GROUP_ID
    member.group = group_name()
    await member.join_new()  # the same connection, a valid group


async def test_requests_to_a_broker_that_does_not_coordinate_the_group(
    broker_factory: BrokerFactory,
) -> None:
    brokers = [broker_factory(SETTINGS, broker_id=i) for i in (1, 2)]
    topic, group = group_name("topic"), group_name()
    await create_topic(brokers[0].bootstrap, topic, partitions=PARTITIONS)
    found = await wait_for_coordinator(",".join(b.bootstrap for b in brokers), group)
    (other,) = [b for b in brokers if b.broker_id != found.node_id]
    wire = await KafkaWire.open(other.bootstrap)
    try:
        member = RawMember(wire, group, topic, "someone", 1)
        assert (await member.join()).error_code == ErrorCode.NOT_COORDINATOR
        assert (await member.sync()).error_code == ErrorCode.NOT_COORDINATOR
        assert await member.heartbeat() == ErrorCode.NOT_COORDINATOR
        assert (await member.leave())[0] == ErrorCode.NOT_COORDINATOR
        assert await member.commit({(topic, 0): 1}) == {(topic, 0): ErrorCode.NOT_COORDINATOR}
        fetched = await wire.call(
            OffsetFetchRequest,
            version=min(wire.version(OffsetFetchRequest), OFFSET_FETCH_VERSION_MAX),
            group_id=group,
            topics=[OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])],
        )
        assert fetched.error_code == ErrorCode.NOT_COORDINATOR
        described = await wire.call(DescribeGroupsRequest, groups=[group])
        assert [g.error_code for g in described.groups] == [ErrorCode.NOT_COORDINATOR]
        deleted = await wire.call(DeleteGroupsRequest, groups_names=[group])
        assert [r.error_code for r in deleted.results] == [ErrorCode.NOT_COORDINATOR]
    finally:
        await wire.close()
    # The coordinator itself answers, and the same offsets API works there.
    assert await committed_offsets(found.address, group, topic, PARTITIONS) == {0: -1, 1: -1}
