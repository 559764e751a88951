"""A consumer's membership in its group: subscription, rebalances, heartbeats and commits.

The split of work follows the Java client, on asyncio tasks instead of threads:

- `poll()` runs inside every `getmany()`, on the application's task. It is where the assignment
  changes and where the listener's hooks run: the partitions lost in the background are
  announced; a finished rebalance is applied (cooperative: the partitions that move are revoked
  first, and the member rejoins to let them go); a needed rejoin is prepared (auto commit, then
  eager: every partition revoked; cooperative: only those of topics no longer subscribed) and
  started; the auto commit runs when due; a pattern subscription and the leader's metadata are
  checked every `metadata_max_age_ms`. So the application never gets records from a partition
  whose revocation hook has run, and the hooks can commit.
- The rebalance itself (JoinGroup, the leader's assignment, SyncGroup, see rebalance.py) runs on
  a task of its own, so a rebalance progresses while the application processes records; its
  result waits for the next `poll()`.
- Heartbeats run on a task of their own every `heartbeat_interval_ms` once the member has
  joined, so slow processing does not drop it. That task also watches the poll interval: when
  the application has not called `getmany()` for `max_poll_interval_ms`, the member leaves the
  group (LeaveGroup; a static member just stops) and its partitions are lost; it rejoins at the
  next `getmany()`. A heartbeat answered UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION also loses the
  partitions (they are taken from the assignment at once; the hook runs at the next poll);
  REBALANCE_IN_PROGRESS asks for a rejoin.

Commits name the member's generation and are allowed while it is STABLE (and rejoin is merely
pending); during a rebalance they fail with REBALANCE_IN_PROGRESS at once, like the Java client's
RebalanceInProgressException, so that a cooperative member keeps consuming the partitions that
don't move. A consumer that assigns partitions itself commits without a generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import Any, Final, Protocol, TypeVar

from riverbed.client.group.assignors import RebalanceProtocol, assignor_for
from riverbed.client.group.coordinator_link import COORDINATOR_MOVED_CODES, CoordinatorLink
from riverbed.client.group.heartbeat import HeartbeatTimers
from riverbed.client.group.listener import RebalanceListener
from riverbed.client.group.member import (
    NO_GENERATION_YET,
    Generation,
    GroupMember,
    MemberState,
)
from riverbed.client.group.offset_requests import (
    OffsetAndMetadata,
    commit_errors,
    commit_request,
    fetch_request,
    fetch_result,
)
from riverbed.client.group.rebalance import Rebalancer, RebalanceResult, rebalance_protocol
from riverbed.client.group.subscription import TopicSubscription
from riverbed.client.pool import BrokerPool
from riverbed.client.settings import ConsumerSettings
from riverbed.common.backoff import backoff_ms
from riverbed.errors import KafkaTimeoutError, RetriableError, error_for
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition

logger = logging.getLogger(__name__)

ResponseT = TypeVar("ResponseT")

# Commit answers after which the member's generation is gone.
_FENCED_CODES: Final = frozenset(
    {ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION, ErrorCode.FENCED_INSTANCE_ID}
)
# Commit / OffsetFetch answers retried after a backoff (the coordinator moves or loads).
_RETRY_CODES: Final = COORDINATOR_MOVED_CODES | {
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.UNSTABLE_OFFSET_COMMIT,
}


class GroupHost(Protocol):
    """What the group needs from its consumer."""

    def assignment(self) -> frozenset[TopicPartition]: ...

    def assign_from_group(self, partitions: frozenset[TopicPartition]) -> None:
        """Read exactly `partitions`; new ones start at their committed offsets."""
        ...

    def consumed_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        """The position of every assigned partition that has one: what a commit commits."""
        ...

    def wake(self) -> None:
        """Make a waiting `getmany()` call `poll()` again."""
        ...


class ConsumerGroup:
    """One consumer's group membership; `start()` / `close()` own its tasks."""

    def __init__(self, settings: ConsumerSettings, pool: BrokerPool, host: GroupHost) -> None:
        if settings.group_id is None:
            raise ValueError("a ConsumerGroup needs settings.group_id")
        self._settings = settings
        self._pool = pool
        self._host = host
        self.member = GroupMember(settings.group_id, settings.group_instance_id)
        self._link = CoordinatorLink(settings, pool, settings.group_id)
        assignors = [assignor_for(name) for name in settings.partition_assignment_strategy]
        self.protocol = rebalance_protocol(assignors)
        self._rebalancer = Rebalancer(settings, pool, self._link, self.member, assignors, self)
        self._subscription: TopicSubscription | None = None
        self._pattern_evaluated = False
        self._listener = RebalanceListener()
        self._lost: frozenset[TopicPartition] = frozenset()  # taken away; hook not yet run
        self._metadata_snapshot: Mapping[str, int] | None = None  # as leader
        self._rebalance: asyncio.Task[RebalanceResult] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._auto_commit: asyncio.Task[None] | None = None
        self._metadata_check: asyncio.Task[None] | None = None
        self._member_changed = asyncio.Event()
        self._poll_lock = asyncio.Lock()
        self._hook_error: BaseException | None = None
        self._error: BaseException | None = None  # raised by the next poll()
        now = asyncio.get_running_loop().time()
        self._timers = HeartbeatTimers(
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            max_poll_interval_ms=settings.max_poll_interval_ms,
            retry_backoff_ms=settings.retry_backoff_ms,
            now=now,
        )
        self._next_auto_commit_at = now + settings.auto_commit_interval_ms / 1000
        self._next_metadata_check_at = now + settings.metadata_max_age_ms / 1000
        self.last_error: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._heartbeat_loop(), name=f"heartbeat-{self.member.group_id}"
        )
        self._heartbeat.add_done_callback(self._background_done)

    async def close(self) -> None:
        """Commit (auto commit), revoke (hooks), leave the group (not a static member), stop."""
        try:
            if self._subscription is not None:
                await self._leave("the consumer is closing")
            elif self._settings.enable_auto_commit:
                await self._commit_quietly(self._host.consumed_offsets())
        finally:
            await self._stop_tasks()
            await self._link.close()

    async def _stop_tasks(self) -> None:
        tasks = [*self._tasks, *(t for t in (self._heartbeat, self._rebalance) if t is not None)]
        self._rebalance = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    # -- health -----------------------------------------------------------------------------
    @property
    def state(self) -> MemberState:
        return self.member.state

    @property
    def subscription(self) -> frozenset[str]:
        return frozenset() if self._subscription is None else self._subscription.topics

    @property
    def subscribed(self) -> bool:
        return self._subscription is not None

    # -- subscription -----------------------------------------------------------------------
    def subscribe(self, subscription: TopicSubscription, listener: RebalanceListener) -> None:
        """Take `subscription` from the next `poll()` on (which joins, or rejoins)."""
        self._subscription = subscription
        self._pattern_evaluated = subscription.pattern is None
        self._listener = listener
        self.member.request_rejoin(f"subscribed to {subscription!r}")
        self._host.wake()

    async def unsubscribe(self) -> None:
        """Commit, revoke, leave; the consumer reads nothing until it subscribes or assigns."""
        async with self._poll_lock:
            await self._leave("the consumer unsubscribed")
        self._subscription = None

    # -- the application's poll ----------------------------------------------------------------
    def poll_started(self) -> None:
        self._timers.poll_started(asyncio.get_running_loop().time())

    def poll_ended(self) -> None:
        self._timers.poll_ended(asyncio.get_running_loop().time())

    async def poll(self) -> None:
        """Bring the membership forward; called by every `getmany()` (see the module doc)."""
        async with self._poll_lock:
            error, self._error = self._error, None
            if error is not None:
                raise error
            if self._lost:
                lost, self._lost = self._lost, frozenset()
                await self._hook(self._listener.on_partitions_lost, lost)
            if self._rebalance is not None and self._rebalance.done():
                task, self._rebalance = self._rebalance, None
                await self._complete_rebalance(task)
            if self._subscription is not None:
                await self._check_metadata_if_due()
                if self.member.rejoin_needed and self._rebalance is None:
                    await self._prepare_rejoin()
                    self._start_rebalance()
            self._auto_commit_if_due()
            hook_error, self._hook_error = self._hook_error, None
            if hook_error is not None:
                raise hook_error

    def until_next_poll_s(self) -> float:
        """How soon `poll()` has work that no event will announce (auto commit, metadata)."""
        now = asyncio.get_running_loop().time()
        due = [self._next_auto_commit_at] if self._settings.enable_auto_commit else []
        if self._subscription is not None:
            due.append(self._next_metadata_check_at)
        return max(0.0, min(due) - now) if due else float("inf")

    async def _hook(
        self,
        hook: Callable[[frozenset[TopicPartition]], Awaitable[None]],
        partitions: frozenset[TopicPartition],
    ) -> None:
        # As the Java client: a failing hook does not stop the assignment from changing; its
        # error is raised once poll() is done.
        try:
            await hook(partitions)
        except Exception as error:
            logger.exception("group %s: %s failed", self.member.group_id, hook.__name__)
            if self._hook_error is None:
                self._hook_error = error

    async def _prepare_rejoin(self) -> None:
        """Kafka's onJoinPrepare: commit, then revoke what the protocol says."""
        owned = self._host.assignment()
        if not owned:
            return
        if self._settings.enable_auto_commit:
            await self._commit_quietly(self._host.consumed_offsets())
        topics = self.subscription
        if self.protocol is RebalanceProtocol.EAGER:
            revoked = owned
        else:
            revoked = frozenset(tp for tp in owned if tp.topic not in topics)
        if revoked:
            await self._hook(self._listener.on_partitions_revoked, revoked)
            self._host.assign_from_group(self._host.assignment() - revoked)

    def _start_rebalance(self) -> None:
        reason = self.member.rejoin_reason or "rejoin"
        task = asyncio.get_running_loop().create_task(
            self._rebalancer.run(reason), name=f"rebalance-{self.member.group_id}"
        )
        task.add_done_callback(lambda _task: self._host.wake())
        self._rebalance = task

    async def _complete_rebalance(self, task: asyncio.Task[RebalanceResult]) -> None:
        """Kafka's onJoinComplete: apply the new generation's assignment."""
        try:
            result = task.result()
        except Exception:
            self.member.request_rejoin("the last rebalance failed")
            raise
        member = self.member
        if member.state is not MemberState.STABLE or member.generation != result.generation:
            member.request_rejoin("the generation was reset before its assignment was applied")
            return
        assigned = frozenset(result.assignment.partitions)
        topics = self.subscription
        unsubscribed = sorted(tp for tp in assigned if tp.topic not in topics)
        if unsubscribed:
            # The subscription changed while joining: the leader assigned the old one.
            member.request_rejoin(f"assigned {unsubscribed}, no longer subscribed")
            assigned -= frozenset(unsubscribed)
        owned = self._host.assignment()
        if self.protocol is RebalanceProtocol.COOPERATIVE:
            revoked = owned - assigned
            if revoked:
                if self._settings.enable_auto_commit:
                    await self._commit_quietly(
                        {tp: o for tp, o in self._host.consumed_offsets().items() if tp in revoked}
                    )
                await self._hook(self._listener.on_partitions_revoked, revoked)
                # KIP-429: the partitions are free only once this member rejoins without them.
                member.request_rejoin(f"revoked {sorted(revoked)}")
        self._metadata_snapshot = result.metadata_snapshot
        self._host.assign_from_group(assigned)
        now = asyncio.get_running_loop().time()
        self._next_auto_commit_at = now + self._settings.auto_commit_interval_ms / 1000
        await self._hook(self._listener.on_partitions_assigned, assigned - owned)

    # -- metadata: pattern subscriptions and the leader's snapshot ---------------------------
    async def _check_metadata_if_due(self) -> None:
        now = asyncio.get_running_loop().time()
        if not self._pattern_evaluated:
            # The first join waits for the pattern's topics.
            await self._check_metadata()
        elif now >= self._next_metadata_check_at:
            self._next_metadata_check_at = now + self._settings.metadata_max_age_ms / 1000
            if self._metadata_check is None or self._metadata_check.done():
                self._metadata_check = self._spawn(self._check_metadata())

    async def _check_metadata(self) -> None:
        """Re-evaluate a pattern against the cluster's topics; as leader, compare the partition
        counts assigned from with today's. Either change makes the member rejoin."""
        subscription = self._subscription
        try:
            if subscription is not None and subscription.pattern is not None:
                topics = await self._all_topics()
                self._pattern_evaluated = True
                if subscription.match(topics):
                    self.member.request_rejoin(f"the pattern now matches {subscription!r}")
            snapshot = self._metadata_snapshot
            if snapshot:
                cluster = await self._pool.refresh(snapshot)
                changed = sorted(t for t, n in snapshot.items() if cluster.partition_count(t) != n)
                if changed:
                    self._metadata_snapshot = None
                    self.member.request_rejoin(f"partitions of {changed} changed")
        except (OSError, TimeoutError, KafkaError) as error:
            self.last_error = error
            logger.info("group %s: metadata check failed: %r", self.member.group_id, error)
        if self.member.rejoin_needed:
            self._host.wake()

    async def _all_topics(self) -> list[str]:
        """Every topic of the cluster (a Metadata request for all topics, folded into the
        client's cluster state)."""
        connection = await self._pool.any_connection()
        response = await connection.call(
            m.MetadataRequest(topics=None, allow_auto_topic_creation=False),
            m.MetadataResponse,
            timeout_ms=self._settings.request_timeout_ms,
        )
        self._pool.cluster.update(response)
        return [t.name for t in response.topics if t.name and t.error_code == ErrorCode.NONE]

    # -- RebalanceHost (called by the rebalance task) ------------------------------------------
    def subscribed_topics(self) -> frozenset[str]:
        return self.subscription

    def owned_partitions(self) -> frozenset[TopicPartition]:
        return self._host.assignment()

    def generation_lost(self, reason: str, *, keep_member_id: bool) -> None:
        """The member is out of its generation: its partitions are taken away now (other
        members may own them already) and announced lost at the next poll."""
        logger.info("group %s: generation lost: %s", self.member.group_id, reason)
        self.member.reset(reason, keep_member_id=keep_member_id)
        owned = self._host.assignment()
        if owned:
            self._lost |= owned
            self._host.assign_from_group(frozenset())
        self._member_changed.set()
        self._host.wake()

    def member_changed(self) -> None:
        if self.member.state is MemberState.SYNCING:
            self._timers.reset(asyncio.get_running_loop().time())
        self._member_changed.set()

    # -- heartbeats ------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._member_changed.clear()
            now = loop.time()
            if not self.member.heartbeating:
                await self._member_changed.wait()
                continue
            if self._timers.poll_expired(now):
                await self._leave_on_poll_timeout()
                continue
            if self._timers.session_expired(now):
                self._link.mark_unknown("no heartbeat answered for session_timeout_ms")
                self._timers.received(now)  # once per session: give the lookup its time
            wait_s = self._timers.until_next_heartbeat_s(now)
            poll_left_s = self._timers.until_poll_expiry_s(now)
            if poll_left_s is not None:
                wait_s = min(wait_s, max(0.0, poll_left_s) + 0.001)
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._member_changed.wait()
                continue
            self._timers.sent(now)
            await self._send_heartbeat()

    async def _send_heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        member = self.member
        generation = member.generation
        request = m.HeartbeatRequest(
            group_id=member.group_id,
            generation_id=generation.generation_id,
            member_id=generation.member_id,
            group_instance_id=member.group_instance_id,
        )
        try:
            # The lookup of a lost coordinator is awaited here too; bounded, so the loop keeps
            # watching the poll interval.
            async with asyncio.timeout(self._settings.request_timeout_ms / 1000):
                response = await self._link.call(
                    request, m.HeartbeatResponse, timeout_ms=self._settings.request_timeout_ms
                )
        except (OSError, TimeoutError, RetriableError) as error:
            self.last_error = error
            self._timers.failed(loop.time())
            return
        code = ErrorCode(response.error_code)
        now = loop.time()
        if code == ErrorCode.NONE:
            self._timers.received(now)
        elif code == ErrorCode.REBALANCE_IN_PROGRESS:
            self._timers.received(now)  # still a member, until the rebalance timeout
            if member.state is MemberState.STABLE and not member.rejoin_needed:
                member.request_rejoin("the group is rebalancing")
                self._host.wake()
        elif code in _FENCED_CODES:
            self._timers.failed(now)
            if member.generation == generation:
                self.generation_lost(
                    f"Heartbeat: {code.name}", keep_member_id=code == ErrorCode.ILLEGAL_GENERATION
                )
                if code == ErrorCode.FENCED_INSTANCE_ID:
                    self._error = error_for(code, f"group.instance.id {member.group_instance_id}")
        elif code in COORDINATOR_MOVED_CODES:
            self._link.mark_unknown(f"Heartbeat: {code.name}")
            self._timers.failed(now)
        else:
            self._timers.failed(now)
            self.last_error = error_for(code, "Heartbeat")
            logger.warning("group %s: heartbeat failed: %s", member.group_id, code.name)

    async def _leave_on_poll_timeout(self) -> None:
        reason = (
            f"getmany() was not called for max_poll_interval_ms "
            f"({self._settings.max_poll_interval_ms} ms): leaving the group"
        )
        logger.warning("group %s: %s", self.member.group_id, reason)
        generation = self.member.generation
        await self._cancel_rebalance()
        self.generation_lost(reason, keep_member_id=False)
        await self._send_leave(generation, reason)

    # -- leaving -----------------------------------------------------------------------------
    async def _leave(self, reason: str) -> None:
        """Commit (auto commit) and revoke while still a member, then LeaveGroup."""
        await self._cancel_rebalance()
        owned = self._host.assignment()
        if self.member.state is MemberState.STABLE and owned:
            if self._settings.enable_auto_commit:
                await self._commit_quietly(self._host.consumed_offsets())
            await self._hook(self._listener.on_partitions_revoked, owned)
        elif owned:
            await self._hook(self._listener.on_partitions_lost, owned)
        if self._lost:
            lost, self._lost = self._lost, frozenset()
            await self._hook(self._listener.on_partitions_lost, lost)
        self._host.assign_from_group(frozenset())
        generation = self.member.generation
        self.member.reset(None)
        self._member_changed.set()
        await self._send_leave(generation, reason)
        hook_error, self._hook_error = self._hook_error, None
        if hook_error is not None:
            raise hook_error

    async def _send_leave(self, generation: Generation, reason: str) -> None:
        """LeaveGroup for a dynamic member that has a member id (a static member's place is
        kept until its session times out, as Kafka does). Failures are logged, not raised: the
        session timeout removes the member anyway."""
        if self.member.static or not generation.member_id or not self._link.known:
            return
        request = m.LeaveGroupRequest(
            group_id=self.member.group_id,
            member_id=generation.member_id,
            members=[m.LeaveGroupRequest.MemberIdentity(generation.member_id, None, reason)],
        )
        try:
            async with asyncio.timeout(self._settings.request_timeout_ms / 1000):
                response = await self._link.call(
                    request, m.LeaveGroupResponse, timeout_ms=self._settings.request_timeout_ms
                )
        except (OSError, TimeoutError, RetriableError) as error:
            logger.info("group %s: LeaveGroup failed: %r", self.member.group_id, error)
            return
        codes = [response.error_code, *(member.error_code for member in response.members)]
        failed = [ErrorCode(code).name for code in codes if code != ErrorCode.NONE]
        if failed:
            logger.info("group %s: LeaveGroup answered %s", self.member.group_id, failed)

    async def _cancel_rebalance(self) -> None:
        task, self._rebalance = self._rebalance, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(BaseException):
            await task

    # -- commits -----------------------------------------------------------------------------
    def _auto_commit_if_due(self) -> None:
        if not self._settings.enable_auto_commit:
            return
        now = asyncio.get_running_loop().time()
        if now < self._next_auto_commit_at:
            return
        self._next_auto_commit_at = now + self._settings.auto_commit_interval_ms / 1000
        in_flight = self._auto_commit is not None and not self._auto_commit.done()
        if in_flight or (self.subscribed and self.member.state is not MemberState.STABLE):
            return
        offsets = self._host.consumed_offsets()
        if offsets:
            self._auto_commit = self._spawn(self._commit_quietly(offsets))

    async def _commit_quietly(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """An automatic commit: its failure is logged (and kept in `last_error`), not raised."""
        if not offsets:
            return
        try:
            await self.commit(offsets)
        except (KafkaError, OSError, TimeoutError) as error:
            self.last_error = error
            logger.warning("group %s: auto commit failed: %r", self.member.group_id, error)

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit `offsets` for the group, retrying while the coordinator moves or loads, up to
        `default_api_timeout_ms`. Raises GroupError when the member's generation is no longer
        the group's (its partitions may belong to others now), or a per-partition error."""
        if not offsets:
            return
        generation = self._commit_generation()
        request = commit_request(
            self.member.group_id,
            generation,
            self.member.group_instance_id if self.subscribed else None,
            offsets,
        )
        response = await self._call_with_retries(
            request, m.OffsetCommitResponse, "OffsetCommit", lambda r: commit_errors(r).values()
        )
        errors = commit_errors(response)
        if not errors:
            return
        code = next(iter(errors.values()))
        failed = ", ".join(f"{tp.topic}-{tp.partition}: {c.name}" for tp, c in errors.items())
        if code in _FENCED_CODES and self.member.generation == generation and self.subscribed:
            self.generation_lost(
                f"OffsetCommit: {code.name}", keep_member_id=code == ErrorCode.ILLEGAL_GENERATION
            )
        elif code == ErrorCode.REBALANCE_IN_PROGRESS:
            self.member.request_rejoin("OffsetCommit: REBALANCE_IN_PROGRESS")
            self._host.wake()
        raise error_for(code, f"commit for group {self.member.group_id} failed ({failed})")

    def _commit_generation(self) -> Generation:
        if not self.subscribed:
            return NO_GENERATION_YET  # a simple commit: partitions assigned by hand
        state = self.member.state
        if state is MemberState.STABLE:
            return self.member.generation
        if state in (MemberState.JOINING, MemberState.SYNCING):
            raise error_for(
                ErrorCode.REBALANCE_IN_PROGRESS,
                f"group {self.member.group_id} is rebalancing: commit after the next getmany()",
            )
        raise error_for(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"the consumer is not a member of group {self.member.group_id} (it left, or was "
            "removed): its partitions may belong to others now",
        )

    async def committed(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offsets of `partitions` (None: nothing committed)."""
        wanted = frozenset(partitions)
        if not wanted:
            return {}
        group_id = self.member.group_id
        request = fetch_request(
            group_id, wanted, require_stable=self._settings.isolation_level == "read_committed"
        )

        def codes(response: m.OffsetFetchResponse) -> list[ErrorCode]:
            result = fetch_result(response, group_id)
            return [result.error, *result.errors.values()]

        response = await self._call_with_retries(
            request, m.OffsetFetchResponse, "OffsetFetch", codes
        )
        result = fetch_result(response, group_id)
        if result.error != ErrorCode.NONE:
            raise error_for(result.error, f"OffsetFetch for group {group_id}")
        if result.errors:
            code = next(iter(result.errors.values()))
            raise error_for(code, f"OffsetFetch {sorted(result.errors)}")
        return {tp: result.offsets.get(tp) for tp in wanted}

    async def _call_with_retries(
        self,
        request: m.OffsetCommitRequest | m.OffsetFetchRequest,
        response_type: type[ResponseT],
        api: str,
        codes: Callable[[ResponseT], Iterable[ErrorCode]],
    ) -> ResponseT:
        """`request` to the coordinator until answered without a retriable error (`codes` reads
        the answer's): the coordinator moving or loading, a lost connection. Up to
        default_api_timeout_ms."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settings.default_api_timeout_ms / 1000
        failures = 0
        while True:
            last: BaseException
            try:
                async with asyncio.timeout_at(deadline):
                    response = await self._link.call(
                        request, response_type, timeout_ms=self._settings.request_timeout_ms
                    )
                retry = next((code for code in codes(response) if code in _RETRY_CODES), None)
                if retry is None:
                    return response
                if retry in COORDINATOR_MOVED_CODES:
                    self._link.mark_unknown(f"{api}: {retry.name}")
                last = error_for(retry, api)
            except (OSError, TimeoutError, RetriableError) as error:
                last = error
            failures += 1
            wait_s = (
                backoff_ms(
                    failures, self._settings.retry_backoff_ms, self._settings.retry_backoff_max_ms
                )
                / 1000
            )
            if loop.time() + wait_s > deadline:
                raise KafkaTimeoutError(
                    f"{api} for group {self.member.group_id} not done within "
                    f"default_api_timeout_ms ({self._settings.default_api_timeout_ms} ms)"
                ) from last
            await asyncio.sleep(wait_s)

    # -- tasks -------------------------------------------------------------------------------
    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        logger.error("group %s: background task failed: %r", self.member.group_id, error)
        self.last_error = error
        self._error = error
        self._host.wake()
