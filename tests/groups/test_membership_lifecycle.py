"""GroupMembership as leadership moves: groups restored from their stored metadata (sessions
starting at load), unloading and closing answer parked calls and stop every timer, and a group's
writes reach the log in the order it made them."""

from __future__ import annotations

import asyncio

from riverbed.broker.groups.group_values import GroupState
from riverbed.protocol import messages as m
from riverbed.protocol.data_messages import GroupMetadataValue
from riverbed.protocol.errors import ErrorCode

from tests.groups.membership_support import (
    heartbeat,
    join,
    join_new,
    running,
    stable_group,
    subscription,
    sync,
)
from tests.support.virtual_time import virtual_time


def stored_group(session_ms: int = 300) -> GroupMetadataValue:
    member = GroupMetadataValue.MemberMetadata
    return GroupMetadataValue(
        protocol_type="consumer",
        generation=4,
        protocol="range",
        leader="m-1",
        current_state_timestamp=1_234,
        members=[
            # m-1 as a version 0 record stores it: without a rebalance timeout.
            member("m-1", None, "c1", "/10.0.0.1", -1, session_ms, subscription("a"), b"A"),
            member("m-2", "inst", "c2", "/10.0.0.2", 5_000, session_ms, subscription("b"), b"B"),
        ],
    )


@virtual_time
async def test_a_loaded_group_is_stable_and_its_sessions_start_at_load() -> None:
    async with running() as (membership, persist):
        membership.load("g", stored_group(session_ms=300))
        assert membership.group_state("g") is GroupState.STABLE
        assert membership.state_timestamp_ms("g") == 1_234
        assert membership.subscribed_topics("g") == frozenset({"a", "b"})
        described = membership.describe("g")
        assert [(d.member_id, d.client_host, d.member_assignment) for d in described.members] == [
            ("m-1", "/10.0.0.1", b"A"),
            ("m-2", "/10.0.0.2", b"B"),
        ]
        assert described.members[1].group_instance_id == "inst"
        resynced = await sync(membership, "m-2", 4, instance="inst")
        assert resynced.assignment == b"B"  # members pick up where they were
        for _ in range(8):  # m-2 heartbeats for 400 ms; m-1 never does
            await asyncio.sleep(0.05)
            error = heartbeat(membership, "m-2", 4, instance="inst")
        assert error is ErrorCode.REBALANCE_IN_PROGRESS
        assert [d.member_id for d in membership.describe("g").members] == ["m-2"]
        rejoined = await join(membership, "m-2", instance="inst", session_ms=300)
        assert (rejoined.generation_id, rejoined.leader) == (5, "m-2")
        assert persist.writes == []  # nothing stored until the new leader syncs


@virtual_time
async def test_a_version_0_record_without_rebalance_timeout_uses_the_session_timeout() -> None:
    async with running() as (membership, _):
        membership.load("g", stored_group(session_ms=300))
        started = asyncio.get_running_loop().time()
        # m-2 rejoins with a 10 ms rebalance timeout; m-1 stays alive without rejoining: the
        # join phase lasts m-1's rebalance timeout, which is its session timeout (300 ms).
        rejoin = asyncio.create_task(join(membership, "m-2", instance="inst", rebalance_ms=10))
        await asyncio.sleep(0)
        while not rejoin.done():
            assert heartbeat(membership, "m-1", 4) is ErrorCode.REBALANCE_IN_PROGRESS
            await asyncio.sleep(0.02)
        # Virtual time: the 300 ms session timeout, seen at the next 20 ms poll at the latest.
        assert 0.3 - 1e-6 <= asyncio.get_running_loop().time() - started <= 0.32 + 1e-6
        assert [member.member_id for member in rejoin.result().members] == ["m-2"]


@virtual_time
async def test_unload_answers_parked_calls_with_not_coordinator_and_forgets_the_group() -> None:
    async with running() as (membership, persist):
        (leader, follower), generation = await stable_group(membership, 2)
        writes = len(persist.writes)
        rejoin = asyncio.create_task(join(membership, leader))
        other = asyncio.create_task(join_new(membership, group_id="h"))
        await asyncio.sleep(0.01)
        membership.unload(["g", "h"])
        assert (await rejoin).error_code == ErrorCode.NOT_COORDINATOR
        assert (await other).error_code == ErrorCode.NOT_COORDINATOR
        assert membership.group_state("g") is None
        assert membership.list([]) == []
        assert heartbeat(membership, follower, generation) is ErrorCode.UNKNOWN_MEMBER_ID
        await asyncio.sleep(0.1)  # no timer of the dropped groups fires: nothing is written
        assert len(persist.writes) == writes


@virtual_time
async def test_a_parked_sync_is_answered_not_coordinator_when_unloaded_mid_write() -> None:
    async with running() as (membership, persist):
        joins = await asyncio.gather(join_new(membership), join_new(membership))
        leader = joins[0].leader
        follower = next(j.member_id for j in joins if j.member_id != leader)
        persist.hold()
        syncs = [
            asyncio.create_task(sync(membership, follower, 1)),
            asyncio.create_task(sync(membership, leader, 1, {leader: b"L", follower: b"F"})),
        ]
        await asyncio.sleep(0.05)
        membership.unload(["g"])
        results = await asyncio.gather(*syncs)
        assert {r.error_code for r in results} == {ErrorCode.NOT_COORDINATOR}
        persist.release()
        await asyncio.sleep(0.01)
        assert persist.writes == []  # the write was cancelled with the group


@virtual_time
async def test_close_answers_parked_calls_and_stops_every_timer() -> None:
    async with running() as (membership, persist):
        (leader, _), _ = await stable_group(membership, 2, session_ms=100)
        rejoin = asyncio.create_task(join(membership, leader, session_ms=100))
        await asyncio.sleep(0.01)
        writes = len(persist.writes)
        membership.close()
        assert (await rejoin).error_code == ErrorCode.NOT_COORDINATOR
        await membership.wait_closed()
        # Were a session timer left, the members would expire and an empty group be written.
        await asyncio.sleep(0.3)
        assert len(persist.writes) == writes


@virtual_time
async def test_a_groups_writes_reach_the_log_in_the_order_it_made_them() -> None:
    async with running() as (membership, persist):
        first = await join(membership, version=3, session_ms=100)
        persist.hold()
        leader_sync = asyncio.create_task(
            sync(membership, first.member_id, 1, {first.member_id: b"A"})
        )
        await asyncio.sleep(0.01)
        # While generation 1 is being written, the member leaves: the group is empty now and
        # asks for generation 2 to be written; it must not overtake the first write.
        await membership.leave(m.LeaveGroupRequest(group_id="g", member_id=first.member_id), 2)
        await asyncio.sleep(0.05)
        assert persist.started == 1  # the second write waits for the first to end
        persist.release()
        assert (await leader_sync).error_code == ErrorCode.UNKNOWN_MEMBER_ID  # it left
        await asyncio.sleep(0.01)
        assert [value.generation for _, value in persist.writes if value] == [1, 2]
        assert membership.group_state("g") is GroupState.EMPTY


@virtual_time
async def test_subscribed_topics_only_for_parsable_consumer_groups() -> None:
    async with running() as (membership, _):
        assert membership.subscribed_topics("nowhere") is None
        await join(membership, group_id="connect", protocol_type="connect", version=3)
        await join(membership, group_id="garbled", protocols=(("range", b"\x00"),), version=3)
        await asyncio.sleep(0.1)  # both through their initial delay
        assert membership.group_state("garbled") is GroupState.COMPLETING_REBALANCE
        assert membership.subscribed_topics("connect") is None
        assert membership.subscribed_topics("garbled") is None
