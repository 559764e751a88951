"""Followers copy their leaders' logs: one fetcher task per leader broker, one connection each
(Kafka's num.replica.fetchers=1).

A partition joins a fetcher when this broker starts following it at a new leader epoch. Before
its first fetch at that epoch it is checked for a divergent tail (KIP-101/279): the leader tells
the end offset of the follower's latest epoch (OffsetForLeaderEpoch) and the follower truncates
to the smaller of that and its own end of the epoch, repeating with an older epoch while the
leader does not know the follower's. Then fetches append the leader's batches byte for byte
(after a CRC check) and follow the leader's high watermark.

The fetcher long-polls (`replica.fetch.wait.max.ms`), so an idle follower costs the leader one
parked request. It fetches through a fetch session (KIP-227) when the leader grants one: a full
fetch at epoch 0 names every partition, then incremental fetches name only the partitions whose
fetch offset, epochs or log start changed, that joined, or that left (forgotten); the leader
answers only partitions with news. The fetcher keeps those partitions in a dirty set (appended,
truncated, added, removed, backed off), so a fetch costs what changed, not the partition count.
A session error (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH,
FETCH_SESSION_TOPIC_ID_ERROR) or a lost connection starts a new session with a full fetch; a
response with session id 0 (the leader's cache is full) means full fetches go on, as before
sessions. While any followed topic lists throttled replicas the fetcher fetches without a
session (the follower quota shares its allowance over all throttled partitions of each fetch).
Errors back off per fetcher (connection) or per partition (a leader that does not lead it yet: the
metadata watch brings the change) and are retried; nothing is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from riverbed.client.connection import BrokerConnection
from riverbed.coordination.metadata_cache import MetadataCache
from riverbed.hot.replication.inter_broker import InterBrokerDialer
from riverbed.hot.replication.partitions import NO_LEADER, Partition
from riverbed.hot.replication.quota import ReplicationQuota
from riverbed.hot.storage.leader_epoch import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
from riverbed.hot.storage.log import OffsetOutOfOrderError
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError, ProtocolDecodeError
from riverbed.protocol.fetch_session_ids import (
    INITIAL_EPOCH,
    NO_SESSION_ID,
    SESSION_ERRORS,
    next_epoch,
)
from riverbed.protocol.records import validate_replicated_records
from riverbed.protocol.regions import FileRegion

log = logging.getLogger(__name__)

# Kafka's replica.fetch.* defaults, except the wait: a fetch parked at the leader holds the
# connection (requests are served in order), so a partition this follower starts copying from
# that leader (a failover) waits for it. Kafka's 500 ms made failovers 0.5 s slower; 100 ms costs
# an idle follower 10 small requests a second per leader.
REPLICA_FETCH_WAIT_MAX_MS: Final = 100
REPLICA_FETCH_MIN_BYTES: Final = 1
REPLICA_FETCH_MAX_BYTES: Final = 1024 * 1024  # per partition
REPLICA_FETCH_RESPONSE_MAX_BYTES: Final = 10 * 1024 * 1024
REPLICA_FETCH_BACKOFF_MS: Final = 1000
# A leader that does not know its new epoch yet (its metadata watch fires a moment after ours)
# is asked again soon: failover time is counted in these.
LEADER_CATCH_UP_BACKOFF_MS: Final = 50
LEADERSHIP_LAG_ERRORS: Final = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.REPLICA_NOT_AVAILABLE,
    }
)
REPLICA_SOCKET_TIMEOUT_MS: Final = 30_000
# A follower's fetch is a consumer fetch plus the replica id.
READ_UNCOMMITTED: Final = 0
ZERO_UUID: Final = uuid.UUID(int=0)
# What the leader's session holds for a partition: topic id, leader epoch, fetch offset, last
# fetched epoch, log start, max bytes. A partition is named again only when this changes.
_SessionEntry = tuple[uuid.UUID, int, int, int, int, int]


@dataclass(eq=False, slots=True)
class _Followed:
    """One partition followed at one leader epoch (a new epoch is a new object)."""

    partition: Partition
    leader_epoch: int
    truncated: bool = False
    retry_at_s: float = 0.0  # loop time before which the partition is not fetched


@dataclass(frozen=True, slots=True)
class _Planned:
    """A partition in a fetch, and what the fetch asks of it."""

    followed: _Followed
    topic_id: uuid.UUID
    max_bytes: int
    throttled: bool  # its bytes count against the follower quota


class _FetchPlan:
    """A replica FetchRequest for a set of partitions, rebuilt only when the set changes."""

    def __init__(self, broker_id: int, planned: list[_Planned]) -> None:
        self.planned = planned
        topics: dict[str, m.FetchRequest.FetchTopic] = {}
        self._entries: list[tuple[_Followed, m.FetchRequest.FetchPartition]] = []
        # The partitions by (topic id, index) and by (name, index): a response names them by id
        # from Fetch v13 on, by name before.
        self.sent: dict[tuple[uuid.UUID | str, int], _Followed] = {}
        self.throttled: set[_Followed] = set()
        for item in planned:
            partition = item.followed.partition
            topic = topics.get(partition.topic)
            if topic is None:
                topic = m.FetchRequest.FetchTopic(topic=partition.topic, topic_id=item.topic_id)
                topics[partition.topic] = topic
            entry = m.FetchRequest.FetchPartition(
                partition=partition.index, partition_max_bytes=item.max_bytes
            )
            topic.partitions.append(entry)
            self._entries.append((item.followed, entry))
            self.sent[(item.topic_id, partition.index)] = item.followed
            self.sent[(partition.topic, partition.index)] = item.followed
            if item.throttled:
                self.throttled.add(item.followed)
        self.request = m.FetchRequest(
            replica_id=broker_id,
            replica_state=m.FetchRequest.ReplicaState(replica_id=broker_id),
            max_wait_ms=REPLICA_FETCH_WAIT_MAX_MS,
            min_bytes=REPLICA_FETCH_MIN_BYTES,
            max_bytes=REPLICA_FETCH_RESPONSE_MAX_BYTES,
            isolation_level=READ_UNCOMMITTED,
            topics=list(topics.values()),
        )

    def bring_up_to_date(self) -> None:
        """Each partition from where its log ends now."""
        for followed, entry in self._entries:
            partition_log = followed.partition.log
            entry.current_leader_epoch = followed.leader_epoch
            entry.fetch_offset = partition_log.log_end_offset
            entry.last_fetched_epoch = partition_log.leader_epochs.latest_epoch
            entry.log_start_offset = partition_log.log_start_offset


class LeaderFetcher:
    """Copies the partitions this broker follows from one leader broker."""

    def __init__(
        self,
        leader_id: int,
        broker_id: int,
        cache: MetadataCache,
        quota: ReplicationQuota,
        dialer: InterBrokerDialer,
    ) -> None:
        self.leader_id = leader_id
        self._broker_id = broker_id
        self._cache = cache
        self._quota = quota
        self._dialer = dialer
        self._followed: dict[tuple[str, int], _Followed] = {}
        self._changed = asyncio.Event()
        self._connection: BrokerConnection | None = None
        self._plan: _FetchPlan | None = None  # the last fetch's, reused while it fits
        self._stopping = False
        # Followed partitions per topic: whether a topic is throttled is asked per topic.
        self._topics: dict[str, int] = {}
        # The fetch session with the leader: its id and the epoch of the next request (0: the
        # next is a full fetch), what it holds per partition, and the partitions whose entry
        # may differ from what it holds (checked at the next fetch).
        self._session_id = NO_SESSION_ID
        self._session_epoch = INITIAL_EPOCH
        # What the session holds per partition, and the _Followed it was sent for (replaced,
        # never cleared in place: a round's response is matched against the dict it sent).
        self._in_session: dict[tuple[str, int], tuple[_SessionEntry, _Followed]] = {}
        self._dirty: set[tuple[str, int]] = set()
        self._untruncated: set[tuple[str, int]] = set()
        self._delayed: dict[tuple[str, int], _Followed] = {}
        self._task = asyncio.create_task(self._run(), name=f"replica-fetcher-{leader_id}")

    def add(self, partition: Partition) -> None:
        key = (partition.topic, partition.index)
        current = self._followed.get(key)
        if (
            current is not None
            and current.partition is partition
            and current.leader_epoch == partition.leader_epoch
        ):
            return
        if current is None:
            self._topics[partition.topic] = self._topics.get(partition.topic, 0) + 1
        self._followed[key] = _Followed(partition, partition.leader_epoch)
        self._untruncated.add(key)
        self._dirty.add(key)
        self._changed.set()

    def remove(self, partition: Partition) -> None:
        key = (partition.topic, partition.index)
        current = self._followed.get(key)
        if current is not None and current.partition is partition:
            del self._followed[key]
            left = self._topics[partition.topic] - 1
            if left:
                self._topics[partition.topic] = left
            else:
                del self._topics[partition.topic]
            self._dirty.add(key)  # forgotten by the session at the next fetch

    def __len__(self) -> int:
        return len(self._followed)

    async def stop(self) -> None:
        # The flag as well as the cancel: Python 3.11's asyncio.wait_for can swallow a
        # cancellation that races with its result, and the loop must end anyway.
        self._stopping = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._disconnect()

    async def _run(self) -> None:
        while not self._stopping:
            # Cleared before the round reads what it follows, never in the wait: a partition
            # added while the round awaits the leader (an epoch bump during truncation) must
            # end the round's wait, or it is never fetched.
            self._changed.clear()
            failed: Exception | None = None
            try:
                await self._round()
            except (OSError, TimeoutError, KafkaError) as error:
                failed = error
            # Handled after the except block, not in it: a coroutine compiled by mypyc (2.4)
            # that awaits inside an except or finally block leaves its exception in every other
            # task's sys.exc_info() while suspended there, and compiled code in another task
            # raised it again (a client connection died of this fetcher's connection refusal).
            # tests/broker/test_compiled_hot_path.py rejects such awaits in compiled modules.
            if failed is not None:
                log.warning(
                    "broker %d: fetching from leader %d failed: %s",
                    self._broker_id,
                    self.leader_id,
                    failed,
                )
                self._reset_session(close=True)
                await self._disconnect()
                await asyncio.sleep(REPLICA_FETCH_BACKOFF_MS / 1000)

    async def _round(self) -> None:
        """One fetch: through the session, or sessionless while a followed topic is throttled."""
        if self._followed and not self._throttling():
            await self._session_round(await self._connect())
            return
        self._reset_session(close=True)
        now = asyncio.get_running_loop().time()
        ready = [f for f in self._followed.values() if f.retry_at_s <= now]
        if not ready:
            await self._wait_for_change(self._followed.values())
            return
        connection = await self._connect()
        pending = [f for f in ready if not f.truncated]
        if pending:
            await self._truncate(connection, pending)
        fetchable = [f for f in ready if f.truncated]
        if fetchable:
            await self._fetch(connection, fetchable)

    async def _wait_for_change(self, backing_off: Iterable[_Followed]) -> None:
        """Wait until the followed partitions change (since this round began), or the first
        of `backing_off` may be fetched again."""
        loop = asyncio.get_running_loop()
        wait_s = min((f.retry_at_s for f in backing_off), default=None)
        timeout_s = None if wait_s is None else max(wait_s - loop.time(), 0.0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()

    async def _connect(self) -> BrokerConnection:
        if self._connection is not None and not self._connection.closed:
            return self._connection
        self._connection = await self._dialer.open(
            self.leader_id,
            client_id=f"riverbed-replica-{self._broker_id}",
            timeout_ms=REPLICA_SOCKET_TIMEOUT_MS,
        )
        return self._connection

    async def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    def _current(self, followed: _Followed) -> bool:
        """Whether `followed` is still what this fetcher copies (no new epoch, not removed)."""
        partition = followed.partition
        key = (partition.topic, partition.index)
        return self._followed.get(key) is followed and partition.leader_epoch == (
            followed.leader_epoch
        )

    def _back_off(self, followed: _Followed, error: ErrorCode | None = None) -> None:
        delay_ms = (
            LEADER_CATCH_UP_BACKOFF_MS
            if error in LEADERSHIP_LAG_ERRORS
            else REPLICA_FETCH_BACKOFF_MS
        )
        followed.retry_at_s = asyncio.get_running_loop().time() + delay_ms / 1000
        key = (followed.partition.topic, followed.partition.index)
        # Out of the session while it waits (Kafka's delayed partitions leave the fetch too).
        self._delayed[key] = followed
        self._dirty.add(key)

    def _needs_truncation(self, followed: _Followed) -> None:
        followed.truncated = False
        key = (followed.partition.topic, followed.partition.index)
        self._untruncated.add(key)
        self._dirty.add(key)

    # -- fetch sessions ------------------------------------------------------------------------

    def _throttling(self) -> bool:
        """Whether a followed topic lists throttled replicas: then fetches are sessionless."""
        throttles = self._quota.throttles_topic
        return any(throttles(topic) for topic in self._topics)

    def _reset_session(self, *, close: bool) -> None:
        """Start over with a full fetch; `close`: name the old session in it, so the leader
        drops it (else it is unknown there anyway)."""
        if not close:
            self._session_id = NO_SESSION_ID
        self._session_epoch = INITIAL_EPOCH
        self._in_session = {}

    async def _session_round(self, connection: BrokerConnection) -> None:
        """One fetch through the session: truncate what needs it, then send what changed."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        for key, followed in list(self._delayed.items()):
            if followed.retry_at_s <= now:
                del self._delayed[key]
                self._dirty.add(key)
        untruncated = []
        unfollowed = []
        for key in self._untruncated:
            current = self._followed.get(key)
            if current is None:
                unfollowed.append(key)
            elif key not in self._delayed:
                untruncated.append(current)
        # Not intersection_update(self._followed): that walks every followed partition.
        self._untruncated.difference_update(unfollowed)
        if untruncated:
            await self._truncate(connection, untruncated)
            for followed in untruncated:
                if followed.truncated:
                    key = (followed.partition.topic, followed.partition.index)
                    self._untruncated.discard(key)
                    self._dirty.add(key)
        full = self._session_epoch == INITIAL_EPOCH
        request, sent = self._session_request(full)
        if full and not sent:
            # Nothing fetchable now: wait for a partition, or the first back-off to end.
            await self._wait_for_change(self._delayed.values())
            return
        response = await connection.send_nowait(
            request, timeout_ms=REPLICA_SOCKET_TIMEOUT_MS + REPLICA_FETCH_WAIT_MAX_MS
        )
        if not isinstance(response, m.FetchResponse):
            raise ProtocolDecodeError(f"expected FetchResponse, got {type(response).__name__}")
        error = ErrorCode(response.error_code)
        if error in SESSION_ERRORS:
            log.info(
                "broker %d: leader %d answered %s; starting a new fetch session",
                self._broker_id,
                self.leader_id,
                error.name,
            )
            self._reset_session(close=error != ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
            return
        if error != ErrorCode.NONE:
            raise KafkaError(error, "replica fetch failed")
        if response.session_id == NO_SESSION_ID:
            self._reset_session(close=False)  # no session granted: full fetches go on
        elif full:
            self._session_id, self._session_epoch = response.session_id, 1
        else:
            self._session_epoch = next_epoch(self._session_epoch)
        for topic_response in response.responses:
            name = topic_response.topic
            if not name:
                metadata = self._cache.topic_by_id(topic_response.topic_id)
                name = metadata.name if metadata is not None else ""
            for data in topic_response.partitions:
                key = (name, data.partition_index)
                held = sent.get(key)
                if held is None or not self._current(target := held[1]):
                    continue
                self._apply(target, data)
                self._dirty.add(key)  # its fetch offset or log start may have moved

    def _session_request(
        self, full: bool
    ) -> tuple[m.FetchRequest, dict[tuple[str, int], tuple[_SessionEntry, _Followed]]]:
        """The session's next request: every fetchable partition (full), or those whose entry
        changed and those to forget (incremental); and the partitions the session then holds
        (those a response may name), each with the _Followed it was sent for. An idle session's
        request costs nothing per partition it holds."""
        keys = list(self._followed) if full else list(self._dirty)
        self._dirty.clear()
        if full:
            self._in_session = {}
        topics: dict[str, m.FetchRequest.FetchTopic] = {}
        forgotten: dict[str, m.FetchRequest.ForgottenTopic] = {}
        for key in keys:
            followed = self._followed.get(key)
            metadata = self._cache.topic(key[0])
            if (
                followed is None
                or not followed.truncated
                or key in self._delayed
                or metadata is None
            ):
                if key in self._in_session:
                    del self._in_session[key]
                    gone = forgotten.get(key[0])
                    if gone is None:
                        old_id = metadata.topic_id if metadata is not None else ZERO_UUID
                        gone = forgotten[key[0]] = m.FetchRequest.ForgottenTopic(
                            topic=key[0], topic_id=old_id
                        )
                    gone.partitions.append(key[1])
                if followed is not None and metadata is None:
                    self._back_off(followed)
                continue
            partition_log = followed.partition.log
            entry: _SessionEntry = (
                metadata.topic_id,
                followed.leader_epoch,
                partition_log.log_end_offset,
                partition_log.leader_epochs.latest_epoch,
                partition_log.log_start_offset,
                REPLICA_FETCH_MAX_BYTES,
            )
            held = self._in_session.get(key)
            if held is not None and held[0] == entry and held[1] is followed:
                continue
            self._in_session[key] = (entry, followed)
            topic = topics.get(key[0])
            if topic is None:
                topic = topics[key[0]] = m.FetchRequest.FetchTopic(
                    topic=key[0], topic_id=metadata.topic_id
                )
            topic.partitions.append(
                m.FetchRequest.FetchPartition(
                    partition=key[1],
                    current_leader_epoch=entry[1],
                    fetch_offset=entry[2],
                    last_fetched_epoch=entry[3],
                    log_start_offset=entry[4],
                    partition_max_bytes=entry[5],
                )
            )
        request = m.FetchRequest(
            replica_id=self._broker_id,
            replica_state=m.FetchRequest.ReplicaState(replica_id=self._broker_id),
            max_wait_ms=REPLICA_FETCH_WAIT_MAX_MS,
            min_bytes=REPLICA_FETCH_MIN_BYTES,
            max_bytes=REPLICA_FETCH_RESPONSE_MAX_BYTES,
            isolation_level=READ_UNCOMMITTED,
            session_id=self._session_id,
            session_epoch=self._session_epoch,
            topics=list(topics.values()),
            forgotten_topics_data=list(forgotten.values()),
        )
        return request, self._in_session

    # -- truncation ----------------------------------------------------------------------------

    async def _truncate(self, connection: BrokerConnection, pending: list[_Followed]) -> None:
        by_topic: dict[str, list[m.OffsetForLeaderEpochRequest.OffsetForLeaderPartition]] = {}
        asked: dict[tuple[str, int], tuple[_Followed, int]] = {}
        for followed in pending:
            partition = followed.partition
            epoch = partition.log.leader_epochs.latest_epoch
            if epoch == UNDEFINED_EPOCH:
                # Nothing written under any epoch: there is no tail that could diverge.
                followed.truncated = True
                continue
            by_topic.setdefault(partition.topic, []).append(
                m.OffsetForLeaderEpochRequest.OffsetForLeaderPartition(
                    partition=partition.index,
                    current_leader_epoch=followed.leader_epoch,
                    leader_epoch=epoch,
                )
            )
            asked[(partition.topic, partition.index)] = (followed, epoch)
        if not by_topic:
            return
        request = m.OffsetForLeaderEpochRequest(
            replica_id=self._broker_id,
            topics=[
                m.OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=name, partitions=parts)
                for name, parts in by_topic.items()
            ],
        )
        response = await connection.call(
            request, m.OffsetForLeaderEpochResponse, timeout_ms=REPLICA_SOCKET_TIMEOUT_MS
        )
        for topic in response.topics:
            for result in topic.partitions:
                entry = asked.get((topic.topic, result.partition))
                if entry is None or not self._current(entry[0]):
                    continue
                followed, asked_epoch = entry
                if result.error_code != ErrorCode.NONE:
                    log.info(
                        "%s: leader %d answered OffsetForLeaderEpoch with %s",
                        followed.partition,
                        self.leader_id,
                        ErrorCode(result.error_code).name,
                    )
                    self._back_off(followed, ErrorCode(result.error_code))
                    continue
                self._apply_epoch_end(followed, asked_epoch, result.leader_epoch, result.end_offset)

    def _apply_epoch_end(
        self, followed: _Followed, asked_epoch: int, leader_epoch: int, end_offset: int
    ) -> None:
        """Truncate to where this replica's log stops agreeing with the leader's (Kafka's
        AbstractFetcherThread.getOffsetTruncationState)."""
        partition = followed.partition
        log_end = partition.log.log_end_offset
        if end_offset == UNDEFINED_EPOCH_OFFSET or leader_epoch == UNDEFINED_EPOCH:
            # The leader knows no epoch up to ours: only the high watermark is known good.
            offset, done = partition.log.high_watermark, True
        else:
            own_epoch, own_end = partition.log.leader_epochs.end_offset_for(leader_epoch, log_end)
            if own_end == UNDEFINED_EPOCH_OFFSET:
                offset, done = partition.log.high_watermark, True
            elif own_epoch != leader_epoch:
                # The leader never had our epoch: cut back to the end of the last epoch we share
                # at most, then ask again about the epoch that leaves us at.
                offset, done = min(own_end, log_end), False
            else:
                offset, done = min(end_offset, own_end, log_end), True
        if offset < log_end:
            log.info(
                "%s: truncating to %d (leader %d epoch %d ends at %d; asked for epoch %d)",
                partition,
                offset,
                self.leader_id,
                leader_epoch,
                end_offset,
                asked_epoch,
            )
            partition.truncate_to(offset)
        followed.truncated = done or partition.log.leader_epochs.latest_epoch == UNDEFINED_EPOCH

    # -- fetching ------------------------------------------------------------------------------

    async def _fetch(self, connection: BrokerConnection, fetchable: list[_Followed]) -> None:
        plan = self._plan_fetch(fetchable)
        if plan is None:
            return
        # One fetch at a time per leader, and a small request: no slot to take and no drain to
        # wait for (send_nowait), on the path of every acks=all produce. The request is encoded
        # here, before the plan can change.
        response = await connection.send_nowait(
            plan.request, timeout_ms=REPLICA_SOCKET_TIMEOUT_MS + REPLICA_FETCH_WAIT_MAX_MS
        )
        if not isinstance(response, m.FetchResponse):
            raise ProtocolDecodeError(f"expected FetchResponse, got {type(response).__name__}")
        if response.error_code != ErrorCode.NONE:
            raise KafkaError(ErrorCode(response.error_code), "replica fetch failed")
        sent, throttled = plan.sent, plan.throttled
        for topic_response in response.responses:
            for data in topic_response.partitions:
                target = sent.get((topic_response.topic_id, data.partition_index)) or sent.get(
                    (topic_response.topic, data.partition_index)
                )
                if target is not None and target in throttled:
                    records = data.records
                    self._quota.record(
                        len(records) if isinstance(records, bytes | memoryview) else 0
                    )
                if target is not None and self._current(target):
                    self._apply(target, data)

    def _plan_fetch(self, fetchable: list[_Followed]) -> _FetchPlan | None:
        """The fetch of `fetchable` now (None: nothing to fetch): each partition from its log
        end, the throttled ones (follower quota) sharing their allowance or left out while it
        is used up. The last plan is reused while it names the same partitions and limits, its
        offsets brought up to date: a follower fetches the same set over and over, and building
        the request's objects again each time was a tenth of its work."""
        quota = self._quota
        throttled_flags = [quota.throttled(f.partition.topic, f.partition.index) for f in fetchable]
        throttled_count = sum(throttled_flags)
        throttled_max_bytes = REPLICA_FETCH_MAX_BYTES
        throttle_delay_s = 0.0
        if throttled_count:
            throttled_max_bytes = quota.fetch_max_bytes(REPLICA_FETCH_MAX_BYTES)
            throttle_delay_s = quota.delay_s(throttled_max_bytes)
        chosen: list[_Planned] = []
        for followed, throttled in zip(fetchable, throttled_flags, strict=True):
            metadata = self._cache.topic(followed.partition.topic)
            if metadata is None:
                self._back_off(followed)
                continue
            max_bytes = REPLICA_FETCH_MAX_BYTES
            if throttled:
                if throttle_delay_s > 0:
                    followed.retry_at_s = asyncio.get_running_loop().time() + throttle_delay_s
                    continue
                # The throttled replicas share one allowance: each asks for its part of it.
                max_bytes = max(1, throttled_max_bytes // throttled_count)
            chosen.append(_Planned(followed, metadata.topic_id, max_bytes, throttled))
        if not chosen:
            return None
        plan = self._plan
        if plan is None or plan.planned != chosen:  # other partitions, epochs or limits
            plan = self._plan = _FetchPlan(self._broker_id, chosen)
        plan.bring_up_to_date()
        return plan

    def _apply(self, followed: _Followed, data: m.FetchResponse.PartitionData) -> None:
        partition = followed.partition
        error = ErrorCode(data.error_code)
        if error == ErrorCode.NONE:
            records = data.records
            assert not isinstance(records, FileRegion), "decoded responses hold bytes"
            try:
                if records:
                    view = memoryview(records)
                    partition.append_as_follower(
                        view, validate_replicated_records(view), data.high_watermark
                    )
                else:
                    partition.follow_high_watermark(data.high_watermark)
                partition.follow_log_start(data.log_start_offset)
            except OffsetOutOfOrderError as out_of_order:
                log.warning("%s: %s; checking for divergence again", partition, out_of_order)
                self._needs_truncation(followed)
            except KafkaError as problem:
                # A corrupt batch from the leader or a failing local disk: nothing is appended;
                # retry after a pause rather than spin.
                log.error(
                    "%s: could not append what leader %d sent: %s",
                    partition,
                    self.leader_id,
                    problem,
                )
                self._back_off(followed)
            return
        if (
            error in (ErrorCode.OFFSET_OUT_OF_RANGE, ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE)
            and data.log_start_offset > partition.log.log_end_offset
        ):
            # The leader's log starts past our end: what we lack is only in the remote tier, or
            # retention deleted it while we were away. Kafka's follower truncates fully and
            # goes on from the leader's log start.
            log.info(
                "%s: the leader's log starts at %d, past our end (%s); restarting the log there",
                partition,
                data.log_start_offset,
                error.name,
            )
            partition.restart_at(data.log_start_offset)
            return
        if error == ErrorCode.OFFSET_OUT_OF_RANGE:
            # Our log end is past the leader's (an unclean election): find where we diverge.
            self._needs_truncation(followed)
        else:
            # After a leadership move every partition answers FENCED_LEADER_EPOCH or one of
            # the leadership-lag errors once, until both sides know the new epoch: at DEBUG,
            # since thousands of such lines at once took 14% of a broker's loop in a profiled
            # shutdown at 4,000 partitions. Anything else is worth an operator's eye.
            transient = error in LEADERSHIP_LAG_ERRORS or error == ErrorCode.FENCED_LEADER_EPOCH
            level = logging.DEBUG if transient else logging.INFO
            log.log(level, "%s: leader %d answered %s", partition, self.leader_id, error.name)
        self._back_off(followed, error)


class ReplicaFetcherManager:
    """The fetchers of this broker, one per leader it follows; owned by the broker."""

    def __init__(self, broker_id: int, cache: MetadataCache, dialer: InterBrokerDialer) -> None:
        self._broker_id = broker_id
        self._cache = cache
        self._dialer = dialer
        self._quota = ReplicationQuota(broker_id, cache)
        self._fetchers: dict[int, LeaderFetcher] = {}
        self._by_partition: dict[tuple[str, int], LeaderFetcher] = {}
        self._retired: set[asyncio.Task[None]] = set()
        self._stopped = False

    def follow(self, partition: Partition) -> None:
        """Copy `partition` from its current leader (at its current epoch); nothing once
        stopped (a broker shutting down must not rejoin ISRs)."""
        if self._stopped:
            return
        key = (partition.topic, partition.index)
        leader_id = partition.leader_id
        current = self._by_partition.get(key)
        if current is not None and current.leader_id != leader_id:
            self.unfollow(partition)
        if leader_id == NO_LEADER or leader_id == self._broker_id:
            return
        fetcher = self._fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self._fetchers[leader_id] = LeaderFetcher(
                leader_id, self._broker_id, self._cache, self._quota, self._dialer
            )
        fetcher.add(partition)
        self._by_partition[key] = fetcher

    def unfollow(self, partition: Partition) -> None:
        fetcher = self._by_partition.pop((partition.topic, partition.index), None)
        if fetcher is None:
            return
        fetcher.remove(partition)
        if not fetcher:
            # Idle: stop its task and connection (in the background, owned here).
            del self._fetchers[fetcher.leader_id]
            task = asyncio.create_task(fetcher.stop(), name=f"stop-fetcher-{fetcher.leader_id}")
            self._retired.add(task)
            task.add_done_callback(self._retired.discard)

    async def stop(self) -> None:
        """Stop every fetcher for good (idempotent)."""
        self._stopped = True
        fetchers = list(self._fetchers.values())
        self._fetchers.clear()
        self._by_partition.clear()
        await asyncio.gather(*(fetcher.stop() for fetcher in fetchers), return_exceptions=True)
        await asyncio.gather(*self._retired, return_exceptions=True)
