"""What request handlers may read and change: the broker's state, named in one place."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from riverbed.broker.fetch_sessions import (
    SESSION_CACHE_SLOTS_DEFAULT,
    SESSION_EVICTION_MS_DEFAULT,
    FetchSessionCache,
)
from riverbed.broker.groups.coordinator import GroupCoordinator
from riverbed.broker.handlers.topic_descriptions import TopicDescriptions
from riverbed.broker.metrics import BrokerMetrics
from riverbed.broker.transactions.coordinator import TransactionCoordinator
from riverbed.configs import BrokerConfig
from riverbed.coordination.controller import Controller
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.metadata_cache import MetadataCache, TopicMetadata
from riverbed.coordination.producer_ids import ProducerIdIssuer
from riverbed.hot.replication.isr import IsrManager
from riverbed.hot.replication.partitions import Partition, PartitionManager
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import ALLOW_ALL, Access, AclAccess
from riverbed.security.acl_store import AclStore
from riverbed.security.authorizer import Authorizer
from riverbed.security.session import Session

if TYPE_CHECKING:
    from riverbed.tiering.service import TieredStorage


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(eq=False)
class BrokerContext:
    broker_id: int
    host: str
    port: int
    config: BrokerConfig
    cache: MetadataCache
    store: ClusterMetadataStore
    partitions: PartitionManager
    producer_ids: ProducerIdIssuer
    isr_manager: IsrManager
    groups: GroupCoordinator
    transactions: TransactionCoordinator
    metrics: BrokerMetrics
    controller: Controller | None = None  # ours; active only while this broker is controller
    now_ms: Callable[[], int] = field(default=wall_clock_ms)
    tiering: TieredStorage | None = None  # when remote.storage.url is set
    # Both set when authorizer.class.name is: requests are checked against ACLs.
    authorizer: Authorizer | None = None
    acl_store: AclStore | None = None
    # Fetch sessions (KIP-227); the broker sizes it from its configs.
    fetch_sessions: FetchSessionCache = field(
        default_factory=lambda: FetchSessionCache(
            SESSION_CACHE_SLOTS_DEFAULT, SESSION_EVICTION_MS_DEFAULT
        )
    )
    # Metadata's answer for each topic, built once per version of it.
    topic_descriptions: TopicDescriptions = field(default_factory=TopicDescriptions)
    # Futures of handlers waiting for a metadata change to be applied locally (see wait_until).
    _applied_waiters: set[asyncio.Future[None]] = field(default_factory=set)

    def access(self, session: Session, request_type: str) -> Access:
        """What one request (of the message class named `request_type`) may do: everything
        without an authorizer, else what the ACLs allow its principal and host."""
        if self.authorizer is None:
            return ALLOW_ALL
        return AclAccess(self.authorizer, session, request_type.removesuffix("Request"))

    def metadata_applied(self) -> None:
        """Called by the broker after it applied a metadata change (opened/closed logs)."""
        waiters, self._applied_waiters = self._applied_waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait for metadata changes until `predicate()` holds; False if the timeout came first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not predicate():
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._applied_waiters.add(waiter)
            try:
                async with asyncio.timeout(remaining_s):
                    await waiter
            except TimeoutError:
                return predicate()
            finally:
                self._applied_waiters.discard(waiter)
        return True

    async def log_start_offset(self, partition: Partition) -> int:
        """Where the partition's log starts for clients: below the local log once tiered."""
        if self.tiering is not None and self.tiering.enabled_for(partition.topic):
            return await self.tiering.log_start_offset(partition)
        return partition.log.log_start_offset

    def known_log_start_offset(self, partition: Partition) -> int:
        """log_start_offset as far as known without reading the object store (informational
        fields only)."""
        if self.tiering is not None and self.tiering.enabled_for(partition.topic):
            return self.tiering.known_log_start_offset(partition)
        return partition.log.log_start_offset

    def topic_applied(self, name: str) -> bool:
        """True once this broker serves every partition of `name` that ZooKeeper says it leads."""
        metadata = self.cache.topic(name)
        if metadata is None:
            return False
        return self._serves_leaderships(metadata, metadata.partitions.keys())

    def topic_created(self, name: str, indexes: Collection[int] | None = None) -> bool:
        """What CreateTopics and CreatePartitions wait for, as Kafka's DelayedCreatePartitions:
        every partition of `name` (or those `indexes`, all of which must be known) has a leader
        in this broker's metadata, and those led here are served. (A topic whose partition went
        offline later is still applied: Metadata describes it.)"""
        metadata = self.cache.topic(name)
        if metadata is None:
            return False
        wanted = metadata.partitions.keys() if indexes is None else indexes
        for index in wanted:
            state = metadata.partitions.get(index)
            if state is None or state.leader < 0:
                return False
        return self._serves_leaderships(metadata, wanted)

    def _serves_leaderships(self, metadata: TopicMetadata, indexes: Collection[int]) -> bool:
        """Whether this broker leads, as a serving leader, each of those partitions that
        ZooKeeper says it leads."""
        for index in indexes:
            if metadata.partitions[index].leader == self.broker_id:
                partition = self.partitions.get(metadata.name, index)
                if partition is None or not partition.is_leader:
                    return False
        return True

    def leader_partition(self, topic: str, index: int, current_leader_epoch: int = -1) -> Partition:
        """The local leader replica of a partition, or the Kafka error the client must see."""
        partition = self.partitions.get(topic, index)
        if partition is None:
            metadata = self.cache.topic(topic)
            if metadata is None or index not in metadata.partitions:
                raise KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {topic}-{index}"
                )
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"not the leader of {topic}-{index}")
        partition.check_leader(current_leader_epoch)
        return partition
