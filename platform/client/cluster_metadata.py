"""What a client knows about the cluster, folded from Metadata responses. No I/O.

`ClusterMetadata.update(response)` replaces what the response covers (brokers, controller, and
each topic it names); everything else answers from that state. Staleness is the only clock-driven
part: the state is stale once `metadata_max_age_ms` has passed since the last update, or as soon
as someone marks it stale (NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, a lost
connection); the I/O side (BrokerPool) then refreshes it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from riverbed.client.types import TopicPartition
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.primitives import ZERO_UUID

NO_LEADER = -1


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int  # NO_LEADER (-1) while the partition has none
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    error: ErrorCode
    partitions: dict[int, PartitionInfo]


class ClusterMetadata:
    """Brokers, topics, partition leaders and the controller, as of the last Metadata response."""

    def __init__(
        self, metadata_max_age_ms: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max_age_s = metadata_max_age_ms / 1000
        self._clock = clock
        self._brokers: dict[int, BrokerAddress] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._names_by_id: dict[uuid.UUID, str] = {}
        self._updated_at: float | None = None
        self._stale_reason: str | None = "never fetched"
        self.controller_id = -1
        self.cluster_id: str | None = None
        # Bumped by every update: a waiter can tell whether anything was folded in since it looked.
        self.generation = 0

    # -- folding responses in -------------------------------------------------------------
    def update(self, response: m.MetadataResponse) -> None:
        """Fold in a Metadata response: brokers and controller are replaced, topics it names are
        replaced (with their errors), topics it does not name are kept."""
        self._brokers = {
            b.node_id: BrokerAddress(b.node_id, b.host, b.port, b.rack) for b in response.brokers
        }
        self.controller_id = response.controller_id
        self.cluster_id = response.cluster_id
        for topic in response.topics:
            if topic.name is None:
                continue
            error = _error_code(topic.error_code)
            partitions = {
                p.partition_index: PartitionInfo(
                    topic=topic.name,
                    partition=p.partition_index,
                    leader=p.leader_id if p.leader_id in self._brokers else NO_LEADER,
                    leader_epoch=p.leader_epoch,
                    replicas=tuple(p.replica_nodes),
                    isr=tuple(p.isr_nodes),
                    error=_error_code(p.error_code),
                )
                for p in topic.partitions
            }
            old = self._topics.get(topic.name)
            if old is not None and old.topic_id != ZERO_UUID:
                self._names_by_id.pop(old.topic_id, None)
            self._topics[topic.name] = TopicInfo(topic.name, topic.topic_id, error, partitions)
            if topic.topic_id != ZERO_UUID:
                self._names_by_id[topic.topic_id] = topic.name
        self._updated_at = self._clock()
        self._stale_reason = None
        self.generation += 1

    def mark_stale(self, reason: str) -> None:
        """Make the next `stale` check true (e.g. after NOT_LEADER_OR_FOLLOWER)."""
        self._stale_reason = reason

    def forget(self, topics: Iterable[str]) -> None:
        """Drop what is known about `topics` (e.g. after deleting them)."""
        for name in topics:
            info = self._topics.pop(name, None)
            if info is not None:
                self._names_by_id.pop(info.topic_id, None)

    # -- questions ------------------------------------------------------------------------
    @property
    def stale(self) -> bool:
        return self.stale_reason is not None

    @property
    def stale_reason(self) -> str | None:
        """Why the state should be refreshed, or None while it is fresh."""
        if self._stale_reason is not None:
            return self._stale_reason
        if self._updated_at is not None and self._clock() - self._updated_at > self._max_age_s:
            return "metadata_max_age_ms passed"
        return None

    @property
    def brokers(self) -> dict[int, BrokerAddress]:
        return dict(self._brokers)

    def broker(self, node_id: int) -> BrokerAddress | None:
        return self._brokers.get(node_id)

    @property
    def topics(self) -> frozenset[str]:
        """Topics this state has an entry for (including ones the cluster reported as errors)."""
        return frozenset(self._topics)

    def topic_error(self, topic: str) -> ErrorCode | None:
        """The error the last response gave for `topic` (NONE when fine), None if never asked."""
        info = self._topics.get(topic)
        return None if info is None else info.error

    def partitions_for(self, topic: str) -> tuple[int, ...] | None:
        """The topic's partition numbers in order; None unless the topic is known and healthy."""
        info = self._topics.get(topic)
        if info is None or info.error != ErrorCode.NONE:
            return None
        return tuple(sorted(info.partitions))

    def partition_count(self, topic: str) -> int:
        """How many partitions `topic` has; 0 when unknown (hot path of the partitioner)."""
        info = self._topics.get(topic)
        return 0 if info is None or info.error != ErrorCode.NONE else len(info.partitions)

    def partition(self, tp: TopicPartition) -> PartitionInfo | None:
        info = self._topics.get(tp.topic)
        return None if info is None else info.partitions.get(tp.partition)

    def leader_for(self, tp: TopicPartition) -> int | None:
        """The node id of the partition's leader, None while unknown or leaderless."""
        partition = self.partition(tp)
        if partition is None or partition.leader == NO_LEADER:
            return None
        return partition.leader

    def leader_epoch(self, tp: TopicPartition) -> int:
        partition = self.partition(tp)
        return -1 if partition is None else partition.leader_epoch

    def partitions_led_by(self, node_id: int) -> list[TopicPartition]:
        return [
            TopicPartition(p.topic, p.partition)
            for info in self._topics.values()
            for p in info.partitions.values()
            if p.leader == node_id
        ]

    def topic_id(self, topic: str) -> uuid.UUID | None:
        """The topic's id (Metadata v10+), None if unknown or the broker sent none."""
        info = self._topics.get(topic)
        if info is None or info.topic_id == ZERO_UUID:
            return None
        return info.topic_id

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return self._names_by_id.get(topic_id)


def _error_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR
