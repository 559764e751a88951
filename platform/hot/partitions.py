"""The partitions this broker hosts, and the waiting rooms of requests parked on them.

A `Partition` pairs a `PartitionLog` with the role ZooKeeper gives this broker for it (leader and
leader epoch). Fetch requests that want more data than there is park a future on each partition
they read (`DataWaiters`); an append that moves the high watermark wakes them. Nothing polls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from riverbed.hot.log import AppendResult, LogConfig, PartitionLog
from riverbed.hot.log_manager import LogManager
from riverbed.hot.producer_state import DuplicateBatch, ProducerStateManager, load_producer_state
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records import BatchHeader, stamp_log_append_time

log = logging.getLogger(__name__)


@dataclass(eq=False)
class DataWaiters:
    """Futures of parked fetches, resolved when new data becomes readable (the HW moves)."""

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


class Partition:
    """A replica of one partition on this broker.

    Replication arrives in a later issue: for now every partition has one replica, so the leader's
    log end offset is also its high watermark as soon as an append returns.
    """

    def __init__(
        self, topic: str, index: int, log: PartitionLog, producer_state: ProducerStateManager
    ) -> None:
        self.topic = topic
        self.index = index
        self.log = log
        self.producer_state = producer_state
        self.leader_epoch = -1
        self.is_leader = False
        # message.timestamp.type=LogAppendTime: the broker stamps batches with its clock.
        self.log_append_time = False
        self.data_waiters = DataWaiters()

    def become_leader(self, leader_epoch: int) -> None:
        if leader_epoch < self.leader_epoch:
            raise ValueError(
                f"{self.topic}-{self.index}: leader epoch went back "
                f"from {self.leader_epoch} to {leader_epoch}"
            )
        self.leader_epoch = leader_epoch
        self.is_leader = True

    def become_non_leader(self, leader_epoch: int) -> None:
        self.leader_epoch = max(self.leader_epoch, leader_epoch)
        self.is_leader = False

    def check_leader(self, current_leader_epoch: int = -1) -> None:
        """Raise the error a client must see when it talks to the wrong replica or epoch."""
        if not self.is_leader:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"not the leader of {self}")
        if current_leader_epoch >= 0:
            if current_leader_epoch > self.leader_epoch:
                raise KafkaError(ErrorCode.UNKNOWN_LEADER_EPOCH, f"{self}: epoch is newer")
            if current_leader_epoch < self.leader_epoch:
                raise KafkaError(ErrorCode.FENCED_LEADER_EPOCH, f"{self}: epoch is fenced")

    def append_as_leader(
        self, records: memoryview, headers: list[BatchHeader], now_ms: int
    ) -> AppendResult | DuplicateBatch:
        """Append validated batches; `now_ms` stamps them when the topic uses LogAppendTime.
        A retried idempotent batch already in the log is not appended: its offsets come back."""
        self.check_leader()
        # check, append, on_append: no await in between, so no other append can interleave.
        duplicate = self.producer_state.check(headers)
        if duplicate is not None:
            return duplicate
        if self.log_append_time:
            headers = stamp_log_append_time(records, headers, now_ms)
        result = self.log.append(records, headers, self.leader_epoch)
        rolled = result.segment_base_offset == result.first_offset
        if rolled and result.first_offset > self.log.log_start_offset:
            # Snapshot the state as of the new segment's base offset, so that reopening the
            # log replays at most the active segment.
            self.producer_state.take_snapshot(self.log.directory, result.first_offset)
        self.producer_state.on_append(headers, result.first_offset)
        # Single replica: everything appended is committed.
        self.log.update_high_watermark(self.log.log_end_offset)
        self.data_waiters.wake_all()
        return result

    def snapshot_producer_state(self) -> None:
        """Called on clean shutdown, after the last append: the next open scans nothing."""
        self.producer_state.take_snapshot(self.log.directory, self.log.log_end_offset)

    def __str__(self) -> str:
        return f"{self.topic}-{self.index}"


class PartitionManager:
    """Owns the `Partition` objects of this broker, keyed by (topic, partition)."""

    def __init__(self, log_manager: LogManager) -> None:
        self._log_manager = log_manager
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

    def ensure(self, topic: str, index: int, config: LogConfig) -> Partition:
        """The hosted partition, opened if new; topic config changes apply live."""
        partition = self._partitions.get((topic, index))
        if partition is None:
            partition_log = self._log_manager.get_or_create(topic, index, config)
            producer_state = load_producer_state(
                partition_log.directory, partition_log.log_end_offset, partition_log.batch_headers
            )
            partition = Partition(topic, index, partition_log, producer_state)
            self._partitions[(topic, index)] = partition
        elif partition.log.config != config:
            partition.log.update_config(config)
            log.info("applied new log config to %s", partition)
        return partition

    def remove(self, topic: str, index: int, *, delete_data: bool) -> None:
        partition = self._partitions.pop((topic, index), None)
        if partition is None:
            return
        partition.is_leader = False
        partition.data_waiters.wake_all()
        if delete_data:
            self._log_manager.delete(topic, index)
            log.info("deleted partition log %s", partition)

    def hosted(self) -> set[tuple[str, int]]:
        return set(self._partitions)

    def hosts_topic(self, topic: str) -> bool:
        return any(name == topic for name, _ in self._partitions)
