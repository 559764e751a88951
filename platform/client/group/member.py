"""A consumer group member's protocol state, without I/O: where it stands in the classic group
protocol, the generation it belongs to, and whether it must (re)join.

States (Kafka's `MemberState`, named by what the member is doing):

- UNJOINED: not in a group: not subscribed yet, before the first `getmany()`, after leaving, or
  after the coordinator forgot it (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, a session or poll
  interval that ran out);
- JOINING: a JoinGroup is in flight (Kafka's PREPARING_REBALANCE); the member's generation is
  still the last one it had;
- SYNCING: JoinGroup answered, the member has its new generation, its SyncGroup is in flight
  (COMPLETING_REBALANCE); heartbeats run;
- STABLE: the generation's assignment arrived; heartbeats run.

Transitions are the table `TRANSITIONS`; a pair absent from it is a bug and raises.

`rejoin_reason` is set when the member must join again (first subscription, the coordinator
reported a rebalance, the subscription or the metadata changed, partitions were revoked under the
cooperative protocol); the consumer acts on it at its next `getmany()`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

NO_GENERATION: Final = -1
NO_MEMBER_ID: Final = ""


class MemberState(enum.Enum):
    UNJOINED = "unjoined"
    JOINING = "joining"
    SYNCING = "syncing"
    STABLE = "stable"


class MemberEvent(enum.Enum):
    JOIN_SENT = "join_sent"
    JOINED = "joined"
    SYNCED = "synced"
    RESET = "reset"


_S, _E = MemberState, MemberEvent
TRANSITIONS: Final[dict[tuple[MemberState, MemberEvent], MemberState]] = {
    (_S.UNJOINED, _E.JOIN_SENT): _S.JOINING,
    (_S.STABLE, _E.JOIN_SENT): _S.JOINING,
    # Joining again: MEMBER_ID_REQUIRED, a coordinator that moved, SyncGroup answered
    # REBALANCE_IN_PROGRESS.
    (_S.JOINING, _E.JOIN_SENT): _S.JOINING,
    (_S.SYNCING, _E.JOIN_SENT): _S.JOINING,
    (_S.JOINING, _E.JOINED): _S.SYNCING,
    (_S.SYNCING, _E.SYNCED): _S.STABLE,
    (_S.UNJOINED, _E.RESET): _S.UNJOINED,
    (_S.JOINING, _E.RESET): _S.UNJOINED,
    (_S.SYNCING, _E.RESET): _S.UNJOINED,
    (_S.STABLE, _E.RESET): _S.UNJOINED,
}


class IllegalTransitionError(RuntimeError):
    """A (state, event) pair the table does not allow: a bug in the consumer."""


@dataclass(frozen=True, slots=True)
class Generation:
    """The group generation a member belongs to, as the coordinator named it in JoinGroup."""

    generation_id: int = NO_GENERATION
    member_id: str = NO_MEMBER_ID
    protocol_name: str | None = None


NO_GENERATION_YET: Final = Generation()


class GroupMember:
    """One member's state; the consumer's only mutable view of it."""

    def __init__(self, group_id: str, group_instance_id: str | None) -> None:
        self.group_id = group_id
        self.group_instance_id = group_instance_id
        self.state = MemberState.UNJOINED
        self.generation = NO_GENERATION_YET
        self.rejoin_reason: str | None = None

    @property
    def static(self) -> bool:
        """A static member (KIP-345) keeps its place across restarts and never sends LeaveGroup."""
        return self.group_instance_id is not None

    @property
    def rejoin_needed(self) -> bool:
        return self.rejoin_reason is not None

    @property
    def heartbeating(self) -> bool:
        """Whether the coordinator expects heartbeats: from JoinGroup's answer on."""
        return self.state in (MemberState.SYNCING, MemberState.STABLE)

    @property
    def in_rebalance(self) -> bool:
        return self.state in (MemberState.JOINING, MemberState.SYNCING)

    def request_rejoin(self, reason: str) -> None:
        if self.rejoin_reason is None:
            self.rejoin_reason = reason

    def join_sent(self) -> None:
        self._apply(MemberEvent.JOIN_SENT)
        self.rejoin_reason = None

    def member_id_assigned(self, member_id: str) -> None:
        """MEMBER_ID_REQUIRED (KIP-394): join again with the member id the coordinator chose."""
        self.generation = Generation(NO_GENERATION, member_id)

    def joined(self, generation: Generation) -> None:
        self._apply(MemberEvent.JOINED)
        self.generation = generation

    def synced(self) -> None:
        self._apply(MemberEvent.SYNCED)

    def reset(self, reason: str | None, *, keep_member_id: bool = False) -> None:
        """Out of the group: the generation is gone (the member id too unless kept, as after
        ILLEGAL_GENERATION, where it may still be valid); rejoin for `reason` unless None."""
        self._apply(MemberEvent.RESET)
        member_id = self.generation.member_id if keep_member_id else NO_MEMBER_ID
        self.generation = Generation(NO_GENERATION, member_id)
        self.rejoin_reason = reason

    def _apply(self, event: MemberEvent) -> None:
        target = TRANSITIONS.get((self.state, event))
        if target is None:
            raise IllegalTransitionError(
                f"{event.value} is not allowed in state {self.state.value}"
            )
        self.state = target
