"""GroupMembership on asyncio, in virtual time: members joining together, followers waiting for
the leader, the group's metadata written before anyone is answered, sessions and rebalance
timeouts that remove members, static members rejoining without a rebalance."""

from __future__ import annotations

import asyncio

from riverbed.broker.groups.group_values import GroupState
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.messages import LeaveGroupRequest

from tests.groups.membership_support import (
    RANGE,
    heartbeat,
    join,
    join_new,
    running,
    stable_group,
    subscription,
    sync,
)
from tests.support.virtual_time import virtual_time


@virtual_time
async def test_concurrent_joins_make_one_generation_and_syncs_hand_out_the_assignment() -> None:
    async with running() as (membership, persist):
        protocols = [
            (("range", subscription("t1")), ("roundrobin", subscription("t1"))),
            (("roundrobin", subscription("t2")), ("range", subscription("t2"))),
            (("range", subscription("t3")),),
        ]
        joins = await asyncio.gather(*(join_new(membership, protocols=p) for p in protocols))
        assert {j.error_code for j in joins} == {ErrorCode.NONE}
        assert {j.generation_id for j in joins} == {1}
        assert {j.protocol_name for j in joins} == {"range"}  # the only one all support
        leader = joins[0].leader
        assert {j.leader for j in joins} == {leader}
        by_id = {j.member_id: j for j in joins}
        assert {m.member_id for m in by_id[leader].members} == set(by_id)
        assert all(not j.members for j in joins if j.member_id != leader)
        assert membership.group_state("g") is GroupState.COMPLETING_REBALANCE

        followers = [member_id for member_id in by_id if member_id != leader]
        parked = [asyncio.create_task(sync(membership, f, 1)) for f in followers]
        await asyncio.sleep(0.1)
        assert not any(task.done() for task in parked)  # waiting for the leader's assignment
        assignments = {member_id: member_id.encode() for member_id in by_id}
        leader_sync = await sync(membership, leader, 1, assignments)
        assert (leader_sync.error_code, leader_sync.assignment) == (ErrorCode.NONE, leader.encode())
        assert (leader_sync.protocol_type, leader_sync.protocol_name) == ("consumer", "range")
        for follower, task in zip(followers, parked, strict=True):
            response = await task
            assert (response.error_code, response.assignment) == (ErrorCode.NONE, follower.encode())

        stored = persist.last()
        assert stored is not None
        assert stored.generation == 1
        assert stored.leader == leader
        assert {m.member_id: m.assignment for m in stored.members} == assignments
        assert membership.group_state("g") is GroupState.STABLE
        assert membership.subscribed_topics("g") == frozenset({"t1", "t2", "t3"})
        described = membership.describe("g")
        assert (described.group_state, described.protocol_data) == ("Stable", "range")
        assert {m.member_id: m.member_assignment for m in described.members} == assignments


@virtual_time
async def test_syncs_are_answered_only_once_the_write_is_committed() -> None:
    async with running() as (membership, persist):
        joins = await asyncio.gather(join_new(membership), join_new(membership))
        leader = joins[0].leader
        follower = next(j.member_id for j in joins if j.member_id != leader)
        persist.hold()
        syncs = [
            asyncio.create_task(sync(membership, leader, 1, {leader: b"L", follower: b"F"})),
            asyncio.create_task(sync(membership, follower, 1)),
        ]
        await asyncio.sleep(0.1)
        assert persist.started == 1
        assert not any(task.done() for task in syncs)
        assert membership.group_state("g") is GroupState.COMPLETING_REBALANCE
        persist.release()
        assert [r.assignment for r in await asyncio.gather(*syncs)] == [b"L", b"F"]


@virtual_time
async def test_a_failed_write_answers_every_member_with_its_error_and_rebalances() -> None:
    async with running() as (membership, persist):
        joins = await asyncio.gather(join_new(membership), join_new(membership))
        leader = joins[0].leader
        follower = next(j.member_id for j in joins if j.member_id != leader)
        persist.error = ErrorCode.NOT_COORDINATOR
        follower_sync = asyncio.create_task(sync(membership, follower, 1))
        await asyncio.sleep(0)
        leader_sync = await sync(membership, leader, 1, {leader: b"L", follower: b"F"})
        assert leader_sync.error_code == ErrorCode.NOT_COORDINATOR
        assert (await follower_sync).error_code == ErrorCode.NOT_COORDINATOR
        assert membership.group_state("g") is GroupState.PREPARING_REBALANCE
        assert heartbeat(membership, follower, 1) is ErrorCode.REBALANCE_IN_PROGRESS


@virtual_time
async def test_a_silent_member_is_removed_when_its_session_expires_and_the_group_rebalances() -> (
    None
):
    async with running() as (membership, _):
        (leader, silent), generation = await stable_group(membership, 2, session_ms=300)
        for _ in range(8):  # 400 ms: the leader keeps its session, the other one lapses
            await asyncio.sleep(0.05)
            error = heartbeat(membership, leader, generation)
        assert error is ErrorCode.REBALANCE_IN_PROGRESS
        assert membership.group_state("g") is GroupState.PREPARING_REBALANCE
        rejoined = await join(membership, leader, session_ms=300)
        assert (rejoined.error_code, rejoined.generation_id) == (ErrorCode.NONE, generation + 1)
        assert [m.member_id for m in rejoined.members] == [leader]
        assert heartbeat(membership, silent, generation) is ErrorCode.UNKNOWN_MEMBER_ID


@virtual_time
async def test_members_that_do_not_rejoin_within_the_rebalance_timeout_are_removed() -> None:
    async with running() as (membership, _):
        (leader, laggard), generation = await stable_group(membership, 2, rebalance_ms=300)
        started = asyncio.get_running_loop().time()
        rejoin = asyncio.create_task(join(membership, leader, rebalance_ms=300))
        await asyncio.sleep(0)
        while not rejoin.done():  # the laggard stays alive but never rejoins
            assert heartbeat(membership, laggard, generation) is ErrorCode.REBALANCE_IN_PROGRESS
            await asyncio.sleep(0.03)
        waited_s = asyncio.get_running_loop().time() - started
        response = rejoin.result()
        assert response.generation_id == generation + 1
        assert [m.member_id for m in response.members] == [leader]
        # Virtual time: the 300 ms timeout, seen at the next 30 ms poll at the latest.
        assert 0.3 - 1e-6 <= waited_s <= 0.33 + 1e-6
        assert heartbeat(membership, laggard, generation) is ErrorCode.UNKNOWN_MEMBER_ID


@virtual_time
async def test_a_follower_syncs_but_a_member_that_never_syncs_is_removed() -> None:
    async with running() as (membership, _):
        joins = await asyncio.gather(
            join_new(membership, rebalance_ms=300), join_new(membership, rebalance_ms=300)
        )
        leader = joins[0].leader
        await sync(membership, leader, 1, {})  # the other member never sends SyncGroup
        await asyncio.sleep(0.4)
        assert membership.group_state("g") is GroupState.PREPARING_REBALANCE
        assert [m.member_id for m in membership.describe("g").members] == [leader]


@virtual_time
async def test_a_static_member_restarting_keeps_its_assignment_without_a_rebalance() -> None:
    async with running() as (membership, persist):
        joins = await asyncio.gather(
            join(membership, instance="host-a"), join(membership, instance="host-b")
        )
        leader = joins[0].leader
        ids = {("host-a", "host-b")[n]: j.member_id for n, j in enumerate(joins)}
        follower_instance = next(i for i, member_id in ids.items() if member_id != leader)
        leader_instance = next(i for i in ids if i != follower_instance)
        await asyncio.gather(
            sync(membership, leader, 1, {leader: b"L", ids[follower_instance]: b"F"},
                 instance=leader_instance),
            sync(membership, ids[follower_instance], 1, instance=follower_instance),
        )  # fmt: skip
        writes = len(persist.writes)

        # The follower's process restarts: no member id, same group.instance.id.
        restarted = await join(membership, instance=follower_instance)
        new_id = restarted.member_id
        assert restarted.error_code == ErrorCode.NONE
        assert restarted.generation_id == 1
        assert new_id != ids[follower_instance]
        assert new_id.startswith(f"{follower_instance}-")
        assert restarted.leader == leader
        assert not restarted.skip_assignment
        assert membership.group_state("g") is GroupState.STABLE
        assert len(persist.writes) == writes + 1  # the new member id, stored
        stored = persist.last()
        assert stored is not None
        assert new_id in {m.member_id for m in stored.members}
        resynced = await sync(membership, new_id, 1, instance=follower_instance)
        assert (resynced.error_code, resynced.assignment) == (ErrorCode.NONE, b"F")
        # The previous incarnation is fenced.
        old = ids[follower_instance]
        assert heartbeat(membership, old, 1, instance=follower_instance) is (
            ErrorCode.FENCED_INSTANCE_ID
        )
        assert heartbeat(membership, new_id, 1, instance=follower_instance) is ErrorCode.NONE
        stale_sync = await sync(membership, old, 1, instance=follower_instance)
        assert stale_sync.error_code == ErrorCode.FENCED_INSTANCE_ID
        stale_join = await join(membership, old, instance=follower_instance)
        assert stale_join.error_code == ErrorCode.FENCED_INSTANCE_ID


@virtual_time
async def test_the_leader_rejoining_forces_a_rebalance_and_an_unchanged_follower_does_not() -> None:
    async with running() as (membership, _):
        (leader, follower), generation = await stable_group(membership, 2)
        same = await join(membership, follower)
        assert (same.error_code, same.generation_id) == (ErrorCode.NONE, generation)
        assert membership.group_state("g") is GroupState.STABLE
        rejoin = asyncio.create_task(join(membership, leader))
        await asyncio.sleep(0.05)
        assert membership.group_state("g") is GroupState.PREPARING_REBALANCE
        follower_rejoin = await join(membership, follower, protocols=RANGE)
        assert follower_rejoin.generation_id == (await rejoin).generation_id == generation + 1


@virtual_time
async def test_the_last_member_leaving_empties_the_group_and_stores_that() -> None:
    async with running() as (membership, persist):
        (leader, follower), generation = await stable_group(membership, 2)
        response = await membership.leave(_leave_request(leader, follower, "nobody"), version=5)
        assert response.error_code == ErrorCode.NONE
        assert [(m.member_id, m.error_code) for m in response.members] == [
            (leader, ErrorCode.NONE),
            (follower, ErrorCode.NONE),
            ("nobody", ErrorCode.UNKNOWN_MEMBER_ID),
        ]
        assert membership.group_state("g") is GroupState.EMPTY
        await asyncio.sleep(0.01)
        stored = persist.last()
        assert stored is not None
        assert stored.members == []
        assert stored.generation == generation + 1
        assert stored.protocol is None
        assert membership.subscribed_topics("g") == frozenset()


def _leave_request(*member_ids: str) -> LeaveGroupRequest:
    return LeaveGroupRequest(
        group_id="g",
        members=[LeaveGroupRequest.MemberIdentity(member_id=i, reason="bye") for i in member_ids],
    )
