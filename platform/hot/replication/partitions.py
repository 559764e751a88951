"""The partitions this broker hosts, their replica roles, and the requests parked on them.

A `Partition` pairs a `PartitionLog` with the role ZooKeeper gives this broker for it: leader
(tracking its followers, the ISR and the high watermark) or follower (appending what it fetched
from the leader). Requests park futures instead of polling: consumer fetches on `data_waiters`
(woken when the high watermark moves), follower fetches on `end_waiters` (woken by appends), and
acks=all produce requests on `commit_waiters` (released once the high watermark passes them).
See docs/replication.md for the rules.

Transactions: the producer state tracks each partition's open and completed transactions; after
every change to them or to the HW the partition tells its log the first unstable offset, so the
log's last stable offset (LSO) is right for readers and the cleaner. The LSO moves only when
the HW does (a transaction starts at the log end, above the HW, and ends with a marker that only
counts once the HW passes it), so consumers at read_committed park on the same waiters as at
read_uncommitted. Markers reach a leader through `append_txn_marker` (WriteTxnMarkers) and a
follower through replication; either way aborted transactions enter the log's txn index.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from riverbed.hot.replication.fetch_watch import (
    END_MOVED,
    HIGH_WATERMARK_MOVED,
    OTHER_CHANGE,
    FetchWatch,
)
from riverbed.hot.replication.followers import FollowerTracker
from riverbed.hot.storage.log import AppendResult, LogConfig, PartitionLog
from riverbed.hot.storage.log_manager import LogManager
from riverbed.hot.storage.partition_metadata import ForeignLogError, PartitionMetadataError
from riverbed.hot.storage.producer_state import (
    DuplicateBatch,
    ProducerStateManager,
    load_producer_state,
)
from riverbed.hot.storage.transactions import AppendOrigin
from riverbed.protocol.control_records import ControlType, encode_marker_batch, read_marker
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records import BatchHeader, parse_batch_header, stamp_log_append_time

log = logging.getLogger(__name__)

NO_LEADER = -1
ZERO_UUID = uuid.UUID(int=0)


@dataclass(eq=False)
class DataWaiters:
    """Futures of parked fetches, resolved when new data becomes readable."""

    _futures: set[asyncio.Future[None]] = field(default_factory=set)

    def park(self, future: asyncio.Future[None]) -> None:
        self._futures.add(future)

    def unpark(self, future: asyncio.Future[None]) -> None:
        self._futures.discard(future)

    def wake_all(self) -> None:
        futures, self._futures = self._futures, set()
        for future in futures:
            if not future.done():
                future.set_result(None)


class CommitWaiters:
    """Requests waiting for an offset to reach theirs: acks=all appends for the high watermark,
    DeleteRecords for the low watermark."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()  # ties on the offset never compare futures

    def park(self, end_offset: int) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (end_offset, next(self._order), future))
        return future

    def release_up_to(self, high_watermark: int) -> None:
        while self._heap and self._heap[0][0] <= high_watermark:
            future = heapq.heappop(self._heap)[2]
            if not future.done():
                future.set_result(None)

    def fail_all(self, error: KafkaError) -> None:
        waiting, self._heap = self._heap, []
        for _, _, future in waiting:
            if not future.done():
                future.set_exception(error)

    def __len__(self) -> int:
        return len(self._heap)


class Partition:
    """A replica of one partition on this broker, leading or following."""

    def __init__(
        self,
        topic: str,
        index: int,
        log: PartitionLog,
        producer_state: ProducerStateManager,
        broker_id: int,
    ) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = ZERO_UUID  # set by the owner: which topic of this name the log holds
        self.log = log
        self.producer_state = producer_state
        self.broker_id = broker_id
        self.leader_id = NO_LEADER
        self.leader_epoch = -1
        self.replicas: tuple[int, ...] = ()
        # The ISR as committed in ZooKeeper, and the znode version it was read or written at.
        self.isr: frozenset[int] = frozenset()
        self.state_version = -1
        # An ISR change being written to ZooKeeper; the HW counts on its union with `isr`.
        self.pending_isr: frozenset[int] | None = None
        self.min_insync_replicas = 1
        # message.timestamp.type=LogAppendTime: the broker stamps batches with its clock.
        self.log_append_time = False
        self.data_waiters = DataWaiters()
        self.end_waiters = DataWaiters()
        self.commit_waiters = CommitWaiters()
        # DeleteRecords requests waiting for every in-sync replica's log start to follow.
        self.low_watermark_waiters = CommitWaiters()
        # The fetch sessions holding this partition: each is told what moves here, so it reads
        # only changed partitions (riverbed.hot.replication.fetch_watch). Closed ones linger
        # until the next change drops them.
        self.watches: dict[FetchWatch, None] = {}
        self._followers: FollowerTracker | None = None
        self._epoch_start_offset = 0
        # The lowest LSO this leadership may answer from now on (-1: not leading).
        self._lso_floor = -1
        self._sync_unstable()

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.broker_id

    # -- roles ---------------------------------------------------------------------------------

    def become_leader(
        self,
        leader_epoch: int,
        replicas: tuple[int, ...],
        isr: frozenset[int],
        state_version: int,
        now_ms: int,
    ) -> bool:
        """Lead at `leader_epoch` (or take in a new ISR at the current one); True if this
        started a new leadership term."""
        if leader_epoch < self.leader_epoch:
            raise ValueError(
                f"{self}: leader epoch went back from {self.leader_epoch} to {leader_epoch}"
            )
        new_term = not self.is_leader or leader_epoch != self.leader_epoch
        if not new_term and replicas != self.replicas and self._followers is not None:
            # A reassignment's replica set can reach us after its leader epoch did.
            self._followers.set_followers(r for r in replicas if r != self.broker_id)
        self.replicas = replicas
        if new_term or state_version >= self.state_version:  # not an older state arriving late
            self.isr = isr
            self.state_version = state_version
        if new_term:
            self.leader_id = self.broker_id
            self.leader_epoch = leader_epoch
            self.pending_isr = None
            self._epoch_start_offset = self.log.log_end_offset
            # In memory: the log writes the checkpoint before its recovery point passes it.
            self.log.leader_epochs.assign(leader_epoch, self._epoch_start_offset)
            followers = (replica for replica in replicas if replica != self.broker_id)
            self._followers = FollowerTracker(followers, isr, now_ms)
            self._lso_floor = -1
            # Fetch sessions must read it again: their followers' states here start over.
            self.notify_watches(OTHER_CHANGE)
        self.maybe_advance_high_watermark()
        return new_term

    def become_follower(
        self, leader_id: int, leader_epoch: int, replicas: tuple[int, ...], isr: frozenset[int]
    ) -> bool:
        """Follow `leader_id` (NO_LEADER: wait for one); True if leader or epoch changed."""
        changed = leader_id != self.leader_id or leader_epoch != self.leader_epoch
        was_leader = self.is_leader
        self.leader_id = leader_id
        self.leader_epoch = max(self.leader_epoch, leader_epoch)
        self.replicas = replicas
        self.isr = isr
        self.pending_isr = None
        self._followers = None
        if was_leader:
            self._resign()
        if changed or was_leader:
            self.notify_watches(OTHER_CHANGE)
        return changed

    def close(self) -> None:
        """The partition is no longer hosted here: answer everything parked on it."""
        if self.is_leader:
            self._resign()
        self.leader_id = NO_LEADER

    def _resign(self) -> None:
        moved = KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{self}: leadership moved")
        self.commit_waiters.fail_all(moved)
        self.low_watermark_waiters.fail_all(moved)
        self.data_waiters.wake_all()
        self.end_waiters.wake_all()
        self.notify_watches(OTHER_CHANGE)

    def notify_watches(self, change: int) -> None:
        """Tell the fetch sessions holding this partition that `change` happened (a
        fetch_watch constant); drop those that closed since."""
        watches = self.watches
        if not watches:
            return
        closed = None
        for watch in watches:
            if watch.open:
                watch.mark(self.topic, self.topic_id, self.index, change)
            else:
                closed = [watch] if closed is None else [*closed, watch]
        for watch in closed or ():
            del watches[watch]

    def log_start_moved(self) -> None:
        """The leader's log start moved (DeleteRecords): fetch sessions answer the new one."""
        self.notify_watches(OTHER_CHANGE)

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed consumers stop (see riverbed.hot.storage.log). Never moves back
        while this broker leads."""
        lso = self.log.last_stable_offset
        if self.is_leader:
            if lso < self._lso_floor:
                raise RuntimeError(f"{self}: the LSO went back from {self._lso_floor} to {lso}")
            self._lso_floor = lso
        return lso

    def _sync_unstable(self) -> None:
        """Tell the log the producer state's first unstable offset (after a change of the
        transactions or of the HW)."""
        self.log.first_unstable_offset = self.producer_state.first_unstable_offset(
            self.log.high_watermark
        )

    def check_leader(self, current_leader_epoch: int = -1) -> None:
        """Raise the error a client must see when it talks to the wrong replica or epoch."""
        if current_leader_epoch >= 0:
            if current_leader_epoch > self.leader_epoch:
                raise KafkaError(ErrorCode.UNKNOWN_LEADER_EPOCH, f"{self}: epoch is newer")
            if current_leader_epoch < self.leader_epoch:
                raise KafkaError(ErrorCode.FENCED_LEADER_EPOCH, f"{self}: epoch is fenced")
        if not self.is_leader:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"not the leader of {self}")

    # -- leader: appends, followers, high watermark --------------------------------------------

    def append_as_leader(
        self,
        records: memoryview,
        headers: list[BatchHeader],
        now_ms: int,
        origin: AppendOrigin = AppendOrigin.CLIENT,
    ) -> AppendResult | DuplicateBatch:
        """Append validated batches; `now_ms` stamps them when the topic uses LogAppendTime.
        A retried idempotent batch already in the log is not appended: its offsets come back.
        `origin`: who writes (AppendOrigin.COORDINATOR: a coordinator's records written for a
        producer, which carry no sequence numbers to check)."""
        self.check_leader()
        # A storage error before the sequence check: see log.WRITE_REFUSED_BACKOFF_MS.
        self.log.check_writable()
        # check, append, on_append: no await in between, so no other append can interleave.
        duplicate = self.producer_state.check(headers, origin)
        if duplicate is not None:
            return duplicate
        if self.log_append_time:
            headers = stamp_log_append_time(records, headers, now_ms)
        if self._followers is not None:
            # Followers fetching through sessions were caught up until now without saying so.
            self._followers.before_end_moves(self.log.log_end_offset)
        result = self.log.append(records, headers, self.leader_epoch)
        self._after_append(result)
        self.producer_state.on_append(headers, result.first_offset)
        if any(header.is_transactional for header in headers):
            self._sync_unstable()
        self.end_waiters.wake_all()
        self.notify_watches(END_MOVED)
        self.maybe_advance_high_watermark()
        return result

    def append_txn_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        control_type: ControlType,
        now_ms: int,
    ) -> AppendResult:
        """Append a transaction's COMMIT or ABORT marker as leader (WriteTxnMarkers). Raises
        KafkaError: INVALID_PRODUCER_EPOCH for a marker older than the producer's epoch,
        TRANSACTION_COORDINATOR_FENCED for one from an older coordinator, or the leader and
        storage errors of any append. The caller waits for the HW to pass it."""
        self.check_leader()
        self.log.check_writable()
        self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
        batch = encode_marker_batch(
            producer_id, producer_epoch, control_type, coordinator_epoch, now_ms
        )
        records = memoryview(bytearray(batch))
        headers = [parse_batch_header(records)]
        if self.log_append_time:
            headers = stamp_log_append_time(records, headers, now_ms)
        if self._followers is not None:
            self._followers.before_end_moves(self.log.log_end_offset)
        result = self.log.append(records, headers, self.leader_epoch)
        self._after_append(result)
        placed = parse_batch_header(records)  # with the offset the append gave it
        aborted = self.producer_state.on_marker(placed, control_type, coordinator_epoch)
        if aborted is not None:
            self.log.record_aborted_txn(aborted)
        self._sync_unstable()
        self.end_waiters.wake_all()
        self.notify_watches(END_MOVED)
        self.maybe_advance_high_watermark()
        return result

    def record_follower_fetch(
        self,
        follower_id: int,
        fetch_offset: int,
        now_ms: int,
        log_start_offset: int = -1,
        watch: FetchWatch | None = None,
    ) -> None:
        """A follower fetched from `fetch_offset`: it has every offset below it, and its log
        starts at `log_start_offset` (-1: it did not say). `watch`: the fetch session it
        fetches through, which goes on fetching the partition at that offset on each of its
        requests (None: a sessionless fetch)."""
        followers = self._followers
        if followers is None or follower_id not in followers:
            raise KafkaError(
                ErrorCode.REPLICA_NOT_AVAILABLE, f"broker {follower_id} is not a replica of {self}"
            )
        moved = followers.on_fetch(
            follower_id, fetch_offset, self.log.log_end_offset, now_ms, log_start_offset, watch
        )
        # The HW is the lowest log end of the ISR, so a follower's fetch can only raise it when
        # that follower's log end rose (ISR changes and appends to a leader alone advance it
        # where they happen). A replica fetch names every partition the follower copies from
        # this leader, and on those nobody writes to nothing moves.
        if moved:
            self.maybe_advance_high_watermark()
        if self.low_watermark_waiters:
            self.low_watermark_waiters.release_up_to(self.low_watermark(self.log.log_start_offset))

    def low_watermark(self, leader_start_offset: int) -> int:
        """The lowest log start of the in-sync replicas, given the leader's (on a tiered topic,
        the start of its whole log)."""
        followers = self._followers
        if followers is None:
            return leader_start_offset
        return followers.low_watermark(
            self.isr | (self.pending_isr or frozenset()), leader_start_offset
        )

    def log_start_followed(self, offset: int) -> asyncio.Future[None]:
        """A future resolved once every in-sync replica's log starts at `offset` or later
        (DeleteRecords' wait, after this leader's own start moved there), failed with
        NOT_LEADER_OR_FOLLOWER if leadership moves first."""
        future = self.low_watermark_waiters.park(offset)
        self.low_watermark_waiters.release_up_to(self.low_watermark(self.log.log_start_offset))
        return future

    def maybe_advance_high_watermark(self) -> bool:
        """Move the HW to the highest offset every ISR member has (pending changes counted, so
        the HW never relies on a replica ZooKeeper does not list yet)."""
        followers = self._followers
        if followers is None:
            return False
        members = self.isr | (self.pending_isr or frozenset())
        bound = followers.high_watermark_bound(members, self.log.log_end_offset)
        if bound <= self.log.high_watermark:
            return False
        self.log.update_high_watermark(bound)
        self._sync_unstable()
        self.commit_waiters.release_up_to(bound)
        self.data_waiters.wake_all()
        self.notify_watches(HIGH_WATERMARK_MOVED)
        return True

    def wanted_isr(self, now_ms: int, lag_max_ms: int) -> frozenset[int] | None:
        """The ISR this leader should write now (lagging members out, caught-up replicas in), or
        None if it is fine or a change is already being written."""
        followers = self._followers
        if followers is None or self.pending_isr is not None:
            return None
        end_offset = self.log.log_end_offset
        lagging = followers.out_of_sync(self.isr, end_offset, now_ms, lag_max_ms)
        joining = followers.ready_to_join(
            set(self.replicas) - self.isr, self.log.high_watermark, self._epoch_start_offset
        )
        wanted = ((self.isr - lagging) | joining) | {self.broker_id}
        return None if wanted == self.isr else frozenset(wanted)

    def isr_written(self, isr: frozenset[int], state_version: int) -> None:
        """ZooKeeper accepted the ISR change (or a re-read showed the current one)."""
        self.isr = isr
        self.state_version = state_version
        self.pending_isr = None
        self.maybe_advance_high_watermark()
        if self.low_watermark_waiters:  # a lagging replica that left no longer holds it back
            self.low_watermark_waiters.release_up_to(self.low_watermark(self.log.log_start_offset))

    def high_watermark_behind_epoch(self) -> bool:
        """A new leader whose HW is still below the start of its epoch: until its followers
        fetch, it cannot tell what is committed, so offsets it would name are stale (Kafka's
        KIP-207 answers ListOffsets with OFFSET_NOT_AVAILABLE then)."""
        return self.is_leader and self.log.high_watermark < self._epoch_start_offset

    def committed(self, end_offset: int) -> asyncio.Future[None]:
        """A future resolved once the HW reaches `end_offset` (at once if it has), failed with
        NOT_LEADER_OR_FOLLOWER if this broker stops leading first."""
        future = self.commit_waiters.park(end_offset)
        self.commit_waiters.release_up_to(self.log.high_watermark)
        return future

    def under_min_isr(self) -> bool:
        return len(self.isr) < self.min_insync_replicas

    # -- follower ------------------------------------------------------------------------------

    def append_as_follower(
        self, records: memoryview, headers: list[BatchHeader], leader_high_watermark: int
    ) -> None:
        """Append batches fetched from the leader as they are, then follow its HW. Markers
        among them end their transactions here too (aborted ones enter the txn index)."""
        result = self.log.append_as_follower(records, headers)
        self._after_append(result)
        with_markers = []
        position = 0
        transactional = False
        for header in headers:
            marker = None
            if header.is_control:
                try:
                    marker = read_marker(records, position, header)
                except KafkaError as error:  # not a marker: replayed as Kafka skips it
                    log.warning("%s: %s", self, error)
            transactional = transactional or header.is_transactional
            with_markers.append((header, marker))
            position += header.size_bytes
        for aborted in self.producer_state.rebuild(with_markers):
            self.log.record_aborted_txn(aborted)
        if transactional:
            self._sync_unstable()
        self.follow_high_watermark(leader_high_watermark)

    def follow_log_start(self, leader_log_start_offset: int) -> None:
        """Follow the leader's log start (DeleteRecords, retention): records below it are gone
        from the partition, so the local segments wholly below it go too."""
        target = min(leader_log_start_offset, self.log.log_end_offset)
        if self.log.advance_log_start_offset(target):
            self.log.delete_segments_below(target, reason="log start")

    def follow_high_watermark(self, leader_high_watermark: int) -> None:
        target = min(leader_high_watermark, self.log.log_end_offset)
        if target > self.log.high_watermark:
            self.log.update_high_watermark(target)
            self._sync_unstable()

    def truncate_to(self, offset: int) -> None:
        """Drop a divergent tail (offsets >= `offset`) and rebuild the producer state."""
        if offset >= self.log.log_end_offset:
            return
        self.log.truncate_to(offset)
        self.producer_state = load_producer_state(
            self.log.directory,
            self.log.log_end_offset,
            self.log.batches_with_markers,
            on_aborted=self.log.record_aborted_txn,
        )
        self._sync_unstable()

    def restart_at(self, offset: int) -> None:
        """Start over, empty, at the leader's local log start (our log ends below it: the
        offsets in between are only in the remote tier, or retention deleted them). Producer
        state starts empty too: Kafka restores it from a remote snapshot, which Riverbed does
        not upload yet."""
        self.log.restart_at(offset)
        self.producer_state = ProducerStateManager()
        self._sync_unstable()

    # -- shared --------------------------------------------------------------------------------

    def _after_append(self, result: AppendResult) -> None:
        rolled = result.segment_base_offset == result.first_offset
        if rolled and result.first_offset > self.log.log_start_offset:
            # Snapshot the state as of the new segment's base offset, so that reopening the
            # log replays at most the active segment.
            self.producer_state.take_snapshot(self.log.directory, result.first_offset)

    def snapshot_producer_state(self) -> None:
        """Called on clean shutdown, after the last append: the next open scans nothing. Not
        fsynced: LogManager.close syncs the file system before it writes the clean marker."""
        self.producer_state.take_snapshot(
            self.log.directory, self.log.log_end_offset, durable=False
        )

    def __str__(self) -> str:
        return f"{self.topic}-{self.index}"


class PartitionManager:
    """Owns the `Partition` objects of this broker, keyed by (topic, partition)."""

    def __init__(self, log_manager: LogManager, broker_id: int) -> None:
        self._log_manager = log_manager
        self._broker_id = broker_id
        self._partitions: dict[tuple[str, int], Partition] = {}

    def get(self, topic: str, index: int) -> Partition | None:
        return self._partitions.get((topic, index))

    def get_or_raise(self, topic: str, index: int) -> Partition:
        partition = self._partitions.get((topic, index))
        if partition is None:
            raise KafkaError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{index} is not hosted here"
            )
        return partition

    def __iter__(self) -> Iterator[Partition]:
        return iter(list(self._partitions.values()))

    def ensure(self, topic: str, index: int, config: LogConfig, topic_id: uuid.UUID) -> Partition:
        """The hosted partition, opened if new; topic config changes apply live.

        Raises ForeignLogError if the partition or its local log is another topic's of this
        name (one deleted and created again, or unreadable partition.metadata): the owner keeps
        that log and hosts nothing until it is resolved (riverbed.broker.stray_logs). A log from
        before partition.metadata is adopted by `topic_id`."""
        partition = self._partitions.get((topic, index))
        if partition is not None and partition.topic_id != topic_id:
            raise ForeignLogError(f"{partition} is hosted for topic id {partition.topic_id}")
        if partition is None:
            self._check_log_identity(topic, index, topic_id)
            partition_log = self._log_manager.get_or_create(topic, index, config, topic_id)
            producer_state = load_producer_state(
                partition_log.directory,
                partition_log.log_end_offset,
                partition_log.batches_with_markers,
                replay_from_max=partition_log.recovered_from,
                on_aborted=partition_log.record_aborted_txn,
            )
            partition = Partition(topic, index, partition_log, producer_state, self._broker_id)
            partition.topic_id = topic_id
            self._partitions[(topic, index)] = partition
        elif partition.log.config != config:
            partition.log.update_config(config)
            log.info("applied new log config to %s", partition)
        return partition

    def _check_log_identity(self, topic: str, index: int, topic_id: uuid.UUID) -> None:
        if self._log_manager.get(topic, index) is None:
            return  # a new log: created with `topic_id`
        try:
            stored = self._log_manager.topic_id(topic, index)
        except PartitionMetadataError as error:
            raise ForeignLogError(str(error)) from None
        if stored is None:
            self._log_manager.adopt(topic, index, topic_id)
            log.info("%s-%d: wrote partition.metadata (topic id %s)", topic, index, topic_id)
        elif stored != topic_id:
            raise ForeignLogError(f"the log of {topic}-{index} is of topic id {stored}")

    def remove(self, topic: str, index: int, *, delete_data: bool) -> None:
        partition = self._partitions.pop((topic, index), None)
        if partition is None:
            return
        partition.close()
        if delete_data:
            self._log_manager.delete(topic, index)
            log.info("deleted partition log %s", partition)

    def logs(self) -> Iterator[tuple[str, PartitionLog]]:
        """Each hosted partition's log with its topic's name: what the log cleaner and the
        retention task go through (riverbed.hot.storage knows logs, not replicas)."""
        return ((partition.topic, partition.log) for partition in list(self._partitions.values()))

    def hosted(self) -> set[tuple[str, int]]:
        return set(self._partitions)

    def hosts_topic(self, topic: str) -> bool:
        return any(name == topic for name, _ in self._partitions)
