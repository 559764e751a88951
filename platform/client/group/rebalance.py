"""One rebalance of a member: JoinGroup, the leader's assignment, SyncGroup, retried until the
member has its generation's assignment (Kafka's `joinGroupIfNeeded`, without the hooks: the
consumer runs those in `getmany()`).

- JoinGroup carries one protocol per `partition.assignment.strategy` entry, in order of
  preference: the member's subscription (topics, the partitions it owns and their generation)
  with that assignor's user data. The coordinator parks it until every member has rejoined (or
  the rebalance timeout, `max_poll_interval_ms`, passes), so it may take that long.
- MEMBER_ID_REQUIRED (KIP-394): join again at once with the member id the coordinator chose.
- The leader (the coordinator's choice) gets every member's subscription, looks up the partition
  counts of every subscribed topic, runs the assignor the group voted for, and sends every
  member's assignment in its SyncGroup; the others send an empty one. Both get their own.
- Errors as the Java client treats them: REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID (the member id
  is forgotten) and ILLEGAL_GENERATION (the generation is) join again at once; the coordinator
  moving or loading, or a lost connection, joins again after a backoff; anything else
  (INCONSISTENT_GROUP_PROTOCOL, INVALID_SESSION_TIMEOUT, FENCED_INSTANCE_ID,
  GROUP_MAX_SIZE_REACHED, GROUP_AUTHORIZATION_FAILED, ...) is raised to the application.
- The heartbeat task may reset the member while a request is in flight: an answer for a
  generation or state the member has left is dropped and the member joins again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from riverbed.client.group.assignors import Assignor, RebalanceProtocol
from riverbed.client.group.consumer_protocol import (
    PROTOCOL_TYPE,
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from riverbed.client.group.coordinator_link import COORDINATOR_MOVED_CODES, CoordinatorLink
from riverbed.client.group.member import Generation, GroupMember, MemberState
from riverbed.client.pool import BrokerPool
from riverbed.client.settings import ConsumerSettings
from riverbed.common.backoff import backoff_ms
from riverbed.errors import RetriableError, error_for
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition

logger = logging.getLogger(__name__)

# Java's JOIN_GROUP_TIMEOUT_LAPSE: a JoinGroup may be parked for the whole rebalance timeout, so
# its answer is awaited that long plus this margin.
JOIN_GROUP_TIMEOUT_LAPSE_MS: Final = 5_000
# Codes after which the member joins again without waiting.
_REJOIN_AT_ONCE_CODES: Final = frozenset(
    {
        ErrorCode.MEMBER_ID_REQUIRED,
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.ILLEGAL_GENERATION,
    }
)


def rebalance_protocol(assignors: Sequence[Assignor]) -> RebalanceProtocol:
    """Cooperative only when every configured assignor supports it (Java's rule), so that a group
    can move from eager to cooperative one rolling restart at a time."""
    if all(a.rebalance_protocol is RebalanceProtocol.COOPERATIVE for a in assignors):
        return RebalanceProtocol.COOPERATIVE
    return RebalanceProtocol.EAGER


@dataclass(frozen=True, slots=True)
class RebalanceResult:
    """The generation joined and this member's assignment in it. The leader also keeps the
    partition counts it assigned from (`metadata_snapshot`): when they change, it rejoins."""

    generation: Generation
    assignment: Assignment
    metadata_snapshot: Mapping[str, int] | None


class RebalanceHost(Protocol):
    """What a rebalance needs from the group it runs for."""

    def subscribed_topics(self) -> frozenset[str]: ...

    def owned_partitions(self) -> frozenset[TopicPartition]: ...

    def generation_lost(self, reason: str, *, keep_member_id: bool) -> None:
        """The coordinator no longer knows the member's generation (or member id)."""
        ...

    def member_changed(self) -> None:
        """The member's state changed (heartbeats start or stop)."""
        ...


class _JoinAgain(Exception):
    """Join again: at once, or after a backoff."""

    def __init__(self, reason: str, *, backoff: bool) -> None:
        super().__init__(reason)
        self.backoff = backoff


class Rebalancer:
    def __init__(
        self,
        settings: ConsumerSettings,
        pool: BrokerPool,
        link: CoordinatorLink,
        member: GroupMember,
        assignors: Sequence[Assignor],
        host: RebalanceHost,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._link = link
        self._member = member
        self._assignors = {assignor.name: assignor for assignor in assignors}
        self._host = host

    async def run(self, reason: str) -> RebalanceResult:
        """Join until the member has an assignment; raises what the application must see."""
        failures = 0
        while True:
            try:
                return await self._attempt(reason)
            except _JoinAgain as again:
                reason = str(again)
                logger.info("group %s: joining again: %s", self._member.group_id, reason)
                if not again.backoff:
                    continue
            except (OSError, TimeoutError, RetriableError) as error:
                reason = f"{type(error).__name__}: {error}"
                logger.info(
                    "group %s: rebalance failed, retrying: %s", self._member.group_id, reason
                )
            failures += 1
            wait_ms = backoff_ms(
                failures, self._settings.retry_backoff_ms, self._settings.retry_backoff_max_ms
            )
            await asyncio.sleep(wait_ms / 1000)

    async def _attempt(self, reason: str) -> RebalanceResult:
        await self._link.connection()  # before JOINING: no heartbeats are due meanwhile
        topics = self._host.subscribed_topics()
        owned = self._host.owned_partitions()
        request = self._join_request(topics, owned, reason)
        self._member.join_sent()
        self._host.member_changed()
        response = await self._link.call(
            request,
            m.JoinGroupResponse,
            timeout_ms=max(
                self._settings.request_timeout_ms,
                self._settings.max_poll_interval_ms + JOIN_GROUP_TIMEOUT_LAPSE_MS,
            ),
        )
        if not self._member_is(MemberState.JOINING):
            raise _JoinAgain("the member left the group while joining", backoff=False)
        self._check_join(response)
        generation = Generation(response.generation_id, response.member_id, response.protocol_name)
        self._member.joined(generation)
        self._host.member_changed()
        logger.info(
            "group %s: joined generation %d as %s (%s, protocol %s)",
            self._member.group_id,
            generation.generation_id,
            generation.member_id,
            "leader" if response.leader == response.member_id else "follower",
            generation.protocol_name,
        )
        snapshot: dict[str, int] | None = None
        assignments: list[m.SyncGroupRequest.SyncGroupRequestAssignment] = []
        if response.leader == response.member_id and not response.skip_assignment:
            assignments, snapshot = await self._assign(response)
        sync = await self._link.call(
            m.SyncGroupRequest(
                group_id=self._member.group_id,
                generation_id=generation.generation_id,
                member_id=generation.member_id,
                group_instance_id=self._member.group_instance_id,
                protocol_type=PROTOCOL_TYPE,
                protocol_name=generation.protocol_name,
                assignments=assignments,
            ),
            m.SyncGroupResponse,
            timeout_ms=self._settings.request_timeout_ms,
        )
        if not self._member_is(MemberState.SYNCING) or self._member.generation != generation:
            raise _JoinAgain("the member's generation was reset while syncing", backoff=False)
        self._check_sync(sync, generation)
        assignment = decode_assignment(sync.assignment)
        self._member.synced()
        return RebalanceResult(generation, assignment, snapshot)

    def _member_is(self, state: MemberState) -> bool:
        # Re-read after every await: the heartbeat task may have reset the member meanwhile.
        return self._member.state is state

    def _join_request(
        self, topics: frozenset[str], owned: frozenset[TopicPartition], reason: str
    ) -> m.JoinGroupRequest:
        generation_id = self._member.generation.generation_id
        protocols = [
            m.JoinGroupRequest.JoinGroupRequestProtocol(
                name=name,
                metadata=encode_subscription(
                    Subscription(
                        topics=tuple(sorted(topics)),
                        user_data=assignor.subscription_user_data(topics, generation_id),
                        owned_partitions=tuple(sorted(owned)),
                        generation_id=generation_id,
                    )
                ),
            )
            for name, assignor in self._assignors.items()
        ]
        return m.JoinGroupRequest(
            group_id=self._member.group_id,
            session_timeout_ms=self._settings.session_timeout_ms,
            rebalance_timeout_ms=self._settings.max_poll_interval_ms,
            member_id=self._member.generation.member_id,
            group_instance_id=self._member.group_instance_id,
            protocol_type=PROTOCOL_TYPE,
            protocols=protocols,
            reason=reason,
        )

    def _check_join(self, response: m.JoinGroupResponse) -> None:
        code = ErrorCode(response.error_code)
        if code == ErrorCode.NONE:
            if response.protocol_type not in (None, PROTOCOL_TYPE):
                raise error_for(
                    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    f"group {self._member.group_id} is a {response.protocol_type!r} group",
                )
            if response.protocol_name not in self._assignors:
                raise error_for(
                    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    f"the coordinator chose assignor {response.protocol_name!r}, not ours",
                )
            return
        if code == ErrorCode.MEMBER_ID_REQUIRED:
            self._member.member_id_assigned(response.member_id)
        elif code == ErrorCode.UNKNOWN_MEMBER_ID:
            self._host.generation_lost("JoinGroup: UNKNOWN_MEMBER_ID", keep_member_id=False)
        self._raise(code, "JoinGroup")

    def _check_sync(self, response: m.SyncGroupResponse, generation: Generation) -> None:
        code = ErrorCode(response.error_code)
        if code == ErrorCode.NONE:
            if response.protocol_type not in (
                None,
                PROTOCOL_TYPE,
            ) or response.protocol_name not in (
                None,
                generation.protocol_name,
            ):
                raise error_for(
                    ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                    f"SyncGroup answered protocol {response.protocol_type}/"
                    f"{response.protocol_name}, joined {PROTOCOL_TYPE}/{generation.protocol_name}",
                )
            return
        if code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION):
            self._host.generation_lost(
                f"SyncGroup: {code.name}", keep_member_id=code == ErrorCode.ILLEGAL_GENERATION
            )
        self._raise(code, "SyncGroup")

    def _raise(self, code: ErrorCode, api: str) -> None:
        if code in _REJOIN_AT_ONCE_CODES:
            raise _JoinAgain(f"{api}: {code.name}", backoff=False)
        if code in COORDINATOR_MOVED_CODES:
            self._link.mark_unknown(f"{api}: {code.name}")
            raise _JoinAgain(f"{api}: {code.name}", backoff=True)
        if code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            raise _JoinAgain(f"{api}: {code.name}", backoff=True)
        raise error_for(code, f"{api} for group {self._member.group_id}")

    async def _assign(
        self, response: m.JoinGroupResponse
    ) -> tuple[list[m.SyncGroupRequest.SyncGroupRequestAssignment], dict[str, int]]:
        """The leader's work: every member's assignment, and the partition counts used."""
        assignor = self._assignors[response.protocol_name or ""]  # known: see _check_join
        subscriptions = {
            member.member_id: decode_subscription(member.metadata, member.group_instance_id)
            for member in response.members
        }
        topics = {topic for subscription in subscriptions.values() for topic in subscription.topics}
        counts = await self._partition_counts(topics)
        assignments = assignor.assign(
            {topic: count for topic, count in counts.items() if count > 0}, subscriptions
        )
        logger.info(
            "group %s: leader assigned %s with %s",
            self._member.group_id,
            {member: list(a.partitions) for member, a in assignments.items()},
            assignor.name,
        )
        return [
            m.SyncGroupRequest.SyncGroupRequestAssignment(member, encode_assignment(assignment))
            for member, assignment in assignments.items()
        ], counts

    async def _partition_counts(self, topics: Collection[str]) -> dict[str, int]:
        """Each topic's partition count from fresh metadata; 0 for a topic that does not exist."""
        if not topics:
            return {}
        cluster = await self._pool.refresh(topics)
        return {topic: cluster.partition_count(topic) for topic in topics}
