"""The values a `Group` (riverbed.broker.groups.group) takes and gives: the calls made on it, their
results and the effects it asks for, what it stores in `__consumer_offsets`, and how
DescribeGroups shows it. Plain frozen data, no behaviour beyond small checks."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from riverbed.configs import BrokerConfig
from riverbed.protocol.errors import ErrorCode

UNKNOWN_MEMBER_ID: Final = ""
NO_GENERATION: Final = -1
NO_LEADER: Final = ""
NO_STATE_TIMESTAMP: Final = -1
# Kafka's GroupCoordinator.NewMemberJoinTimeoutMs: a new member parked in its first JoinGroup
# cannot heartbeat; if its client gave up (request timeout) it would stay in the rebalance
# forever, so its join expires after this long and a live client simply retries.
NEW_MEMBER_JOIN_TIMEOUT_MS: Final = 5 * 60 * 1000
Protocols = tuple[tuple[str, bytes], ...]  # (name, metadata) in the member's order of preference


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """The broker's group.* settings a group obeys."""

    min_session_timeout_ms: int
    max_session_timeout_ms: int
    initial_rebalance_delay_ms: int
    max_size: int
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS

    @classmethod
    def from_config(cls, config: BrokerConfig) -> GroupLimits:
        return cls(
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms,
            initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            max_size=config.group_max_size,
        )

    def session_timeout_error(self, session_timeout_ms: int) -> ErrorCode:
        if self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms:
            return ErrorCode.NONE
        return ErrorCode.INVALID_SESSION_TIMEOUT


# -- calls in --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinCall:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    require_known_member_id: bool  # JoinGroup v4+ (KIP-394): a new member first gets its id
    supports_skip_assignment: bool  # JoinGroup v9+ (KIP-814)
    reason: str = "not provided"


@dataclass(frozen=True, slots=True)
class SyncCall:
    member_id: str
    generation_id: int
    group_instance_id: str | None
    protocol_type: str | None  # SyncGroup v5+ (KIP-559); None: not checked
    protocol_name: str | None
    assignments: Mapping[str, bytes]  # the leader's assignment per member id; empty otherwise


# -- results and effects out -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinedMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = NO_LEADER
    skip_assignment: bool = False
    members: tuple[JoinedMember, ...] = ()  # for the leader only


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class StoredMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes  # the member's metadata for the group's protocol
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """What `__consumer_offsets` keeps of a group (Kafka's GroupMetadataValue)."""

    protocol_type: str  # "" for a group that never had members
    generation_id: int
    protocol_name: str | None
    leader: str | None
    state_timestamp_ms: int  # NO_STATE_TIMESTAMP if unknown
    members: tuple[StoredMember, ...]


@dataclass(frozen=True, slots=True)
class Reply:
    ticket: int
    result: JoinResult | SyncResult


@dataclass(frozen=True, slots=True)
class Store:
    token: int
    record: GroupRecord


Effect = Reply | Store


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    state: GroupState
    protocol_type: str
    protocol_name: str
    members: tuple[MemberDescription, ...]


# What DescribeGroups answers for a group this coordinator does not know (as Kafka does).
DEAD_GROUP: Final = GroupDescription(GroupState.DEAD, "", "", ())
