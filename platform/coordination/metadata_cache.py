"""The broker's in-memory view of cluster metadata, kept current by ZooKeeper watches.

Two parts with one job each:

* `MetadataCache` holds the view and does no I/O: synchronous snapshot reads for request
  handlers, `apply_*` methods that fold one change in, and listeners told what changed (topics
  added/removed, partition states changed...) so the broker can open or close partition logs.
* `MetadataWatcher` owns the ZooKeeper watches and feeds the cache. Its callbacks all run on the
  event loop, so the cache is only ever touched from the loop thread.

A topic appears in the cache only once its assignment, every partition state and its config
overrides are all loaded, so a reader never sees half a topic. ZooKeeper watches on different
znodes can fire in any order, so a partition state or config znode counts only if it was created
no earlier than the topic's assignment (same transaction, same zxid): leftovers of a deleted
topic of the same name are never mixed into its successor.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from riverbed.coordination import layout
from riverbed.coordination.layout import (
    BrokerRegistration,
    MalformedZnodeError,
    PartitionState,
    TopicAssignment,
    TopicConfigOverrides,
)
from riverbed.coordination.zk import AsyncZooKeeper, NodeStat, WatchHandle, ZkError

log = logging.getLogger(__name__)

# Listeners run synchronously on every change; a broker needs a handful, not an open-ended list.
LISTENERS_MAX: Final = 64
# Topics and partition states whose reads failed while connected are read again after this.
STATE_READ_RETRY_MS: Final = 200


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    replicas: tuple[int, ...]
    leader: int  # layout.NO_LEADER (-1) when none
    leader_epoch: int
    isr: tuple[int, ...]
    # The state znode's version: leaders and the controller write it back conditionally on it.
    state_version: int = 0
    # The zxid of the state's last write: a broker registered later (see
    # MetadataCache.broker_epoch) has restarted since, and cannot hold a role this state gave it.
    state_modified_zxid: int = 0
    # A reassignment in progress: `replicas` is the full set, target replicas first.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """Where the partition is going (or is): the replicas not being removed."""
        return tuple(r for r in self.replicas if r not in self.removing_replicas)


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID
    partitions: Mapping[int, PartitionMetadata]
    configs: Mapping[str, str]  # overrides only; see riverbed.configs for effective values
    # The assignment znode's version: the controller rewrites it conditionally (reassignments).
    assignment_version: int = 0


@dataclass(frozen=True, slots=True)
class MetadataChange:
    """What one update changed; empty fields mean unchanged."""

    brokers_added: frozenset[int] = frozenset()
    brokers_removed: frozenset[int] = frozenset()
    topics_added: frozenset[str] = frozenset()
    topics_removed: tuple[TopicMetadata, ...] = ()  # with their ids, to delete the right logs
    partitions_changed: frozenset[tuple[str, int]] = frozenset()
    configs_changed: frozenset[str] = frozenset()
    controller_changed: bool = False
    broker_configs_changed: bool = False  # the cluster-wide dynamic broker configs

    def __bool__(self) -> bool:
        return any(
            (
                self.brokers_added,
                self.brokers_removed,
                self.topics_added,
                self.topics_removed,
                self.partitions_changed,
                self.configs_changed,
                self.controller_changed,
                self.broker_configs_changed,
            )
        )


Listener = Callable[[MetadataChange], None]


class MetadataCache:
    """Snapshot reads are plain synchronous methods; all state changes go through `apply_*`."""

    def __init__(self) -> None:
        self._brokers: dict[int, BrokerRegistration] = {}
        self._broker_epochs: dict[int, int] = {}  # broker -> its registration's creation zxid
        self._listed_broker_ids: frozenset[int] = frozenset()
        self._topics: dict[str, TopicMetadata] = {}
        self._topics_by_id: dict[uuid.UUID, TopicMetadata] = {}
        self._controller_id: int | None = None
        self._cluster_id: str | None = None
        self._broker_default_configs: Mapping[str, str] = {}
        self._listeners: list[Listener] = []

    # ---- reads ------------------------------------------------------------------------------

    @property
    def controller_id(self) -> int | None:
        return self._controller_id

    @property
    def cluster_id(self) -> str | None:
        return self._cluster_id

    @property
    def broker_default_configs(self) -> Mapping[str, str]:
        """The cluster-wide dynamic broker config overrides (/config/brokers/<default>)."""
        return self._broker_default_configs

    def brokers(self) -> Mapping[int, BrokerRegistration]:
        return dict(self._brokers)

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        return self._brokers.get(broker_id)

    def live_broker_ids(self) -> frozenset[int]:
        return frozenset(self._brokers)

    def listed_broker_ids(self) -> frozenset[int]:
        """The ids under /brokers/ids, including ones whose registration is still being read:
        the controller counts these as alive (they are), so it never drops a broker from an
        ISR merely because its registration arrived after the ISR change naming it."""
        return self._listed_broker_ids | frozenset(self._brokers)

    def broker_epoch(self, broker_id: int) -> int | None:
        """The broker's epoch (Kafka's KIP-380): the zxid that created its current registration.
        It grows with every restart or new ZooKeeper session; None while unknown."""
        return self._broker_epochs.get(broker_id)

    def topics(self) -> Mapping[str, TopicMetadata]:
        return dict(self._topics)

    def topic_names(self) -> frozenset[str]:
        return frozenset(self._topics)

    def topic(self, name: str) -> TopicMetadata | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMetadata | None:
        return self._topics_by_id.get(topic_id)

    def partition(self, topic: str, partition: int) -> PartitionMetadata | None:
        metadata = self._topics.get(topic)
        return None if metadata is None else metadata.partitions.get(partition)

    # ---- listeners --------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """`listener(change)` runs on the loop after every change, in order."""
        if len(self._listeners) >= LISTENERS_MAX:
            raise RuntimeError(f"more than {LISTENERS_MAX} metadata listeners")
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    async def wait_until(self, predicate: Callable[[MetadataCache], bool], timeout_ms: int) -> None:
        """Return once `predicate(cache)` holds, e.g. after a write, before answering a client
        whose next request must see it. Raises TimeoutError."""
        if predicate(self):
            return
        reached: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def check(_change: MetadataChange) -> None:
            if not reached.done() and predicate(self):
                reached.set_result(None)

        self.add_listener(check)
        try:
            async with asyncio.timeout(timeout_ms / 1000):
                await reached
        finally:
            self.remove_listener(check)

    # ---- updates (called by MetadataWatcher, on the loop) -----------------------------------

    def apply_broker_ids(self, broker_ids: frozenset[int]) -> None:
        """The children of /brokers/ids (their registrations follow through apply_broker)."""
        previous, self._listed_broker_ids = self._listed_broker_ids, broker_ids
        self._notify(
            MetadataChange(
                brokers_added=broker_ids - previous, brokers_removed=previous - broker_ids
            )
        )

    def apply_broker(
        self, broker_id: int, registration: BrokerRegistration | None, epoch: int = 0
    ) -> None:
        """A registration that replaces one with another epoch or timestamp is a new incarnation
        of the broker (a restart, or a new ZooKeeper session whose removal and re-creation one
        watch event covered): reported as the old one removed and the new one added."""
        previous = self._brokers.get(broker_id)
        previous_epoch = self._broker_epochs.get(broker_id)
        this = frozenset({broker_id})
        if registration is None:
            self._brokers.pop(broker_id, None)
            self._broker_epochs.pop(broker_id, None)
            self._listed_broker_ids -= this
            removed = this if previous is not None else frozenset()
            self._notify(MetadataChange(brokers_removed=removed))
            return
        self._brokers[broker_id] = registration
        self._broker_epochs[broker_id] = epoch
        if previous is None:
            self._notify(MetadataChange(brokers_added=this))
        elif previous.timestamp_ms != registration.timestamp_ms or previous_epoch != epoch:
            self._notify(MetadataChange(brokers_removed=this, brokers_added=this))

    def apply_cluster_id(self, cluster_id: str | None) -> None:
        self._cluster_id = cluster_id  # set once per cluster: not worth a change event

    def apply_broker_default_configs(self, overrides: Mapping[str, str]) -> None:
        changed = dict(overrides) != dict(self._broker_default_configs)
        self._broker_default_configs = dict(overrides)
        self._notify(MetadataChange(broker_configs_changed=changed))

    def apply_controller(self, controller_id: int | None) -> None:
        changed = controller_id != self._controller_id
        self._controller_id = controller_id
        self._notify(MetadataChange(controller_changed=changed))

    def apply_topic(self, metadata: TopicMetadata) -> None:
        """Insert or replace a whole topic; the change names exactly what differs."""
        previous = self._topics.get(metadata.name)
        if previous == metadata:
            return
        if previous is not None and previous.topic_id != metadata.topic_id:
            self._drop(previous)  # same name, new topic: report a removal and an addition
            self._store(metadata)
            self._notify(
                MetadataChange(topics_removed=(previous,), topics_added=frozenset({metadata.name}))
            )
            return
        self._store(metadata)
        if previous is None:
            self._notify(MetadataChange(topics_added=frozenset({metadata.name})))
            return
        changed = {
            (metadata.name, p)
            for p in set(previous.partitions) | set(metadata.partitions)
            if previous.partitions.get(p) != metadata.partitions.get(p)
        }
        configs = frozenset({metadata.name} if previous.configs != metadata.configs else ())
        self._notify(MetadataChange(partitions_changed=frozenset(changed), configs_changed=configs))

    def apply_partitions(self, name: str, states: Mapping[int, PartitionMetadata]) -> None:
        """Replace some partitions of a known topic: the cost follows the partitions that
        changed, not the topic's size (a leadership move touches a few of thousands)."""
        previous = self._topics.get(name)
        if previous is None:
            raise KeyError(f"topic {name!r} is not in the cache")
        changed = {p: state for p, state in states.items() if previous.partitions.get(p) != state}
        if not changed:
            return
        # Copy on write: readers keep the snapshot they hold. A dict copy is C-speed, far below
        # what each changed partition costs its listeners.
        self._store(replace(previous, partitions={**previous.partitions, **changed}))
        self._notify(MetadataChange(partitions_changed=frozenset((name, p) for p in changed)))

    def apply_topic_removed(self, name: str) -> None:
        previous = self._topics.get(name)
        if previous is not None:
            self._drop(previous)
            self._notify(MetadataChange(topics_removed=(previous,)))

    def _store(self, metadata: TopicMetadata) -> None:
        self._topics[metadata.name] = metadata
        self._topics_by_id[metadata.topic_id] = metadata

    def _drop(self, metadata: TopicMetadata) -> None:
        del self._topics[metadata.name]
        self._topics_by_id.pop(metadata.topic_id, None)

    def _notify(self, change: MetadataChange) -> None:
        if not change:
            return
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:  # one faulty listener must not starve the others
                log.exception("metadata listener %r failed", listener)


@dataclass(slots=True)
class _TopicParts:
    """What has been read of one topic so far; published to the cache once complete, then
    partition by partition as states change."""

    name: str
    assignment: TopicAssignment | None = None
    assignment_zxid: int = 0
    assignment_version: int = 0
    # partition -> (state, czxid, znode version, mzxid)
    states: dict[int, tuple[PartitionState, int, int, int]] = field(default_factory=dict)
    configs: tuple[Mapping[str, str], int] | None = None  # (overrides, czxid; 0 if no znode)
    handles: list[WatchHandle] = field(default_factory=list)
    # Partitions whose states have been asked for (the assignment named them).
    read_partitions: set[int] = field(default_factory=set)
    # Whether the cache holds this topic as last published whole; until then, and after its
    # assignment or configs change, the next publication rebuilds the whole topic.
    published: bool = False
    # Partitions whose state changed since the last publication.
    dirty_states: set[int] = field(default_factory=set)

    def publish(self, cache: MetadataCache) -> None:
        """Fold what changed into `cache`: the whole topic if needed, else only the partitions
        whose states changed, so a burst of state writes costs what it changes, not the number
        of partitions times the topic's size."""
        if not self.published or cache.topic(self.name) is None:
            metadata = self.complete()
            if metadata is None:
                return  # the rest is on its way; its watch publishes again
            cache.apply_topic(metadata)
            self.published = True
            self.dirty_states.clear()
            return
        assignment = self.assignment
        if assignment is None:
            return
        states: dict[int, PartitionMetadata] = {}
        for partition in self.dirty_states:
            if partition not in assignment.partitions:
                continue  # not (yet) part of the topic as the assignment knows it
            state = self._partition(assignment, partition)
            if state is None:
                return  # a state vanished (the topic is being deleted): keep the last view
            states[partition] = state
        self.dirty_states.clear()
        cache.apply_partitions(self.name, states)

    def complete(self) -> TopicMetadata | None:
        assignment = self.assignment
        if assignment is None or self.configs is None:
            return None
        overrides, config_zxid = self.configs
        if config_zxid and config_zxid < self.assignment_zxid:
            return None  # a predecessor's config; ours is on its way
        if len(self.states) < len(assignment.partitions):
            # States still on their way: said without building anything, since a new topic's
            # states arrive one watch at a time and each asks again.
            return None
        partitions: dict[int, PartitionMetadata] = {}
        for partition in assignment.partitions:
            state = self._partition(assignment, partition)
            if state is None:
                return None
            partitions[partition] = state
        return TopicMetadata(
            self.name, assignment.topic_id, partitions, dict(overrides), self.assignment_version
        )

    def _partition(self, assignment: TopicAssignment, partition: int) -> PartitionMetadata | None:
        """The partition as the cache holds it; None until its state of this topic is loaded."""
        loaded = self.states.get(partition)
        if loaded is None or loaded[1] < self.assignment_zxid:
            return None
        state, _created_zxid, version, modified_zxid = loaded
        return PartitionMetadata(
            assignment.partitions[partition],
            state.leader,
            state.leader_epoch,
            state.isr,
            version,
            modified_zxid,
            assignment.adding.get(partition, ()),
            assignment.removing.get(partition, ()),
        )


class MetadataWatcher:
    """Owns the watches on /brokers/ids, /brokers/topics (and each topic's znodes) and
    /controller, and folds every change into `cache` on the loop."""

    def __init__(self, zk: AsyncZooKeeper, cache: MetadataCache) -> None:
        self.zk = zk
        self.cache = cache
        self._handles: list[WatchHandle] = []
        self._broker_handles: dict[int, WatchHandle | None] = {}  # None: being set up
        self._topics: dict[str, _TopicParts] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._stopped = False
        # Topics with changes not yet in the cache, published together once the watch events
        # queued on the loop have been taken in (`_publish`).
        self._unpublished: dict[str, _TopicParts] = {}
        self._publication: asyncio.Handle | None = None
        # Partition states to read (again): named by a new assignment, or reported changed by
        # the watch on /brokers/topics. One task reads them, in multiRead batches.
        self._stale: set[tuple[str, int]] = set()
        self._reading = False
        # A topic znode was created or deleted: the topics are listed again (`_list_topics`).
        self._topics_changed = False
        self._listing = False
        self._read_retry: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        """Set up the watches; return once the initial full load is in the cache."""
        for path in (layout.BROKER_IDS_PATH, layout.BROKER_TOPICS_PATH, layout.CONFIG_TOPICS_PATH):
            await self.zk.ensure_path(path)
        zk = self.zk
        # Before any topic is read: a topic or state written later is then reported, one
        # written earlier is in the read. It also stands for a children watch on the path, which
        # the session must not hold as well: ZooKeeper before 3.9 keeps one watch mode per path
        # and session (ZOOKEEPER-4466), and the persistent watch set again after a reconnect
        # silently replaced kazoo's restored children watch (new topics went unseen).
        self._handles.append(await zk.watch_tree(layout.BROKER_TOPICS_PATH, self._on_topic_znode))
        self._handles.append(await zk.watch_data(layout.CLUSTER_ID_PATH, self._on_cluster_id))
        self._handles.append(
            await zk.watch_data(layout.BROKER_DEFAULT_CONFIG_PATH, self._on_broker_default_configs)
        )
        self._handles.append(await zk.watch_data(layout.CONTROLLER_PATH, self._on_controller))
        self._handles.append(await zk.watch_children(layout.BROKER_IDS_PATH, self._on_brokers))
        self._on_topics(await zk.get_children(layout.BROKER_TOPICS_PATH))
        await self._drain()
        self._publish_pending()

    async def stop(self) -> None:
        self._stopped = True
        if self._publication is not None:
            self._publication.cancel()
            self._publication = None
        if self._read_retry is not None:
            self._read_retry.cancel()
            self._read_retry = None
        for handle in self._all_handles():
            handle.cancel()
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    async def _drain(self) -> None:
        """Wait until everything is read. Loading one node may schedule more (a topic schedules
        its partitions), and a failed read of the topics or states is retried (after a pause, or
        once connected again): start() must not return with a topic missing, since the broker
        would take its local logs for those of a deleted topic."""
        while not self._stopped and (self._pending or self._stale or self._topics_changed):
            if self._pending:
                await asyncio.gather(*list(self._pending))
            else:  # a retry is due
                await asyncio.sleep(STATE_READ_RETRY_MS / 1000)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._pending.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("metadata watch setup failed", exc_info=task.exception())

    def _all_handles(self) -> Iterable[WatchHandle]:
        yield from self._handles
        yield from (handle for handle in self._broker_handles.values() if handle is not None)
        for parts in self._topics.values():
            yield from parts.handles

    # ---- cluster, controller and brokers ----------------------------------------------------

    def _on_cluster_id(self, data: bytes | None, _stat: NodeStat | None) -> None:
        cluster_id = None
        if data is not None:
            try:
                cluster_id = layout.decode_cluster_id(data)
            except MalformedZnodeError:
                log.exception("ignoring the cluster id znode")
        self.cache.apply_cluster_id(cluster_id)

    def _on_broker_default_configs(self, data: bytes | None, _stat: NodeStat | None) -> None:
        overrides: Mapping[str, str] = {}
        if data is not None:
            try:
                path = layout.BROKER_DEFAULT_CONFIG_PATH
                overrides = TopicConfigOverrides.decode_at(path, data).config
            except MalformedZnodeError:
                log.exception("ignoring the dynamic broker configs")
        self.cache.apply_broker_default_configs(overrides)

    def _on_controller(self, data: bytes | None, _stat: NodeStat | None) -> None:
        controller_id = None
        if data is not None:
            try:
                controller_id = layout.decode_controller(data)
            except MalformedZnodeError:
                log.exception("ignoring the controller znode")
        self.cache.apply_controller(controller_id)

    def _on_brokers(self, children: list[str]) -> None:
        current = {int(child) for child in children if child.isdigit()}
        self.cache.apply_broker_ids(frozenset(current))
        for broker_id in current - set(self._broker_handles):
            self._broker_handles[broker_id] = None
            self._spawn(self._watch_broker(broker_id))
        for broker_id in set(self._broker_handles) - current:
            handle = self._broker_handles.pop(broker_id)
            if handle is not None:
                handle.cancel()
            self.cache.apply_broker(broker_id, None)

    async def _watch_broker(self, broker_id: int) -> None:
        def on_data(data: bytes | None, stat: NodeStat | None) -> None:
            registration = None
            if data is not None:
                try:
                    registration = BrokerRegistration.decode(broker_id, data)
                except MalformedZnodeError:
                    log.exception("ignoring broker %d's registration", broker_id)
            epoch = 0 if stat is None else stat.created_zxid
            self.cache.apply_broker(broker_id, registration, epoch)

        handle = await self.zk.watch_data(layout.broker_path(broker_id), on_data)
        if self._stopped or broker_id not in self._broker_handles:
            handle.cancel()  # gone (or stopped) while the watch was being set up
            return
        self._broker_handles[broker_id] = handle

    # ---- topics -----------------------------------------------------------------------------

    def _on_topics(self, children: list[str]) -> None:
        current = set(children)
        for name in current - set(self._topics):
            parts = _TopicParts(name)
            self._topics[name] = parts
            self._spawn(self._watch_topic(parts))
        for name in set(self._topics) - current:
            for handle in self._topics.pop(name).handles:
                handle.cancel()
            self.cache.apply_topic_removed(name)

    async def _watch_topic(self, parts: _TopicParts) -> None:
        name = parts.name

        def on_assignment(data: bytes | None, stat: NodeStat | None) -> None:
            if data is None or stat is None:
                parts.assignment = None
                parts.published = False
                self.cache.apply_topic_removed(name)
                return
            try:
                parts.assignment = TopicAssignment.decode(name, data)
            except MalformedZnodeError:
                log.exception("ignoring topic %r", name)
                return
            parts.assignment_zxid = stat.created_zxid
            parts.assignment_version = stat.version
            parts.published = False  # replicas (or the partitions) changed: rebuild it whole
            added = set(parts.assignment.partitions) - parts.read_partitions
            parts.read_partitions |= added
            self._stale.update((name, partition) for partition in added)
            self._read_stale_soon()
            self._publish(parts)

        def on_config(data: bytes | None, stat: NodeStat | None) -> None:
            try:
                overrides = {} if data is None else TopicConfigOverrides.decode(name, data).config
            except MalformedZnodeError:
                log.exception("ignoring the config overrides of topic %r", name)
                overrides = {}
            parts.configs = (overrides, 0 if stat is None else stat.created_zxid)
            parts.published = False
            self._publish(parts)

        await self._add_topic_watch(parts, layout.topic_config_path(name), on_config)
        await self._add_topic_watch(parts, layout.topic_path(name), on_assignment)

    # ---- partition states --------------------------------------------------------------------

    def _on_topic_znode(self, path: str | None) -> None:
        """A znode below /brokers/topics changed (None: changes may have been missed)."""
        if path is None or layout.is_topic_path(path):
            self._list_topics_soon()
        if path is None:
            for parts in self._topics.values():
                self._stale.update((parts.name, partition) for partition in parts.read_partitions)
        else:
            key = layout.parse_partition_state_path(path)
            if key is None or key[0] not in self._topics:
                return  # not a state, or of a topic not read yet (its reading will see it)
            self._stale.add(key)
        self._read_stale_soon()

    def _list_topics_soon(self) -> None:
        self._topics_changed = True
        if not self._listing and not self._stopped:
            self._listing = True
            self._spawn(self._list_topics())

    async def _list_topics(self) -> None:
        try:
            while self._topics_changed and not self._stopped:
                self._topics_changed = False
                try:
                    children = await self.zk.get_children(layout.BROKER_TOPICS_PATH)
                except ZkError as error:
                    # A lost connection ends in a new listing (the tree watch says None).
                    log.warning("could not list the topics: %s", error)
                    self._topics_changed = True
                    self._read_retry_later()
                    return
                self._on_topics(children)
        finally:
            self._listing = False

    def _read_stale_soon(self) -> None:
        if not self._reading and self._stale and not self._stopped:
            self._reading = True
            self._spawn(self._read_stale())

    async def _read_stale(self) -> None:
        """Read the stale states, in batches, until none is left: a watch event costs what its
        partition's share of a multiRead costs, and no read to set a watch again."""
        try:
            while self._stale and not self._stopped:
                batch = list(self._stale)
                self._stale = set()
                paths = [layout.partition_state_path(topic, index) for topic, index in batch]
                try:
                    found = await self.zk.get_many(paths)
                except ZkError as error:
                    # Lost connections end in a full re-read (the tree watch says None); other
                    # failures are retried after a pause.
                    self._stale.update(batch)
                    log.warning("could not read %d partition states: %s", len(batch), error)
                    self._read_retry_later()
                    return
                for (topic, index), path, result in zip(batch, paths, found, strict=True):
                    if result is not None:
                        self._take_state(topic, index, path, *result)
        finally:
            self._reading = False

    def _read_retry_later(self) -> None:
        if self._read_retry is None:
            self._read_retry = asyncio.get_running_loop().call_later(
                STATE_READ_RETRY_MS / 1000, self._retry_reads
            )

    def _retry_reads(self) -> None:
        self._read_retry = None
        if self._topics_changed:
            self._list_topics_soon()
        self._read_stale_soon()

    def _take_state(self, topic: str, index: int, path: str, data: bytes, stat: NodeStat) -> None:
        """Keep a state read, unless one as new is held: reads of one partition may complete in
        any order with its watch events, so the newest (topic incarnation, version) wins."""
        parts = self._topics.get(topic)
        if parts is None:
            return  # deleted meanwhile
        held = parts.states.get(index)
        if held is not None and (stat.created_zxid, stat.version) <= (held[1], held[2]):
            return
        try:
            state = PartitionState.decode(path, data)
        except MalformedZnodeError:
            log.exception("ignoring the state of %s-%d", topic, index)
            return
        parts.states[index] = (state, stat.created_zxid, stat.version, stat.modified_zxid)
        parts.dirty_states.add(index)
        self._publish(parts)

    async def _add_topic_watch(
        self,
        parts: _TopicParts,
        path: str,
        callback: Callable[[bytes | None, NodeStat | None], None],
    ) -> None:
        try:
            handle = await self.zk.watch_data(path, callback)
        except ZkError:
            log.exception("could not watch %s", path)
            return
        if self._stopped or self._topics.get(parts.name) is not parts:
            handle.cancel()  # the topic went away while the watch was being set up
            return
        parts.handles.append(handle)

    def _publish(self, parts: _TopicParts) -> None:
        """Publish `parts` once the loop has taken in the watch events already queued: a
        controller's transaction fires one watch per partition it wrote, and they arrive
        together."""
        self._unpublished[parts.name] = parts
        if self._publication is None and not self._stopped:
            self._publication = asyncio.get_running_loop().call_soon(self._publish_pending)

    def _publish_pending(self) -> None:
        self._publication = None
        pending, self._unpublished = self._unpublished, {}
        for name, parts in pending.items():
            if self._topics.get(name) is parts:
                parts.publish(self.cache)
