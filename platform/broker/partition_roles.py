"""The broker's partitions follow ZooKeeper: each metadata change opens, leads, follows or
deletes the hosted partitions it touches (Kafka's LeaderAndIsr and StopReplica handling, driven
by the metadata watch rather than controller requests).

A change is applied where it lands: a leadership move or ISR write costs the partitions it
names, not every partition the broker hosts. At 4,000 partitions a controlled shutdown writes
thousands of partition states, and one whole pass per state made it quadratic (136 s). Whole
passes remain for what is rare and broad: the first application at startup, topics created or
deleted, brokers registered or gone, the cluster-wide broker configs; only a whole pass also
deletes logs that a topic deleted while this broker was down left on disk.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.stray_logs import StrayLogs
from riverbed.common.log_events import event
from riverbed.configs import BrokerConfig, effective_topic_config, topic_config
from riverbed.coordination.layout import NO_LEADER
from riverbed.coordination.metadata_cache import (
    MetadataCache,
    MetadataChange,
    PartitionMetadata,
    TopicMetadata,
)
from riverbed.hot.replication.followers import monotonic_ms
from riverbed.hot.replication.partitions import Partition
from riverbed.hot.replication.replica_fetcher import ReplicaFetcherManager
from riverbed.hot.storage.log import LogConfig
from riverbed.hot.storage.log_manager import LogManager
from riverbed.hot.storage.partition_metadata import ForeignLogError, PartitionMetadataError
from riverbed.protocol.errors import KafkaError

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


def log_config(config: BrokerConfig, overrides: Mapping[str, str]) -> LogConfig:
    """The log settings of a topic with `overrides` on this broker."""
    effective = effective_topic_config(config, overrides)
    return LogConfig.from_topic_config({k: v.value for k, v in effective.items() if v.value})


@dataclass(frozen=True, slots=True)
class _TopicSetup:
    """What a topic's configs give each of its partitions, computed once per topic and pass."""

    log_config: LogConfig
    log_append_time: bool
    min_insync_replicas: int


class PartitionRoles:
    """Applies metadata changes to the hosted partitions (on the loop, from the cache's
    listener)."""

    def __init__(
        self,
        config: BrokerConfig,
        cache: MetadataCache,
        ctx: BrokerContext,
        fetchers: ReplicaFetcherManager,
        log_manager: LogManager,
        strays: StrayLogs,
        broker_epoch: Callable[[], int],
    ) -> None:
        self._config = config
        self._broker_id = config.broker_id
        self._cache = cache
        self._ctx = ctx
        self._fetchers = fetchers
        self._log_manager = log_manager
        self._strays = strays
        self._broker_epoch = broker_epoch  # changes when the broker registers again

    def on_change(self, change: MetadataChange) -> None:
        """Apply what `change` touched (or everything, for the broad changes)."""
        if (
            change.topics_added
            or change.topics_removed
            or change.broker_configs_changed
            or change.brokers_added  # also our own registration anew: roles are judged by it
            or change.brokers_removed
        ):
            self.apply_all()
            return
        touched: dict[str, set[int]] = defaultdict(set)
        for topic, index in change.partitions_changed:
            touched[topic].add(index)
        for topic in change.configs_changed:
            metadata = self._cache.topic(topic)
            if metadata is not None:
                touched[topic].update(metadata.partitions)
        for topic, indexes in touched.items():
            metadata = self._cache.topic(topic)
            if metadata is None:
                continue  # removed meanwhile: its removal brings a whole pass
            setup = self._setup(metadata)
            for index in indexes:
                state = metadata.partitions.get(index)
                if state is not None and self._broker_id in state.replicas:
                    self._host(metadata, index, state, setup)
                else:
                    self._drop(topic, index)  # moved away by a reassignment
        self._applied()

    def apply_all(self) -> None:
        """Make the hosted partitions match the whole cache: open, lead, follow, or delete."""
        ctx = self._ctx
        wanted: set[TopicPartition] = set()
        for metadata in self._cache.topics().values():
            setup = self._setup(metadata)
            for index, state in metadata.partitions.items():
                if self._broker_id in state.replicas:
                    wanted.add((metadata.name, index))
                    self._host(metadata, index, state, setup)
        for topic, index in ctx.partitions.hosted() - wanted:
            self._drop(topic, index)
        for topic, index in set(self._log_manager.partitions()) - wanted - ctx.partitions.hosted():
            # Left on disk by a topic deleted, or a replica moved away, while this broker was
            # down (or stray since an earlier pass).
            if self._same_topic(topic, self._stored_topic_id(topic, index)):
                self._log_manager.delete(topic, index)
            else:
                self._strays.note(topic, index)
        self._applied()

    def _setup(self, metadata: TopicMetadata) -> _TopicSetup:
        typed = topic_config(self._config, metadata.configs)
        return _TopicSetup(
            log_config(self._config, metadata.configs),
            typed.message_timestamp_type == "LogAppendTime",
            typed.min_insync_replicas,
        )

    def _host(
        self, metadata: TopicMetadata, index: int, state: PartitionMetadata, setup: _TopicSetup
    ) -> None:
        ctx = self._ctx
        hosted = ctx.partitions.get(metadata.name, index)
        if hosted is not None and hosted.topic_id != metadata.topic_id:
            self._release(hosted, delete_data=False)  # the topic was deleted and created again
        try:
            partition = ctx.partitions.ensure(
                metadata.name, index, setup.log_config, metadata.topic_id
            )
        except ForeignLogError:
            self._strays.note(metadata.name, index)
            return
        partition.log_append_time = setup.log_append_time
        partition.min_insync_replicas = setup.min_insync_replicas
        try:
            self._apply_role(partition, state)
        except KafkaError as error:  # one failing disk must not stop the others
            log.error("%s: cannot take its role: %s", partition, error)
        ctx.groups.on_partition_role(partition)
        ctx.transactions.on_partition_role(partition)

    def _drop(self, topic: str, index: int) -> None:
        removed = self._ctx.partitions.get(topic, index)
        if removed is None:
            return
        # Moved away by a reassignment: the topic is still there, so the replica goes (Kafka's
        # StopReplica with delete). A topic gone from the metadata is not proof of a deletion.
        same_topic = self._same_topic(topic, removed.topic_id)
        self._release(removed, delete_data=same_topic)
        if not same_topic:
            self._strays.note(topic, index)

    def _release(self, partition: Partition, *, delete_data: bool) -> None:
        ctx = self._ctx
        self._fetchers.unfollow(partition)
        ctx.partitions.remove(partition.topic, partition.index, delete_data=delete_data)
        ctx.groups.on_partition_role(partition)  # closed: it leads no more
        ctx.transactions.on_partition_role(partition)

    def _same_topic(self, topic: str, topic_id: uuid.UUID | None) -> bool:
        """Whether the metadata still holds the topic of that name and id."""
        current = self._cache.topic(topic)
        return current is not None and topic_id is not None and current.topic_id == topic_id

    def _stored_topic_id(self, topic: str, index: int) -> uuid.UUID | None:
        try:
            return self._log_manager.topic_id(topic, index)
        except PartitionMetadataError:
            return None

    def _applied(self) -> None:
        ctx = self._ctx
        if ctx.tiering is not None:
            ctx.tiering.wake()  # a leadership or remote.storage.enable may be new
        ctx.metadata_applied()

    def _apply_role(self, partition: Partition, state: PartitionMetadata) -> None:
        isr = frozenset(state.isr)
        if state.leader == self._broker_id:
            same_term = partition.is_leader and partition.leader_epoch == state.leader_epoch
            if (
                same_term
                and state.state_version <= partition.state_version
                and state.replicas == partition.replicas
            ):
                return  # our own ISR write coming back, or an older state arriving late
            if not same_term and state.state_modified_zxid < self._broker_epoch():
                # Written before this incarnation registered: the leadership was our previous
                # incarnation's (whose log tail may be lost). The controller fences it with a
                # new epoch; until then nobody leads here.
                if partition.become_follower(NO_LEADER, state.leader_epoch, state.replicas, isr):
                    self._fetchers.unfollow(partition)
                    event(
                        log,
                        logging.INFO,
                        "partition.leadership_refused",
                        topic=partition.topic,
                        partition=partition.index,
                        leader_epoch=state.leader_epoch,
                        reason="decided before this broker registered; waiting for the controller",
                    )
                return
            self._fetchers.unfollow(partition)
            if partition.become_leader(
                state.leader_epoch, state.replicas, isr, state.state_version, monotonic_ms()
            ):
                event(
                    log,
                    logging.INFO,
                    "partition.leading",
                    topic=partition.topic,
                    partition=partition.index,
                    leader_epoch=state.leader_epoch,
                    isr=list(state.isr),
                )
            return
        if partition.become_follower(state.leader, state.leader_epoch, state.replicas, isr):
            if state.leader == NO_LEADER:
                self._fetchers.unfollow(partition)
                event(
                    log,
                    logging.WARNING,
                    "partition.leaderless",
                    topic=partition.topic,
                    partition=partition.index,
                    leader_epoch=state.leader_epoch,
                )
            else:
                self._fetchers.follow(partition)
                event(
                    log,
                    logging.INFO,
                    "partition.following",
                    topic=partition.topic,
                    partition=partition.index,
                    leader=state.leader,
                    leader_epoch=state.leader_epoch,
                )
