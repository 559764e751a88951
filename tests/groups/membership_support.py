"""Driving `GroupMembership` directly, as the coordinator does: requests built like a client's,
asyncio timers on a virtual-time loop (`tests.support.virtual_time`: the tests run on it, and
the membership's clock is the loop's), and an in-memory `persist` (the real one is the
coordinator's, tested with brokers) that records, holds or fails writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from riverbed.broker.groups.membership import GroupMembership
from riverbed.configs import BrokerConfig
from riverbed.protocol import messages as m
from riverbed.protocol.data_messages import ConsumerProtocolSubscription, GroupMetadataValue
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.versioned import encode_versioned

from tests.support.virtual_time import loop_now_ms

SESSION_MS = 2_000
REBALANCE_MS = 3_000
INITIAL_DELAY_MS = 50


def subscription(*topics: str) -> bytes:
    """A consumer's JoinGroup metadata (ConsumerProtocolSubscription v1)."""
    return encode_versioned(ConsumerProtocolSubscription(topics=list(topics)), 1)


RANGE = (("range", subscription("t1")),)


def broker_config(**settings: str) -> BrokerConfig:
    values = {
        "zookeeper.connect": "127.0.0.1:2181",
        "group.min.session.timeout.ms": "10",
        "group.max.session.timeout.ms": "60000",
        "group.initial.rebalance.delay.ms": str(INITIAL_DELAY_MS),
    }
    values.update({key.replace("_", "."): value for key, value in settings.items()})
    return BrokerConfig.from_mapping(values)


@dataclass
class MemoryLog:
    """The persist callable: every committed write in order; `hold()` parks writes until
    `release()`, `error` fails them."""

    writes: list[tuple[str, GroupMetadataValue | None]] = field(default_factory=list)
    started: int = 0
    error: ErrorCode | None = None
    _open: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._open.set()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    async def __call__(self, group_id: str, value: GroupMetadataValue | None) -> None:
        self.started += 1
        await self._open.wait()
        if self.error is not None:
            raise KafkaError(self.error, "injected")
        self.writes.append((group_id, value))

    def last(self, group_id: str = "g") -> GroupMetadataValue | None:
        return [value for written, value in self.writes if written == group_id][-1]


@asynccontextmanager
async def running(**settings: str) -> AsyncIterator[tuple[GroupMembership, MemoryLog]]:
    persist = MemoryLog()
    membership = GroupMembership(broker_config(**settings), persist, loop_now_ms)
    try:
        yield membership, persist
    finally:
        membership.close()
        await membership.wait_closed()


async def join(
    membership: GroupMembership,
    member_id: str = "",
    *,
    group_id: str = "g",
    version: int = 9,
    instance: str | None = None,
    protocols: tuple[tuple[str, bytes], ...] = RANGE,
    protocol_type: str = "consumer",
    session_ms: int = SESSION_MS,
    rebalance_ms: int = REBALANCE_MS,
    client_id: str = "consumer",
) -> m.JoinGroupResponse:
    request = m.JoinGroupRequest(
        group_id=group_id,
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms,
        member_id=member_id,
        group_instance_id=instance,
        protocol_type=protocol_type,
        protocols=[m.JoinGroupRequest.JoinGroupRequestProtocol(n, d) for n, d in protocols],
        reason="test",
    )
    return await membership.join(request, version, client_id, "/127.0.0.1")


async def join_new(membership: GroupMembership, **options: object) -> m.JoinGroupResponse:
    """A new member's join as a v4+ client does it: MEMBER_ID_REQUIRED, then with its id."""
    first = await join(membership, **options)  # type: ignore[arg-type]
    if first.error_code != ErrorCode.MEMBER_ID_REQUIRED:
        return first
    return await join(membership, first.member_id, **options)  # type: ignore[arg-type]


async def sync(
    membership: GroupMembership,
    member_id: str,
    generation_id: int,
    assignments: dict[str, bytes] | None = None,
    *,
    group_id: str = "g",
    version: int = 5,
    instance: str | None = None,
    protocol_name: str | None = "range",
) -> m.SyncGroupResponse:
    request = m.SyncGroupRequest(
        group_id=group_id,
        generation_id=generation_id,
        member_id=member_id,
        group_instance_id=instance,
        protocol_type="consumer",
        protocol_name=protocol_name,
        assignments=[
            m.SyncGroupRequest.SyncGroupRequestAssignment(member, assignment)
            for member, assignment in (assignments or {}).items()
        ],
    )
    return await membership.sync(request, version)


def heartbeat(
    membership: GroupMembership,
    member_id: str,
    generation_id: int,
    *,
    group_id: str = "g",
    instance: str | None = None,
) -> ErrorCode:
    request = m.HeartbeatRequest(
        group_id=group_id,
        generation_id=generation_id,
        member_id=member_id,
        group_instance_id=instance,
    )
    return ErrorCode(membership.heartbeat(request).error_code)


async def stable_group(
    membership: GroupMembership, count: int, **options: object
) -> tuple[list[str], int]:
    """`count` dynamic members joined together and synced: their ids (leader first) and the
    generation; each member's assignment is b"assigned-<member id>"."""
    joins = await asyncio.gather(*(join_new(membership, **options) for _ in range(count)))
    assert {ErrorCode(j.error_code) for j in joins} == {ErrorCode.NONE}
    generation = joins[0].generation_id
    leader = joins[0].leader
    members = [leader, *(j.member_id for j in joins if j.member_id != leader)]
    assignments = {member_id: f"assigned-{member_id}".encode() for member_id in members}
    results = await asyncio.gather(
        sync(membership, leader, generation, assignments),
        *(sync(membership, member_id, generation) for member_id in members[1:]),
    )
    assert {ErrorCode(r.error_code) for r in results} == {ErrorCode.NONE}
    return members, generation
