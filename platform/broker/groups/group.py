"""One consumer group under Kafka's classic group protocol: its members, generations and
rebalances, as a state machine without I/O (kafka.coordinator.group.GroupMetadata and the
membership half of GroupCoordinator).

The caller feeds it calls (`join`, `sync`, `heartbeat`, `leave`, ...; their values are in
riverbed.broker.groups.group_values) and the time, and takes
back `effects()`: `Reply(ticket, result)` answers a JoinGroup or SyncGroup call, now or later
(a call parks by its ticket until the rebalance answers it), and `Store(token, record)` asks for
the group's metadata to be written to `__consumer_offsets`; the caller reports the write's
outcome with `on_stored(token, error)`. Timers are deadlines the group keeps: the caller wakes
it at `next_deadline_ms()` with `on_timer(now_ms)`.

States (Kafka's names, as DescribeGroups and ListGroups report them):

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
      ^                 ^        |                                            |       |
      |                 |        +--no member left--> Empty     leader's SyncGroup stored
      |                 +--join, leave, expiry, sync timeout----------------+       v
      |                 +--leader or changed member rejoins, leave, expiry------- Stable
    Dead: deleted or unloaded (leadership moved); the owner drops the group.

Deadlines: each member's session (a new member's first join waits at most
`new_member_join_timeout_ms`; a member parked in a join or sync has no session deadline), each
pending member's session (KIP-394), the join phase (initial delay of a new group (KIP-134), else
the largest rebalance timeout of the members) and the sync phase (members that do not send
SyncGroup within the rebalance timeout are removed).
"""

from __future__ import annotations

import functools
import itertools
import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from riverbed.broker.groups.group_values import (
    NO_LEADER,
    NO_STATE_TIMESTAMP,
    UNKNOWN_MEMBER_ID,
    Effect,
    GroupDescription,
    GroupLimits,
    GroupRecord,
    GroupState,
    JoinCall,
    JoinedMember,
    JoinResult,
    MemberDescription,
    Protocols,
    Reply,
    Store,
    StoredMember,
    SyncCall,
    SyncResult,
)
from riverbed.common.log_events import event
from riverbed.protocol.errors import ErrorCode

# GroupState too, for callers that need nothing else of group_values.
__all__ = ["EXPIRIES_PER_TIMER_MAX", "Group", "GroupState", "Member"]

log = logging.getLogger(__name__)

# A group whose members asked for a zero rebalance timeout can keep re-arming deadlines that
# are already due; one `on_timer` call handles at most this many, the rest on the next wake-up.
EXPIRIES_PER_TIMER_MAX: Final = 1000

_VALID_PREVIOUS_STATES: Final[dict[GroupState, frozenset[GroupState]]] = {
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocols: Protocols
    assignment: bytes = b""
    join_ticket: int | None = None  # a JoinGroup parked until the join phase completes
    sync_ticket: int | None = None  # a SyncGroup parked until the leader's assignment is stored
    is_new: bool = False  # joined but not yet through its first join phase
    session_deadline_ms: int = 0

    @property
    def protocol_names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.protocols)

    @property
    def session_expires(self) -> bool:
        # A member parked in a call is alive by definition (its socket is busy waiting); a new
        # one is the exception (see NEW_MEMBER_JOIN_TIMEOUT_MS).
        return self.is_new or (self.join_ticket is None and self.sync_ticket is None)

    def metadata(self, protocol_name: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        raise ValueError(f"member {self.member_id} does not support protocol {protocol_name!r}")

    def vote(self, candidates: frozenset[str]) -> str:
        return next(name for name, _ in self.protocols if name in candidates)


@dataclass(frozen=True, slots=True)
class _AssignmentWrite:
    generation_id: int
    assignment: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class _EmptyGroupWrite:
    generation_id: int


@dataclass(frozen=True, slots=True)
class _StaticRejoinWrite:
    """A known static member rejoined a Stable group under a new member id without changing the
    group's protocol: the new id is stored, then its join is answered (KIP-345)."""

    generation_id: int
    group_instance_id: str
    old_member_id: str
    new_member_id: str
    ticket: int
    old_protocols: Protocols
    old_rebalance_timeout_ms: int
    old_session_timeout_ms: int
    leader_before: str
    supports_skip_assignment: bool


_Write = _AssignmentWrite | _EmptyGroupWrite | _StaticRejoinWrite


class Group:
    """One group's membership. Not thread-safe; every call takes the current time."""

    def __init__(self, group_id: str, limits: GroupLimits, now_ms: int) -> None:
        self.group_id = group_id
        self._limits = limits
        self._state = GroupState.EMPTY
        self._state_timestamp_ms: int | None = now_ms
        self._protocol_type: str | None = None
        self._protocol_name: str | None = None
        self._generation_id = 0
        self._leader_id: str | None = None
        self._members: dict[str, Member] = {}
        self._static_members: dict[str, str] = {}  # group.instance.id -> member id
        self._pending_members: dict[str, int] = {}  # KIP-394 member id -> session deadline
        self._pending_sync: set[str] = set()  # members yet to send SyncGroup this generation
        self._subscriptions: tuple[bytes, ...] = ()  # members' metadata as of this generation
        self._new_member_added = False
        self._join_deadline_ms: int | None = None
        self._initial_delay: tuple[int, int] | None = None  # (delay_ms, remaining_ms), KIP-134
        self._sync_deadline_ms: int | None = None
        self._writes: dict[int, _Write] = {}
        self._tokens = itertools.count(1)
        self._effects: list[Effect] = []

    @classmethod
    def restore(cls, group_id: str, limits: GroupLimits, record: GroupRecord, now_ms: int) -> Group:
        """The group as `__consumer_offsets` left it: Stable with its members (their sessions
        start now), or Empty."""
        group = cls(group_id, limits, now_ms)
        if record.members and not record.protocol_name:
            raise ValueError(f"group {group_id}: stored members without a protocol")
        group._generation_id = record.generation_id
        group._protocol_type = record.protocol_type or None
        group._protocol_name = record.protocol_name
        group._leader_id = record.leader
        group._state_timestamp_ms = (
            None if record.state_timestamp_ms == NO_STATE_TIMESTAMP else record.state_timestamp_ms
        )
        for stored in record.members:
            member = Member(
                member_id=stored.member_id,
                group_instance_id=stored.group_instance_id,
                client_id=stored.client_id,
                client_host=stored.client_host,
                rebalance_timeout_ms=stored.rebalance_timeout_ms,
                session_timeout_ms=stored.session_timeout_ms,
                protocols=((record.protocol_name or "", stored.subscription),),
                assignment=stored.assignment,
            )
            group._add(member, record.protocol_type, ticket=None)
            group._schedule_session(member, now_ms)
        group._subscriptions = tuple(stored.subscription for stored in record.members)
        if group._members:
            group._state = GroupState.STABLE
            if len(group._members) > limits.max_size:
                group._prepare_rebalance(now_ms, f"loaded over capacity ({limits.max_size})")
        return group

    # -- read-only views ---------------------------------------------------------------------------

    @property
    def state(self) -> GroupState:
        return self._state

    @property
    def state_timestamp_ms(self) -> int | None:
        """When the group entered its state (None: a record from before Kafka 2.1 did not say)."""
        return self._state_timestamp_ms

    @property
    def protocol_type(self) -> str | None:
        return self._protocol_type

    @property
    def protocol_name(self) -> str | None:
        return self._protocol_name

    @property
    def generation_id(self) -> int:
        return self._generation_id

    @property
    def leader_id(self) -> str | None:
        return self._leader_id

    @property
    def subscriptions(self) -> tuple[bytes, ...]:
        """Each member's metadata for the protocol chosen at the current generation."""
        return self._subscriptions

    def member(self, member_id: str) -> Member | None:
        return self._members.get(member_id)

    def members(self) -> list[Member]:
        return list(self._members.values())

    def is_pending(self, member_id: str) -> bool:
        return member_id in self._pending_members

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self._members.values()), default=0)

    def describe(self) -> GroupDescription:
        protocol_name = self._protocol_name
        if self._state is GroupState.STABLE and protocol_name is not None:
            members = tuple(
                MemberDescription(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.metadata(protocol_name),
                    m.assignment,
                )
                for m in self._members.values()
            )
            return GroupDescription(self._state, self._protocol_type or "", protocol_name, members)
        members = tuple(
            MemberDescription(
                m.member_id, m.group_instance_id, m.client_id, m.client_host, b"", b""
            )
            for m in self._members.values()
        )
        return GroupDescription(self._state, self._protocol_type or "", "", members)

    def effects(self) -> list[Effect]:
        """Replies and writes produced since the last call, in order."""
        effects, self._effects = self._effects, []
        return effects

    # -- JoinGroup ---------------------------------------------------------------------------------

    def join(self, ticket: int, call: JoinCall, now_ms: int) -> None:
        """JoinGroup; answered by a `Reply` for `ticket`, at once or when the join phase ends.
        The session timeout was validated by the caller (before the group was looked up)."""
        if not self._accepts_joining_member(call.member_id):
            self._remove(call.member_id)
            self._reply_join(ticket, ErrorCode.GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER_ID)
        elif call.member_id == UNKNOWN_MEMBER_ID:
            self._join_new_member(ticket, call, now_ms)
        else:
            self._join_current_member(ticket, call, now_ms)
        if self._state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(now_ms)

    def _accepts_joining_member(self, member_id: str) -> bool:
        member = self._members.get(member_id)
        if self._state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if self._state is GroupState.PREPARING_REBALANCE:
            # Counting the members that rejoined (not the group's size, which may exceed a
            # lowered group.max.size) lets the last ones to rejoin be turned away.
            awaiting = sum(1 for m in self._members.values() if m.join_ticket is not None)
            return (member is not None and member.join_ticket is not None) or (
                awaiting < self._limits.max_size
            )
        return member is not None or len(self._members) < self._limits.max_size

    def _join_new_member(self, ticket: int, call: JoinCall, now_ms: int) -> None:
        if self._state is GroupState.DEAD:
            # Removed by another call meanwhile (unloaded or deleted): find the coordinator again.
            self._reply_join(ticket, ErrorCode.COORDINATOR_NOT_AVAILABLE, UNKNOWN_MEMBER_ID)
            return
        if not self._supports_protocols(call.protocol_type, call.protocols):
            self._reply_join(ticket, ErrorCode.INCONSISTENT_GROUP_PROTOCOL, UNKNOWN_MEMBER_ID)
            return
        instance_id = call.group_instance_id
        new_member_id = f"{instance_id or call.client_id}-{uuid.uuid4()}"
        if instance_id is not None:
            old_member_id = self._static_members.get(instance_id)
            if old_member_id is not None:
                log.info(
                    "group %s: static member %s rejoins in state %s, replacing member id %s "
                    "with %s (reason: %s)",
                    self.group_id,
                    instance_id,
                    self._state.value,
                    old_member_id,
                    new_member_id,
                    call.reason,
                )
                self._rejoin_static_member(ticket, call, old_member_id, new_member_id, now_ms)
                return
        elif call.require_known_member_id:
            log.info(
                "group %s: new member %s must rejoin with its id (KIP-394)",
                self.group_id,
                new_member_id,
            )
            self._pending_members[new_member_id] = now_ms + call.session_timeout_ms
            self._reply_join(ticket, ErrorCode.MEMBER_ID_REQUIRED, new_member_id)
            return
        self._add_member_and_rebalance(ticket, new_member_id, call, now_ms)

    def _join_current_member(self, ticket: int, call: JoinCall, now_ms: int) -> None:
        member_id = call.member_id
        if self._state is GroupState.DEAD:
            self._reply_join(ticket, ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id)
            return
        if not self._supports_protocols(call.protocol_type, call.protocols):
            self._reply_join(ticket, ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id)
            return
        if member_id in self._pending_members:
            if call.group_instance_id is not None:
                # Only dynamic members are ever pending: Kafka fails such a call the same way.
                log.warning(
                    "group %s: pending member %s rejoined with group.instance.id %s",
                    self.group_id,
                    member_id,
                    call.group_instance_id,
                )
                self._reply_join(ticket, ErrorCode.UNKNOWN_SERVER_ERROR, member_id)
                return
            log.info("group %s: pending member %s joins", self.group_id, member_id)
            self._add_member_and_rebalance(ticket, member_id, call, now_ms)
            return
        error = self._validate_member(member_id, call.group_instance_id)
        if error is not ErrorCode.NONE:
            self._reply_join(ticket, error, member_id)
            return
        member = self._members[member_id]
        if self._state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(member, call, ticket, now_ms)
        elif self._state is GroupState.COMPLETING_REBALANCE:
            if member.protocols == call.protocols:
                # The same join again (its response was lost): the current generation again.
                self._reply_generation(ticket, member_id, with_members=self._is_leader(member_id))
            else:
                self._update_member_and_rebalance(member, call, ticket, now_ms)
        elif self._state is GroupState.STABLE:
            # The leader may rejoin to have metadata changes (e.g. new partitions) reassigned.
            if self._is_leader(member_id) or member.protocols != call.protocols:
                self._update_member_and_rebalance(member, call, ticket, now_ms)
            else:
                self._reply_generation(ticket, member_id, with_members=False)
        else:  # Empty: no members to match (validated above), kept for safety as Kafka does
            self._reply_join(ticket, ErrorCode.UNKNOWN_MEMBER_ID, member_id)

    def _add_member_and_rebalance(
        self, ticket: int, member_id: str, call: JoinCall, now_ms: int
    ) -> None:
        member = Member(
            member_id=member_id,
            group_instance_id=call.group_instance_id,
            client_id=call.client_id,
            client_host=call.client_host,
            rebalance_timeout_ms=call.rebalance_timeout_ms,
            session_timeout_ms=call.session_timeout_ms,
            protocols=call.protocols,
            is_new=True,
        )
        if self._state is GroupState.PREPARING_REBALANCE and self._generation_id == 0:
            self._new_member_added = True  # extends the initial delay (KIP-134)
        self._add(member, call.protocol_type, ticket)
        member.session_deadline_ms = now_ms + self._limits.new_member_join_timeout_ms
        self._maybe_prepare_rebalance(
            now_ms, f"adding member {member_id} (client reason: {call.reason})"
        )

    def _rejoin_static_member(
        self, ticket: int, call: JoinCall, old_member_id: str, new_member_id: str, now_ms: int
    ) -> None:
        instance_id = call.group_instance_id
        if instance_id is None:
            raise ValueError("a static rejoin needs a group.instance.id")
        leader_before = self._leader_id or NO_LEADER
        member = self._replace_static_member(instance_id, old_member_id, new_member_id)
        self._schedule_session(member, now_ms)
        old = (member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms)
        self._update_member(member, call, ticket)
        if self._state is GroupState.STABLE:
            if self._select_protocol() == self._protocol_name:
                # The assignment stays valid: store the new member id, no rebalance (KIP-345).
                write = _StaticRejoinWrite(
                    self._generation_id,
                    instance_id,
                    old_member_id,
                    new_member_id,
                    ticket,
                    *old,
                    leader_before,
                    call.supports_skip_assignment,
                )
                self._store(write, {m.member_id: m.assignment for m in self._members.values()})
            else:
                self._prepare_rebalance(
                    now_ms, f"static member {instance_id} rejoined with a different protocol"
                )
        elif self._state is GroupState.COMPLETING_REBALANCE:
            # The leader may be assigning to the old member id: start over.
            self._prepare_rebalance(now_ms, f"static member {instance_id} rejoined")
        elif self._state is not GroupState.PREPARING_REBALANCE:
            raise RuntimeError(f"group {self.group_id}: a static member in state {self._state}")

    def _update_member_and_rebalance(
        self, member: Member, call: JoinCall, ticket: int, now_ms: int
    ) -> None:
        self._update_member(member, call, ticket)
        self._maybe_prepare_rebalance(
            now_ms,
            f"member {member.member_id} rejoins in state {self._state.value} "
            f"(client reason: {call.reason})",
        )

    def _update_member(self, member: Member, call: JoinCall, ticket: int) -> None:
        member.protocols = call.protocols
        member.rebalance_timeout_ms = call.rebalance_timeout_ms
        member.session_timeout_ms = call.session_timeout_ms
        if member.join_ticket is not None and member.join_ticket != ticket:
            # The same member joined again while parked (its client gave up on the first call,
            # e.g. on a new connection): only the latest call is part of the rebalance.
            self._answer_join(member, JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        member.join_ticket = ticket

    # -- SyncGroup ---------------------------------------------------------------------------------

    def sync(self, ticket: int, call: SyncCall, now_ms: int) -> None:
        """SyncGroup; answered by a `Reply` for `ticket`: at once in Stable, else once the
        leader's assignment is stored."""
        error = self._validate_sync(call)
        if error is not ErrorCode.NONE:
            self._reply(ticket, SyncResult(error))
        elif self._state is GroupState.EMPTY:
            self._reply(ticket, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        elif self._state is GroupState.PREPARING_REBALANCE:
            self._reply(ticket, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        elif self._state is GroupState.COMPLETING_REBALANCE:
            member = self._members[call.member_id]
            if member.sync_ticket is not None:  # superseded, as for joins
                self._answer_sync(member, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
            member.sync_ticket = ticket
            self._synced(call.member_id)
            if self._is_leader(call.member_id):
                # Members the leader left out get an empty assignment, as in Kafka.
                assignment = {
                    member_id: bytes(call.assignments.get(member_id, b""))
                    for member_id in self._members
                }
                log.info(
                    "group %s: assignment from leader %s for generation %d (%d members)",
                    self.group_id,
                    call.member_id,
                    self._generation_id,
                    len(assignment),
                )
                self._store(_AssignmentWrite(self._generation_id, assignment), assignment)
        else:  # Stable
            member = self._members[call.member_id]
            self._synced(call.member_id)
            self._reply(ticket, self._assignment_result(member))
            self._schedule_session(member, now_ms)

    def _validate_sync(self, call: SyncCall) -> ErrorCode:
        if self._state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._validate_member(call.member_id, call.group_instance_id)
        if error is not ErrorCode.NONE:
            return error
        if call.generation_id != self._generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if call.protocol_type is not None and call.protocol_type != self._protocol_type:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if call.protocol_name is not None and call.protocol_name != self._protocol_name:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return ErrorCode.NONE

    def _synced(self, member_id: str) -> None:
        self._pending_sync.discard(member_id)
        if not self._pending_sync:
            self._sync_deadline_ms = None

    def _assignment_result(self, member: Member) -> SyncResult:
        return SyncResult(
            ErrorCode.NONE, self._protocol_type, self._protocol_name, member.assignment
        )

    # -- Heartbeat, LeaveGroup, OffsetCommit checks ------------------------------------------------

    def heartbeat(
        self, member_id: str, group_instance_id: str | None, generation_id: int, now_ms: int
    ) -> ErrorCode:
        if self._state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._validate_member(member_id, group_instance_id)
        if error is not ErrorCode.NONE:
            return error
        if generation_id != self._generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if self._state is GroupState.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._schedule_session(self._members[member_id], now_ms)
        if self._state is GroupState.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        # CompletingRebalance too: members may heartbeat once their join was answered.
        return ErrorCode.NONE

    def leave(
        self, member_id: str, group_instance_id: str | None, reason: str, now_ms: int
    ) -> ErrorCode:
        """One member of a LeaveGroup. The caller answers COORDINATOR_NOT_AVAILABLE for the
        whole request if the group is Dead."""
        if member_id == UNKNOWN_MEMBER_ID:
            # An administrative removal of a static member by its instance id alone.
            current_id = self._static_members.get(group_instance_id) if group_instance_id else None
            if current_id is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            member_id = current_id
        elif member_id in self._pending_members:
            log.info("group %s: pending member %s left", self.group_id, member_id)
            self._remove_pending_member(member_id, now_ms)
            return ErrorCode.NONE
        else:
            error = self._validate_member(member_id, group_instance_id)
            if error is not ErrorCode.NONE:
                return error
        log.info("group %s: member %s left (client reason: %s)", self.group_id, member_id, reason)
        self._remove_member_and_update_group(member_id, now_ms, "member left")
        return ErrorCode.NONE

    def check_commit(
        self,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        now_ms: int,
        *,
        transactional: bool = False,
    ) -> ErrorCode:
        """Whether an OffsetCommit may be stored (Kafka's validateOffsetCommit); a commit by a
        member counts as a heartbeat. A TxnOffsetCommit (`transactional`) is only fenced
        (KIP-447): v0-2 carry no member, so one without a member goes through whatever the
        group's state, and it neither waits for a rebalance nor counts as a heartbeat."""
        if self._state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and self._state is GroupState.EMPTY:
            return ErrorCode.NONE  # a "simple" commit (admin client, assign() consumers)
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = self._validate_member(member_id, group_instance_id)
            if error is not ErrorCode.NONE:
                return error
            if generation_id != self._generation_id:
                return ErrorCode.ILLEGAL_GENERATION
        elif not transactional:
            return ErrorCode.UNKNOWN_MEMBER_ID  # only members commit for a group with members
        if transactional:
            return ErrorCode.NONE
        if self._state is GroupState.COMPLETING_REBALANCE:
            # The member has the new generation but not yet its assignment.
            return ErrorCode.REBALANCE_IN_PROGRESS
        if self._state is not GroupState.EMPTY:
            self._schedule_session(self._members[member_id], now_ms)
        return ErrorCode.NONE

    def _validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode:
        if group_instance_id is not None:
            current_id = self._static_members.get(group_instance_id)
            if current_id is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if current_id != member_id:
                log.info(
                    "group %s: member %s of static instance %s is fenced by member %s",
                    self.group_id,
                    member_id,
                    group_instance_id,
                    current_id,
                )
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in self._members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return ErrorCode.NONE

    # -- the group's end ---------------------------------------------------------------------------

    def delete(self, now_ms: int) -> ErrorCode:
        """DeleteGroups: only an Empty group goes; it becomes Dead."""
        if self._state is GroupState.DEAD:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if self._state is not GroupState.EMPTY:
            return ErrorCode.NON_EMPTY_GROUP
        self._die(now_ms, ErrorCode.NOT_COORDINATOR)
        return ErrorCode.NONE

    def unload(self, now_ms: int) -> None:
        """This broker no longer coordinates the group: parked calls get NOT_COORDINATOR, so
        their clients look the coordinator up again."""
        log.info(
            "group %s: unloading at generation %d (state %s)",
            self.group_id,
            self._generation_id,
            self._state.value,
        )
        self._die(now_ms, ErrorCode.NOT_COORDINATOR)

    def _die(self, now_ms: int, error: ErrorCode) -> None:
        self._transition(GroupState.DEAD, now_ms)
        for member in self._members.values():
            self._answer_join(member, JoinResult(error, member.member_id))
            self._answer_sync(member, SyncResult(error))
        self._join_deadline_ms = self._sync_deadline_ms = None
        self._initial_delay = None
        self._pending_members.clear()
        self._writes.clear()

    # -- stored metadata ---------------------------------------------------------------------------

    def on_stored(self, token: int, error: ErrorCode, now_ms: int) -> None:
        """The outcome of the write `Store(token)` asked for (NONE once committed)."""
        write = self._writes.pop(token, None)
        if isinstance(write, _AssignmentWrite):
            self._on_assignment_stored(write, error, now_ms)
        elif isinstance(write, _StaticRejoinWrite):
            self._on_static_rejoin_stored(write, error, now_ms)
        elif isinstance(write, _EmptyGroupWrite) and error is not ErrorCode.NONE:
            # Safe to leave: the last stored generation had members who are gone; if it is
            # loaded again they simply expire.
            log.warning(
                "group %s: storing empty generation %d failed: %s",
                self.group_id,
                write.generation_id,
                error.name,
            )

    def _on_assignment_stored(self, write: _AssignmentWrite, error: ErrorCode, now_ms: int) -> None:
        # Members may have joined or left while the write was in flight: only the generation it
        # was for completes.
        if (
            self._state is not GroupState.COMPLETING_REBALANCE
            or write.generation_id != self._generation_id
        ):
            return
        if error is not ErrorCode.NONE:
            log.warning(
                "group %s: storing generation %d failed: %s; rebalancing",
                self.group_id,
                write.generation_id,
                error.name,
            )
            self._propagate_assignment(error, now_ms)
            self._maybe_prepare_rebalance(now_ms, f"storing the assignment failed: {error.name}")
            return
        for member in self._members.values():
            member.assignment = write.assignment[member.member_id]
        self._propagate_assignment(ErrorCode.NONE, now_ms)
        self._transition(GroupState.STABLE, now_ms)
        log.info(
            "group %s: stable at generation %d with %d members",
            self.group_id,
            self._generation_id,
            len(self._members),
        )

    def _on_static_rejoin_stored(
        self, write: _StaticRejoinWrite, error: ErrorCode, now_ms: int
    ) -> None:
        member = self._members.get(write.new_member_id)
        if (
            member is None
            or member.join_ticket != write.ticket
            or self._state is not GroupState.STABLE
            or self._generation_id != write.generation_id
        ):
            return  # a rebalance started meanwhile; it answers the member
        if error is not ErrorCode.NONE:
            log.warning(
                "group %s: storing static member %s as %s failed: %s; reverting to %s",
                self.group_id,
                write.group_instance_id,
                write.new_member_id,
                error.name,
                write.old_member_id,
            )
            member.join_ticket = None
            member.protocols = write.old_protocols
            member.rebalance_timeout_ms = write.old_rebalance_timeout_ms
            member.session_timeout_ms = write.old_session_timeout_ms
            self._replace_static_member(
                write.group_instance_id, write.new_member_id, write.old_member_id
            )
            self._schedule_session(member, now_ms)
            result = JoinResult(
                error,
                UNKNOWN_MEMBER_ID,
                self._generation_id,
                self._protocol_type,
                self._protocol_name,
                write.leader_before,
            )
            self._reply(write.ticket, result)
            return
        if write.supports_skip_assignment:
            # JoinGroup v9+: a static leader learns it leads, but must not reassign (KIP-814).
            is_leader = self._is_leader(member.member_id)
            result = self._generation_join_result(member.member_id, is_leader, skip=is_leader)
        else:
            # Before v9, the old leader id keeps a rejoining static leader from reassigning: a
            # Stable group would not hand its new assignment out.
            result = self._generation_join_result(
                member.member_id, False, leader=write.leader_before
            )
        self._answer_join(member, result)
        self._schedule_session(member, now_ms)

    def _record(self, assignment: Mapping[str, bytes]) -> GroupRecord:
        protocol_name = self._protocol_name
        members: tuple[StoredMember, ...] = ()
        if protocol_name is not None:
            members = tuple(
                StoredMember(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.rebalance_timeout_ms,
                    m.session_timeout_ms,
                    m.metadata(protocol_name),
                    assignment[m.member_id],
                )
                for m in self._members.values()
            )
        return GroupRecord(
            protocol_type=self._protocol_type or "",
            generation_id=self._generation_id,
            protocol_name=protocol_name,
            leader=self._leader_id,
            state_timestamp_ms=(
                NO_STATE_TIMESTAMP if self._state_timestamp_ms is None else self._state_timestamp_ms
            ),
            members=members,
        )

    def _store(self, write: _Write, assignment: Mapping[str, bytes]) -> None:
        token = next(self._tokens)
        self._writes[token] = write
        self._effects.append(Store(token, self._record(assignment)))

    # -- deadlines ---------------------------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        return min((deadline for deadline, _ in self._deadlines()), default=None)

    def on_timer(self, now_ms: int) -> None:
        """Expire whatever is due: sessions, the join phase, the sync phase."""
        for _ in range(EXPIRIES_PER_TIMER_MAX):
            due = min(self._deadlines(), key=lambda item: item[0], default=None)
            if due is None or due[0] > now_ms:
                return
            due[1](now_ms)

    def _deadlines(self) -> Iterator[tuple[int, Callable[[int], None]]]:
        if self._state is GroupState.DEAD:
            return
        for member_id, deadline_ms in self._pending_members.items():
            yield deadline_ms, functools.partial(self._expire_pending_member, member_id)
        for member in self._members.values():
            if member.session_expires:
                yield (
                    member.session_deadline_ms,
                    functools.partial(self._expire_member, member.member_id),
                )
        if self._sync_deadline_ms is not None:
            yield self._sync_deadline_ms, self._expire_sync
        if self._join_deadline_ms is not None:
            yield self._join_deadline_ms, self._expire_join

    def _schedule_session(self, member: Member, now_ms: int) -> None:
        member.session_deadline_ms = now_ms + member.session_timeout_ms

    def _expire_pending_member(self, member_id: str, now_ms: int) -> None:
        log.info("group %s: pending member %s expired", self.group_id, member_id)
        self._remove_pending_member(member_id, now_ms)

    def _expire_member(self, member_id: str, now_ms: int) -> None:
        log.info("group %s: member %s failed (session expired)", self.group_id, member_id)
        self._remove_member_and_update_group(member_id, now_ms, f"member {member_id} expired")

    def _expire_sync(self, now_ms: int) -> None:
        self._sync_deadline_ms = None
        laggards = sorted(self._pending_sync)
        if not laggards:
            return
        for member_id in laggards:
            self._remove(member_id)
        self._prepare_rebalance(now_ms, f"members {laggards} did not send SyncGroup in time")

    def _expire_join(self, now_ms: int) -> None:
        self._join_deadline_ms = None
        if self._initial_delay is not None:
            delay_ms, remaining_ms = self._initial_delay
            if self._new_member_added and remaining_ms != 0:
                # More members arrived during the delay: wait again, within the rebalance timeout.
                self._new_member_added = False
                next_delay_ms = min(self._limits.initial_rebalance_delay_ms, remaining_ms)
                self._initial_delay = (next_delay_ms, max(remaining_ms - delay_ms, 0))
                self._join_deadline_ms = now_ms + next_delay_ms
                return
            self._initial_delay = None
        self._complete_join(now_ms)

    # -- rebalancing -------------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, now_ms: int, reason: str) -> None:
        if self._state in _VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]:
            self._prepare_rebalance(now_ms, reason)

    def _prepare_rebalance(self, now_ms: int, reason: str) -> None:
        if self._state is GroupState.COMPLETING_REBALANCE:
            for member in self._members.values():
                member.assignment = b""
            self._propagate_assignment(ErrorCode.REBALANCE_IN_PROGRESS, now_ms)
        self._pending_sync.clear()
        self._sync_deadline_ms = None
        if self._state is GroupState.EMPTY:
            delay_ms = self._limits.initial_rebalance_delay_ms
            self._initial_delay = (delay_ms, max(self.rebalance_timeout_ms - delay_ms, 0))
            self._join_deadline_ms = now_ms + delay_ms
        else:
            self._initial_delay = None
            self._join_deadline_ms = now_ms + self.rebalance_timeout_ms
        log.info(
            "group %s: preparing to rebalance from %s at generation %d (reason: %s)",
            self.group_id,
            self._state.value,
            self._generation_id,
            reason,
        )
        self._transition(GroupState.PREPARING_REBALANCE, now_ms)
        self._try_complete_join(now_ms)

    def _try_complete_join(self, now_ms: int) -> None:
        if (
            self._state is GroupState.PREPARING_REBALANCE
            and self._initial_delay is None  # the initial delay always runs its course
            and not self._pending_members
            and all(m.join_ticket is not None for m in self._members.values())
        ):
            self._complete_join(now_ms)

    def _complete_join(self, now_ms: int) -> None:
        self._join_deadline_ms = None
        laggards = [
            m.member_id
            for m in self._members.values()
            if m.join_ticket is None and m.group_instance_id is None
        ]
        if laggards:
            log.info("group %s: removing members that did not rejoin: %s", self.group_id, laggards)
        for member_id in laggards:
            self._remove(member_id)
        if not self._elect_joined_leader() and self._members:
            # Only static members that did not rejoin remain: wait for them, or for their
            # sessions to expire.
            log.error("group %s: no member rejoined; waiting another round", self.group_id)
            self._join_deadline_ms = now_ms + self.rebalance_timeout_ms
            return
        self._init_next_generation(now_ms)
        if self._state is GroupState.EMPTY:
            log.info("group %s: empty at generation %d", self.group_id, self._generation_id)
            self._store(_EmptyGroupWrite(self._generation_id), {})
            return
        event(
            log,
            logging.INFO,
            "group.rebalanced",
            group=self.group_id,
            generation=self._generation_id,
            members=len(self._members),
            protocol=self._protocol_name,
            leader=self._leader_id,
        )
        for member in self._members.values():
            if member.join_ticket is not None:
                leads = self._is_leader(member.member_id)
                self._answer_join(member, self._generation_join_result(member.member_id, leads))
            self._schedule_session(member, now_ms)
            member.is_new = False
            self._pending_sync.add(member.member_id)
        self._sync_deadline_ms = now_ms + self.rebalance_timeout_ms

    def _elect_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick a member that did; False if none did."""
        if self._leader_id is None:
            return False
        if self._members[self._leader_id].join_ticket is not None:
            return True
        joined = next((m for m in self._members.values() if m.join_ticket is not None), None)
        if joined is None:
            return False
        log.info(
            "group %s: leader %s did not rejoin; %s leads",
            self.group_id,
            self._leader_id,
            joined.member_id,
        )
        self._leader_id = joined.member_id
        return True

    def _init_next_generation(self, now_ms: int) -> None:
        self._generation_id += 1
        if self._members:
            protocol_name = self._select_protocol()
            self._protocol_name = protocol_name
            self._subscriptions = tuple(m.metadata(protocol_name) for m in self._members.values())
            self._transition(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self._protocol_name = None
            self._subscriptions = ()
            self._transition(GroupState.EMPTY, now_ms)
        self._pending_sync.clear()
        self._sync_deadline_ms = None

    def _select_protocol(self) -> str:
        """The protocol every member supports that most members prefer (ties: first voted)."""
        candidates = frozenset.intersection(*(m.protocol_names for m in self._members.values()))
        votes = Counter(m.vote(candidates) for m in self._members.values())
        return max(votes, key=votes.__getitem__)

    def _supports_protocols(self, protocol_type: str, protocols: Protocols) -> bool:
        names = {name for name, _ in protocols}
        if self._state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        return protocol_type == self._protocol_type and any(
            all(name in m.protocol_names for m in self._members.values()) for name in names
        )

    def _propagate_assignment(self, error: ErrorCode, now_ms: int) -> None:
        for member in self._members.values():
            if member.sync_ticket is None:
                continue
            if error is ErrorCode.NONE:
                self._answer_sync(member, self._assignment_result(member))
            else:
                self._answer_sync(member, SyncResult(error))
            # Sessions do not run while parked: they restart now.
            self._schedule_session(member, now_ms)

    # -- membership bookkeeping --------------------------------------------------------------------

    def _add(self, member: Member, protocol_type: str, ticket: int | None) -> None:
        instance_id = member.group_instance_id
        if instance_id is not None:
            if instance_id in self._static_members:
                raise RuntimeError(f"group {self.group_id}: instance {instance_id} added twice")
            self._static_members[instance_id] = member.member_id
        if not self._members:
            self._protocol_type = protocol_type
        if self._leader_id is None:
            self._leader_id = member.member_id
        self._members[member.member_id] = member
        member.join_ticket = ticket
        self._pending_members.pop(member.member_id, None)

    def _remove(self, member_id: str) -> None:
        member = self._members.pop(member_id, None)
        if member is not None:
            # A removed member's parked calls end now; UNKNOWN_MEMBER_ID makes a live client
            # join again from scratch.
            self._answer_join(member, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER_ID))
            self._answer_sync(member, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
            if member.group_instance_id is not None:
                self._static_members.pop(member.group_instance_id, None)
        if self._leader_id == member_id:
            self._leader_id = next(iter(self._members), None)
        self._pending_members.pop(member_id, None)
        self._pending_sync.discard(member_id)

    def _remove_member_and_update_group(self, member_id: str, now_ms: int, reason: str) -> None:
        self._remove(member_id)
        if self._state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(now_ms, reason)
        elif self._state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(now_ms)

    def _remove_pending_member(self, member_id: str, now_ms: int) -> None:
        self._pending_members.pop(member_id, None)
        self._try_complete_join(now_ms)

    def _replace_static_member(
        self, instance_id: str, old_member_id: str, new_member_id: str
    ) -> Member:
        member = self._members.pop(old_member_id)
        # A client still running under the old id is a duplicate instance: fence its calls.
        self._answer_join(member, JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_member_id))
        self._answer_sync(member, SyncResult(ErrorCode.FENCED_INSTANCE_ID))
        member.member_id = new_member_id
        self._members[new_member_id] = member
        if self._leader_id == old_member_id:
            self._leader_id = new_member_id
        if old_member_id in self._pending_sync:
            # Kafka keeps waiting for the old id here, which forces a needless rebalance when
            # the sync deadline passes; the new id owes the SyncGroup instead.
            self._pending_sync.discard(old_member_id)
            self._pending_sync.add(new_member_id)
        self._static_members[instance_id] = new_member_id
        return member

    def _is_leader(self, member_id: str) -> bool:
        return self._leader_id == member_id

    def _transition(self, state: GroupState, now_ms: int) -> None:
        if self._state not in _VALID_PREVIOUS_STATES[state]:
            raise RuntimeError(
                f"group {self.group_id}: no transition {self._state.value} -> {state.value}"
            )
        self._state = state
        self._state_timestamp_ms = now_ms

    # -- replies -----------------------------------------------------------------------------------

    def _reply(self, ticket: int, result: JoinResult | SyncResult) -> None:
        self._effects.append(Reply(ticket, result))

    def _reply_join(self, ticket: int, error: ErrorCode, member_id: str) -> None:
        self._reply(ticket, JoinResult(error, member_id))

    def _answer_join(self, member: Member, result: JoinResult) -> None:
        if member.join_ticket is not None:
            self._reply(member.join_ticket, result)
            member.join_ticket = None

    def _answer_sync(self, member: Member, result: SyncResult) -> None:
        if member.sync_ticket is not None:
            self._reply(member.sync_ticket, result)
            member.sync_ticket = None

    def _generation_join_result(
        self, member_id: str, with_members: bool, *, skip: bool = False, leader: str | None = None
    ) -> JoinResult:
        protocol_name = self._protocol_name
        members: tuple[JoinedMember, ...] = ()
        if with_members and protocol_name is not None:
            members = tuple(
                JoinedMember(m.member_id, m.group_instance_id, m.metadata(protocol_name))
                for m in self._members.values()
            )
        return JoinResult(
            ErrorCode.NONE,
            member_id,
            self._generation_id,
            self._protocol_type,
            protocol_name,
            (self._leader_id or NO_LEADER) if leader is None else leader,
            skip,
            members,
        )

    def _reply_generation(
        self, ticket: int, member_id: str, with_members: bool, leader: str | None = None
    ) -> None:
        self._reply(ticket, self._generation_join_result(member_id, with_members, leader=leader))
