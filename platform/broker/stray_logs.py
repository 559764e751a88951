"""Local logs whose topic ZooKeeper no longer names: kept until a DeleteTopics says they may go.

A log becomes *stray* when its topic disappears from the metadata, or when the topic of its name
has another id (deleted and created again while this broker was away). Neither alone proves the
topic was deleted: a ZooKeeper wiped, restored from an old backup, or pointed at by a wrong
chroot looks the same. Deleting on that evidence is how a metadata accident becomes data loss,
so a stray log is closed and kept, and deleted only when a DeleteTopics marker
(`/admin/delete_topics/<topic id>`, layout.TopicDeletion) names the id in its partition.metadata.
A stray log that no marker names stays on disk, unserved, with one error line saying so; if its
topic comes back (a restored ZooKeeper), the broker hosts it again.

One task resolves strays, woken when some are noted and once at start: it reads the markers,
deletes the logs they name, takes this broker out of every marker it has finished (so the last
broker deletes the marker), and asks for a metadata pass when it deleted something, so that a
partition of a topic created again under the old name is hosted afresh.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Final

from riverbed.common.log_events import event
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.zk import ZkError
from riverbed.hot.replication.partitions import PartitionManager
from riverbed.hot.storage.log_manager import LogManager
from riverbed.hot.storage.partition_metadata import PartitionMetadataError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

# After ZooKeeper failed a pass (unreachable, session moving): the pass is tried again then.
RETRY_BACKOFF_MS: Final = 1_000


class StrayLogs:
    """Owns the stray logs of one broker and the task that resolves them."""

    def __init__(
        self,
        store: ClusterMetadataStore,
        log_manager: LogManager,
        partitions: PartitionManager,
        broker_id: int,
        on_deleted: Callable[[], None],
    ) -> None:
        self._store = store
        self._log_manager = log_manager
        self._partitions = partitions
        self._broker_id = broker_id
        self._on_deleted = on_deleted
        self._strays: set[TopicPartition] = set()
        self._reported: set[TopicPartition] = set()  # each kept log is reported once
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def note(self, topic: str, index: int) -> None:
        """The log of (topic, index) is not this broker's to serve or to delete on its own."""
        self._strays.add((topic, index))
        self._wakeup.set()

    def __contains__(self, key: TopicPartition) -> bool:
        return key in self._strays

    def start(self) -> None:
        self._wakeup.set()  # markers left from before this start may name logs here
        self._task = asyncio.get_running_loop().create_task(self._run(), name="stray logs")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            try:
                deleted = await self._resolve()
            except ZkError as error:
                log.warning("stray logs: ZooKeeper failed the check, retrying: %s", error)
                await asyncio.sleep(RETRY_BACKOFF_MS / 1000)
                self._wakeup.set()
                continue
            if deleted:
                self._on_deleted()

    async def _resolve(self) -> bool:
        """One pass; True if it deleted a log."""
        markers = await self._store.topic_deletions()
        deletable = {marker.topic_id for marker in markers}
        deleted = False
        for key in sorted(self._strays):
            if self._partitions.get(*key) is not None or self._log_manager.get(*key) is None:
                self._forget(key)  # hosted again (its topic is back), or gone
                continue
            topic_id = self._topic_id(key)
            if topic_id is not None and topic_id in deletable:
                self._delete(key, topic_id)
                deleted = True
            elif key not in self._reported:
                self._reported.add(key)
                self._report(key, topic_id)
        for marker in markers:
            if self._broker_id in marker.replicas and not self._holds(marker.topic_id):
                await self._store.finish_topic_deletion(marker.topic_id, self._broker_id)
        return deleted

    def _topic_id(self, key: TopicPartition) -> uuid.UUID | None:
        try:
            return self._log_manager.topic_id(*key)
        except PartitionMetadataError:
            return None  # reported as unreadable; never deleted on a guess

    def _holds(self, topic_id: uuid.UUID) -> bool:
        """Whether a log of `topic_id` is still here (hosted, or stray and not yet deleted)."""
        return any(self._topic_id(key) == topic_id for key in self._log_manager.partitions())

    def _delete(self, key: TopicPartition, topic_id: uuid.UUID) -> None:
        self._log_manager.delete(*key)
        self._forget(key)
        event(
            log,
            logging.INFO,
            "partition.deleted",
            topic=key[0],
            partition=key[1],
            topic_id=str(topic_id),
            reason="DeleteTopics",
        )

    def _forget(self, key: TopicPartition) -> None:
        self._strays.discard(key)
        self._reported.discard(key)

    def _report(self, key: TopicPartition, topic_id: uuid.UUID | None) -> None:
        topic, index = key
        try:
            self._log_manager.topic_id(topic, index)
        except PartitionMetadataError as error:
            why = f"its partition.metadata is unreadable ({error})"
        else:
            known = f"topic id {topic_id}" if topic_id is not None else "no topic id"
            why = f"its {known} is not {topic!r}'s in ZooKeeper and no DeleteTopics removed it"
        log.error(
            "keeping the log of %s-%d and not serving it: %s (the data stays in %s until the "
            "topic is back or an operator removes it)",
            topic,
            index,
            why,
            self._log_manager.data_dir,
        )
