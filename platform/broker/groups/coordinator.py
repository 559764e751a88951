"""The group coordinator of one broker: the groups of the `__consumer_offsets` partitions it leads.

`GroupCoordinator` composes the membership state machines (`GroupMembership`) and the committed
offsets (`OffsetStore`), and decides whether this broker may answer for a group at all: only for
a group whose partition it leads and has loaded (NOT_COORDINATOR otherwise, and
COORDINATOR_LOAD_IN_PROGRESS while the load runs).

Leadership arrives from the broker (`on_partition_role`, called whenever it applied a role to a
`__consumer_offsets` partition). Becoming leader starts a load task that replays the partition's
log; stopping to lead cancels it and drops the partition's groups, whose parked calls are answered
NOT_COORDINATOR so their clients look the coordinator up again. Like Kafka, a leader re-elected
at a higher epoch without having followed in between keeps its state: another leader's committed
writes would have needed this broker to fetch them (or to leave the ISR and catch up again to be
elected), which it only does as a follower, when its state is dropped.

Every write to the log goes through `_append`, which refuses a partition that is not loaded and
re-checks after the write that the partition was not unloaded (or reloaded) meanwhile, so no
write's outcome lands in memory that belongs to another leadership term.

Transactional offsets (TxnOffsetCommit) stay pending until the broker, having written the
transaction's marker to a `__consumer_offsets` partition it leads, calls `complete_transaction`.
A marker written while the partition still loads is remembered and applied once the load ends:
the load may have read the log's end before the marker landed (applying one the load did replay
finds nothing left to decide, and no later transaction of that producer can have been written
meanwhile, since TxnOffsetCommit waits for the load).

Expiry runs every `offsets.retention.check.interval.ms` (see riverbed.broker.groups.offset_store).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

from riverbed.broker.groups import log_store
from riverbed.broker.groups.group_values import GroupState
from riverbed.broker.groups.log_store import (
    CommittedOffset,
    Entry,
    OnAppended,
    TransactionalProducer,
)
from riverbed.broker.groups.membership import GroupMembership
from riverbed.broker.groups.offset_store import MS_PER_MINUTE, ExpiryBase, OffsetStore
from riverbed.broker.groups.offsets_topic import (
    OFFSETS_TOPIC,
    coordinator_of,
    ensure_offsets_topic,
    partition_for,
)
from riverbed.configs import BrokerConfig
from riverbed.coordination.layout import BrokerRegistration
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.metadata_cache import MetadataCache
from riverbed.hot.replication.partitions import Partition, PartitionManager
from riverbed.protocol import messages as m
from riverbed.protocol.data_messages import GroupMetadataValue
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition

log = logging.getLogger(__name__)

DescribedGroup = m.DescribeGroupsResponse.DescribedGroup
ListedGroup = m.ListGroupsResponse.ListedGroup


class GroupCoordinator:
    """Routes group requests to the membership and offsets of the groups this broker leads."""

    def __init__(
        self,
        config: BrokerConfig,
        cache: MetadataCache,
        store: ClusterMetadataStore,
        partitions: PartitionManager,
        now_ms: Callable[[], int],
    ) -> None:
        self._config = config
        self._cache = cache
        self._store = store
        self._partitions = partitions
        self._now_ms = now_ms
        self._membership = GroupMembership(config, self._persist_group, now_ms)
        self._offsets = OffsetStore(cache, self._append, config.offset_metadata_max_bytes)
        # The partition count of __consumer_offsets (fixed once created), as metadata shows it.
        self._partition_count = config.offsets_topic_num_partitions
        self._loading: dict[int, asyncio.Task[None]] = {}
        self._loaded: set[int] = set()
        # A load that failed: the partition answers COORDINATOR_NOT_AVAILABLE until it moves.
        self._failed: set[int] = set()
        # Bumped at every load: a write's outcome only counts in the term it was written in.
        self._terms: dict[int, int] = {}
        # Markers written while their partition loads: (producer id, committed), in order.
        self._ended_while_loading: dict[int, list[tuple[int, bool]]] = {}
        self._expiry_task: asyncio.Task[None] | None = None
        self._active = False

    def start(self) -> None:
        self._active = True
        self._expiry_task = asyncio.create_task(self._expiry_loop(), name="offsets-expiry")

    async def close(self) -> None:
        """Stop serving: parked calls are answered NOT_COORDINATOR, tasks end. Idempotent."""
        self._active = False
        tasks = [task for task in (self._expiry_task, *self._loading.values()) if task]
        self._expiry_task = None
        for index in sorted(self._owned()):
            self._unload(index)
        self._membership.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._membership.wait_closed()

    # -- leadership --------------------------------------------------------------------------------

    def on_partition_role(self, partition: Partition) -> None:
        """The broker applied a role to (or removed) a `__consumer_offsets` partition."""
        if partition.topic != OFFSETS_TOPIC:
            return
        topic = self._cache.topic(OFFSETS_TOPIC)
        if topic is not None:
            self._partition_count = len(topic.partitions)
        index = partition.index
        owned = index in self._owned()
        if partition.is_leader and not owned and self._active:
            self._terms[index] = self._terms.get(index, 0) + 1
            self._loading[index] = asyncio.create_task(
                self._load(index, partition), name=f"load-{partition}"
            )
            log.info("loading groups and offsets of %s", partition)
        elif not partition.is_leader and owned:
            self._unload(index)

    def _owned(self) -> set[int]:
        return set(self._loading) | self._loaded | self._failed

    async def _load(self, index: int, partition: Partition) -> None:
        started_ms = self._now_ms()
        try:
            loaded = await log_store.load(partition)
        except Exception:
            log.exception("cannot load groups and offsets of %s", partition)
            self._failed.add(index)
            del self._loading[index]
            return
        # No await from here on: the partition's groups appear at once.
        for group_id, value in loaded.groups.items():
            self._membership.load(group_id, value)
        for group_id, offsets in loaded.offsets.items():
            self._offsets.load(group_id, offsets)
        self._offsets.load_transactional(loaded.transactional)
        del self._loading[index]
        self._loaded.add(index)
        for producer_id, committed in self._ended_while_loading.pop(index, []):
            self.complete_transaction(index, producer_id, committed)
        log.info(
            "loaded %d groups and the offsets of %d groups from %s in %d ms",
            len(loaded.groups),
            len(loaded.offsets),
            partition,
            self._now_ms() - started_ms,
        )

    def _unload(self, index: int) -> None:
        task = self._loading.pop(index, None)
        if task is not None:
            task.cancel()
        self._loaded.discard(index)
        self._failed.discard(index)
        self._ended_while_loading.pop(index, None)
        group_ids = [
            group_id
            for group_id in self._group_ids()
            if partition_for(group_id, self._partition_count) == index
        ]
        self._membership.unload(group_ids)
        self._offsets.unload(group_ids)
        log.info("unloaded %d groups of %s-%d", len(group_ids), OFFSETS_TOPIC, index)

    def _group_ids(self) -> set[str]:
        return {g.group_id for g in self._membership.list([])} | self._offsets.group_ids()

    # -- placement ---------------------------------------------------------------------------------

    async def find(self, group_id: str) -> BrokerRegistration:
        """FindCoordinator: the broker leading the group's partition (the topic is created on
        first use). Raises KafkaError(COORDINATOR_NOT_AVAILABLE) while there is none."""
        topic = await ensure_offsets_topic(self._cache, self._store, self._config)
        return coordinator_of(self._cache, topic, group_id)

    def _check(self, group_id: str, *, allow_empty_id: bool = False) -> None:
        """Raise the error of a request for a group this broker cannot answer for now."""
        if not group_id and not allow_empty_id:
            raise KafkaError(ErrorCode.INVALID_GROUP_ID, "the group id is empty")
        if not self._active:
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the coordinator is stopped")
        index = partition_for(group_id, self._partition_count)
        if index in self._loaded:
            return
        if index in self._loading:
            raise KafkaError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, f"{OFFSETS_TOPIC}-{index} is loading"
            )
        if index in self._failed:
            raise KafkaError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{OFFSETS_TOPIC}-{index} failed to load"
            )
        raise KafkaError(
            ErrorCode.NOT_COORDINATOR, f"this broker does not lead {OFFSETS_TOPIC}-{index}"
        )

    # -- membership --------------------------------------------------------------------------------

    async def join(
        self, request: m.JoinGroupRequest, version: int, client_id: str, client_host: str
    ) -> m.JoinGroupResponse:
        self._check(request.group_id)
        return await self._membership.join(request, version, client_id, client_host)

    async def sync(self, request: m.SyncGroupRequest, version: int) -> m.SyncGroupResponse:
        self._check(request.group_id)
        return await self._membership.sync(request, version)

    def heartbeat(self, request: m.HeartbeatRequest) -> m.HeartbeatResponse:
        self._check(request.group_id)
        return self._membership.heartbeat(request)

    async def leave(self, request: m.LeaveGroupRequest, version: int) -> m.LeaveGroupResponse:
        self._check(request.group_id)
        return await self._membership.leave(request, version)

    def describe(self, group_id: str) -> DescribedGroup:
        self._check(group_id, allow_empty_id=True)
        described = self._membership.describe(group_id)
        if self._membership.group_state(group_id) is None and self._offsets.has_offsets(group_id):
            # A group known only by its offsets (simple consumers): Kafka shows it Empty.
            described.group_state = GroupState.EMPTY.value
        return described

    def list_groups(self, states_filter: Sequence[str]) -> list[ListedGroup]:
        """Every group of the loaded partitions in one of `states_filter` (all if empty);
        raises COORDINATOR_LOAD_IN_PROGRESS while a partition loads, as Kafka does."""
        if not self._active:
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the coordinator is stopped")
        if self._loading:
            raise KafkaError(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "partitions are loading")
        listed = self._membership.list(list(states_filter))
        wanted = {state.lower() for state in states_filter}
        if not wanted or GroupState.EMPTY.value.lower() in wanted:
            known = {g.group_id for g in self._membership.list([])}
            listed += [
                ListedGroup(group_id=group_id, protocol_type="", group_state=GroupState.EMPTY.value)
                for group_id in sorted(self._offsets.group_ids() - known)
            ]
        return listed

    async def delete_groups(self, group_ids: Sequence[str]) -> dict[str, ErrorCode]:
        """DeleteGroups: Empty groups (and groups with only offsets) go with their offsets."""
        results: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            try:
                results[group_id] = await self._delete_group(group_id)
            except KafkaError as error:
                results[group_id] = error.code
        return results

    async def _delete_group(self, group_id: str) -> ErrorCode:
        self._check(group_id, allow_empty_id=True)
        if self._membership.group_state(group_id) is not None:
            code = await self._membership.delete(group_id)
            if code != ErrorCode.NONE:
                return code
        elif not self._offsets.has_offsets(group_id):
            return ErrorCode.GROUP_ID_NOT_FOUND
        await self._offsets.remove_group(group_id)
        return ErrorCode.NONE

    async def _persist_group(self, group_id: str, value: GroupMetadataValue | None) -> None:
        """GroupMembership's persistence: write the group's metadata (or its tombstone)."""
        try:
            await self._append(group_id, [log_store.group_metadata_entry(group_id, value)])
        except KafkaError as error:
            raise log_store.coordinator_error(error, commit=False) from error

    # -- offsets -----------------------------------------------------------------------------------

    async def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> dict[TopicPartition, ErrorCode]:
        """OffsetCommit: the error code of each partition."""
        # Unknown partitions are refused first, whoever coordinates the group (as Kafka does).
        codes = dict.fromkeys(
            self._offsets.unknown_partitions(offsets), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
        known = {tp: committed for tp, committed in offsets.items() if tp not in codes}
        if not known:
            return codes
        try:
            self._check(group_id, allow_empty_id=True)
        except KafkaError as error:
            return codes | dict.fromkeys(known, error.code)
        code = self._membership.check_commit(group_id, generation_id, member_id, group_instance_id)
        if code != ErrorCode.NONE:
            return codes | dict.fromkeys(known, code)
        return codes | await self._offsets.commit(group_id, known)

    async def commit_transactional_offsets(
        self,
        group_id: str,
        producer: TransactionalProducer,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> dict[TopicPartition, ErrorCode]:
        """TxnOffsetCommit: the error code of each partition. The offsets are pending until
        `complete_transaction`; the producer's epoch is checked by the log as the batch is
        appended (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED pass through to the client)."""
        codes = dict.fromkeys(
            self._offsets.unknown_partitions(offsets), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
        known = {tp: committed for tp, committed in offsets.items() if tp not in codes}
        if not known:
            return codes
        try:
            self._check(group_id)  # unlike OffsetCommit, an empty group id is INVALID_GROUP_ID
        except KafkaError as error:
            return codes | dict.fromkeys(known, error.code)
        code = self._membership.check_commit(
            group_id, generation_id, member_id, group_instance_id, transactional=True
        )
        if code != ErrorCode.NONE:
            return codes | dict.fromkeys(known, code)
        return codes | await self._offsets.commit_transactional(group_id, producer, known)

    def complete_transaction(self, partition_index: int, producer_id: int, committed: bool) -> None:
        """A marker for `producer_id` is committed in `__consumer_offsets-<partition_index>`,
        which this broker leads: its pending offsets in the partition's groups become the
        committed offsets (`committed`) or are dropped."""
        if partition_index in self._loading:
            self._ended_while_loading.setdefault(partition_index, []).append(
                (producer_id, committed)
            )
            return
        if partition_index not in self._loaded:
            # Not led here (any more): the partition's next leader replays the marker.
            return
        group_ids = [
            group_id
            for group_id in self._offsets.transactional_groups(producer_id)
            if partition_for(group_id, self._partition_count) == partition_index
        ]
        completed = self._offsets.complete_transaction(producer_id, group_ids, committed)
        if completed:
            log.debug(
                "%s offsets of producer %d in groups %s",
                "committed" if committed else "aborted",
                producer_id,
                sorted(completed),
            )

    def fetch_offsets(
        self, group_id: str, partitions: Collection[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        """OffsetFetch: the committed offsets of `partitions` (None: all the group has);
        pending transactional offsets are not among them."""
        self._check(group_id, allow_empty_id=True)
        return self._offsets.fetch(group_id, partitions)

    def unstable_offsets(
        self, group_id: str, partitions: Collection[TopicPartition]
    ) -> set[TopicPartition]:
        """Those of `partitions` with a pending transactional offset (OffsetFetch with
        require_stable answers them UNSTABLE_OFFSET_COMMIT, as Kafka does)."""
        self._check(group_id, allow_empty_id=True)
        return self._offsets.unstable(group_id, partitions)

    def committed_offsets(self) -> Iterator[tuple[str, TopicPartition, int]]:
        """(group, partition, committed offset) of every group this coordinator has loaded."""
        for group_id in sorted(self._offsets.group_ids()):
            for tp, committed in self._offsets.fetch(group_id, None).items():
                if committed is not None:
                    yield group_id, tp, committed.offset

    # -- the log -----------------------------------------------------------------------------------

    async def _append(
        self,
        group_id: str,
        entries: Sequence[Entry],
        *,
        producer: TransactionalProducer | None = None,
        on_appended: OnAppended | None = None,
    ) -> int:
        """Write entries to the group's partition (in `producer`'s transaction if given); the
        first one's offset once committed. Raises KafkaError with the storage's code."""
        index = partition_for(group_id, self._partition_count)
        partition = self._partitions.get(OFFSETS_TOPIC, index)
        if partition is None or index not in self._loaded:
            raise KafkaError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{OFFSETS_TOPIC}-{index} is not loaded here"
            )
        term = self._terms.get(index)
        first_offset = await log_store.append(
            partition,
            entries,
            self._now_ms(),
            self._config.offsets_commit_timeout_ms,
            producer=producer,
            on_appended=on_appended,
        )
        if index not in self._loaded or self._terms.get(index) != term:
            # Committed, but the new coordinator loads it from the log; this broker forgot
            # the group meanwhile, so the client must ask there.
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{partition}: leadership moved")
        return first_offset

    # -- expiry ------------------------------------------------------------------------------------

    async def _expiry_loop(self) -> None:
        interval_s = self._config.offsets_retention_check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.expire_offsets()
            except Exception:  # a bug in one round must not end expiry for good
                log.exception("offset expiry failed")

    async def expire_offsets(self) -> int:
        """One expiry round: tombstone expired offsets; an Empty group left without offsets
        is deleted. Returns how many offsets expired."""
        now_ms = self._now_ms()
        retention_ms = self._config.offsets_retention_minutes * MS_PER_MINUTE
        removed = 0
        for group_id in sorted(self._group_ids()):
            if partition_for(group_id, self._partition_count) not in self._loaded:
                continue  # unloaded during an earlier group's write
            base = self._expiry_base(group_id)
            if base is None:
                continue
            expired = self._offsets.expired(group_id, base, now_ms, retention_ms)
            try:
                await self._offsets.remove(group_id, expired)
                removed += len(expired)
                if self._membership.group_state(
                    group_id
                ) is GroupState.EMPTY and not self._offsets.has_offsets(group_id):
                    await self._membership.delete(group_id)
            except KafkaError as error:
                # Retried at the next round (the offsets stay until their tombstones commit).
                log.warning("group %s: cannot remove expired offsets: %s", group_id, error)
        if removed:
            log.info("expired %d offsets in %d ms", removed, self._now_ms() - now_ms)
        return removed

    def _expiry_base(self, group_id: str) -> ExpiryBase | None:
        """How the group's offsets age (None: they do not, in its state)."""
        state = self._membership.group_state(group_id)
        if state is None:  # offsets only: a "simple" consumer's, by commit time
            return ExpiryBase()
        if state is GroupState.EMPTY:
            return ExpiryBase(since_ms=self._membership.state_timestamp_ms(group_id))
        if state is GroupState.STABLE:
            topics = self._membership.subscribed_topics(group_id)
            return None if topics is None else ExpiryBase(kept_topics=frozenset(topics))
        return None
