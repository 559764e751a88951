"""The consumer's offset resetter: positions for the partitions that have none.

A partition awaits a reset (positions.FetchState.AWAITING_RESET) once assigned, after
`seek_to_beginning/end`, and after OFFSET_OUT_OF_RANGE under an `auto_offset_reset` policy. The
resetter's `WakeupLoop` (consumer_parts.py), woken by any of those, finds its position in the
background:

- a partition the group assigned starts at the group's committed offset (OffsetFetch through the
  consumer's group), looked up before anything else; the partitions waiting for one are looked
  up together and, after a failed lookup, again after a backoff (retry_backoff_ms doubling up to
  retry_backoff_max_ms);
- any other partition, or one with nothing committed, starts at its reset timestamp (earliest
  or latest): ListOffsets to each partition's leader (`list_offsets`: retried, with the metadata
  refreshed and backing off, until request_timeout_ms). A partition without a policy
  (`auto_offset_reset="none"`) fails instead, and `getmany` raises OffsetOutOfRangeError until
  the application seeks it.

`Consumer.position()` and `seek_to_beginning/end` find positions the same way in the foreground
(`find_position`, `reset_positions`). An answer is applied only if the partition's `generation`
is the one it was asked at: a seek in between wins.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping

from riverbed.client.consumer_parts import CONSUMER_REPLICA_ID, ConsumerEvents, WakeupLoop
from riverbed.client.pool import BrokerPool
from riverbed.client.positions import FetchState, Positions
from riverbed.client.settings import ConsumerSettings
from riverbed.client.types import OffsetAndMetadata, TopicPartition
from riverbed.common.backoff import backoff_ms
from riverbed.errors import (
    KafkaError,
    KafkaTimeoutError,
    OffsetOutOfRangeError,
    RetriableError,
    error_for,
)
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

# The group's committed offsets of some partitions (None: nothing committed).
CommittedOffsets = Callable[
    [list[TopicPartition]], Awaitable[Mapping[TopicPartition, OffsetAndMetadata | None]]
]


class OffsetResetter:
    """Finds positions for the consumer's partitions awaiting a reset.

    Owns its loop and its lookup tasks; `close()` stops them all.
    """

    def __init__(
        self,
        settings: ConsumerSettings,
        pool: BrokerPool,
        positions: Positions,
        committed_offsets: CommittedOffsets,
        events: ConsumerEvents,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._positions = positions
        self._committed_offsets = committed_offsets
        self._events = events
        self._wakeup_loop = WakeupLoop(
            "riverbed-consumer-offset-reset", self._start_due, events.crashed
        )
        # Partitions a background lookup is finding a position for.
        self._looking_up: set[TopicPartition] = set()
        # Partitions the group assigned whose start is their committed offset, not looked up yet.
        self._awaiting_committed: set[TopicPartition] = set()
        self._committed_failures = 0
        self._committed_retry_at = 0.0

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._wakeup_loop.start()

    def wake(self) -> None:
        """Look for partitions awaiting a reset again (an assignment, a seek, out of range)."""
        self._wakeup_loop.wake()

    async def close(self) -> None:
        """Cancel the loop and the lookups in flight; wait for them."""
        await self._wakeup_loop.stop()

    # -- what the consumer asks -------------------------------------------------------------
    def group_assigned(
        self, assigned: frozenset[TopicPartition], new: frozenset[TopicPartition]
    ) -> None:
        """The group's assignment is `assigned` now: the `new` partitions start at their
        committed offsets (unless the application seeks them first)."""
        self._awaiting_committed = (self._awaiting_committed & assigned) | new

    async def find_position(self, tp: TopicPartition) -> None:
        """Position `tp`, which awaits a reset, now: at its committed offset if it waits for
        one and the group has one, else by its reset timestamp."""
        if tp in self._awaiting_committed:
            await self._position_from_committed([tp])
        state = self._positions.find(tp)
        if state is not None and state.state is FetchState.AWAITING_RESET:
            await self.reset_positions([tp])

    async def reset_positions(self, tps: list[TopicPartition]) -> None:
        """Look up the offsets of those of `tps` awaiting a reset, by their reset timestamps."""
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
                self._events.readable()  # getmany raises it
                continue
            lookups[tp] = (state.reset_timestamp, state.generation)
        if not lookups:
            return
        answers = await list_offsets(
            self._settings, self._pool, {tp: ts for tp, (ts, _) in lookups.items()}
        )
        positioned = False
        for tp, (offset, _) in answers.items():
            positioned |= self._positions.reset_done(tp, lookups[tp][1], offset)
        if positioned:
            self._events.fetch_due()

    # -- the loop's pass --------------------------------------------------------------------
    def _start_due(self) -> float | None:
        """Start the lookups that are due; return how long until the committed offsets' retry
        backoff ends (None: nothing to wait for but a wakeup)."""
        to_reset: list[TopicPartition] = []
        from_committed: list[TopicPartition] = []
        for tp, state in self._positions.items():
            if state.state is not FetchState.AWAITING_RESET or tp in self._looking_up:
                continue
            if tp in self._awaiting_committed:
                from_committed.append(tp)
            else:
                to_reset.append(tp)
        if to_reset:
            self._looking_up.update(to_reset)
            self._wakeup_loop.spawn(self._reset_in_background(to_reset))
        if not from_committed:
            return None
        wait_s = self._committed_retry_at - asyncio.get_running_loop().time()
        if wait_s > 0:
            return wait_s
        self._looking_up.update(from_committed)
        self._wakeup_loop.spawn(self._committed_in_background(from_committed))
        return None

    async def _reset_in_background(self, tps: list[TopicPartition]) -> None:
        try:
            await self.reset_positions(tps)
        except (OSError, TimeoutError, KafkaError) as error:
            # The partitions still await their reset: the pass this finally asks for retries.
            self._events.failed(error)
        finally:
            self._looking_up.difference_update(tps)
            self.wake()

    async def _committed_in_background(self, tps: list[TopicPartition]) -> None:
        try:
            await self._position_from_committed(tps)
            self._committed_failures = 0
        except (OSError, TimeoutError, KafkaError) as error:
            self._events.failed(error)
            self._committed_failures += 1
            wait_ms = backoff_ms(
                self._committed_failures,
                self._settings.retry_backoff_ms,
                self._settings.retry_backoff_max_ms,
            )
            self._committed_retry_at = asyncio.get_running_loop().time() + wait_ms / 1000
        finally:
            self._looking_up.difference_update(tps)
            self.wake()

    async def _position_from_committed(self, tps: list[TopicPartition]) -> None:
        """Start group-assigned partitions at their committed offsets; those without one are
        left to their reset timestamp."""
        # A lookup scheduled before a rebalance may run after it revoked some of `tps`.
        generations = {
            tp: state.generation for tp in tps if (state := self._positions.find(tp)) is not None
        }
        if not generations:
            return
        committed = await self._committed_offsets(list(generations))
        positioned = False
        for tp, generation in generations.items():
            state = self._positions.find(tp)
            if state is None:
                continue
            self._awaiting_committed.discard(tp)
            offset = committed.get(tp)
            if offset is not None and state.state is FetchState.AWAITING_RESET:
                positioned |= self._positions.reset_done(tp, generation, offset.offset)
        if positioned:
            self._events.fetch_due()


async def list_offsets(
    settings: ConsumerSettings, pool: BrokerPool, timestamps: dict[TopicPartition, int]
) -> dict[TopicPartition, tuple[int, int]]:
    """ListOffsets for every partition, retried (metadata refreshed, backing off) until
    request_timeout_ms; returns tp -> (offset, timestamp)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.request_timeout_ms / 1000
    answers: dict[TopicPartition, tuple[int, int]] = {}
    failures = 0
    last: BaseException | None = None
    while True:
        pending = {tp: ts for tp, ts in timestamps.items() if tp not in answers}
        if not pending:
            return answers
        if loop.time() > deadline:
            raise KafkaTimeoutError(
                f"no offsets for {sorted(pending)} within {settings.request_timeout_ms} ms"
            ) from last
        if failures:
            await asyncio.sleep(
                backoff_ms(failures, settings.retry_backoff_ms, settings.retry_backoff_max_ms)
                / 1000
            )
        by_leader = await _by_leader(pool, pending)
        results = await asyncio.gather(
            *(_list_offsets_from(settings, pool, node, group) for node, group in by_leader.items()),
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
            # Some leader answered: the rest are retried after the shortest backoff.
            failures = min(failures, 1)


async def _by_leader(
    pool: BrokerPool, timestamps: dict[TopicPartition, int]
) -> dict[int, dict[TopicPartition, int]]:
    """`timestamps` grouped by the partitions' leaders (refreshed first if one is unknown);
    partitions without a leader for now are left for the next round."""
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
    settings: ConsumerSettings,
    pool: BrokerPool,
    node: int,
    timestamps: dict[TopicPartition, int],
) -> dict[TopicPartition, tuple[int, int]]:
    """One ListOffsets to broker `node`; partitions answered with a retriable error are left
    out (and the metadata marked stale), any other error is raised."""
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
            isolation_level=settings.isolation_level_code,
            topics=list(topics.values()),
        ),
        m.ListOffsetsResponse,
        timeout_ms=settings.request_timeout_ms,
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
