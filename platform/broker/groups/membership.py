"""Every group of the `__consumer_offsets` partitions this broker leads: the asyncio layer around
the `Group` state machines (riverbed.broker.groups.group).

It turns requests into calls on the groups and their effects into I/O:
- a JoinGroup or SyncGroup parks on a future under a ticket until its group replies;
- one timer per group wakes it at its next deadline (sessions, join and sync phases);
- a group's metadata writes go through the injected `persist`, one after the other per group
  (so the log keeps them in the order the group made them), and their outcome goes back to it.

Placement is not checked here: the coordinator only routes requests for groups it leads and has
loaded. Groups known only by their committed offsets are the coordinator's, not ours.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Final

from riverbed.broker.groups.group import Group
from riverbed.broker.groups.group_values import (
    DEAD_GROUP,
    UNKNOWN_MEMBER_ID,
    GroupDescription,
    GroupLimits,
    GroupRecord,
    GroupState,
    JoinCall,
    JoinResult,
    Reply,
    Store,
    StoredMember,
    SyncCall,
    SyncResult,
)
from riverbed.configs import BrokerConfig
from riverbed.protocol import messages as m
from riverbed.protocol.codec import read_data
from riverbed.protocol.data_messages import ConsumerProtocolSubscription, GroupMetadataValue
from riverbed.protocol.errors import ErrorCode, KafkaError, ProtocolDecodeError
from riverbed.protocol.primitives import INT16

log = logging.getLogger(__name__)

# Writes a group's metadata (None: its tombstone) to its partition and returns once committed;
# raises KafkaError with the code to answer the members with.
PersistGroup = Callable[[str, GroupMetadataValue | None], Awaitable[None]]

CONSUMER_PROTOCOL_TYPE: Final = "consumer"
# JoinGroup v0 has no rebalance timeout: the session timeout serves as both (as in Kafka).
JOIN_REBALANCE_TIMEOUT_MIN_VERSION: Final = 1
JOIN_REQUIRE_KNOWN_MEMBER_ID_MIN_VERSION: Final = 4  # KIP-394
JOIN_NULLABLE_PROTOCOL_NAME_MIN_VERSION: Final = 7
JOIN_SKIP_ASSIGNMENT_MIN_VERSION: Final = 9  # KIP-814
SYNC_PROTOCOL_REQUIRED_MIN_VERSION: Final = 5  # KIP-559
LEAVE_BATCH_MIN_VERSION: Final = 3  # KIP-345

DescribedGroup = m.DescribeGroupsResponse.DescribedGroup
ListedGroup = m.ListGroupsResponse.ListedGroup


class GroupMembership:
    """The groups of the loaded partitions, their members and rebalances."""

    def __init__(
        self, config: BrokerConfig, persist: PersistGroup, now_ms: Callable[[], int]
    ) -> None:
        self._limits = GroupLimits.from_config(config)
        self._persist = persist
        self._now_ms = now_ms
        self._groups: dict[str, Group] = {}
        self._calls: dict[int, asyncio.Future[JoinResult | SyncResult]] = {}
        self._tickets = itertools.count(1)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # Each group's metadata writes in flight, oldest first (each waits for the previous).
        self._writes: dict[str, list[asyncio.Task[ErrorCode]]] = {}

    # -- JoinGroup / SyncGroup ---------------------------------------------------------------------

    async def join(
        self, request: m.JoinGroupRequest, version: int, client_id: str, client_host: str
    ) -> m.JoinGroupResponse:
        call = JoinCall(
            member_id=request.member_id,
            group_instance_id=request.group_instance_id,
            client_id=client_id,
            client_host=client_host,
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=(
                request.rebalance_timeout_ms
                if version >= JOIN_REBALANCE_TIMEOUT_MIN_VERSION
                else request.session_timeout_ms
            ),
            protocol_type=request.protocol_type,
            protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
            require_known_member_id=(
                version >= JOIN_REQUIRE_KNOWN_MEMBER_ID_MIN_VERSION
                and request.group_instance_id is None
            ),
            supports_skip_assignment=version >= JOIN_SKIP_ASSIGNMENT_MIN_VERSION,
            reason=request.reason or "not provided",  # JoinGroup v8+ (KIP-800)
        )
        result = await self._join(request.group_id, call)
        return _join_response(result, version)

    async def _join(self, group_id: str, call: JoinCall) -> JoinResult:
        error = self._limits.session_timeout_error(call.session_timeout_ms)
        if error is not ErrorCode.NONE:
            return JoinResult(error, call.member_id)
        group = self._groups.get(group_id)
        if group is None:
            if call.member_id != UNKNOWN_MEMBER_ID:
                return JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, call.member_id)
            group = self._groups[group_id] = Group(group_id, self._limits, self._now_ms())
        result = await self._park(group, lambda ticket: group.join(ticket, call, self._now_ms()))
        if not isinstance(result, JoinResult):
            raise TypeError(f"group {group_id} answered a JoinGroup with {result}")
        return result

    async def sync(self, request: m.SyncGroupRequest, version: int) -> m.SyncGroupResponse:
        result = await self._sync(request, version)
        response = m.SyncGroupResponse(error_code=result.error, assignment=result.assignment)
        if version >= SYNC_PROTOCOL_REQUIRED_MIN_VERSION:
            response.protocol_type = result.protocol_type
            response.protocol_name = result.protocol_name
        return response

    async def _sync(self, request: m.SyncGroupRequest, version: int) -> SyncResult:
        if version >= SYNC_PROTOCOL_REQUIRED_MIN_VERSION and (
            request.protocol_type is None or request.protocol_name is None
        ):
            return SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        group = self._groups.get(request.group_id)
        if group is None:
            return SyncResult(ErrorCode.UNKNOWN_MEMBER_ID)
        call = SyncCall(
            member_id=request.member_id,
            generation_id=request.generation_id,
            group_instance_id=request.group_instance_id,
            protocol_type=request.protocol_type,
            protocol_name=request.protocol_name,
            assignments={a.member_id: bytes(a.assignment) for a in request.assignments},
        )
        result = await self._park(group, lambda ticket: group.sync(ticket, call, self._now_ms()))
        if not isinstance(result, SyncResult):
            raise TypeError(f"group {request.group_id} answered a SyncGroup with {result}")
        return result

    async def _park(self, group: Group, start: Callable[[int], None]) -> JoinResult | SyncResult:
        """Start a call under a new ticket and wait for the group's reply to it."""
        ticket = next(self._tickets)
        future: asyncio.Future[JoinResult | SyncResult] = asyncio.get_running_loop().create_future()
        self._calls[ticket] = future
        try:
            start(ticket)
            self._settle(group)
            return await future
        finally:
            # If the caller is cancelled (its connection closed), the group still counts the
            # call until it answers it; the answer then finds no future and is dropped.
            del self._calls[ticket]

    # -- Heartbeat / LeaveGroup --------------------------------------------------------------------

    def heartbeat(self, request: m.HeartbeatRequest) -> m.HeartbeatResponse:
        group = self._groups.get(request.group_id)
        if group is None:
            return m.HeartbeatResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID)
        error = group.heartbeat(
            request.member_id, request.group_instance_id, request.generation_id, self._now_ms()
        )
        self._settle(group)
        return m.HeartbeatResponse(error_code=error)

    async def leave(self, request: m.LeaveGroupRequest, version: int) -> m.LeaveGroupResponse:
        if version >= LEAVE_BATCH_MIN_VERSION:
            leaving = request.members
        else:
            leaving = [m.LeaveGroupRequest.MemberIdentity(member_id=request.member_id)]
        top_error, errors = self._leave(request.group_id, leaving)
        if version < LEAVE_BATCH_MIN_VERSION:
            # One member, one error code (Kafka's LeaveGroupResponse for old versions).
            first = next((e for e in errors if e is not ErrorCode.NONE), ErrorCode.NONE)
            return m.LeaveGroupResponse(error_code=top_error or first)
        return m.LeaveGroupResponse(
            error_code=top_error,
            members=[
                m.LeaveGroupResponse.MemberResponse(
                    member_id=identity.member_id,
                    group_instance_id=identity.group_instance_id,
                    error_code=error,
                )
                for identity, error in zip(leaving, errors, strict=True)
            ],
        )

    def _leave(
        self, group_id: str, leaving: list[m.LeaveGroupRequest.MemberIdentity]
    ) -> tuple[ErrorCode, list[ErrorCode]]:
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(leaving)
        if group.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        errors = [
            group.leave(
                identity.member_id,
                identity.group_instance_id,
                identity.reason or "not provided",  # LeaveGroup v5+ (KIP-800)
                self._now_ms(),
            )
            for identity in leaving
        ]
        self._settle(group)
        return ErrorCode.NONE, errors

    # -- DescribeGroups / ListGroups ---------------------------------------------------------------

    def describe(self, group_id: str) -> DescribedGroup:
        """A group as DescribeGroups shows it; "Dead" if this coordinator does not know it."""
        group = self._groups.get(group_id)
        description: GroupDescription = DEAD_GROUP if group is None else group.describe()
        return DescribedGroup(
            error_code=ErrorCode.NONE,
            group_id=group_id,
            group_state=description.state.value,
            protocol_type=description.protocol_type,
            protocol_data=description.protocol_name,
            members=[
                m.DescribeGroupsResponse.DescribedGroupMember(
                    member_id=member.member_id,
                    group_instance_id=member.group_instance_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    member_metadata=member.metadata,
                    member_assignment=member.assignment,
                )
                for member in description.members
            ],
        )

    def list(self, states_filter: Iterable[str]) -> list[ListedGroup]:
        """ListGroups: the groups in one of `states_filter` (case-insensitive; empty: all)."""
        wanted = {state.lower() for state in states_filter}
        return [
            ListedGroup(
                group_id=group.group_id,
                protocol_type=group.protocol_type or "",
                group_state=group.state.value,
            )
            for group in self._groups.values()
            if not wanted or group.state.value.lower() in wanted
        ]

    # -- what the offsets need ---------------------------------------------------------------------

    def check_commit(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        *,
        transactional: bool = False,
    ) -> ErrorCode:
        """NONE if an OffsetCommit (a TxnOffsetCommit if `transactional`) with these credentials
        may be stored (Kafka's rules)."""
        group = self._groups.get(group_id)
        if group is None:
            # Without group management (generation -1) anyone may commit. Otherwise an
            # OffsetCommit's generation names a group that is gone; Kafka validates a
            # TxnOffsetCommit against a new Empty group instead, where no member is known.
            if generation_id < 0:
                return ErrorCode.NONE
            return ErrorCode.UNKNOWN_MEMBER_ID if transactional else ErrorCode.ILLEGAL_GENERATION
        error = group.check_commit(
            generation_id, member_id, group_instance_id, self._now_ms(), transactional=transactional
        )
        self._settle(group)
        return error

    def group_state(self, group_id: str) -> GroupState | None:
        group = self._groups.get(group_id)
        return None if group is None else group.state

    def state_timestamp_ms(self, group_id: str) -> int | None:
        """When the group entered its state (None: unknown group, or an old record)."""
        group = self._groups.get(group_id)
        return None if group is None else group.state_timestamp_ms

    def subscribed_topics(self, group_id: str) -> frozenset[str] | None:
        """The topics a consumer group's members subscribed to as of its generation; None if
        unknown (not a consumer group, or metadata that does not parse)."""
        group = self._groups.get(group_id)
        if group is None or group.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not group.subscriptions:
            return frozenset() if not group.members() else None
        try:
            # Version 0 is a prefix of every version, as Kafka reads it here.
            return frozenset(
                itertools.chain.from_iterable(
                    read_data(ConsumerProtocolSubscription, subscription, 0, INT16.size)[0].topics
                    for subscription in group.subscriptions
                )
            )
        except ProtocolDecodeError as error:
            log.warning("group %s: unreadable consumer subscription: %s", group_id, error)
            return None

    # -- loading, unloading, deleting --------------------------------------------------------------

    def load(self, group_id: str, value: GroupMetadataValue) -> None:
        """Restore a group from its latest record in the log (this broker now leads it)."""
        self._drop(group_id)
        try:
            group = Group.restore(group_id, self._limits, _record(value), self._now_ms())
        except ValueError as error:
            log.error("group %s: cannot load its metadata: %s", group_id, error)
            return
        log.info(
            "group %s: loaded at generation %d in state %s with %d members",
            group_id,
            group.generation_id,
            group.state.value,
            len(group.members()),
        )
        self._groups[group_id] = group
        self._settle(group)

    def unload(self, group_ids: Iterable[str]) -> None:
        """This broker stopped leading these groups: parked calls get NOT_COORDINATOR."""
        for group_id in group_ids:
            self._drop(group_id)

    async def delete(self, group_id: str) -> ErrorCode:
        """DeleteGroups (and offset expiry): an Empty group is removed and its tombstone
        written; NON_EMPTY_GROUP or GROUP_ID_NOT_FOUND otherwise."""
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        error = group.delete(self._now_ms())
        if error is not ErrorCode.NONE:
            return error
        del self._groups[group_id]
        self._cancel_timer(group_id)
        self._deliver(group)
        write = self._write(group_id, None)
        await asyncio.wait([write])  # our caller's cancellation still propagates
        return ErrorCode.NOT_COORDINATOR if write.cancelled() else write.result()

    def close(self) -> None:
        """Stop: every timer and write is cancelled, every parked call answered
        NOT_COORDINATOR. `wait_closed` waits for the cancelled writes to end."""
        for group_id in list(self._groups):
            self._drop(group_id)
        for writes in self._writes.values():
            for write in writes:
                write.cancel()

    async def wait_closed(self) -> None:
        writes = [write for writes in self._writes.values() for write in writes]
        await asyncio.gather(*writes, return_exceptions=True)

    def _drop(self, group_id: str) -> None:
        """Forget a group this broker no longer coordinates, answering its parked calls."""
        group = self._groups.pop(group_id, None)
        self._cancel_timer(group_id)
        for write in self._writes.get(group_id, []):
            write.cancel()
        if group is not None:
            group.unload(self._now_ms())
            self._deliver(group)

    # -- effects -----------------------------------------------------------------------------------

    def _settle(self, group: Group) -> None:
        """Carry out what the group asked for, then wake it at its next deadline."""
        self._deliver(group)
        if self._groups.get(group.group_id) is group:
            self._arm_timer(group)

    def _deliver(self, group: Group) -> None:
        current = self._groups.get(group.group_id) is group
        for effect in group.effects():
            if isinstance(effect, Reply):
                future = self._calls.get(effect.ticket)
                if future is not None and not future.done():
                    future.set_result(effect.result)
            elif current:
                self._store(group, effect)

    def _store(self, group: Group, store: Store) -> None:
        write = self._write(group.group_id, _value(store.record))

        def written(task: asyncio.Task[ErrorCode]) -> None:
            if task.cancelled() or self._groups.get(group.group_id) is not group:
                return  # unloaded or deleted meanwhile: the outcome is nobody's
            group.on_stored(store.token, task.result(), self._now_ms())
            self._settle(group)

        write.add_done_callback(written)

    def _write(self, group_id: str, value: GroupMetadataValue | None) -> asyncio.Task[ErrorCode]:
        writes = self._writes.setdefault(group_id, [])
        previous = writes[-1] if writes else None
        task = asyncio.get_running_loop().create_task(
            self._persist_after(previous, group_id, value), name=f"group-write-{group_id}"
        )
        writes.append(task)

        def forget(task: asyncio.Task[ErrorCode]) -> None:
            pending = self._writes.get(group_id, [])
            if task in pending:
                pending.remove(task)
            if not pending:
                self._writes.pop(group_id, None)

        task.add_done_callback(forget)
        return task

    async def _persist_after(
        self,
        previous: asyncio.Task[ErrorCode] | None,
        group_id: str,
        value: GroupMetadataValue | None,
    ) -> ErrorCode:
        if previous is not None:
            await asyncio.wait([previous])  # only its end matters, not its outcome
        try:
            await self._persist(group_id, value)
        except KafkaError as error:
            return error.code
        except Exception:
            log.exception("group %s: writing its metadata failed", group_id)
            return ErrorCode.UNKNOWN_SERVER_ERROR
        return ErrorCode.NONE

    # -- timers ------------------------------------------------------------------------------------

    def _arm_timer(self, group: Group) -> None:
        self._cancel_timer(group.group_id)
        deadline_ms = group.next_deadline_ms()
        if deadline_ms is None:
            return
        delay_s = max(deadline_ms - self._now_ms(), 0) / 1000
        self._timers[group.group_id] = asyncio.get_running_loop().call_later(
            delay_s, self._on_timer, group
        )

    def _cancel_timer(self, group_id: str) -> None:
        timer = self._timers.pop(group_id, None)
        if timer is not None:
            timer.cancel()

    def _on_timer(self, group: Group) -> None:
        self._timers.pop(group.group_id, None)
        if self._groups.get(group.group_id) is not group:
            return
        group.on_timer(self._now_ms())
        self._settle(group)


def _join_response(result: JoinResult, version: int) -> m.JoinGroupResponse:
    protocol_name = result.protocol_name
    if version < JOIN_NULLABLE_PROTOCOL_NAME_MIN_VERSION:
        protocol_name = protocol_name or ""  # no null before v7 (Kafka's JoinGroupResponse)
    elif not protocol_name:
        protocol_name = None
    return m.JoinGroupResponse(
        error_code=result.error,
        generation_id=result.generation_id,
        protocol_type=result.protocol_type,
        protocol_name=protocol_name,
        leader=result.leader,
        skip_assignment=result.skip_assignment,
        member_id=result.member_id,
        members=[
            m.JoinGroupResponse.JoinGroupResponseMember(
                member_id=member.member_id,
                group_instance_id=member.group_instance_id,
                metadata=member.metadata,
            )
            for member in result.members
        ],
    )


def _value(record: GroupRecord) -> GroupMetadataValue:
    return GroupMetadataValue(
        protocol_type=record.protocol_type,
        generation=record.generation_id,
        protocol=record.protocol_name,
        leader=record.leader,
        current_state_timestamp=record.state_timestamp_ms,
        members=[
            GroupMetadataValue.MemberMetadata(
                member_id=member.member_id,
                group_instance_id=member.group_instance_id,
                client_id=member.client_id,
                client_host=member.client_host,
                rebalance_timeout=member.rebalance_timeout_ms,
                session_timeout=member.session_timeout_ms,
                subscription=member.subscription,
                assignment=member.assignment,
            )
            for member in record.members
        ],
    )


def _record(value: GroupMetadataValue) -> GroupRecord:
    return GroupRecord(
        protocol_type=value.protocol_type,
        generation_id=value.generation,
        protocol_name=value.protocol,
        leader=value.leader,
        state_timestamp_ms=value.current_state_timestamp,
        members=tuple(
            StoredMember(
                member_id=member.member_id,
                group_instance_id=member.group_instance_id,
                client_id=member.client_id,
                client_host=member.client_host,
                # Version 0 records have no rebalance timeout: the session timeout was both.
                rebalance_timeout_ms=(
                    member.rebalance_timeout
                    if member.rebalance_timeout >= 0
                    else member.session_timeout
                ),
                session_timeout_ms=member.session_timeout,
                subscription=bytes(member.subscription),
                assignment=bytes(member.assignment),
            )
            for member in value.members
        ),
    )
