"""GroupMembership's error codes and per-version request and response rules, as Kafka answers
them (clients react to each code differently)."""

from __future__ import annotations

import asyncio
import re

import pytest
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

from tests.groups.membership_support import (
    heartbeat,
    join,
    join_new,
    running,
    stable_group,
    sync,
)
from tests.support.virtual_time import virtual_time


@virtual_time
async def test_a_new_member_needs_its_id_first_from_join_v4() -> None:
    async with running() as (membership, _):
        first = await join(membership, version=4, client_id="rdkafka")
        assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
        uuid4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
        assert re.fullmatch(f"rdkafka-{uuid4}", first.member_id)
        assert first.generation_id == -1
        assert first.leader == ""
        second = await join(membership, first.member_id, version=4)
        assert (second.error_code, second.member_id) == (ErrorCode.NONE, first.member_id)
        # Before v4 a new member joins at once.
        old = await join(membership, version=3, group_id="h")
        assert old.error_code == ErrorCode.NONE
        assert old.member_id.startswith("consumer-")


@virtual_time
async def test_join_errors() -> None:
    async with running(group_max_size="2") as (membership, _):
        too_short = await join(membership, session_ms=9)
        assert (too_short.error_code, too_short.member_id) == (
            ErrorCode.INVALID_SESSION_TIMEOUT,
            "",
        )
        too_long = await join(membership, "m-1", session_ms=60_001)
        assert (too_long.error_code, too_long.member_id) == (
            ErrorCode.INVALID_SESSION_TIMEOUT,
            "m-1",
        )
        unknown = await join(membership, "m-1", group_id="nowhere")
        assert unknown.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        no_type = await join(membership, protocol_type="")
        assert no_type.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL

        alone = await join(membership, group_id="p", version=3)  # CompletingRebalance
        other_type = await join(membership, group_id="p", protocol_type="connect", version=3)
        assert other_type.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        unshared = await join(
            membership, alone.member_id, group_id="p", protocols=(("roundrobin", b""),)
        )
        assert unshared.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        stranger = await join(membership, "stranger", group_id="p")
        assert stranger.error_code == ErrorCode.UNKNOWN_MEMBER_ID

        await stable_group(membership, 2)  # at group.max.size
        third = await join(membership, version=3)
        assert (third.error_code, third.member_id) == (ErrorCode.GROUP_MAX_SIZE_REACHED, "")


@virtual_time
async def test_join_protocol_name_is_empty_before_v7_and_null_from_v7_when_unset() -> None:
    async with running() as (membership, _):
        v6 = await join(membership, session_ms=1, version=6)
        v7 = await join(membership, session_ms=1, version=7)
        assert (v6.protocol_name, v7.protocol_name) == ("", None)


@virtual_time
async def test_join_v0_uses_the_session_timeout_as_rebalance_timeout() -> None:
    async with running() as (membership, _):
        # v0 has no rebalance timeout field: 60 s here must be ignored for the session's 300 ms.
        first = await join(membership, version=0, session_ms=300, rebalance_ms=60_000)
        await sync(membership, first.member_id, 1, {first.member_id: b"A"}, version=0)
        started = asyncio.get_running_loop().time()
        second = asyncio.create_task(join(membership, version=3, session_ms=300, rebalance_ms=300))
        await asyncio.sleep(0)
        while not second.done():  # the first member stays alive but does not rejoin
            assert heartbeat(membership, first.member_id, 1) is ErrorCode.REBALANCE_IN_PROGRESS
            await asyncio.sleep(0.05)
        waited_s = asyncio.get_running_loop().time() - started
        # Virtual time: the 300 ms timeout, seen at the next 50 ms poll at the latest.
        assert 0.3 - 1e-6 <= waited_s <= 0.35 + 1e-6
        assert [m.member_id for m in second.result().members] == [second.result().member_id]


@virtual_time
async def test_a_rejoining_static_leader_is_told_to_skip_the_assignment_from_join_v9() -> None:
    async with running() as (membership, _):
        first = await join(membership, instance="solo")
        await sync(membership, first.member_id, 1, {first.member_id: b"A"}, instance="solo")
        again = await join(membership, instance="solo", version=9)
        assert again.skip_assignment
        assert again.leader == again.member_id != first.member_id
        assert [m.member_id for m in again.members] == [again.member_id]
        before_v9 = await join(membership, instance="solo", version=8)
        assert not before_v9.skip_assignment
        assert before_v9.leader == again.member_id
        assert before_v9.members == []


@virtual_time
async def test_sync_errors() -> None:
    async with running() as (membership, _):
        unknown_group = await sync(membership, "m", 1)
        assert unknown_group.error_code == ErrorCode.UNKNOWN_MEMBER_ID
        (leader, follower), generation = await stable_group(membership, 2)
        cases = [
            (ErrorCode.ILLEGAL_GENERATION, sync(membership, follower, generation + 1)),
            (ErrorCode.UNKNOWN_MEMBER_ID, sync(membership, "nobody", generation)),
            # A group.instance.id the group does not know.
            (ErrorCode.UNKNOWN_MEMBER_ID, sync(membership, follower, generation, instance="x")),
        ]
        for code, call in cases:
            assert (await call).error_code == code
        wrong_name = await sync(membership, follower, generation, protocol_name="roundrobin")
        assert wrong_name.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        # v5 requires protocol type and name (KIP-559); before v5 they are absent.
        missing = await sync(membership, follower, generation, protocol_name=None)
        assert missing.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        v4 = await sync(membership, follower, generation, protocol_name=None, version=4)
        assert (v4.error_code, v4.assignment) == (ErrorCode.NONE, f"assigned-{follower}".encode())
        assert v4.protocol_name is None
        assert v4.protocol_type is None
        rejoin = asyncio.create_task(join(membership, leader))
        await asyncio.sleep(0.01)
        during = await sync(membership, follower, generation)
        assert during.error_code == ErrorCode.REBALANCE_IN_PROGRESS
        rejoin.cancel()


@virtual_time
async def test_heartbeat_errors() -> None:
    async with running() as (membership, _):
        assert heartbeat(membership, "m", 0) is ErrorCode.UNKNOWN_MEMBER_ID  # no such group
        first = await join(membership, instance="i")
        (member_id, generation) = (first.member_id, first.generation_id)
        assert heartbeat(membership, member_id, generation, instance="i") is ErrorCode.NONE
        assert heartbeat(membership, member_id, 5, instance="i") is ErrorCode.ILLEGAL_GENERATION
        assert heartbeat(membership, "old", generation, instance="i") is (
            ErrorCode.FENCED_INSTANCE_ID
        )
        assert heartbeat(membership, member_id, generation, instance="j") is (
            ErrorCode.UNKNOWN_MEMBER_ID
        )
        assert heartbeat(membership, "nobody", generation) is ErrorCode.UNKNOWN_MEMBER_ID


@virtual_time
async def test_leave_answers_per_member_from_v3_and_one_code_before() -> None:
    async with running() as (membership, _):
        (leader, follower), _ = await stable_group(membership, 2)
        static = await join(membership, instance="s", group_id="h")
        batch = m.LeaveGroupRequest(
            group_id="h",
            members=[
                m.LeaveGroupRequest.MemberIdentity(member_id="wrong", group_instance_id="s"),
                m.LeaveGroupRequest.MemberIdentity(member_id="", group_instance_id="t"),
                m.LeaveGroupRequest.MemberIdentity(member_id="", group_instance_id="s"),
            ],
        )
        response = await membership.leave(batch, version=3)
        assert [(r.member_id, r.group_instance_id, r.error_code) for r in response.members] == [
            ("wrong", "s", ErrorCode.FENCED_INSTANCE_ID),
            ("", "t", ErrorCode.UNKNOWN_MEMBER_ID),
            ("", "s", ErrorCode.NONE),
        ]
        assert heartbeat(membership, static.member_id, 1, group_id="h") is (
            ErrorCode.UNKNOWN_MEMBER_ID
        )
        v0 = await membership.leave(m.LeaveGroupRequest(group_id="g", member_id="nobody"), 0)
        assert (v0.error_code, v0.members) == (ErrorCode.UNKNOWN_MEMBER_ID, [])
        ok = await membership.leave(m.LeaveGroupRequest(group_id="g", member_id=follower), 2)
        assert ok.error_code == ErrorCode.NONE
        gone = await membership.leave(m.LeaveGroupRequest(group_id="nowhere", member_id=leader), 1)
        assert gone.error_code == ErrorCode.UNKNOWN_MEMBER_ID


@virtual_time
async def test_commit_checks_follow_kafkas_rules() -> None:
    async with running() as (membership, _):
        check = membership.check_commit
        assert check("simple", -1, "", None) is ErrorCode.NONE  # no group: a simple commit
        assert check("simple", 3, "m", None) is ErrorCode.ILLEGAL_GENERATION
        (leader, follower), generation = await stable_group(membership, 2)
        assert check("g", generation, follower, None) is ErrorCode.NONE
        assert check("g", -1, "", None) is ErrorCode.UNKNOWN_MEMBER_ID  # members own the group
        assert check("g", generation - 1, follower, None) is ErrorCode.ILLEGAL_GENERATION
        assert check("g", generation, "nobody", None) is ErrorCode.UNKNOWN_MEMBER_ID
        assert check("g", generation, follower, "i") is ErrorCode.UNKNOWN_MEMBER_ID
        rejoins = [asyncio.create_task(join(membership, mid)) for mid in (leader, follower)]
        await asyncio.gather(*rejoins)
        # CompletingRebalance: the member has the new generation but not its assignment.
        assert check("g", generation + 1, follower, None) is ErrorCode.REBALANCE_IN_PROGRESS


@virtual_time
async def test_describe_list_and_delete() -> None:
    async with running() as (membership, persist):
        dead = membership.describe("nowhere")
        assert (dead.error_code, dead.group_state, dead.members) == (ErrorCode.NONE, "Dead", [])
        await stable_group(membership, 1)
        empty = await join(membership, group_id="other", session_ms=100, version=3)
        await membership.leave(m.LeaveGroupRequest(group_id="other", member_id=empty.member_id), 1)
        preparing = await join_new(membership, group_id="third")
        assert preparing.error_code == ErrorCode.NONE
        listed = {(g.group_id, g.protocol_type, g.group_state) for g in membership.list([])}
        assert listed == {
            ("g", "consumer", "Stable"),
            ("other", "consumer", "Empty"),
            ("third", "consumer", "CompletingRebalance"),
        }
        assert [g.group_id for g in membership.list(["stable", "EMPTY"])] == ["g", "other"]
        assert membership.list(["Dead"]) == []

        assert await membership.delete("g") is ErrorCode.NON_EMPTY_GROUP
        assert await membership.delete("nowhere") is ErrorCode.GROUP_ID_NOT_FOUND
        assert await membership.delete("other") is ErrorCode.NONE
        assert persist.writes[-1] == ("other", None)  # the tombstone
        assert membership.group_state("other") is None
        assert membership.describe("other").group_state == "Dead"
        assert await membership.delete("other") is ErrorCode.GROUP_ID_NOT_FOUND


@pytest.mark.parametrize("error", [ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE])
@virtual_time
async def test_delete_reports_a_failed_tombstone(error: ErrorCode) -> None:
    async with running() as (membership, persist):
        member = await join(membership, version=3, session_ms=100)
        await membership.leave(m.LeaveGroupRequest(group_id="g", member_id=member.member_id), 1)
        await asyncio.sleep(0.01)
        persist.error = error
        assert await membership.delete("g") is error
