"""Writes the ISR changes of the partitions this broker leads (Kafka's ZooKeeper-mode leader path:
the isr-expiration task and ISR expansion on follower fetches).

Every write is conditional on the state znode's version, after re-reading it: if the leader or
the leader epoch changed, this broker lost the leadership and writes nothing (the watch brings
the new state); if only the version moved (the controller removed a dead replica), the change is
recomputed on the new ISR. A shrink takes effect in memory only once ZooKeeper has it, so the
high watermark never counts on a replica the controller could not elect. With ZooKeeper
unreachable nothing is written: leaderships and acks go on with the ISR as it was, and the next
check retries.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from prometheus_client import Counter
from riverbed.common.log_events import event
from riverbed.coordination.layout import PartitionState
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.zk import BadVersionError, ZkError
from riverbed.hot.replication.followers import monotonic_ms
from riverbed.hot.replication.partitions import Partition, PartitionManager

log = logging.getLogger(__name__)

# Version conflicts on one change before giving up until the next check (each conflict means
# another writer moved the znode; a handful in a row means something is wrong).
ISR_WRITE_ATTEMPTS_MAX: Final = 5
# ISR writes in flight at once (each is a read and a conditional write to ZooKeeper).
ISR_WRITES_IN_FLIGHT_MAX: Final = 16


class IsrManager:
    """Owned by the broker: `start()` runs the periodic lag check, `stop()` ends every task."""

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
        self._writes: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(ISR_WRITES_IN_FLIGHT_MAX)
        self._checker: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._checker = asyncio.create_task(self._check_periodically(), name="isr-expiration")

    async def stop(self) -> None:
        tasks = list(self._writes.values())
        if self._checker is not None:
            tasks.append(self._checker)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def check(self, partition: Partition) -> None:
        """Start writing the ISR `partition` should have now, if it differs (non-blocking)."""
        wanted = partition.wanted_isr(monotonic_ms(), self._lag_max_ms)
        key = (partition.topic, partition.index)
        if wanted is None or key in self._writes:
            return
        partition.pending_isr = wanted
        task = asyncio.create_task(self._write(partition, wanted), name=f"isr-{partition}")
        self._writes[key] = task
        task.add_done_callback(lambda _: self._writes.pop(key, None))

    async def _check_periodically(self) -> None:
        # Kafka checks every replica.lag.time.max.ms / 2.
        interval_s = self._lag_max_ms / 2000
        while True:
            await asyncio.sleep(interval_s)
            for partition in self._partitions:
                if partition.is_leader:
                    self.check(partition)

    async def _write(self, partition: Partition, wanted: frozenset[int]) -> None:
        epoch = partition.leader_epoch
        try:
            async with self._slots:
                for _ in range(ISR_WRITE_ATTEMPTS_MAX):
                    state, version = await self._store.get_partition_state(
                        partition.topic, partition.index
                    )
                    if not self._still_leading(partition, epoch, state):
                        return
                    if version != partition.state_version:
                        # Someone else (the controller) changed the ISR: decide again on it.
                        partition.pending_isr = None
                        partition.isr_written(frozenset(state.isr), version)
                        recomputed = partition.wanted_isr(monotonic_ms(), self._lag_max_ms)
                        if recomputed is None:
                            return
                        wanted = recomputed
                        partition.pending_isr = wanted
                    new_state = PartitionState(
                        leader=self._broker_id,
                        leader_epoch=epoch,
                        isr=tuple(r for r in partition.replicas if r in wanted),
                        controller_epoch=state.controller_epoch,
                    )
                    try:
                        new_version = await self._store.update_partition_state(
                            partition.topic, partition.index, new_state, version
                        )
                    except BadVersionError:
                        continue
                    if partition.is_leader and partition.leader_epoch == epoch:
                        event(
                            log,
                            logging.INFO,
                            "partition.isr_changed",
                            topic=partition.topic,
                            partition=partition.index,
                            isr=list(new_state.isr),
                            previous_isr=list(state.isr),
                            leader_epoch=epoch,
                        )
                        self._count_change(frozenset(state.isr), frozenset(new_state.isr))
                        partition.isr_written(frozenset(new_state.isr), new_version)
                    return
                log.warning(
                    "%s: ISR change kept conflicting; retrying at the next check", partition
                )
        except ZkError as error:
            log.warning("%s: ISR change not written (%s); retrying later", partition, error)
        finally:
            if partition.pending_isr is wanted:
                partition.pending_isr = None

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
