"""Writes the ISR changes of the partitions this broker leads (Kafka's ZooKeeper-mode leader path:
the isr-expiration task and ISR expansion on follower fetches).

Changes wait in a queue and are written in batches, as Kafka's AlterPartition requests carry
every pending change at once: a restarted follower catches up on thousands of partitions
within a second or two, and one ZooKeeper read and write per partition was most of what its
return to the ISRs cost. A batch's states are re-read together (multiRead) and written in one
transaction, each conditional on its znode's version. If the leader or the leader epoch
changed, this broker lost the leadership and writes nothing for that partition (the watch
brings the new state); if only the version moved (the controller removed a dead replica), the
change is recomputed on the new ISR. A conflict fails the whole transaction: the partition
that changed is read again and the batch goes again. A shrink takes effect in memory only
once ZooKeeper has it, so the high watermark never counts on a replica the controller could
not elect. With ZooKeeper unreachable nothing is written: leaderships and acks go on with the
ISR as it was, and the next check retries.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter as Tally
from typing import Final

from prometheus_client import Counter
from riverbed.common.log_events import event
from riverbed.coordination.layout import MalformedZnodeError, PartitionState
from riverbed.coordination.metadata import ClusterMetadataStore, PartitionStateUpdate
from riverbed.coordination.zk import BadVersionError, NoNodeError, ZkError
from riverbed.hot.replication.followers import monotonic_ms
from riverbed.hot.replication.partitions import Partition, PartitionManager

log = logging.getLogger(__name__)

# Version conflicts of one partition before its change waits for the next check (each conflict
# means another writer moved the znode; a handful in a row means something is wrong).
ISR_WRITE_ATTEMPTS_MAX: Final = 5
# ISR changes per ZooKeeper transaction: ~100 bytes of state each, far below the 1 MiB limit.
ISR_WRITES_PER_TRANSACTION_MAX: Final = 500

_Key = tuple[str, int]


class IsrManager:
    """Owned by the broker: `start()` runs the periodic lag check and the writer, `stop()` ends
    both."""

    def __init__(
        self,
        store: ClusterMetadataStore,
        partitions: PartitionManager,
        *,
        broker_id: int,
        lag_max_ms: int,
        shrinks: Counter,
        expands: Counter,
    ) -> None:
        self._store = store
        self._shrinks = shrinks  # riverbed_isr_shrinks (the broker's metrics own both counters)
        self._expands = expands
        self._partitions = partitions
        self._broker_id = broker_id
        self._lag_max_ms = lag_max_ms
        # Changes to write, oldest first: the partition and the ISR it should have. A partition
        # stays here (or in the batch being written) until its change is written or dropped.
        self._queued: dict[_Key, tuple[Partition, frozenset[int]]] = {}
        self._queued_changed = asyncio.Event()
        self._conflicts: Tally[_Key] = Tally()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._check_periodically(), name="isr-expiration"),
            asyncio.create_task(self._write_queued(), name="isr-writes"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for partition, _ in self._queued.values():
            _settle(partition)
        self._queued.clear()

    def check(self, partition: Partition) -> None:
        """Queue the ISR `partition` should have now, if it differs (non-blocking)."""
        wanted = partition.wanted_isr(monotonic_ms(), self._lag_max_ms)
        if wanted is None:  # also while a change is queued or being written (pending_isr)
            return
        partition.pending_isr = wanted
        self._queued[(partition.topic, partition.index)] = (partition, wanted)
        self._queued_changed.set()

    async def _check_periodically(self) -> None:
        # Kafka checks every replica.lag.time.max.ms / 2.
        interval_s = self._lag_max_ms / 2000
        while True:
            await asyncio.sleep(interval_s)
            for partition in self._partitions:
                if partition.is_leader:
                    self.check(partition)

    async def _write_queued(self) -> None:
        while True:
            await self._queued_changed.wait()
            self._queued_changed.clear()
            while self._queued:
                # No check() adds to a partition being written: its pending_isr is set.
                keys = list(self._queued)[:ISR_WRITES_PER_TRANSACTION_MAX]
                batch = [self._queued.pop(key) for key in keys]
                try:
                    requeued = await self._write(batch)
                except (ZkError, MalformedZnodeError) as error:
                    log.warning(
                        "%d ISR changes not written (%s); retrying at the next check",
                        len(batch),
                        error,
                    )
                    requeued = []
                except Exception:
                    # A bug here must not end the one writer: every later ISR change would wait
                    # forever, silently. This batch is decided anew at the next check.
                    log.exception("%d ISR changes not written", len(batch))
                    requeued = []
                again = {(partition.topic, partition.index) for partition, _ in requeued}
                for partition, _ in batch:
                    if (partition.topic, partition.index) not in again:
                        _settle(partition)
                for partition, wanted in requeued:
                    self._queued[(partition.topic, partition.index)] = (partition, wanted)

    async def _write(
        self, batch: list[tuple[Partition, frozenset[int]]]
    ) -> list[tuple[Partition, frozenset[int]]]:
        """Write what `batch` still needs in one transaction; return the entries to write again
        (those of a transaction that failed on another writer's change)."""
        keys = [(partition.topic, partition.index) for partition, _ in batch]
        states = await self._store.read_partition_states(keys)
        todo: list[tuple[Partition, frozenset[int], PartitionState, PartitionStateUpdate]] = []
        for (partition, wanted), read in zip(batch, states, strict=True):
            decided = self._decide(partition, wanted, read)
            if decided is not None:
                todo.append((partition, *decided))
        if not todo:
            return []
        try:
            versions = await self._store.write_leader_states([update for *_, update in todo])
        except (BadVersionError, NoNodeError) as error:
            return self._after_conflict(todo, error)
        for (partition, _, before, update), version in zip(todo, versions, strict=True):
            self._conflicts.pop((partition.topic, partition.index), None)
            if partition.is_leader and partition.leader_epoch == update.state.leader_epoch:
                self._written(partition, before, update.state, version)
        return []

    def _decide(
        self,
        partition: Partition,
        wanted: frozenset[int],
        read: tuple[PartitionState, int] | None,
    ) -> tuple[frozenset[int], PartitionState, PartitionStateUpdate] | None:
        """The state to write for `partition`, from the state just read; None if nothing is to
        be written (leadership lost, topic deleted, or the change no longer needed)."""
        epoch = partition.leader_epoch
        if read is None or not self._still_leading(partition, epoch, read[0]):
            return None
        state, version = read
        if version != partition.state_version:
            # Someone else (the controller) changed the ISR: decide again on it.
            partition.isr_written(frozenset(state.isr), version)  # clears pending_isr
            recomputed = partition.wanted_isr(monotonic_ms(), self._lag_max_ms)
            if recomputed is None:
                return None
            wanted = recomputed
            partition.pending_isr = wanted
        new_state = PartitionState(
            leader=self._broker_id,
            leader_epoch=epoch,
            isr=tuple(r for r in partition.replicas if r in wanted),
            controller_epoch=state.controller_epoch,
        )
        update = PartitionStateUpdate(partition.topic, partition.index, new_state, version)
        return wanted, state, update

    def _after_conflict(
        self,
        todo: list[tuple[Partition, frozenset[int], PartitionState, PartitionStateUpdate]],
        error: BadVersionError | NoNodeError,
    ) -> list[tuple[Partition, frozenset[int]]]:
        """The transaction wrote nothing: every change goes again (re-read first), but the one
        whose znode changed only ISR_WRITE_ATTEMPTS_MAX times, and not if it is gone."""
        again = []
        for partition, wanted, _, update in todo:
            key = (partition.topic, partition.index)
            if update.path == error.path:
                self._conflicts[key] += 1
                if isinstance(error, NoNodeError) or self._conflicts[key] >= ISR_WRITE_ATTEMPTS_MAX:
                    del self._conflicts[key]
                    log.warning(
                        "%s: ISR change kept conflicting; retrying at the next check", partition
                    )
                    continue
            again.append((partition, wanted))
        return again

    def _written(
        self, partition: Partition, before: PartitionState, after: PartitionState, version: int
    ) -> None:
        event(
            log,
            logging.INFO,
            "partition.isr_changed",
            topic=partition.topic,
            partition=partition.index,
            isr=list(after.isr),
            previous_isr=list(before.isr),
            leader_epoch=after.leader_epoch,
        )
        self._count_change(frozenset(before.isr), frozenset(after.isr))
        partition.isr_written(frozenset(after.isr), version)

    def _count_change(self, before: frozenset[int], after: frozenset[int]) -> None:
        # A recomputed change may both drop and add replicas: it counts as both.
        if before - after:
            self._shrinks.inc()
        if after - before:
            self._expands.inc()

    def _still_leading(self, partition: Partition, epoch: int, state: PartitionState) -> bool:
        return (
            partition.is_leader
            and partition.leader_epoch == epoch
            and state.leader == self._broker_id
            and state.leader_epoch == epoch
        )


def _settle(partition: Partition) -> None:
    """The partition's change is no longer being written (written, dropped or failed): a
    later check decides anew."""
    partition.pending_isr = None
