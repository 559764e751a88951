"""The asyncio consumer: assigned partitions, fetched from every leader at once.

    async with Consumer(bootstrap_servers="127.0.0.1:9092") as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        await consumer.seek_to_beginning()
        batches = await consumer.getmany(max_records=10_000, timeout_ms=1000)
        async for record in consumer: ...

Design. Positions live in `Positions` (positions.py, no I/O); fetched data is decoded lazily
by `PartitionFetch` (fetcher.py, no I/O). This module is the I/O around them:

- one background task, the *driver*, wakes on any change (assign, seek, data taken, a fetch
  answered) and starts what is missing: a metadata refresh when a leader is unknown, offset
  lookups for partitions awaiting a reset, and a Fetch for each leader broker that has
  fetchable partitions and no Fetch in flight. So brokers are fetched concurrently, one Fetch
  each, and the next Fetch of a partition is in flight while the application works through the
  last one (positions.PREFETCHED_FETCHES_MAX bounds what is buffered);
- `getmany` only takes from buffered fetches, and waits for the driver when there is nothing.

Every answer is applied only if the partition's `generation` is the one the request was sent
at: a seek between the request and its answer wins.

Consumer groups (group/, with a `group_id`): `subscribe()` hands the assignment to the group
(`ConsumerGroup`, group/group.py), which changes it inside `getmany()` (that is where the
rebalance listener's hooks run). A partition the group assigns starts at the group's committed
offset (OffsetFetch, looked up by the driver before any `auto_offset_reset` lookup), unless the
application seeks it first (in `on_partitions_assigned`, say). `commit()` / `committed()` go to
the group's coordinator; with `assign()` they are "simple" commits outside any generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Final, NamedTuple

from riverbed.client.connection import BrokerConnection
from riverbed.client.fetched_records import (
    ISOLATION_READ_COMMITTED,
    PartitionFetch,
)
from riverbed.client.group.consumer_group import ConsumerGroup
from riverbed.client.group.listener import RebalanceListener
from riverbed.client.group.member import NO_GENERATION, MemberState
from riverbed.client.group.offset_requests import OffsetAndMetadata
from riverbed.client.group.subscription import TopicSubscription
from riverbed.client.lifecycle import AsyncClient
from riverbed.client.pool import BrokerPool
from riverbed.client.positions import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchState,
    PartitionPosition,
    Positions,
)
from riverbed.client.settings import ConsumerSettings
from riverbed.client.types import Record, TopicPartition
from riverbed.common.backoff import backoff_ms
from riverbed.errors import (
    ClientClosedError,
    GroupError,
    KafkaError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    RetriableError,
    error_for,
)
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

logger = logging.getLogger(__name__)

FETCH_API_KEY: Final = 1
# Fetch v13 names topics by id instead of by name (KIP-516).
FETCH_TOPIC_IDS_VERSION_MIN: Final = 13
# A consumer is not a replica (Fetch and ListOffsets replica_id).
CONSUMER_REPLICA_ID: Final = -1
# Error codes after which the partition's leader must be looked up again.
_REFRESH_METADATA_CODES: Final = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.INCONSISTENT_TOPIC_ID,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.OFFSET_NOT_AVAILABLE,
    }
)


class ConsumerState(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    CLOSED = "closed"


class OffsetAndTimestamp(NamedTuple):
    """The earliest offset whose timestamp is at or after the one asked for."""

    offset: int
    timestamp_ms: int


class Consumer(AsyncClient):
    """Reads records of assigned or subscribed partitions; an async context manager.

    Settings are keyword arguments named after Kafka's consumer settings with dots as
    underscores (`bootstrap_servers`, `auto_offset_reset`, `isolation_level`,
    `fetch_min_bytes`, `fetch_max_wait_ms`, `fetch_max_bytes`, `max_partition_fetch_bytes`,
    `max_poll_records`, `check_crcs`, `request_timeout_ms`, `retry_backoff_ms`, `client_id`,
    ...; for groups `group_id`, `group_instance_id`, `session_timeout_ms`,
    `heartbeat_interval_ms`, `max_poll_interval_ms`, `partition_assignment_strategy`,
    `enable_auto_commit`, `auto_commit_interval_ms`, `default_api_timeout_ms`); unknown names
    and bad values raise at construction.

    With a `group_id`, `subscribe(topics)` (or `subscribe(pattern=...)`) joins the group at the
    next `getmany()`, and `getmany()` keeps the membership going: call it at least every
    `max_poll_interval_ms`, or the member leaves the group.
    """

    def __init__(self, **settings: object) -> None:
        self.settings: ConsumerSettings = ConsumerSettings.from_kwargs(settings)
        reset = self.settings.auto_offset_reset
        self._positions = Positions(
            {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP}.get(reset)
        )
        self._pool: BrokerPool | None = None
        self._state = ConsumerState.CREATED
        self._driver: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Leader node ids with a Fetch in flight, and when each may be fetched again after an
        # error (loop time).
        self._fetching_nodes: set[int] = set()
        self._node_backoff_until: dict[int, float] = {}
        self._node_failures: dict[int, int] = {}
        self._resetting: set[TopicPartition] = set()
        # Partitions the group assigned whose start is their committed offset, not looked up yet.
        self._committed_lookup: set[TopicPartition] = set()
        self._committed_failures = 0
        self._committed_retry_at = 0.0
        self._group: ConsumerGroup | None = None
        self._pending_subscription: tuple[TopicSubscription, RebalanceListener] | None = None
        self._wakeup = asyncio.Event()
        self._data_ready = asyncio.Event()
        self._next_partition = 0  # round-robin start of getmany
        self.last_error: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect to a bootstrap server and start the fetch driver."""
        if self._state is not ConsumerState.CREATED:
            raise ClientClosedError(f"the consumer is {self._state.value}")
        self._pool = BrokerPool(self.settings, allow_auto_topic_creation=False)
        try:
            await self._pool.any_connection()
        except BaseException:
            await self._pool.close()
            self._state = ConsumerState.CLOSED
            raise
        self._state = ConsumerState.RUNNING
        self._driver = asyncio.get_running_loop().create_task(self._drive(), name="consumer")
        if self.settings.group_id is not None:
            self._group = ConsumerGroup(self.settings, self._pool, _GroupHost(self))
            self._group.start()
            if self._pending_subscription is not None:
                self._group.subscribe(*self._pending_subscription)
                self._pending_subscription = None

    async def close(self) -> None:
        """Leave the group (after the auto commit and the revocation hooks), stop fetching and
        close every connection. Idempotent."""
        if self._state is ConsumerState.CLOSED:
            return
        try:
            if self._group is not None and self._state is ConsumerState.RUNNING:
                await self._group.close()
        finally:
            await self._shut()

    async def _shut(self) -> None:
        self._state = ConsumerState.CLOSED
        tasks = [*self._tasks, *([self._driver] if self._driver else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        if self._pool is not None:
            await self._pool.close()
        self._data_ready.set()  # wake getmany callers: they raise ClientClosedError

    # -- health -----------------------------------------------------------------------------
    @property
    def state(self) -> ConsumerState:
        """CREATED until started, RUNNING, then CLOSED."""
        return self._state

    @property
    def member_state(self) -> MemberState:
        """The member's place in its group: UNJOINED (no subscription, not joined yet, or out
        of the group after leaving or being removed), JOINING / SYNCING (a rebalance is in
        progress), STABLE (it has its generation's assignment)."""
        return MemberState.UNJOINED if self._group is None else self._group.state

    @property
    def member_id(self) -> str | None:
        """The member id the coordinator gave this consumer; None outside a group."""
        if self._group is None or not self._group.member.generation.member_id:
            return None
        return self._group.member.generation.member_id

    @property
    def generation_id(self) -> int:
        """The group generation this consumer belongs to; -1 outside one."""
        return NO_GENERATION if self._group is None else self._group.member.generation.generation_id

    def subscription(self) -> frozenset[str]:
        """The topics subscribed (for a pattern: those it matched at the last metadata check)."""
        if self._group is None:
            pending = self._pending_subscription
            return frozenset() if pending is None else pending[0].topics
        return self._group.subscription

    def partition_state(self, tp: TopicPartition) -> FetchState:
        """AWAITING_RESET (no position yet), FETCHING, or FAILED (see `getmany`)."""
        return self._positions.get(tp).state

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's high watermark from the last fetch, None before one answered."""
        value = self._positions.get(tp).high_watermark
        return None if value < 0 else value

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        """The partition's last stable offset from the latest fetch (None before the first one)."""
        value = self._positions.get(tp).last_stable_offset
        return None if value < 0 else value

    # -- assignment and positions -----------------------------------------------------------
    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions from now on. Partitions already assigned keep their
        position; new ones start at `auto_offset_reset` unless seeked. Not while subscribed."""
        if self._subscribed():
            raise RuntimeError("assign() is not allowed while subscribed: unsubscribe() first")
        self._positions.assign(TopicPartition(tp[0], tp[1]) for tp in partitions)
        self._wake()

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this consumer reads (set by `assign`, or by its group)."""
        return self._positions.assignment()

    # -- consumer groups ------------------------------------------------------------------
    def subscribe(
        self,
        topics: Iterable[str] = (),
        *,
        pattern: str | re.Pattern[str] | None = None,
        listener: RebalanceListener | None = None,
    ) -> None:
        """Read the partitions the group assigns this consumer among `topics`, or among the
        topics whose whole name matches `pattern` (re-evaluated every `metadata_max_age_ms`).
        The group is joined (or rejoined with the new subscription) at the next `getmany()`;
        `listener`'s hooks run inside `getmany()` as the assignment changes."""
        if self.settings.group_id is None:
            raise GroupError(ErrorCode.INVALID_GROUP_ID, "subscribe() needs a group_id")
        if not self._subscribed() and self._positions.assignment():
            raise RuntimeError("subscribe() is not allowed after assign(): assign([]) first")
        if isinstance(topics, str):
            topics = [topics]
        compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
        subscription = TopicSubscription(topics, compiled)
        if self._group is None:
            self._pending_subscription = (subscription, listener or RebalanceListener())
        else:
            self._group.subscribe(subscription, listener or RebalanceListener())

    async def unsubscribe(self) -> None:
        """Commit (auto commit), run the revocation hook and leave the group."""
        self._pending_subscription = None
        if self._group is not None and self._group.subscribed:
            await self._group.unsubscribe()

    async def commit(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None
    ) -> None:
        """Commit `offsets` (the next offset to read, per partition) for the group; by default
        the current position of every assigned partition. Raises GroupError when the commit
        is refused: REBALANCE_IN_PROGRESS during a rebalance (retry after the next getmany()),
        UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION when this consumer's partitions may belong to
        another member now."""
        group = self._require_group("commit()")
        if offsets is None:
            wanted = self._consumed_offsets()
        else:
            wanted = {
                TopicPartition(tp[0], tp[1]): (
                    value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
                )
                for tp, value in offsets.items()
            }
        await group.commit(wanted)

    async def committed(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's committed offset of each partition; None where nothing was committed."""
        group = self._require_group("committed()")
        return await group.committed(TopicPartition(tp[0], tp[1]) for tp in partitions)

    def _subscribed(self) -> bool:
        return self._pending_subscription is not None or (
            self._group is not None and self._group.subscribed
        )

    def _require_group(self, what: str) -> ConsumerGroup:
        if self.settings.group_id is None:
            raise GroupError(ErrorCode.INVALID_GROUP_ID, f"{what} needs a group_id")
        self._check_running()
        if self._group is None:
            raise ClientClosedError("the consumer is not started: use `async with Consumer(...)`")
        return self._group

    def _consumed_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        return {
            tp: OffsetAndMetadata(state.position)
            for tp, state in self._positions.items()
            if state.state is FetchState.FETCHING and state.position >= 0
        }

    def _assign_from_group(self, partitions: frozenset[TopicPartition]) -> None:
        new = partitions - self._positions.assignment()
        self._positions.assign(sorted(partitions))
        self._committed_lookup = (self._committed_lookup & partitions) | new
        self._wake()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read `tp` from `offset` on; drops whatever was fetched from the old position."""
        self._positions.seek(tp, offset)
        self._wake()

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move `partitions` (default: every assigned one) to their log start offset."""
        await self._seek_to(EARLIEST_TIMESTAMP, partitions)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move `partitions` (default: every assigned one) to their end: only records produced
        from now on are read (up to the last stable offset with read_committed)."""
        await self._seek_to(LATEST_TIMESTAMP, partitions)

    async def _seek_to(self, timestamp: int, partitions: tuple[TopicPartition, ...]) -> None:
        targets = list(partitions) or sorted(self._positions.assignment())
        for tp in targets:
            self._positions.request_reset(tp, timestamp)
        await self._reset_positions(targets)

    async def position(self, tp: TopicPartition) -> int:
        """The offset of the next record `getmany` returns for `tp` (looked up if needed)."""
        state = self._positions.get(tp)
        if state.state is FetchState.AWAITING_RESET and tp in self._committed_lookup:
            await self._position_from_committed([tp])
        if state.state is FetchState.AWAITING_RESET:
            await self._reset_positions([tp])
        if state.error is not None:
            raise state.error
        return state.position

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the earliest offset whose timestamp is >= the given one (ms);
        None when no record is that recent."""
        for tp, timestamp in timestamps.items():
            if timestamp < 0:
                raise ValueError(f"{tp}: timestamp must be >= 0, got {timestamp}")
        answers = await self._list_offsets(dict(timestamps))
        return {
            tp: None if offset < 0 else OffsetAndTimestamp(offset, timestamp)
            for tp, (offset, timestamp) in answers.items()
        }

    # -- reading ----------------------------------------------------------------------------
    async def getmany(
        self, *partitions: TopicPartition, max_records: int | None = None, timeout_ms: int = 0
    ) -> dict[TopicPartition, list[Record]]:
        """Records fetched so far, at most `max_records` (default `max_poll_records`), waiting
        up to `timeout_ms` for the first ones. Limited to `partitions` if any are given.

        Raises the error of a partition that cannot be read: OffsetOutOfRangeError when it has
        no valid position and auto_offset_reset is "none", a CorruptRecordError for a batch that
        fails its CRC; the error stays until the partition is seeked.
        """
        limit = self.settings.max_poll_records if max_records is None else max_records
        if limit <= 0:
            raise ValueError(f"max_records must be positive, got {limit}")
        self._check_running()
        group = self._group
        if group is None:
            return await self._getmany(limit, partitions, timeout_ms, None)
        group.poll_started()
        try:
            return await self._getmany(limit, partitions, timeout_ms, group)
        finally:
            group.poll_ended()

    async def _getmany(
        self,
        limit: int,
        partitions: tuple[TopicPartition, ...],
        timeout_ms: int,
        group: ConsumerGroup | None,
    ) -> dict[TopicPartition, list[Record]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            self._check_running()
            self._data_ready.clear()  # before poll(): what it starts may answer while we wait
            if group is not None:
                await group.poll()
            records = self._take(limit, partitions)
            if records:
                return records
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                return {}
            if group is not None:
                remaining_s = min(remaining_s, group.until_next_poll_s())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining_s):
                    await self._data_ready.wait()

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Record]:
        while True:
            batches = await self.getmany(timeout_ms=self.settings.fetch_max_wait_ms)
            for records in batches.values():
                for record in records:
                    yield record

    def _take(
        self, limit: int, only: tuple[TopicPartition, ...]
    ) -> dict[TopicPartition, list[Record]]:
        items = self._positions.items()
        if only:
            wanted = set(only)
            items = [item for item in items if item[0] in wanted]
        if not items:
            return {}
        # Round-robin: each call starts one partition further, so none starves.
        start = self._next_partition % len(items)
        self._next_partition = start + 1
        out: dict[TopicPartition, list[Record]] = {}
        taken = 0
        freed = False
        for tp, state in items[start:] + items[:start]:
            if state.error is not None:
                if out:
                    break  # return what we have; the error comes with the next call
                raise state.error
            while state.buffered and taken < limit:
                fetch = state.buffered[0]
                try:
                    records = fetch.take(limit - taken)
                except KafkaError as error:
                    state.error = error
                    if out:
                        break
                    raise
                state.position = fetch.next_offset
                if records:
                    out.setdefault(tp, []).extend(records)
                    taken += len(records)
                if fetch.exhausted:
                    state.buffered.popleft()
                    freed = True
            if taken >= limit:
                break
        if freed:
            self._wake()
        return out

    # -- the driver -------------------------------------------------------------------------
    def _wake(self) -> None:
        self._wakeup.set()

    def _check_running(self) -> None:
        if self._state is not ConsumerState.RUNNING:
            raise ClientClosedError(f"the consumer is {self._state.value}")

    def _require_pool(self) -> BrokerPool:
        if self._pool is None:
            raise ClientClosedError("the consumer is not started: use `async with Consumer(...)`")
        return self._pool

    async def _drive(self) -> None:
        pool = self._require_pool()
        while True:
            self._wakeup.clear()
            wait_s = self._start_work(pool)
            if wait_s is None:
                await self._wakeup.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._wakeup.wait()

    def _start_work(self, pool: BrokerPool) -> float | None:
        """Start fetches, lookups and refreshes that are due; return how long until a backoff
        ends (None: nothing to wait for but a wakeup)."""
        now = asyncio.get_running_loop().time()
        cluster = pool.cluster
        by_node: dict[int, list[TopicPartition]] = {}
        to_reset: list[TopicPartition] = []
        from_committed: list[TopicPartition] = []
        need_metadata: set[str] = set()
        for tp, state in self._positions.items():
            if state.state is FetchState.AWAITING_RESET:
                if tp in self._resetting:
                    continue
                if tp in self._committed_lookup:
                    from_committed.append(tp)
                else:
                    to_reset.append(tp)
                continue
            if not state.fetchable:
                continue
            leader = cluster.leader_for(tp)
            if leader is None:
                need_metadata.add(tp.topic)
                continue
            by_node.setdefault(leader, []).append(tp)
        if need_metadata or (cluster.stale and by_node):
            self._spawn(self._refresh_metadata(pool, need_metadata))
        if to_reset:
            self._resetting.update(to_reset)
            self._spawn(self._reset_in_background(to_reset))
        wait_s: float | None = None
        if from_committed:
            if self._committed_retry_at > now:
                wait_s = self._committed_retry_at - now
            else:
                self._resetting.update(from_committed)
                self._spawn(self._committed_in_background(from_committed))
        for node, tps in by_node.items():
            if node in self._fetching_nodes:
                continue
            until = self._node_backoff_until.get(node, 0.0)
            if until > now:
                wait_s = min(wait_s or until - now, until - now)
                continue
            self._fetching_nodes.add(node)
            self._spawn(self._fetch(pool, node, tps))
        return wait_s

    def _spawn(self, coroutine: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.last_error = task.exception()
            logger.warning("consumer task failed: %r", task.exception())

    async def _refresh_metadata(self, pool: BrokerPool, topics: set[str]) -> None:
        try:
            await pool.refresh(topics | {tp.topic for tp in self._positions.assignment()})
        except (OSError, TimeoutError, KafkaError) as error:
            self.last_error = error
        finally:
            self._wake()

    # -- fetching ---------------------------------------------------------------------------
    async def _fetch(self, pool: BrokerPool, node: int, tps: list[TopicPartition]) -> None:
        try:
            connection = await pool.connection_for(node)
            request, sent = self._fetch_request(pool, connection, tps)
            response = await connection.call(
                request,
                m.FetchResponse,
                timeout_ms=self.settings.request_timeout_ms + self.settings.fetch_max_wait_ms,
            )
            if response.error_code != ErrorCode.NONE:
                raise error_for(response.error_code, f"Fetch from broker {node}")
            failed = self._apply_fetch(pool, response, sent)
            self._node_failures.pop(node, None)
            if failed:
                self._back_off(node)
        except (OSError, TimeoutError, RetriableError) as error:
            self.last_error = error
            pool.cluster.mark_stale(f"fetch from broker {node} failed: {error}")
            self._back_off(node)
        finally:
            self._fetching_nodes.discard(node)
            self._wake()

    def _back_off(self, node: int) -> None:
        failures = self._node_failures.get(node, 0) + 1
        self._node_failures[node] = failures
        wait_ms = backoff_ms(
            failures, self.settings.retry_backoff_ms, self.settings.retry_backoff_max_ms
        )
        self._node_backoff_until[node] = asyncio.get_running_loop().time() + wait_ms / 1000

    def _fetch_request(
        self, pool: BrokerPool, connection: BrokerConnection, tps: list[TopicPartition]
    ) -> tuple[m.FetchRequest, dict[TopicPartition, tuple[int, int]]]:
        """The Fetch for `tps`, and what it asked: tp -> (fetch offset, generation)."""
        use_ids = connection.version_for(FETCH_API_KEY) >= FETCH_TOPIC_IDS_VERSION_MIN
        topics: dict[str, m.FetchRequest.FetchTopic] = {}
        sent: dict[TopicPartition, tuple[int, int]] = {}
        for tp in tps:
            state = self._positions.get(tp)
            topic_id = pool.cluster.topic_id(tp.topic)
            if use_ids and topic_id is None:
                continue  # not fetchable until metadata names the topic's id
            topic = topics.get(tp.topic)
            if topic is None:
                topic = topics[tp.topic] = m.FetchRequest.FetchTopic(tp.topic)
                if topic_id is not None:
                    topic.topic_id = topic_id
            topic.partitions.append(
                m.FetchRequest.FetchPartition(
                    partition=tp.partition,
                    current_leader_epoch=pool.cluster.leader_epoch(tp),
                    fetch_offset=state.fetch_offset,
                    partition_max_bytes=self.settings.max_partition_fetch_bytes,
                )
            )
            sent[tp] = (state.fetch_offset, state.generation)
        request = m.FetchRequest(
            replica_id=CONSUMER_REPLICA_ID,
            max_wait_ms=self.settings.fetch_max_wait_ms,
            min_bytes=self.settings.fetch_min_bytes,
            max_bytes=self.settings.fetch_max_bytes,
            isolation_level=self.settings.isolation_level_code,
            topics=list(topics.values()),
        )
        return request, sent

    def _apply_fetch(
        self,
        pool: BrokerPool,
        response: m.FetchResponse,
        sent: dict[TopicPartition, tuple[int, int]],
    ) -> bool:
        """Buffer what the response carries; True if some partition needs a retry later."""
        read_committed = self.settings.isolation_level_code == ISOLATION_READ_COMMITTED
        retry = False
        for topic in response.responses:
            name = topic.topic or pool.cluster.topic_name(topic.topic_id) or ""
            for data in topic.partitions:
                tp = TopicPartition(name, data.partition_index)
                asked = sent.get(tp)
                if asked is None:
                    continue
                fetch_offset, generation = asked
                state = self._current(tp, generation)
                if state is None:
                    continue  # seeked or unassigned since: the answer is for an old position
                if data.error_code != ErrorCode.NONE:
                    retry |= self._fetch_error(pool, tp, state, generation, data.error_code)
                    continue
                state.high_watermark = data.high_watermark
                state.last_stable_offset = data.last_stable_offset
                state.log_start_offset = data.log_start_offset
                records = data.records
                if not isinstance(records, bytes | memoryview) or not records:
                    continue
                try:
                    fetch = PartitionFetch(
                        tp,
                        records,
                        fetch_offset,
                        generation,
                        read_committed=read_committed,
                        aborted_transactions=[
                            (a.producer_id, a.first_offset) for a in data.aborted_transactions or ()
                        ],
                        check_crcs=self.settings.check_crcs,
                    )
                except KafkaError as error:
                    state.error = error
                    continue
                if fetch.end_offset > state.fetch_offset:
                    state.fetch_offset = fetch.end_offset
                    state.buffered.append(fetch)
        self._data_ready.set()
        return retry

    def _current(self, tp: TopicPartition, generation: int) -> PartitionPosition | None:
        state = self._positions.find(tp)
        return state if state is not None and state.generation == generation else None

    def _fetch_error(
        self,
        pool: BrokerPool,
        tp: TopicPartition,
        state: PartitionPosition,
        generation: int,
        code: int,
    ) -> bool:
        error = error_for(code, f"Fetch {tp.topic}-{tp.partition} at {state.fetch_offset}")
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            self._positions.out_of_range(tp, generation, error)
            self._data_ready.set()  # a getmany may have to raise it
            return False
        if code in _REFRESH_METADATA_CODES or isinstance(error, RetriableError):
            pool.cluster.mark_stale(f"{tp.topic}-{tp.partition}: {ErrorCode(code).name}")
            return True
        state.error = error
        self._data_ready.set()
        return False

    # -- offset lookups ---------------------------------------------------------------------
    async def _committed_in_background(self, tps: list[TopicPartition]) -> None:
        try:
            await self._position_from_committed(tps)
            self._committed_failures = 0
        except (OSError, TimeoutError, KafkaError) as error:
            self.last_error = error
            self._committed_failures += 1
            wait_ms = backoff_ms(
                self._committed_failures,
                self.settings.retry_backoff_ms,
                self.settings.retry_backoff_max_ms,
            )
            self._committed_retry_at = asyncio.get_running_loop().time() + wait_ms / 1000
        finally:
            self._resetting.difference_update(tps)
            self._wake()

    async def _position_from_committed(self, tps: list[TopicPartition]) -> None:
        """Start group-assigned partitions at their committed offsets; those without one are
        left to auto_offset_reset."""
        group = self._require_group("a committed offset lookup")
        # A lookup scheduled before a rebalance may run after it revoked some of `tps`.
        generations = {
            tp: state.generation for tp in tps if (state := self._positions.find(tp)) is not None
        }
        if not generations:
            return
        committed = await group.committed(list(generations))
        for tp, generation in generations.items():
            state = self._positions.find(tp)
            if state is None:
                continue
            self._committed_lookup.discard(tp)
            offset = committed.get(tp)
            if offset is not None and state.state is FetchState.AWAITING_RESET:
                self._positions.reset_done(tp, generation, offset.offset)

    async def _reset_in_background(self, tps: list[TopicPartition]) -> None:
        try:
            await self._reset_positions(tps)
        except (OSError, TimeoutError, KafkaError) as error:
            self.last_error = error
        finally:
            self._resetting.difference_update(tps)
            self._wake()

    async def _reset_positions(self, tps: list[TopicPartition]) -> None:
        """Look up the offsets of partitions awaiting a reset, by their reset timestamps."""
        lookups: dict[TopicPartition, tuple[int, int]] = {}  # tp -> (timestamp, generation)
        for tp in tps:
            state = self._positions.find(tp)  # None: revoked since the lookup was scheduled
            if state is None or state.state is not FetchState.AWAITING_RESET:
                continue
            if state.reset_timestamp is None:
                self._positions.fail_without_policy(
                    tp,
                    OffsetOutOfRangeError(
                        ErrorCode.OFFSET_OUT_OF_RANGE,
                        f"{tp.topic}-{tp.partition} has no position (nor committed offset) and "
                        'auto_offset_reset is "none": seek it first',
                    ),
                )
                self._data_ready.set()
                continue
            lookups[tp] = (state.reset_timestamp, state.generation)
        if not lookups:
            return
        answers = await self._list_offsets({tp: ts for tp, (ts, _) in lookups.items()})
        for tp, (offset, _) in answers.items():
            self._positions.reset_done(tp, lookups[tp][1], offset)
        self._wake()

    async def _list_offsets(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets for every partition, retried (metadata refreshed, backing off) until
        request_timeout_ms; returns tp -> (offset, timestamp)."""
        pool = self._require_pool()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.request_timeout_ms / 1000
        answers: dict[TopicPartition, tuple[int, int]] = {}
        failures = 0
        last: BaseException | None = None
        while True:
            pending = {tp: ts for tp, ts in timestamps.items() if tp not in answers}
            if not pending:
                return answers
            if loop.time() > deadline:
                raise KafkaTimeoutError(
                    f"no offsets for {sorted(pending)} within {self.settings.request_timeout_ms} ms"
                ) from last
            if failures:
                await asyncio.sleep(
                    backoff_ms(
                        failures,
                        self.settings.retry_backoff_ms,
                        self.settings.retry_backoff_max_ms,
                    )
                    / 1000
                )
            by_leader = await self._group_by_leader(pool, pending)
            results = await asyncio.gather(
                *(self._list_offsets_from(pool, node, group) for node, group in by_leader.items()),
                return_exceptions=True,
            )
            progress = False
            for result in results:
                if isinstance(result, dict):
                    answers.update(result)
                    progress = progress or bool(result)
                elif isinstance(result, OSError | TimeoutError | RetriableError):
                    last = result
                    pool.cluster.mark_stale(f"ListOffsets failed: {result}")
                elif isinstance(result, BaseException):
                    raise result
            if len(answers) < len(timestamps):
                failures += 1
            if progress:
                failures = min(failures, 1)

    async def _group_by_leader(
        self, pool: BrokerPool, timestamps: dict[TopicPartition, int]
    ) -> dict[int, dict[TopicPartition, int]]:
        if pool.cluster.stale or any(pool.cluster.leader_for(tp) is None for tp in timestamps):
            with contextlib.suppress(OSError, TimeoutError):
                await pool.refresh({tp.topic for tp in timestamps})
        grouped: dict[int, dict[TopicPartition, int]] = {}
        for tp, timestamp in timestamps.items():
            leader = pool.cluster.leader_for(tp)
            if leader is not None:
                grouped.setdefault(leader, {})[tp] = timestamp
                continue
            error = pool.partition_error(tp)
            if not isinstance(error, RetriableError):
                raise error  # e.g. TOPIC_AUTHORIZATION_FAILED: no retry will change it
        return grouped

    async def _list_offsets_from(
        self, pool: BrokerPool, node: int, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int]]:
        connection = await pool.connection_for(node)
        topics: dict[str, m.ListOffsetsRequest.ListOffsetsTopic] = {}
        for tp, timestamp in timestamps.items():
            topic = topics.setdefault(tp.topic, m.ListOffsetsRequest.ListOffsetsTopic(tp.topic))
            topic.partitions.append(
                m.ListOffsetsRequest.ListOffsetsPartition(
                    partition_index=tp.partition,
                    current_leader_epoch=pool.cluster.leader_epoch(tp),
                    timestamp=timestamp,
                )
            )
        response = await connection.call(
            m.ListOffsetsRequest(
                replica_id=CONSUMER_REPLICA_ID,
                isolation_level=self.settings.isolation_level_code,
                topics=list(topics.values()),
            ),
            m.ListOffsetsResponse,
            timeout_ms=self.settings.request_timeout_ms,
        )
        answers: dict[TopicPartition, tuple[int, int]] = {}
        retriable: RetriableError | None = None
        for topic_response in response.topics:
            for partition in topic_response.partitions:
                tp = TopicPartition(topic_response.name, partition.partition_index)
                if tp not in timestamps:
                    continue
                if partition.error_code == ErrorCode.NONE:
                    answers[tp] = (partition.offset, partition.timestamp)
                    continue
                error = error_for(partition.error_code, f"ListOffsets {tp.topic}-{tp.partition}")
                if not isinstance(error, RetriableError):
                    raise error
                retriable = error
        if retriable is not None:
            pool.cluster.mark_stale(str(retriable))
        return answers


class _GroupHost:
    """The consumer as its group sees it (group.GroupHost), without widening its public API."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def assignment(self) -> frozenset[TopicPartition]:
        return self._consumer.assignment()

    def assign_from_group(self, partitions: frozenset[TopicPartition]) -> None:
        self._consumer._assign_from_group(partitions)

    def consumed_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        return self._consumer._consumed_offsets()

    def wake(self) -> None:
        self._consumer._data_ready.set()
