"""Coordinator topics (`__consumer_offsets`, `__transaction_state`): placement and creation.

A coordinator key (a group id, a transactional id) lives in partition
`abs(hashCode(key)) % partitions` — Java's `String.hashCode` over UTF-16 code units and Kafka's
`Utils.abs` (which maps Integer.MIN_VALUE to 0), so a key sits in the same partition as it would
on a Kafka cluster. The key's coordinator is that partition's leader.

Each topic is created by the first FindCoordinator for its key type, with the configs its
coordinator gives it. Like Kafka, the replication factor is strict: while fewer brokers than it
are registered the topic is not created and its keys have no coordinator
(COORDINATOR_NOT_AVAILABLE, which clients retry).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from riverbed.coordination.layout import NO_LEADER, BrokerRegistration
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.metadata_cache import MetadataCache, TopicMetadata
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.java_hash import java_string_hash

INT32_MIN: Final = -(2**31)
# A FindCoordinator that created the topic waits this long for its leaders to be known, so the
# first lookup usually answers at once instead of sending the client into a retry.
LEADER_WAIT_MS: Final = 1_000


@dataclass(frozen=True, slots=True)
class InternalTopic:
    """How one coordinator topic is created: its name, size and config overrides.
    `replication_factor_config` names the broker config of the factor, for error messages."""

    name: str
    num_partitions: int
    replication_factor: int
    replication_factor_config: str
    configs: Mapping[str, str]


def partition_for(key: str, partition_count: int) -> int:
    """The partition of `key` (Kafka's `partitionFor`)."""
    code = java_string_hash(key)
    # Kafka's Utils.abs: |n|, except that Integer.MIN_VALUE (which has no positive) gives 0.
    magnitude = 0 if code == INT32_MIN else abs(code)
    return magnitude % partition_count


def not_available(message: str) -> KafkaError:
    return KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, message)


async def ensure_internal_topic(
    cache: MetadataCache, store: ClusterMetadataStore, topic: InternalTopic
) -> TopicMetadata:
    """The topic's metadata, creating the topic first if it does not exist. Raises
    KafkaError(COORDINATOR_NOT_AVAILABLE) while it cannot be created or is not visible yet."""
    metadata = cache.topic(topic.name)
    if metadata is not None:
        return metadata
    live = sorted(cache.brokers())
    wanted = topic.replication_factor
    if len(live) < wanted:
        raise not_available(
            f"{topic.name} needs {topic.replication_factor_config}={wanted} brokers, "
            f"{len(live)} registered"
        )
    try:
        await store.create_topic(
            topic.name,
            num_partitions=topic.num_partitions,
            replication_factor=wanted,
            configs=dict(topic.configs),
            live_broker_ids=live,
        )
    except KafkaError as error:
        if error.code != ErrorCode.TOPIC_ALREADY_EXISTS:  # another broker created it first
            raise not_available(f"cannot create {topic.name}: {error}") from error
    with contextlib.suppress(TimeoutError):  # answered as not available yet; clients retry
        await cache.wait_until(lambda c: _has_leaders(c, topic.name), LEADER_WAIT_MS)
    metadata = cache.topic(topic.name)
    if metadata is None:
        raise not_available(f"{topic.name} is being created")
    return metadata


def coordinator_of(cache: MetadataCache, topic: TopicMetadata, key: str) -> BrokerRegistration:
    """The live leader of the key's partition; KafkaError(COORDINATOR_NOT_AVAILABLE) if none."""
    index = partition_for(key, len(topic.partitions))
    state = topic.partitions.get(index)
    leader = None if state is None or state.leader == NO_LEADER else cache.broker(state.leader)
    if leader is None:
        raise not_available(f"{topic.name}-{index} has no live leader")
    return leader


def _has_leaders(cache: MetadataCache, name: str) -> bool:
    topic = cache.topic(name)
    return topic is not None and all(
        cache.broker(state.leader) is not None for state in topic.partitions.values()
    )
