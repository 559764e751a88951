"""The asyncio consumer: assigned partitions, fetched from every leader at once.

    async with Consumer(bootstrap_servers="127.0.0.1:9092") as consumer:
        consumer.assign([TopicPartition("orders", 0)])
        await consumer.seek_to_beginning()
        batches = await consumer.getmany(max_records=10_000, timeout_ms=1000)
        async for record in consumer: ...

Design. `Consumer` is the public face; the work is done by parts it composes and owns:

- `Positions` (positions.py, no I/O): every assigned partition's position, a state machine;
- the fetch driver (`FetchDriver`, fetch_driver.py): keeps one Fetch in flight per leader broker
  for the partitions that have a position, prefetching while the application processes, applies
  the answers to the positions and hands their records out, decoded lazily by `PartitionFetch`
  (fetched_records.py);
- the offset resetter (`OffsetResetter`, offset_reset.py): finds positions for partitions that
  have none, from committed offsets or by `auto_offset_reset` (ListOffsets), with retries;
- the group membership (`ConsumerGroup`, group/consumer_group.py), with a `group_id`.

`getmany` only takes records the fetch driver buffered, and waits when there are none. An
assignment or a seek wakes both background parts; each wakes the other through the consumer
(`ConsumerEvents`, consumer_parts.py) when a partition gets or loses its position.

Consumer groups (group/, with a `group_id`): `subscribe()` hands the assignment to the group,
which changes it inside `getmany()` (that is where the rebalance listener's hooks run). A
partition the group assigns starts at the group's committed offset (OffsetFetch, looked up by the
offset resetter before any `auto_offset_reset` lookup), unless the application seeks it first
(in `on_partitions_assigned`, say). `commit()` / `committed()` go to the group's coordinator;
with `assign()` they are "simple" commits outside any generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import NamedTuple, TypeVar

from riverbed.client.fetch_driver import FetchDriver
from riverbed.client.group.consumer_group import ConsumerGroup
from riverbed.client.group.listener import RebalanceListener
from riverbed.client.group.member import NO_GENERATION, MemberState
from riverbed.client.group.subscription import TopicSubscription
from riverbed.client.lifecycle import AsyncClient
from riverbed.client.offset_reset import OffsetResetter, list_offsets
from riverbed.client.pool import BrokerPool
from riverbed.client.positions import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchState,
    Positions,
)
from riverbed.client.settings import ConsumerSettings
from riverbed.client.types import (
    ConsumerGroupMetadata,
    OffsetAndMetadata,
    Record,
    TopicPartition,
)
from riverbed.errors import ClientClosedError, GroupError
from riverbed.protocol.errors import ErrorCode

logger = logging.getLogger(__name__)

T = TypeVar("T")


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
        self._state = ConsumerState.CREATED
        # Made by start(), they all need the connections; close() stops them.
        self._pool: BrokerPool | None = None
        self._fetcher: FetchDriver | None = None
        self._resetter: OffsetResetter | None = None
        self._group: ConsumerGroup | None = None
        self._pending_subscription: tuple[TopicSubscription, RebalanceListener] | None = None
        self._data_ready = asyncio.Event()
        self.last_error: BaseException | None = None

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        """Connect to a bootstrap server and start the fetch driver."""
        if self._state is not ConsumerState.CREATED:
            raise ClientClosedError(f"the consumer is {self._state.value}")
        pool = self._pool = BrokerPool(self.settings, allow_auto_topic_creation=False)
        try:
            await pool.any_connection()
        except BaseException:
            await pool.close()
            self._state = ConsumerState.CLOSED
            raise
        self._state = ConsumerState.RUNNING
        events = _PartEvents(self)
        self._resetter = OffsetResetter(
            self.settings, pool, self._positions, self._committed_for_reset, events
        )
        self._fetcher = FetchDriver(self.settings, pool, self._positions, events)
        self._resetter.start()
        self._fetcher.start()
        if self.settings.group_id is not None:
            self._group = ConsumerGroup(self.settings, pool, _GroupHost(self))
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
        for part in (self._fetcher, self._resetter):
            if part is not None:
                await part.close()
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

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group, generation, member id and group instance id of this consumer, for a
        transactional producer's send_offsets_to_transaction() (KIP-447: the group coordinator
        refuses offsets from a member of an older generation). Read it after the getmany()
        that returned the records the offsets cover."""
        group_id = self.settings.group_id
        if group_id is None:
            raise GroupError(ErrorCode.INVALID_GROUP_ID, "group_metadata() needs a group_id")
        return ConsumerGroupMetadata(
            group_id=group_id,
            generation_id=self.generation_id,
            member_id=self.member_id or "",
            group_instance_id=self.settings.group_instance_id,
        )

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
        self._positions_moved()

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
        return _started(self._group)

    async def _committed_for_reset(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """Where the offset resetter starts group-assigned partitions."""
        return await self._require_group("a committed offset lookup").committed(partitions)

    def _consumed_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        return {
            tp: OffsetAndMetadata(state.position)
            for tp, state in self._positions.items()
            if state.state is FetchState.FETCHING and state.position >= 0
        }

    def _assign_from_group(self, partitions: frozenset[TopicPartition]) -> None:
        new = partitions - self._positions.assignment()
        self._positions.assign(sorted(partitions))
        _started(self._resetter).group_assigned(partitions, new)
        self._positions_moved()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read `tp` from `offset` on; drops whatever was fetched from the old position."""
        self._positions.seek(tp, offset)
        self._positions_moved()

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
        # Looked up before returning, not left to the resetter's loop: the move is done when
        # this returns (position() right after answers the new offset).
        await _started(self._resetter).reset_positions(targets)

    async def position(self, tp: TopicPartition) -> int:
        """The offset of the next record `getmany` returns for `tp` (looked up if needed)."""
        state = self._positions.get(tp)
        if state.state is FetchState.AWAITING_RESET:
            await _started(self._resetter).find_position(tp)
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
        answers = await list_offsets(self.settings, _started(self._pool), dict(timestamps))
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
        fetcher = _started(self._fetcher)
        while True:
            self._check_running()
            self._data_ready.clear()  # before poll(): what it starts may answer while we wait
            if group is not None:
                await group.poll()
            records = fetcher.take(limit, partitions)
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

    # -- internals --------------------------------------------------------------------------
    def _positions_moved(self) -> None:
        """An assignment or a seek: partitions may await a reset, or be fetchable, now."""
        for part in (self._fetcher, self._resetter):
            if part is not None:  # before start() their first pass finds the change
                part.wake()

    def _check_running(self) -> None:
        if self._state is not ConsumerState.RUNNING:
            raise ClientClosedError(f"the consumer is {self._state.value}")


def _started(part: T | None) -> T:
    """A part that `start()` makes; before it, the consumer is not started."""
    if part is None:
        raise ClientClosedError("the consumer is not started: use `async with Consumer(...)`")
    return part


class _PartEvents:
    """The consumer as its fetch driver and offset resetter see it
    (consumer_parts.ConsumerEvents): it passes their news on to the other part or to getmany."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def readable(self) -> None:
        self._consumer._data_ready.set()

    def fetch_due(self) -> None:
        _started(self._consumer._fetcher).wake()

    def reset_due(self) -> None:
        _started(self._consumer._resetter).wake()

    def failed(self, error: BaseException) -> None:
        self._consumer.last_error = error

    def crashed(self, error: BaseException) -> None:
        self._consumer.last_error = error
        logger.warning("consumer task failed: %r", error)


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
