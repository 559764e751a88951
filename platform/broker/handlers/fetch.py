"""Fetch: hand file ranges of whole batches to the server, long-polling without busy loops.

Semantics follow Kafka: reads stop at the high watermark (at the last stable offset for
consumers at isolation_level 1, read_committed, whose partitions then carry the aborted
transactions overlapping what they read, from the log's transaction index, or for offsets only
the remote tier holds from the manifest's objects and then the local index; `aborted_transactions`
is null otherwise, as Kafka sends it); the response holds at most `max_bytes`
(and `partition_max_bytes` per partition) except that the first batch of the first non-empty
partition is always returned whole (KIP-74), so a consumer can never get stuck on a large batch.
When fewer than `min_bytes` are available the request parks a future on each partition it reads
and is woken by the next append, or answered at `max_wait_ms` with what there is.

Followers fetch with their broker id as `replica_id`: they read up to the log end offset rather
than the HW, park on appends rather than HW moves, and each fetch offset tells the leader how far
that follower has replicated (which can move the HW and the ISR).

Fetch sessions (KIP-227, riverbed.broker.fetch_sessions): a full fetch at epoch 0 creates a
session when the cache has room; incremental fetches then name only the partitions whose
request changed, and are answered with only the partitions that have records, an error, or a
moved high watermark, last stable offset or log start. Partitions mark the sessions holding
them when they change (hot.replication.fetch_watch), so an incremental fetch reads only marked,
named or still-owed partitions and parks on one future: its cost follows what changed, not the
session's size. A follower's session also stands for its fetches of the partitions it does not
name (FollowerTracker.before_end_moves), so an idle follower stays in sync.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from riverbed.broker.fetch_sessions import INVALID_SESSION_ID, FetchSession
from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.metrics import CONSUMER, FOLLOWER, BrokerMetrics
from riverbed.hot.replication.fetch_watch import FetchWatch, PartitionKey
from riverbed.hot.replication.followers import monotonic_ms
from riverbed.hot.storage.log import ReadResult
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.fetch_session_ids import FINAL_EPOCH, INITIAL_EPOCH
from riverbed.protocol.records_header import iter_batch_headers
from riverbed.protocol.regions import FileRegion
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

log = logging.getLogger(__name__)

TopicResponse = m.FetchResponse.FetchableTopicResponse
PartitionData = m.FetchResponse.PartitionData
AbortedTransaction = m.FetchResponse.AbortedTransaction

# A consumer fetch names no replica (-1); followers send their broker id (>= 0).
CONSUMER_REPLICA_ID = -1
# The longest a fetch may park, whatever the client asks (Kafka bounds it by its request timeout).
FETCH_MAX_WAIT_MS_MAX = 60_000
# Partition results that let a fetch go on waiting for data.
_WAITING_CODES = frozenset({ErrorCode.NONE, ErrorCode.TOPIC_AUTHORIZATION_FAILED})
# Kafka's IsolationLevel.READ_COMMITTED.
READ_COMMITTED = 1
# Fetch v7 brought sessions; older requests are sessionless.
FETCH_SESSIONS_VERSION_MIN = 7
ZERO_UUID = uuid.UUID(int=0)
# What one partition of a fetch asks: (topic name from the request, topic id, the partition's
# request, its key in the session or None without one).
_Wanted = tuple[str, uuid.UUID, m.FetchRequest.FetchPartition, PartitionKey | None]


@dataclass(slots=True)
class _PartitionRead:
    topic: str
    topic_id: uuid.UUID
    data: PartitionData
    region: FileRegion | None = None
    # A consumer's offset below the local log start, to be read from the remote tier, and the
    # bytes it may take; the batches rebuilt from it.
    remote_offset: int | None = None
    remote_max_bytes: int = 0
    remote_batches: bytes | None = None
    # A read_committed consumer's remote read: cut at the LSO, with the aborted transactions.
    remote_read_committed: bool = False
    # Offsets the response hands out from the fetch offset on (riverbed_topic_records_out).
    offsets_out: int = 0
    key: PartitionKey | None = None  # in the fetch session
    # Readable data beyond the fetch offset (whether or not this response had room for it).
    more_to_read: bool = False

    @property
    def size_bytes(self) -> int:
        if self.region is not None:
            return self.region.size
        return len(self.remote_batches or b"")


async def handle_fetch(
    ctx: BrokerContext, request: m.FetchRequest, version: int, access: Access
) -> m.FetchResponse:
    replica_id = request.replica_state.replica_id if version >= 15 else request.replica_id
    follower = replica_id >= 0
    sessions = ctx.fetch_sessions
    now_ms = monotonic_ms()
    session: FetchSession | None = None
    full = version < FETCH_SESSIONS_VERSION_MIN or request.session_epoch in (
        INITIAL_EPOCH,
        FINAL_EPOCH,
    )
    if full:
        if version >= FETCH_SESSIONS_VERSION_MIN and request.session_id != INVALID_SESSION_ID:
            sessions.remove(request.session_id)  # a full fetch closes the session it names
        if version >= FETCH_SESSIONS_VERSION_MIN and request.session_epoch == INITIAL_EPOCH:
            size = sum(len(topic.partitions) for topic in request.topics)
            session = sessions.new_session(
                follower=follower, size=size, version=version, now_ms=now_ms
            )
    else:
        opened = sessions.open_incremental(request.session_id, request.session_epoch, version)
        if isinstance(opened, ErrorCode):
            return m.FetchResponse(error_code=opened, session_id=INVALID_SESSION_ID)
        session = opened
        _update_session(ctx, session, request)
        if not sessions.continued(session, now_ms):
            session, full = None, True  # it held nothing more: a sessionless answer
    wanted = _requested(request, session)
    if session is None or full:
        return await _serve(ctx, request, version, access, replica_id, wanted, session)
    return await _serve(ctx, request, version, access, replica_id, None, session)


def _requested(request: m.FetchRequest, session: FetchSession | None) -> list[_Wanted]:
    """The partitions the request names; each joins `session`, if any (a full fetch)."""
    uses_ids = session is not None and session.uses_topic_ids
    wanted: list[_Wanted] = []
    for topic in request.topics:
        for partition in topic.partitions:
            key: PartitionKey | None = None
            if session is not None:
                key = (topic.topic_id if uses_ids else topic.topic, partition.partition)
                session.put(key, topic.topic, topic.topic_id, partition)
            wanted.append((topic.topic, topic.topic_id, partition, key))
    return wanted


def _update_session(ctx: BrokerContext, session: FetchSession, request: m.FetchRequest) -> None:
    """An incremental request's changes: the partitions it names join or update the session,
    its forgotten ones leave it (and stop marking it)."""
    _requested(request, session)
    uses_ids = session.uses_topic_ids
    for forgotten in request.forgotten_topics_data:
        for index in forgotten.partitions:
            key: PartitionKey = (forgotten.topic_id if uses_ids else forgotten.topic, index)
            cached = session.forget(key)
            if cached is None:
                continue
            name, _ = _resolve_topic(ctx, cached.topic, cached.topic_id, uses_ids)
            partition = ctx.partitions.get(name, index) if name is not None else None
            if partition is not None:
                partition.watches.pop(session.watch, None)


async def _serve(
    ctx: BrokerContext,
    request: m.FetchRequest,
    version: int,
    access: Access,
    replica_id: int,
    wanted: list[_Wanted] | None,
    session: FetchSession | None,
) -> m.FetchResponse:
    """Read and long-poll: the partitions `wanted` (a full fetch, which `session` starts if
    given), or what `session` must read (an incremental fetch, `wanted` None)."""
    loop = asyncio.get_running_loop()
    max_wait_ms = min(max(request.max_wait_ms, 0), FETCH_MAX_WAIT_MS_MAX)
    deadline = loop.time() + max_wait_ms / 1000
    uses_ids = version >= 13
    read_committed = request.isolation_level == READ_COMMITTED and replica_id < 0
    watch = session.watch if session is not None else None
    incremental = wanted is None
    arrived = True
    while True:
        if session is not None and incremental:
            to_read: list[_Wanted] = [
                (cached.topic, cached.topic_id, cached.wanted, key)
                for key, cached in session.to_read()
            ]
        else:
            assert wanted is not None
            to_read = wanted
        denied = _denied_topics(ctx, to_read, uses_ids, replica_id, access)
        reads = _read_all(
            ctx,
            to_read,
            request.max_bytes,
            uses_ids,
            replica_id,
            denied,
            arrived,
            watch,
            read_committed,
        )
        arrived = False
        await _read_remote(ctx, reads)
        size_bytes = sum(r.size_bytes for r in reads)
        # Like Kafka, the partitions the principal may not read do not end the long poll of the
        # others (a consumer would spin on them), but a fetch of only those is answered at once.
        # An incremental fetch with nothing to read waits for its session's partitions.
        has_error = any(r.data.error_code not in _WAITING_CODES for r in reads)
        readable = any(r.data.error_code != ErrorCode.TOPIC_AUTHORIZATION_FAILED for r in reads)
        readable = readable or (incremental and not reads)
        remaining_s = deadline - loop.time()
        if size_bytes >= request.min_bytes or has_error or remaining_s <= 0 or not readable:
            _count_out(ctx.metrics, reads, FOLLOWER if replica_id >= 0 else CONSUMER)
            return _response(reads, session, incremental=incremental)
        _release(reads)
        if watch is not None:
            await _wait_for_change(watch, remaining_s)
        else:
            await _wait_for_data(ctx, reads, remaining_s, follower=replica_id >= 0)


def _denied_topics(
    ctx: BrokerContext, wanted: list[_Wanted], uses_ids: bool, replica_id: int, access: Access
) -> frozenset[str]:
    """Topics the fetch may not read, checked once per read round: a follower needs
    CLUSTER_ACTION on the cluster for all of them, a consumer READ on each."""
    if not access.enabled:
        return frozenset()
    names = {
        name
        for name, _ in (_resolve_topic(ctx, t, tid, uses_ids) for t, tid, _, _ in wanted)
        if name
    }
    if replica_id >= 0:
        return (
            frozenset() if access.allows_cluster(AclOperation.CLUSTER_ACTION) else frozenset(names)
        )
    return access.denied(AclOperation.READ, ResourceType.TOPIC, list(names))


def _read_all(
    ctx: BrokerContext,
    wanted: list[_Wanted],
    max_bytes: int,
    uses_ids: bool,
    replica_id: int,
    denied: frozenset[str],
    arrived: bool,
    watch: FetchWatch | None,
    read_committed: bool,
) -> list[_PartitionRead]:
    """Read every wanted partition once, within the request's byte budgets (`arrived`: the
    first read of the request, not one after its long poll woke; `watch`: the fetch session's,
    which each partition read marks from now on; `read_committed`: a consumer's fetch at
    read_committed)."""
    reads: list[_PartitionRead] = []
    budget_bytes = max_bytes
    anything_read = False
    for topic, topic_id_asked, partition_wanted, key in wanted:
        name, topic_id = _resolve_topic(ctx, topic, topic_id_asked, uses_ids)
        data = PartitionData(
            partition_index=partition_wanted.partition,
            high_watermark=-1,
            last_stable_offset=-1,
            log_start_offset=-1,
            aborted_transactions=None,
        )
        read = _PartitionRead(name or "", topic_id, data, key=key)
        reads.append(read)
        if name is None:
            data.error_code = ErrorCode.UNKNOWN_TOPIC_ID
            continue
        if name in denied:
            data.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            continue
        try:
            result = _read_partition(
                ctx,
                name,
                partition_wanted,
                read,
                budget_bytes,
                replica_id=replica_id,
                first_non_empty=not anything_read,
                arrived=arrived,
                watch=watch,
                read_committed=read_committed,
            )
        except KafkaError as error:
            if not _goes_remote(
                ctx, read, partition_wanted, error, budget_bytes, replica_id, reads, read_committed
            ):
                data.error_code = error.code
            continue
        if result is not None:
            read.region = result.region
            read.offsets_out = result.next_offset - partition_wanted.fetch_offset
            budget_bytes -= result.region.size
            anything_read = True
    return reads


def _resolve_topic(
    ctx: BrokerContext, topic: str, topic_id: uuid.UUID, uses_ids: bool
) -> tuple[str | None, uuid.UUID]:
    """(name, id) of a requested topic: by id from Fetch v13 on (None: unknown id), by name
    before."""
    if uses_ids:
        metadata = ctx.cache.topic_by_id(topic_id)
        return (metadata.name if metadata is not None else None), topic_id
    metadata = ctx.cache.topic(topic)
    return topic, (metadata.topic_id if metadata is not None else ZERO_UUID)


def _read_partition(
    ctx: BrokerContext,
    topic: str,
    wanted: m.FetchRequest.FetchPartition,
    read: _PartitionRead,
    budget_bytes: int,
    *,
    replica_id: int,
    first_non_empty: bool,
    arrived: bool,
    watch: FetchWatch | None,
    read_committed: bool,
) -> ReadResult | None:
    data = read.data
    partition = ctx.leader_partition(topic, wanted.partition, wanted.current_leader_epoch)
    if watch is not None:
        partition.watches[watch] = None  # from now on its changes mark the session
    partition_log = partition.log
    if replica_id >= 0:
        # Checked against the log's range before it counts as the follower's position.
        # A replica starts at whole batches: below the log start if DeleteRecords cut a batch.
        start, end = partition_log.replica_start_offset(), partition_log.log_end_offset
        if wanted.fetch_offset < start and ctx.tiering is not None:
            # Kafka's answer when the rest is in the remote tier. The follower restarts its log
            # at our local log start, which (unlike Kafka) log_start_offset carries here: the
            # follower is the only reader of this answer.
            data.log_start_offset = start
            raise KafkaError(
                ErrorCode.OFFSET_MOVED_TO_TIERED_STORAGE,
                f"{partition}: follower offset {wanted.fetch_offset} is below the local log "
                f"start {start}",
            )
        if not start <= wanted.fetch_offset <= end:
            # With our log start: a follower below it (retention ran while it was away)
            # restarts its log there.
            data.log_start_offset = start
            raise KafkaError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"{partition}: follower offset {wanted.fetch_offset} is outside [{start}, {end}]",
            )
        if arrived:
            # Once per request, as Kafka updates a follower's state: after a long poll the
            # follower is where it was, and the HW and the ISR were settled with it then.
            partition.record_follower_fetch(
                replica_id, wanted.fetch_offset, monotonic_ms(), wanted.log_start_offset, watch
            )
            if replica_id not in partition.isr:
                ctx.isr_manager.check(partition)  # it may have caught up enough to rejoin
        max_offset = partition_log.log_end_offset
    else:
        max_offset = (
            partition.last_stable_offset if read_committed else partition_log.high_watermark
        )
    data.high_watermark = partition_log.high_watermark
    data.last_stable_offset = partition.last_stable_offset
    if read_committed:
        data.aborted_transactions = []
    if replica_id >= 0:
        # What the follower's log start follows. On a tiered topic not the whole log's start
        # as far as a manifest in memory tells (that may be the local start, above records
        # only the remote tier holds), but the start DeleteRecords and remote retention set.
        tiered = ctx.tiering is not None and ctx.tiering.enabled_for(topic)
        data.log_start_offset = (
            partition_log.truncated_before if tiered else partition_log.log_start_offset
        )
    else:
        data.log_start_offset = ctx.known_log_start_offset(partition)
    read.more_to_read = wanted.fetch_offset < max_offset
    if replica_id >= 0 and wanted.fetch_offset == max_offset:
        return None  # a follower at our log end (its offset was range-checked above)
    max_bytes = min(wanted.partition_max_bytes, budget_bytes)
    if max_bytes <= 0 and not first_non_empty:
        return None
    result = partition_log.read(
        wanted.fetch_offset, max(max_bytes, 0), max_offset, from_replica=replica_id >= 0
    )
    if result is None:
        return None
    if result.region.size > max_bytes and not first_non_empty:
        # KIP-74 lets only the first partition with data exceed the budget.
        result.region.close()
        return None
    if read_committed:
        data.aborted_transactions = [
            AbortedTransaction(producer_id=txn.producer_id, first_offset=txn.first_offset)
            for txn in partition_log.aborted_transactions(wanted.fetch_offset, result.next_offset)
        ]
    return result


def _goes_remote(
    ctx: BrokerContext,
    read: _PartitionRead,
    wanted: m.FetchRequest.FetchPartition,
    error: KafkaError,
    budget_bytes: int,
    replica_id: int,
    reads: list[_PartitionRead],
    read_committed: bool,
) -> bool:
    """Whether a consumer's out-of-range offset lies in the remote tier: then the partition is
    read from there (the first such partition of a request only, as Kafka does, so one slow
    object read delays no more than one partition; the others are answered empty and without
    error, and come in a later fetch)."""
    if error.code != ErrorCode.OFFSET_OUT_OF_RANGE or replica_id >= 0 or ctx.tiering is None:
        return False
    partition = ctx.partitions.get(read.topic, wanted.partition)
    if partition is None or not ctx.tiering.enabled_for(read.topic):
        return False
    if wanted.fetch_offset >= partition.log.log_start_offset:
        return False  # past the end: out of range
    read.data.high_watermark = partition.log.high_watermark
    read.data.last_stable_offset = partition.last_stable_offset
    if any(r.remote_offset is not None for r in reads):
        # Not OFFSET_OUT_OF_RANGE: that would make the consumer reset its position.
        read.data.log_start_offset = ctx.known_log_start_offset(partition)
        return True
    # Below the local log: whether the remote tier holds it is for _read_remote to say.
    read.remote_offset = wanted.fetch_offset
    read.remote_max_bytes = max(min(wanted.partition_max_bytes, budget_bytes), 0)
    read.remote_read_committed = read_committed
    return True


async def _read_remote(ctx: BrokerContext, reads: list[_PartitionRead]) -> None:
    for read in reads:
        if read.remote_offset is None or read.remote_batches is not None:
            continue
        partition = ctx.partitions.get(read.topic, read.data.partition_index)
        if ctx.tiering is None or partition is None:
            read.data.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
            continue
        metrics = ctx.metrics
        metrics.remote_fetches.inc()
        started_s = time.perf_counter()
        try:
            read.data.log_start_offset = await ctx.tiering.log_start_offset(partition)
            batches = await ctx.tiering.read(partition, read.remote_offset, read.remote_max_bytes)
        except KafkaError as error:
            metrics.remote_fetch_errors.inc()
            read.data.error_code = error.code
            continue
        except Exception as failure:  # the store failed after its retries: the consumer retries
            metrics.remote_fetch_errors.inc()
            log.warning("%s: cold read at %d failed: %s", partition, read.remote_offset, failure)
            read.data.error_code = ErrorCode.KAFKA_STORAGE_ERROR
            continue
        metrics.remote_fetch_seconds.observe(time.perf_counter() - started_s)
        if batches is None:
            read.data.error_code = ErrorCode.OFFSET_OUT_OF_RANGE
            continue
        if read.remote_read_committed:
            batches = _below(batches, partition.last_stable_offset)
            end_offset = _next_offset(batches, read.remote_offset)
            try:
                aborted = await ctx.tiering.aborted_transactions(
                    partition, read.remote_offset, end_offset
                )
            except KafkaError as error:
                read.data.error_code = error.code
                continue
            read.data.aborted_transactions = [
                AbortedTransaction(producer_id=txn.producer_id, first_offset=txn.first_offset)
                for txn in aborted
            ]
        read.remote_batches = batches
        read.offsets_out = _next_offset(batches, read.remote_offset) - read.remote_offset


def _below(batches: bytes, offset: int) -> bytes:
    """The whole batches of `batches` that end below `offset` (headers only)."""
    end = 0
    for position, header in iter_batch_headers(batches):
        if header.last_offset >= offset:
            return batches[:position]
        end = position + header.size_bytes
    return batches[:end]


def _next_offset(batches: bytes, offset: int) -> int:
    """The offset after the last of `batches` (headers only; `offset` if there are none)."""
    for _, header in iter_batch_headers(batches):
        offset = header.last_offset + 1
    return offset


def _count_out(metrics: BrokerMetrics, reads: list[_PartitionRead], reader: str) -> None:
    for read in reads:
        if read.size_bytes:
            traffic = metrics.traffic_out(read.topic, reader)
            traffic.bytes.inc(read.size_bytes)
            traffic.records.inc(max(read.offsets_out, 0))


async def _wait_for_data(
    ctx: BrokerContext, reads: list[_PartitionRead], timeout_s: float, *, follower: bool
) -> None:
    """Park until new data is readable in one of the read partitions (an append for followers,
    a HW move for consumers), or the timeout."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    parked = []
    for read in reads:
        if read.data.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
            continue  # its data is not for this fetch
        partition = ctx.partitions.get(read.topic, read.data.partition_index)
        if partition is not None:
            waiters = partition.end_waiters if follower else partition.data_waiters
            waiters.park(future)
            parked.append(waiters)
    # The timeout resolves the future as new data does (the caller looks again either way):
    # a bare timer, not asyncio.timeout, which costs a Timeout object and a cancellation of
    # this task to undo on every parked fetch.
    timer = loop.call_later(timeout_s, _wake, future)
    try:
        await future
    finally:
        timer.cancel()
        for waiters in parked:
            waiters.unpark(future)


async def _wait_for_change(watch: FetchWatch, timeout_s: float) -> None:
    """Park a session's fetch until one of its partitions has news for it (an append for a
    follower, a HW move for a consumer, any role or log start change), or the timeout: one
    future for the whole session, however many partitions it holds."""
    if watch.changed:
        return  # marked while this round read: look again at once
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    watch.park(future)
    timer = loop.call_later(timeout_s, _wake, future)
    try:
        await future
    finally:
        timer.cancel()
        watch.unpark()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _response(
    reads: list[_PartitionRead], session: FetchSession | None, *, incremental: bool
) -> m.FetchResponse:
    """The answer: every read partition, except that an incremental one carries only those
    with records, an error or a moved offset (which the session remembers)."""
    topics: list[TopicResponse] = []
    by_topic: dict[tuple[str, uuid.UUID], TopicResponse] = {}
    for read in reads:
        if read.region is not None:
            read.data.records = read.region
        else:
            read.data.records = read.remote_batches or b""
        if session is not None and read.key is not None:
            include = session.answer(read.key, read.data, read.size_bytes, read.more_to_read)
            if incremental and not include:
                continue
        key = (read.topic, read.topic_id)
        topic = by_topic.get(key)
        if topic is None:
            topic = TopicResponse(topic=read.topic, topic_id=read.topic_id)
            by_topic[key] = topic
            topics.append(topic)
        topic.partitions.append(read.data)
    session_id = session.id if session is not None else INVALID_SESSION_ID
    return m.FetchResponse(error_code=ErrorCode.NONE, session_id=session_id, responses=topics)


def _release(reads: list[_PartitionRead]) -> None:
    for read in reads:
        if read.region is not None:
            read.region.close()
            read.region = None
