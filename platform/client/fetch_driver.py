"""The consumer's fetch driver: one Fetch in flight per leader broker, answers into positions.

The driver's `WakeupLoop` (consumer_parts.py) is woken by an assignment or a seek, by a
partition getting its position from the offset resetter, by `take` making room in a partition's
buffer and by every Fetch answered. Each pass starts what is missing: a metadata refresh when a
fetchable partition's leader is unknown (or the metadata is stale), and a Fetch for each leader
broker that has fetchable partitions and no Fetch in flight, unless that broker is backing off
after a failure. So brokers are fetched concurrently, one Fetch each, and the next Fetch of a
partition is in flight while the application works through the last one
(positions.PREFETCHED_FETCHES_MAX bounds what is buffered).

An answer is applied only if the partition's `generation` is the one the Fetch was sent at: a
seek between the request and its answer wins. A partition's records stay in the response frame
as a `PartitionFetch` (fetched_records.py), decoded a batch at a time as `take` hands them to
`getmany`. Partition errors: OFFSET_OUT_OF_RANGE resets the partition by `auto_offset_reset` (the
offset resetter finds its new position) or fails it; an error a new leader or fresh metadata can
fix marks the metadata stale and backs the broker off; any other error stays with the partition
(`getmany` raises it) until it is seeked.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Final

from riverbed.client.connection import BrokerConnection
from riverbed.client.consumer_parts import CONSUMER_REPLICA_ID, ConsumerEvents, WakeupLoop
from riverbed.client.fetch_session import FetchSessionHandler
from riverbed.client.fetched_records import ISOLATION_READ_COMMITTED, PartitionFetch
from riverbed.client.pool import BrokerPool
from riverbed.client.positions import PartitionPosition, Positions
from riverbed.client.settings import ConsumerSettings
from riverbed.client.types import Record, TopicPartition
from riverbed.common.backoff import backoff_ms
from riverbed.errors import KafkaError, RetriableError, error_for
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.fetch_session_ids import SESSION_ERRORS

FETCH_API_KEY: Final = 1
# Fetch v13 names topics by id instead of by name (KIP-516).
FETCH_TOPIC_IDS_VERSION_MIN: Final = 13
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

ZERO_UUID: Final = uuid.UUID(int=0)
# What a Fetch asked for each partition: tp -> (fetch offset, generation).
SentFetch = dict[TopicPartition, tuple[int, int]]


class FetchDriver:
    """Fetches the consumer's positioned partitions and hands their records to `getmany`.

    Owns its loop, its Fetch tasks and its metadata refresh; `close()` stops them all.
    """

    def __init__(
        self,
        settings: ConsumerSettings,
        pool: BrokerPool,
        positions: Positions,
        events: ConsumerEvents,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._positions = positions
        self._events = events
        self._wakeup_loop = WakeupLoop("riverbed-consumer-fetch", self._start_due, events.crashed)
        # Leader node ids with a Fetch in flight, and when each may be fetched again after an
        # error (loop time).
        self._fetching_nodes: set[int] = set()
        self._node_backoff_until: dict[int, float] = {}
        self._node_failures: dict[int, int] = {}
        # One refresh at a time: the pool merges concurrent ones anyway, and a pass per answer
        # while a leader is unknown would otherwise pile up tasks waiting on the same refresh.
        self._refreshing = False
        self._next_partition = 0  # round-robin start of take
        # One fetch session (KIP-227) per broker connection: a new connection starts another.
        self._sessions: dict[int, tuple[BrokerConnection, FetchSessionHandler]] = {}

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        self._wakeup_loop.start()

    def wake(self) -> None:
        """Look for partitions to fetch again (an assignment, a seek, a position found)."""
        self._wakeup_loop.wake()

    async def close(self) -> None:
        """Cancel the loop, the Fetches in flight and the metadata refresh; wait for them."""
        await self._wakeup_loop.stop()

    @property
    def fetching_nodes(self) -> frozenset[int]:
        """The leader node ids this consumer has a Fetch in flight to."""
        return frozenset(self._fetching_nodes)

    # -- handing records out ----------------------------------------------------------------
    def take(
        self, limit: int, only: tuple[TopicPartition, ...]
    ) -> dict[TopicPartition, list[Record]]:
        """Up to `limit` buffered records (of the partitions in `only`, if any), moving each
        partition's position past what it returns. Raises the error of a partition that cannot
        be read, unless records of other partitions come first (then it is raised next time)."""
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
            self.wake()  # room to buffer another Fetch of those partitions
        return out

    # -- the loop's pass --------------------------------------------------------------------
    def _start_due(self) -> float | None:
        """Start the Fetches and the metadata refresh that are due; return how long until a
        broker's backoff ends (None: nothing to wait for but a wakeup)."""
        now = asyncio.get_running_loop().time()
        cluster = self._pool.cluster
        by_node: dict[int, list[TopicPartition]] = {}
        need_metadata: set[str] = set()
        for tp, state in self._positions.items():
            if not state.fetchable:
                continue
            leader = cluster.leader_for(tp)
            if leader is None:
                need_metadata.add(tp.topic)
                continue
            by_node.setdefault(leader, []).append(tp)
        if (need_metadata or (cluster.stale and by_node)) and not self._refreshing:
            self._refreshing = True
            self._wakeup_loop.spawn(self._refresh_metadata(need_metadata))
        wait_s: float | None = None
        for node, tps in by_node.items():
            if node in self._fetching_nodes:
                continue
            left_s = self._node_backoff_until.get(node, 0.0) - now
            if left_s > 0:
                wait_s = left_s if wait_s is None else min(wait_s, left_s)
                continue
            self._fetching_nodes.add(node)
            self._wakeup_loop.spawn(self._fetch(node, tps))
        return wait_s

    async def _refresh_metadata(self, topics: set[str]) -> None:
        try:
            await self._pool.refresh(topics | {tp.topic for tp in self._positions.assignment()})
        except (OSError, TimeoutError, KafkaError) as error:
            self._events.failed(error)
        finally:
            self._refreshing = False
            self.wake()

    # -- fetching ---------------------------------------------------------------------------
    async def _fetch(self, node: int, tps: list[TopicPartition]) -> None:
        pool = self._pool
        session: FetchSessionHandler | None = None
        try:
            connection = await pool.connection_for(node)
            session = self._session(node, connection)
            request, sent = self._fetch_request(connection, tps, session)
            try:
                response = await connection.call(
                    request,
                    m.FetchResponse,
                    # The broker may hold the request fetch_max_wait_ms before it answers.
                    timeout_ms=self._settings.request_timeout_ms + self._settings.fetch_max_wait_ms,
                )
            except BaseException:
                session.failed()
                raise
            session.answered(response.error_code, response.session_id)
            if response.error_code in SESSION_ERRORS:
                return  # the next Fetch starts a new session; nothing is wrong with the data
            if response.error_code != ErrorCode.NONE:
                raise error_for(response.error_code, f"Fetch from broker {node}")
            failed = self._apply_fetch(response, sent)
            self._node_failures.pop(node, None)
            if failed:
                self._back_off(node)
        except (OSError, TimeoutError, RetriableError) as error:
            self._events.failed(error)
            pool.cluster.mark_stale(f"fetch from broker {node} failed: {error}")
            self._back_off(node)
        finally:
            self._fetching_nodes.discard(node)
            self.wake()

    def _back_off(self, node: int) -> None:
        failures = self._node_failures.get(node, 0) + 1
        self._node_failures[node] = failures
        wait_ms = backoff_ms(
            failures, self._settings.retry_backoff_ms, self._settings.retry_backoff_max_ms
        )
        self._node_backoff_until[node] = asyncio.get_running_loop().time() + wait_ms / 1000

    def _session(self, node: int, connection: BrokerConnection) -> FetchSessionHandler:
        """The fetch session on `connection` (a new one when the connection is new)."""
        current = self._sessions.get(node)
        if current is not None and current[0] is connection:
            return current[1]
        session = FetchSessionHandler()
        self._sessions[node] = (connection, session)
        return session

    def _fetch_request(
        self,
        connection: BrokerConnection,
        tps: list[TopicPartition],
        session: FetchSessionHandler,
    ) -> tuple[m.FetchRequest, SentFetch]:
        """The Fetch for `tps` through `session` (naming only what the session does not hold
        already), and what it asks of each partition, named or not."""
        cluster = self._pool.cluster
        use_ids = connection.version_for(FETCH_API_KEY) >= FETCH_TOPIC_IDS_VERSION_MIN
        wanted = []
        sent: SentFetch = {}
        for tp in tps:
            state = self._positions.get(tp)
            topic_id = cluster.topic_id(tp.topic)
            if use_ids and topic_id is None:
                continue  # not fetchable until metadata names the topic's id
            partition = m.FetchRequest.FetchPartition(
                partition=tp.partition,
                current_leader_epoch=cluster.leader_epoch(tp),
                fetch_offset=state.fetch_offset,
                partition_max_bytes=self._settings.max_partition_fetch_bytes,
            )
            wanted.append((tp, topic_id or ZERO_UUID, partition))
            sent[tp] = (state.fetch_offset, state.generation)
        fetch = session.build(wanted)
        topics: dict[str, m.FetchRequest.FetchTopic] = {}
        for tp, topic_id, partition in fetch.named:
            topic = topics.get(tp.topic)
            if topic is None:
                topic = topics[tp.topic] = m.FetchRequest.FetchTopic(tp.topic, topic_id=topic_id)
            topic.partitions.append(partition)
        forgotten: dict[str, m.FetchRequest.ForgottenTopic] = {}
        for tp, topic_id in fetch.forgotten:
            gone = forgotten.get(tp.topic)
            if gone is None:
                gone = forgotten[tp.topic] = m.FetchRequest.ForgottenTopic(
                    topic=tp.topic, topic_id=topic_id
                )
            gone.partitions.append(tp.partition)
        request = m.FetchRequest(
            replica_id=CONSUMER_REPLICA_ID,
            max_wait_ms=self._settings.fetch_max_wait_ms,
            min_bytes=self._settings.fetch_min_bytes,
            max_bytes=self._settings.fetch_max_bytes,
            isolation_level=self._settings.isolation_level_code,
            session_id=fetch.session_id,
            session_epoch=fetch.epoch,
            topics=list(topics.values()),
            forgotten_topics_data=list(forgotten.values()),
        )
        return request, sent

    def _apply_fetch(self, response: m.FetchResponse, sent: SentFetch) -> bool:
        """Buffer what the response carries; True if some partition needs a retry later."""
        cluster = self._pool.cluster
        read_committed = self._settings.isolation_level_code == ISOLATION_READ_COMMITTED
        retry = False
        for topic in response.responses:
            name = topic.topic or cluster.topic_name(topic.topic_id) or ""
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
                    retry |= self._fetch_error(tp, state, generation, data.error_code)
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
                        check_crcs=self._settings.check_crcs,
                    )
                except KafkaError as error:
                    state.error = error
                    continue
                if fetch.end_offset > state.fetch_offset:
                    state.fetch_offset = fetch.end_offset
                    state.buffered.append(fetch)
        # Records, or a partition error getmany raises (corrupt data, out of range), are waiting.
        self._events.readable()
        return retry

    def _current(self, tp: TopicPartition, generation: int) -> PartitionPosition | None:
        state = self._positions.find(tp)
        return state if state is not None and state.generation == generation else None

    def _fetch_error(
        self, tp: TopicPartition, state: PartitionPosition, generation: int, code: int
    ) -> bool:
        """Apply a partition's error code; True if a retry (after a backoff) may succeed."""
        error = error_for(code, f"Fetch {tp.topic}-{tp.partition} at {state.fetch_offset}")
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            self._positions.out_of_range(tp, generation, error)
            # Under a reset policy the partition now awaits a new position (else it failed).
            self._events.reset_due()
            return False
        if code in _REFRESH_METADATA_CODES or isinstance(error, RetriableError):
            self._pool.cluster.mark_stale(f"{tp.topic}-{tp.partition}: {ErrorCode(code).name}")
            return True
        state.error = error
        return False
