"""The classic group state machine (riverbed.broker.groups.group) driven directly, with a fake
clock: Kafka's GroupCoordinator rules for joins, syncs, heartbeats, leaves, commits and
deadlines."""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, field

import pytest
from riverbed.broker.groups.group import EXPIRIES_PER_TIMER_MAX, Group
from riverbed.broker.groups.group_values import (
    DEAD_GROUP,
    GroupLimits,
    GroupRecord,
    GroupState,
    JoinCall,
    JoinResult,
    Protocols,
    Reply,
    Store,
    StoredMember,
    SyncCall,
    SyncResult,
)
from riverbed.protocol.errors import ErrorCode

LIMITS = GroupLimits(
    min_session_timeout_ms=10,
    max_session_timeout_ms=100_000,
    initial_rebalance_delay_ms=100,
    max_size=100,
    new_member_join_timeout_ms=60_000,
)
SESSION_MS = 1_000
REBALANCE_MS = 5_000
# Members joining a new group together: the initial delay (100 ms), extended once because more
# than the first member arrived during it (KIP-134).
FIRST_REBALANCE_MS = 200
RANGE: Protocols = (("range", b"sub-a"),)
UUID_RE = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"


@dataclass
class Harness:
    """A group, a clock, and every reply and write it produced (each ticket answered once)."""

    limits: GroupLimits = LIMITS
    now_ms: int = 1_000
    replies: dict[int, JoinResult | SyncResult] = field(default_factory=dict)
    stores: list[Store] = field(default_factory=list)
    group: Group = field(init=False)
    _tickets: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.group = Group("g", self.limits, self.now_ms)

    def drain(self) -> None:
        for effect in self.group.effects():
            if isinstance(effect, Reply):
                assert effect.ticket not in self.replies, f"ticket {effect.ticket} answered twice"
                self.replies[effect.ticket] = effect.result
            else:
                self.stores.append(effect)

    def join(
        self,
        member_id: str = "",
        *,
        client_id: str = "client",
        instance: str | None = None,
        protocols: Protocols = RANGE,
        protocol_type: str = "consumer",
        session_ms: int = SESSION_MS,
        rebalance_ms: int = REBALANCE_MS,
        require_known_member_id: bool = True,
        skip: bool = True,
    ) -> int:
        ticket = next(self._tickets)
        call = JoinCall(
            member_id=member_id,
            group_instance_id=instance,
            client_id=client_id,
            client_host="/127.0.0.1",
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            protocol_type=protocol_type,
            protocols=protocols,
            require_known_member_id=require_known_member_id and instance is None,
            supports_skip_assignment=skip,
        )
        self.group.join(ticket, call, self.now_ms)
        self.drain()
        return ticket

    def sync(
        self,
        member_id: str,
        generation_id: int,
        assignments: dict[str, bytes] | None = None,
        *,
        instance: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> int:
        ticket = next(self._tickets)
        call = SyncCall(
            member_id, generation_id, instance, protocol_type, protocol_name, assignments or {}
        )
        self.group.sync(ticket, call, self.now_ms)
        self.drain()
        return ticket

    def advance(self, ms: int) -> None:
        """Let `ms` pass, waking the group at each of its deadlines like a punctual timer."""
        until_ms = self.now_ms + ms
        while (deadline := self.group.next_deadline_ms()) is not None and deadline <= until_ms:
            self.now_ms = max(self.now_ms, deadline)
            self.group.on_timer(self.now_ms)
            self.drain()
            if self.group.next_deadline_ms() == deadline:  # see EXPIRIES_PER_TIMER_MAX
                if self.now_ms == until_ms:
                    break
                self.now_ms = min(until_ms, self.now_ms + 100)  # the next wake-up, later
        self.now_ms = until_ms

    def leave(self, member_id: str, instance: str | None = None) -> ErrorCode:
        error = self.group.leave(member_id, instance, "test", self.now_ms)
        self.drain()
        return error

    def stored(self, error: ErrorCode = ErrorCode.NONE) -> GroupRecord:
        store = self.stores.pop(0)
        self.group.on_stored(store.token, error, self.now_ms)
        self.drain()
        return store.record

    def join_result(self, ticket: int) -> JoinResult:
        result = self.replies[ticket]
        assert isinstance(result, JoinResult)
        return result

    def sync_result(self, ticket: int) -> SyncResult:
        result = self.replies[ticket]
        assert isinstance(result, SyncResult)
        return result

    def new_member(self, client_id: str = "client", session_ms: int = SESSION_MS) -> str:
        """A member id from the KIP-394 round trip (the member is pending, not yet joined)."""
        ticket = self.join(client_id=client_id, session_ms=session_ms)
        result = self.join_result(ticket)
        assert result.error is ErrorCode.MEMBER_ID_REQUIRED
        return result.member_id

    def stable(self, count: int, **join: object) -> list[str]:
        """`count` members through a first rebalance to Stable; the leader comes first."""
        ids = [self.new_member(f"c{i}") for i in range(count)]
        tickets = [self.join(member_id, **join) for member_id in ids]  # type: ignore[arg-type]
        self.advance(2 * self.limits.initial_rebalance_delay_ms)
        results = [self.join_result(t) for t in tickets]
        leader = results[0].leader
        ordered = [leader, *(m for m in ids if m != leader)]
        generation = results[0].generation_id
        syncs = [self.sync(m, generation) for m in ordered[1:]]
        leader_sync = self.sync(
            leader, generation, {m: f"assignment-{m}".encode() for m in ordered}
        )
        self.stored()
        for ticket in [*syncs, leader_sync]:
            assert self.sync_result(ticket).error is ErrorCode.NONE
        assert self.group.state is GroupState.STABLE
        return ordered


# -- joining ---------------------------------------------------------------------------------------


def test_a_new_member_gets_an_id_then_joins_after_the_initial_delay() -> None:
    h = Harness()
    first = h.join(client_id="consumer-1")
    result = h.join_result(first)
    assert result.error is ErrorCode.MEMBER_ID_REQUIRED
    assert re.fullmatch(f"consumer-1-{UUID_RE}", result.member_id)
    assert h.group.state is GroupState.EMPTY
    assert h.group.is_pending(result.member_id)

    ticket = h.join(result.member_id)
    assert h.group.state is GroupState.PREPARING_REBALANCE
    h.advance(99)
    assert ticket not in h.replies  # KIP-134: the initial delay runs its course
    h.advance(1)
    joined = h.join_result(ticket)
    assert joined.error is ErrorCode.NONE
    assert (joined.generation_id, joined.leader, joined.member_id) == (
        1,
        result.member_id,
        result.member_id,
    )
    assert (joined.protocol_type, joined.protocol_name) == ("consumer", "range")
    assert [(m.member_id, m.metadata) for m in joined.members] == [(result.member_id, b"sub-a")]
    assert h.group.state is GroupState.COMPLETING_REBALANCE
    assert not h.group.is_pending(result.member_id)


def test_join_v3_and_below_adds_a_new_member_at_once() -> None:
    h = Harness()
    ticket = h.join(require_known_member_id=False)
    assert ticket not in h.replies
    h.advance(100)
    result = h.join_result(ticket)
    assert result.error is ErrorCode.NONE
    assert re.fullmatch(f"client-{UUID_RE}", result.member_id)


def test_initial_delay_extends_while_members_arrive_but_not_past_the_rebalance_timeout() -> None:
    h = Harness()  # delay 100 ms; rebalance timeout 250 ms: at most 250 ms in all
    tickets = [h.join(h.new_member("a"), rebalance_ms=250)]
    for _ in range(4):  # a new member every 60 ms
        h.advance(60)
        tickets.append(h.join(h.new_member(), rebalance_ms=250))
        assert not any(t in h.replies for t in tickets)
    # 240 ms in; one more wait of min(100, remaining) happened at 200; done at 250.
    h.advance(9)
    assert not any(t in h.replies for t in tickets)
    h.advance(1)
    assert {h.join_result(t).generation_id for t in tickets} == {1}
    assert len(h.group.members()) == 5


def test_initial_delay_completes_when_no_member_arrived_during_it() -> None:
    h = Harness()
    a = h.join(h.new_member("a"))
    h.advance(50)
    b = h.join(h.new_member("b"))
    h.advance(50)  # t=100: b arrived, so wait another 100
    assert a not in h.replies
    h.advance(100)  # t=200: nobody new
    assert h.join_result(a).generation_id == h.join_result(b).generation_id == 1


def test_rebalance_completes_as_soon_as_every_known_member_rejoins() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    leader_join = h.join(leader)  # the leader rejoining forces a rebalance
    assert h.group.state is GroupState.PREPARING_REBALANCE
    assert leader_join not in h.replies
    follower_join = h.join(follower)
    assert (
        h.join_result(leader_join).generation_id == h.join_result(follower_join).generation_id == 2
    )
    assert len(h.join_result(leader_join).members) == 2
    assert h.join_result(follower_join).members == ()  # only the leader gets the metadata


def test_rebalance_timeout_is_the_largest_and_removes_members_that_did_not_rejoin() -> None:
    h = Harness()
    leader, slow, quick = h.stable(3, rebalance_ms=300)
    h.join(slow, rebalance_ms=700, protocols=(("range", b"new"),))  # rebalance, 700 ms
    ticket = h.join(leader, rebalance_ms=300)
    h.advance(699)
    assert ticket not in h.replies
    assert len(h.group.members()) == 3
    h.advance(1)
    result = h.join_result(ticket)
    assert result.error is ErrorCode.NONE
    assert result.generation_id == 2
    assert {m.member_id for m in result.members} == {leader, slow}
    assert h.group.member(quick) is None


def test_a_static_member_that_does_not_rejoin_stays_in_the_next_generation() -> None:
    h = Harness()
    static_ticket = h.join(instance="static-1", session_ms=10_000)
    dynamic_ticket = h.join(h.new_member("d"))
    h.advance(FIRST_REBALANCE_MS)
    static_id = h.join_result(static_ticket).member_id
    dynamic_id = h.join_result(dynamic_ticket).member_id
    assert re.fullmatch(f"static-1-{UUID_RE}", static_id)  # Kafka: <group.instance.id>-<uuid>
    follower = dynamic_id if h.group.leader_id == static_id else static_id
    h.sync(follower, 1)
    h.sync(h.group.leader_id or "", 1, {static_id: b"s", dynamic_id: b"d"})
    h.stored()
    rejoin = h.join(dynamic_id, protocols=(("range", b"changed"),))
    h.advance(REBALANCE_MS)
    assert h.join_result(rejoin).error is ErrorCode.NONE
    assert {m.member_id for m in h.group.members()} == {static_id, dynamic_id}


def test_the_protocol_is_chosen_by_vote_among_those_every_member_supports() -> None:
    h = Harness()
    prefs = [
        (("range", b"1"), ("roundrobin", b"1"), ("sticky", b"1")),
        (("range", b"2"), ("roundrobin", b"2")),
        (("roundrobin", b"3"), ("range", b"3")),
    ]
    tickets = [h.join(h.new_member(f"c{i}"), protocols=p) for i, p in enumerate(prefs)]
    h.advance(FIRST_REBALANCE_MS)
    result = h.join_result(tickets[0])
    assert result.protocol_name == "range"  # 2 votes to 1; "sticky" is not shared
    leader = h.join_result(next(t for t in tickets if h.join_result(t).members))
    assert {m.metadata for m in leader.members} == {b"1", b"2", b"3"}


def test_inconsistent_group_protocol() -> None:
    h = Harness()
    assert h.join_result(h.join(protocol_type="")).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert h.join_result(h.join(protocols=())).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    h.stable(1)
    other_type = h.join(protocol_type="connect")
    assert h.join_result(other_type).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    no_common = h.join("", protocols=(("roundrobin", b""),))
    assert h.join_result(no_common).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert h.join_result(no_common).member_id == ""


def test_group_max_size_reached() -> None:
    h = Harness(limits=GroupLimits(10, 100_000, 100, max_size=2))
    h.stable(2)
    third = h.join(require_known_member_id=False)
    assert h.join_result(third).error is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert len(h.group.members()) == 2
    assert h.group.state is GroupState.STABLE


def test_during_a_rebalance_members_beyond_max_size_are_turned_away_and_removed() -> None:
    h = Harness(limits=GroupLimits(10, 100_000, 100, max_size=2))
    leader, follower = h.stable(2)
    first = h.join(leader)  # rebalance; 1 member awaiting
    extra = h.join(require_known_member_id=False)  # 2 awaiting: at the limit
    late = h.join(follower)
    assert h.join_result(late).error is ErrorCode.GROUP_MAX_SIZE_REACHED
    assert h.group.member(follower) is None
    # Everyone left has rejoined: generation 2 has the leader and the newcomer.
    assert h.join_result(first).generation_id == h.join_result(extra).generation_id == 2


def test_a_follower_rejoining_a_stable_group_unchanged_gets_the_current_generation() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    result = h.join_result(h.join(follower))
    assert (result.error, result.generation_id, result.leader) == (ErrorCode.NONE, 1, leader)
    assert h.group.state is GroupState.STABLE
    changed = h.join(follower, protocols=(("range", b"new-topics"),))
    assert changed not in h.replies
    assert h.group.state is GroupState.PREPARING_REBALANCE


def test_a_repeated_join_while_completing_gets_the_generation_again() -> None:
    h = Harness()
    ids = [h.new_member("a"), h.new_member("b")]
    tickets = [h.join(m) for m in ids]
    h.advance(FIRST_REBALANCE_MS)
    leader = h.join_result(tickets[0]).leader
    again = h.join_result(h.join(leader))
    assert again.generation_id == 1
    assert len(again.members) == 2
    assert h.group.state is GroupState.COMPLETING_REBALANCE


def test_a_superseded_parked_join_is_answered() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    first = h.join(leader)
    second = h.join(leader)
    assert h.join_result(first).error is ErrorCode.REBALANCE_IN_PROGRESS
    h.join(follower)
    assert h.join_result(second).error is ErrorCode.NONE


def test_join_with_an_unknown_member_id() -> None:
    h = Harness()
    h.stable(1)
    assert h.join_result(h.join("nobody")).error is ErrorCode.UNKNOWN_MEMBER_ID


# -- syncing ---------------------------------------------------------------------------------------


def test_followers_wait_for_the_leaders_assignment_to_be_stored() -> None:
    h = Harness()
    ids = [h.new_member("a"), h.new_member("b"), h.new_member("c")]
    tickets = [h.join(m) for m in ids]
    h.advance(FIRST_REBALANCE_MS)
    leader = h.join_result(tickets[0]).leader
    followers = [m for m in ids if m != leader]
    parked = [h.sync(m, 1) for m in followers]
    assert not any(t in h.replies for t in parked)
    leader_sync = h.sync(leader, 1, {leader: b"L", followers[0]: b"F0"})  # one left out
    assert leader_sync not in h.replies  # not before the write is committed
    assert h.group.state is GroupState.COMPLETING_REBALANCE
    record = h.stored()
    assert (record.generation_id, record.protocol_type, record.protocol_name) == (
        1,
        "consumer",
        "range",
    )
    assert record.leader == leader
    assert {m.member_id: m.assignment for m in record.members} == {
        leader: b"L",
        followers[0]: b"F0",
        followers[1]: b"",
    }
    assert {m.subscription for m in record.members} == {b"sub-a"}
    assert h.sync_result(leader_sync).assignment == b"L"
    assert h.sync_result(parked[0]) == SyncResult(ErrorCode.NONE, "consumer", "range", b"F0")
    assert h.sync_result(parked[1]).assignment == b""
    assert h.group.state is GroupState.STABLE
    # Stable: a SyncGroup is answered at once with the stored assignment.
    assert h.sync_result(h.sync(followers[0], 1)).assignment == b"F0"


def test_a_failed_write_answers_every_member_with_the_error_and_rebalances() -> None:
    h = Harness()
    ids = [h.new_member("a"), h.new_member("b")]
    tickets = [h.join(m) for m in ids]
    h.advance(FIRST_REBALANCE_MS)
    leader = h.join_result(tickets[0]).leader
    follower = next(m for m in ids if m != leader)
    parked = h.sync(follower, 1)
    leader_sync = h.sync(leader, 1, {leader: b"L", follower: b"F"})
    h.stored(ErrorCode.NOT_COORDINATOR)
    assert h.sync_result(parked) == SyncResult(ErrorCode.NOT_COORDINATOR)
    assert h.sync_result(leader_sync) == SyncResult(ErrorCode.NOT_COORDINATOR)
    assert h.group.state is GroupState.PREPARING_REBALANCE
    assert all(m.assignment == b"" for m in h.group.members())


def test_a_write_for_a_generation_that_moved_on_is_ignored() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    h.join(leader)
    h.join(follower)  # generation 2, CompletingRebalance
    h.sync(leader, 2, {leader: b"x", follower: b"y"})
    h.join(follower, protocols=(("range", b"other"),))  # back to PreparingRebalance
    h.stored()
    assert h.group.state is GroupState.PREPARING_REBALANCE
    kept = h.group.member(leader)
    assert kept is not None
    assert kept.assignment == b""


def test_sync_errors() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    assert h.sync_result(h.sync(follower, 7)).error is ErrorCode.ILLEGAL_GENERATION
    assert h.sync_result(h.sync("nobody", 1)).error is ErrorCode.UNKNOWN_MEMBER_ID
    wrong_name = h.sync(follower, 1, protocol_type="consumer", protocol_name="roundrobin")
    assert h.sync_result(wrong_name).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    wrong_type = h.sync(follower, 1, protocol_type="connect", protocol_name="range")
    assert h.sync_result(wrong_type).error is ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    right = h.sync(follower, 1, protocol_type="consumer", protocol_name="range")
    assert h.sync_result(right).error is ErrorCode.NONE
    h.join(leader)
    assert h.sync_result(h.sync(follower, 1)).error is ErrorCode.REBALANCE_IN_PROGRESS


def test_a_rebalance_answers_parked_syncs_with_rebalance_in_progress() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    h.join(leader)
    h.join(follower)
    parked = h.sync(follower, 2)
    h.join(leader, protocols=(("range", b"changed"),))
    assert h.sync_result(parked).error is ErrorCode.REBALANCE_IN_PROGRESS


def test_members_that_do_not_sync_within_the_rebalance_timeout_are_removed() -> None:
    h = Harness()
    leader, follower, silent = h.stable(3, rebalance_ms=400)
    h.join(leader, rebalance_ms=400)
    h.join(follower, rebalance_ms=400)
    h.join(silent, rebalance_ms=400)  # generation 2
    h.sync(leader, 2, {})
    h.stored()
    h.sync(follower, 2)
    h.advance(399)
    assert h.group.state is GroupState.STABLE
    h.advance(1)
    assert h.group.member(silent) is None
    assert h.group.state is GroupState.PREPARING_REBALANCE


# -- heartbeats and sessions -----------------------------------------------------------------------


def test_heartbeat_errors_by_state() -> None:
    h = Harness()
    leader, follower = h.stable(2, instance=None)
    assert h.group.heartbeat(follower, None, 1, h.now_ms) is ErrorCode.NONE
    assert h.group.heartbeat(follower, None, 0, h.now_ms) is ErrorCode.ILLEGAL_GENERATION
    assert h.group.heartbeat("nobody", None, 1, h.now_ms) is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.group.heartbeat(follower, "some-instance", 1, h.now_ms) is ErrorCode.UNKNOWN_MEMBER_ID
    h.join(leader)
    assert h.group.heartbeat(follower, None, 1, h.now_ms) is ErrorCode.REBALANCE_IN_PROGRESS
    h.join(follower)
    assert h.group.heartbeat(follower, None, 2, h.now_ms) is ErrorCode.NONE  # Completing


def test_a_session_expires_without_heartbeats_and_the_group_rebalances() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    for _ in range(5):  # heartbeats keep it alive well past one session timeout
        h.advance(SESSION_MS - 1)
        assert h.group.heartbeat(leader, None, 1, h.now_ms) is ErrorCode.NONE
        assert h.group.heartbeat(follower, None, 1, h.now_ms) is ErrorCode.NONE
    h.advance(SESSION_MS - 1)
    h.group.heartbeat(leader, None, 1, h.now_ms)
    h.advance(1)
    assert h.group.member(follower) is None
    assert h.group.state is GroupState.PREPARING_REBALANCE
    assert h.group.heartbeat(follower, None, 1, h.now_ms) is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_commit_by_a_member_counts_as_a_heartbeat() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    h.advance(SESSION_MS - 1)
    assert h.group.check_commit(1, follower, None, h.now_ms) is ErrorCode.NONE
    h.group.heartbeat(leader, None, 1, h.now_ms)
    h.advance(SESSION_MS - 1)
    assert h.group.member(follower) is not None


def test_members_parked_in_a_join_do_not_expire() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    parked = h.join(leader)
    h.new_member(session_ms=4_000)  # pending (KIP-394): holds the join phase until it expires
    parked_too = h.join(follower)
    h.advance(3_999)  # sessions are 1 s, but parked members are alive
    assert parked not in h.replies
    assert parked_too not in h.replies
    assert h.group.member(leader) is not None
    assert h.group.member(follower) is not None
    h.advance(1)  # the pending member expires: everyone else has rejoined
    assert h.join_result(parked).generation_id == h.join_result(parked_too).generation_id == 2


def test_a_new_members_first_join_expires_after_the_new_member_join_timeout() -> None:
    h = Harness(limits=GroupLimits(10, 100_000, 100, 100, new_member_join_timeout_ms=3_000))
    leader, follower = h.stable(2)
    newcomer = h.join(require_known_member_id=False, rebalance_ms=10_000)  # a 10 s rebalance
    for _ in range(3):
        h.advance(999)
        assert newcomer not in h.replies
        for member_id in (leader, follower):  # alive, but not rejoining
            assert (
                h.group.heartbeat(member_id, None, 1, h.now_ms) is ErrorCode.REBALANCE_IN_PROGRESS
            )
    h.advance(3)
    assert h.join_result(newcomer) == JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, "")
    assert len(h.group.members()) == 2
    assert h.group.state is GroupState.PREPARING_REBALANCE


def test_a_pending_member_expires_after_its_session_timeout() -> None:
    h = Harness()
    pending = h.new_member()
    h.advance(SESSION_MS - 1)
    assert h.group.is_pending(pending)
    h.advance(1)
    assert not h.group.is_pending(pending)
    assert h.join_result(h.join(pending)).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_pending_member_holds_the_join_phase_until_it_joins_or_expires() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    h.join(leader)
    h.new_member()  # pending
    last = h.join(follower)
    assert last not in h.replies  # waits for the pending member
    h.advance(SESSION_MS)
    assert h.join_result(last).generation_id == 2


# -- leaving ---------------------------------------------------------------------------------------


def test_leave_removes_members_and_rebalances_and_the_last_one_empties_the_group() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    assert h.leave(follower) is ErrorCode.NONE
    assert h.group.state is GroupState.PREPARING_REBALANCE
    assert h.leave(follower) is ErrorCode.UNKNOWN_MEMBER_ID
    ticket = h.join(leader)
    assert h.join_result(ticket).generation_id == 2
    assert h.group.leader_id == leader
    h.sync(leader, 2, {leader: b"all"})
    h.stored()
    assert h.leave(leader) is ErrorCode.NONE
    assert h.group.state is GroupState.EMPTY
    assert h.group.generation_id == 3
    record = h.stored()
    assert record.members == ()
    assert record.protocol_name is None
    assert record.generation_id == 3
    assert record.leader is None
    assert record.state_timestamp_ms == h.now_ms


def test_leave_of_a_member_parked_in_a_join_answers_it() -> None:
    h = Harness()
    leader, _ = h.stable(2)
    parked = h.join(leader)
    assert h.leave(leader) is ErrorCode.NONE
    assert h.join_result(parked).error is ErrorCode.UNKNOWN_MEMBER_ID


def test_leave_of_a_static_member_by_instance_id_and_fencing() -> None:
    h = Harness()
    tickets = [h.join(instance="i-1"), h.join(instance="i-2")]
    h.advance(FIRST_REBALANCE_MS)
    first, second = (h.join_result(t).member_id for t in tickets)
    assert h.group.leave("stale-id", "i-1", "", h.now_ms) is ErrorCode.FENCED_INSTANCE_ID
    assert h.group.leave("", "i-3", "", h.now_ms) is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.group.leave("", "i-1", "admin", h.now_ms) is ErrorCode.NONE
    assert h.group.member(first) is None
    assert h.group.member(second) is not None


def test_a_pending_member_may_leave() -> None:
    h = Harness()
    pending = h.new_member()
    assert h.group.leave(pending, None, "", h.now_ms) is ErrorCode.NONE
    assert not h.group.is_pending(pending)


# -- static membership (KIP-345) -------------------------------------------------------------------


def static_stable(h: Harness, count: int, skip: bool = True) -> list[tuple[str, str]]:
    """(instance id, member id) of `count` static members in a Stable group, leader first."""
    tickets = [h.join(instance=f"i-{n}", skip=skip) for n in range(count)]
    h.advance(FIRST_REBALANCE_MS)
    members = [(f"i-{n}", h.join_result(t).member_id) for n, t in enumerate(tickets)]
    members.sort(key=lambda pair: pair[1] != h.group.leader_id)
    for _, member_id in members[1:]:
        h.sync(member_id, 1)
    h.sync(members[0][1], 1, {m: f"assigned-{i}".encode() for i, m in members})
    h.stored()
    return members


def test_a_static_member_rejoining_unchanged_keeps_its_assignment_without_a_rebalance() -> None:
    h = Harness()
    (_, leader), (instance, old_id) = static_stable(h, 2, skip=False)
    ticket = h.join(instance=instance, skip=False)
    assert ticket not in h.replies  # first the new member id is stored
    record = h.stored()
    new_id = h.join_result(ticket).member_id
    assert new_id != old_id
    assert re.fullmatch(f"{instance}-{UUID_RE}", new_id)
    assert {m.member_id for m in record.members} == {leader, new_id}
    result = h.join_result(ticket)
    assert (result.error, result.generation_id, result.leader) == (ErrorCode.NONE, 1, leader)
    assert h.group.state is GroupState.STABLE
    assert h.group.generation_id == 1
    assert (
        h.sync_result(h.sync(new_id, 1, instance=instance)).assignment
        == f"assigned-{instance}".encode()
    )
    # The old member id is fenced wherever it shows up.
    assert h.group.heartbeat(old_id, instance, 1, h.now_ms) is ErrorCode.FENCED_INSTANCE_ID
    assert h.sync_result(h.sync(old_id, 1, instance=instance)).error is ErrorCode.FENCED_INSTANCE_ID
    assert h.group.check_commit(1, old_id, instance, h.now_ms) is ErrorCode.FENCED_INSTANCE_ID
    assert h.join_result(h.join(old_id, instance=instance)).error is ErrorCode.FENCED_INSTANCE_ID


def test_a_static_leader_rejoining_with_join_v9_is_told_to_skip_the_assignment() -> None:
    h = Harness()
    (instance, old_leader), _ = static_stable(h, 2)
    ticket = h.join(instance=instance, skip=True)
    h.stored()
    result = h.join_result(ticket)
    assert result.skip_assignment
    assert result.leader == result.member_id != old_leader
    assert len(result.members) == 2


def test_a_static_leader_rejoining_before_v9_is_given_the_old_leader_id() -> None:
    h = Harness()
    (instance, old_leader), _ = static_stable(h, 2, skip=False)
    ticket = h.join(instance=instance, skip=False)
    h.stored()
    result = h.join_result(ticket)
    assert not result.skip_assignment
    assert result.leader == old_leader != result.member_id
    assert h.group.leader_id == result.member_id


def test_a_failed_static_rejoin_write_reverts_to_the_old_member_id() -> None:
    h = Harness()
    _, (instance, old_id) = static_stable(h, 2)
    ticket = h.join(instance=instance)
    h.stored(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    result = h.join_result(ticket)
    assert result.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert result.member_id == ""
    assert h.group.heartbeat(old_id, instance, 1, h.now_ms) is ErrorCode.NONE


def test_a_static_member_rejoining_with_a_new_protocol_choice_triggers_a_rebalance() -> None:
    h = Harness()
    first = h.join(instance="i-0", protocols=(("range", b"1"), ("roundrobin", b"1")))
    h.advance(100)
    member_id = h.join_result(first).member_id
    h.sync(member_id, 1, {member_id: b"a"})
    h.stored()
    ticket = h.join(instance="i-0", protocols=(("roundrobin", b"2"), ("range", b"2")))
    assert not h.stores  # no write for a rejoin that changes the group's protocol
    result = h.join_result(ticket)  # its only member rejoined: generation 2 at once
    assert (result.generation_id, result.protocol_name) == (2, "roundrobin")
    assert result.member_id != member_id


def test_a_static_member_rejoining_while_parked_fences_the_old_call() -> None:
    h = Harness()
    (_, leader), (instance, old_id), (last_instance, last_id) = static_stable(h, 3)
    h.join(leader, instance="i-0")  # PreparingRebalance
    old_call = h.join(old_id, instance=instance)
    new_call = h.join(instance=instance)
    assert h.join_result(old_call) == JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_id)
    assert new_call not in h.replies
    h.join(last_id, instance=last_instance)
    result = h.join_result(new_call)  # everyone rejoined: generation 2
    assert result.error is ErrorCode.NONE
    assert result.generation_id == 2
    assert result.member_id != old_id


# -- offset commits --------------------------------------------------------------------------------


def test_commit_checks() -> None:
    h = Harness()
    assert h.group.check_commit(-1, "", None, h.now_ms) is ErrorCode.NONE  # simple, Empty
    assert h.group.check_commit(3, "x", None, h.now_ms) is ErrorCode.UNKNOWN_MEMBER_ID
    leader, follower = h.stable(2)
    assert h.group.check_commit(-1, "", None, h.now_ms) is ErrorCode.UNKNOWN_MEMBER_ID
    assert h.group.check_commit(1, follower, None, h.now_ms) is ErrorCode.NONE
    assert h.group.check_commit(0, follower, None, h.now_ms) is ErrorCode.ILLEGAL_GENERATION
    assert h.group.check_commit(-1, follower, None, h.now_ms) is ErrorCode.ILLEGAL_GENERATION
    assert h.group.check_commit(1, "nobody", None, h.now_ms) is ErrorCode.UNKNOWN_MEMBER_ID
    h.join(leader)
    # PreparingRebalance: commits of the previous generation still go through.
    assert h.group.check_commit(1, follower, None, h.now_ms) is ErrorCode.NONE
    h.join(follower)
    assert h.group.check_commit(2, follower, None, h.now_ms) is ErrorCode.REBALANCE_IN_PROGRESS
    assert h.group.check_commit(1, follower, None, h.now_ms) is ErrorCode.ILLEGAL_GENERATION


# -- describe, delete, unload, restore -------------------------------------------------------------


def test_describe_shows_metadata_and_assignments_only_when_stable() -> None:
    h = Harness()
    assert h.group.describe().state is GroupState.EMPTY
    leader, follower = h.stable(2)
    described = h.group.describe()
    assert (described.state.value, described.protocol_type, described.protocol_name) == (
        "Stable",
        "consumer",
        "range",
    )
    assert {m.member_id: (m.metadata, m.assignment) for m in described.members} == {
        leader: (b"sub-a", f"assignment-{leader}".encode()),
        follower: (b"sub-a", f"assignment-{follower}".encode()),
    }
    assert {m.client_host for m in described.members} == {"/127.0.0.1"}
    h.join(leader)
    described = h.group.describe()
    assert described.state.value == "PreparingRebalance"
    assert described.protocol_name == ""
    assert {(m.metadata, m.assignment) for m in described.members} == {(b"", b"")}
    assert DEAD_GROUP.state.value == "Dead"
    assert DEAD_GROUP.members == ()


def test_delete_only_an_empty_group() -> None:
    h = Harness()
    h.stable(1)
    assert h.group.delete(h.now_ms) is ErrorCode.NON_EMPTY_GROUP
    empty = Harness()
    assert empty.group.delete(empty.now_ms) is ErrorCode.NONE
    assert empty.group.state is GroupState.DEAD
    assert empty.group.delete(empty.now_ms) is ErrorCode.GROUP_ID_NOT_FOUND
    assert empty.join_result(empty.join()).error is ErrorCode.COORDINATOR_NOT_AVAILABLE


def test_unload_answers_every_parked_call_with_not_coordinator() -> None:
    h = Harness()
    leader, follower = h.stable(2)
    h.join(leader)
    h.join(follower)
    parked_sync = h.sync(follower, 2)
    h2_join = h.join(h.new_member())  # a third member arriving: back to preparing
    assert h.sync_result(parked_sync).error is ErrorCode.REBALANCE_IN_PROGRESS
    h.group.unload(h.now_ms)
    h.drain()
    assert h.join_result(h2_join).error is ErrorCode.NOT_COORDINATOR
    assert h.group.state is GroupState.DEAD
    assert h.group.next_deadline_ms() is None
    assert h.group.heartbeat(leader, None, 2, h.now_ms) is ErrorCode.COORDINATOR_NOT_AVAILABLE


def test_restore_a_stable_group_with_sessions_starting_at_load_time() -> None:
    record = GroupRecord(
        protocol_type="consumer",
        generation_id=7,
        protocol_name="range",
        leader="m-1",
        state_timestamp_ms=500,
        members=(
            StoredMember("m-1", None, "c1", "/h", 5_000, 1_000, b"sub1", b"as1"),
            StoredMember("m-2", "inst", "c2", "/h", 5_000, 2_000, b"sub2", b"as2"),
        ),
    )
    group = Group.restore("g", LIMITS, record, now_ms=10_000)
    assert group.state is GroupState.STABLE
    assert group.generation_id == 7
    assert group.leader_id == "m-1"
    assert group.state_timestamp_ms == 500
    assert group.subscriptions == (b"sub1", b"sub2")
    assert group.heartbeat("m-2", "inst", 7, 10_500) is ErrorCode.NONE
    assert group.heartbeat("m-2", "wrong", 7, 10_500) is ErrorCode.UNKNOWN_MEMBER_ID
    assert group.next_deadline_ms() == 11_000  # m-1's session, started at load
    group.on_timer(11_000)
    assert group.member("m-1") is None
    assert group.state is GroupState.PREPARING_REBALANCE
    assert [effect for effect in group.effects() if isinstance(effect, Reply)] == []

    no_members = GroupRecord("consumer", 3, None, None, -1, ())
    restored = Group.restore("g", LIMITS, no_members, now_ms=10_000)
    assert restored.state is GroupState.EMPTY
    assert restored.generation_id == 3
    assert restored.state_timestamp_ms is None
    assert restored.protocol_type == "consumer"


def test_restore_over_capacity_rebalances() -> None:
    members = tuple(
        StoredMember(f"m-{i}", None, "c", "/h", 5_000, 1_000, b"", b"") for i in range(3)
    )
    record = GroupRecord("consumer", 2, "range", "m-0", 0, members)
    group = Group.restore("g", GroupLimits(10, 100_000, 100, max_size=2), record, 0)
    assert group.state is GroupState.PREPARING_REBALANCE


def test_restore_rejects_members_without_a_protocol() -> None:
    record = GroupRecord(
        "consumer", 2, None, "m", 0, (StoredMember("m", None, "c", "/h", 1, 1, b"", b""),)
    )
    with pytest.raises(ValueError, match="without a protocol"):
        Group.restore("g", LIMITS, record, 0)


def test_session_timeout_bounds() -> None:
    assert LIMITS.session_timeout_error(10) is ErrorCode.NONE
    assert LIMITS.session_timeout_error(100_000) is ErrorCode.NONE
    assert LIMITS.session_timeout_error(9) is ErrorCode.INVALID_SESSION_TIMEOUT
    assert LIMITS.session_timeout_error(100_001) is ErrorCode.INVALID_SESSION_TIMEOUT


def test_a_zero_rebalance_timeout_cannot_spin_the_timer_forever() -> None:
    h = Harness()
    tickets = [h.join(instance="i-0"), h.join(instance="i-1", rebalance_ms=0)]
    h.advance(FIRST_REBALANCE_MS)
    first, second = (h.join_result(t).member_id for t in tickets)
    leader = h.group.leader_id
    h.sync(second if leader == first else first, 1)
    h.sync(leader or "", 1, {first: b"", second: b""})
    h.stored()
    # One static member leaves; the other does not rejoin, and the join phase times out at
    # once, again and again (Kafka waits for the session to expire the silent member).
    assert h.group.leave("", "i-0", "", h.now_ms) is ErrorCode.NONE
    h.advance(0)  # returns after EXPIRIES_PER_TIMER_MAX rounds
    assert h.group.state is GroupState.PREPARING_REBALANCE
    assert h.group.next_deadline_ms() == h.now_ms
    h.advance(SESSION_MS)
    assert h.group.state is GroupState.EMPTY
    assert h.group.members() == []
    assert EXPIRIES_PER_TIMER_MAX == 1000


# -- random sequences: invariants ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_random_calls_keep_the_group_consistent(seed: int) -> None:
    """Any mix of calls and time: every call is answered at most once, parked calls are those
    of members, the leader is a member, and unloading answers everything still parked."""
    rng = random.Random(seed)
    h = Harness(limits=GroupLimits(10, 100_000, rng.choice([0, 50]), max_size=4))
    issued: list[int] = []
    known: list[tuple[str, str | None]] = []
    for _ in range(300):
        action = rng.randrange(9)
        member_id, instance = rng.choice(known) if known and rng.random() < 0.8 else ("", None)
        if action <= 2:
            if not member_id and rng.random() < 0.3:
                instance = f"i-{rng.randrange(3)}"
            protocols = rng.choice(
                [RANGE, (("roundrobin", b"r"),), (("range", b"x"), ("roundrobin", b"y"))]
            )
            ticket = h.join(
                member_id,
                instance=instance,
                protocols=protocols,
                rebalance_ms=rng.choice([50, 200]),
            )
            issued.append(ticket)
            result = h.replies.get(ticket)
            if isinstance(result, JoinResult) and result.member_id:
                known.append((result.member_id, instance))
        elif action == 3:
            generation = h.group.generation_id if rng.random() < 0.8 else 0
            leads = h.group.leader_id == member_id
            assignments = {m.member_id: b"a" for m in h.group.members()} if leads else {}
            issued.append(h.sync(member_id, generation, assignments, instance=instance))
        elif action == 4:
            h.group.heartbeat(member_id, instance, h.group.generation_id, h.now_ms)
        elif action == 5:
            h.group.leave(member_id, instance, "", h.now_ms)
            h.drain()
        elif action == 6 and h.stores:
            h.stored(rng.choice([ErrorCode.NONE, ErrorCode.NONE, ErrorCode.NOT_COORDINATOR]))
        else:
            h.advance(rng.choice([0, 10, 60, 300, 1_500]))
        check_invariants(h.group)
    h.group.unload(h.now_ms)
    h.drain()
    assert set(issued) <= set(h.replies), "unload left calls unanswered"


def check_invariants(group: Group) -> None:
    members = group.members()
    if members:
        assert group.leader_id in {m.member_id for m in members}
        assert group.state is not GroupState.EMPTY
    else:
        assert group.leader_id is None
    if group.state is GroupState.PREPARING_REBALANCE:
        assert group.next_deadline_ms() is not None  # the join phase always ends
    if group.state is not GroupState.COMPLETING_REBALANCE:
        assert all(m.sync_ticket is None for m in members)
    else:
        assert all(m.join_ticket is None for m in members)
    instances = [m.group_instance_id for m in members if m.group_instance_id]
    assert len(instances) == len(set(instances))
