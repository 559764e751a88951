"""`__consumer_offsets`: which partition holds a group, and creating the topic on first use.

A group lives in partition `abs(hashCode(group_id)) % partitions` — Java's `String.hashCode`
over UTF-16 code units and Kafka's `Utils.abs` (which maps Integer.MIN_VALUE to 0), so a group
sits in the same partition as it would on a Kafka cluster. The group's coordinator is that
partition's leader.

The topic is created by the first FindCoordinator, with Kafka's configs for it (compacted,
`offsets.topic.segment.bytes` segments, compression kept as written). Like Kafka, the replication
factor is strict: while fewer than `offsets.topic.replication.factor` brokers are registered the
topic is not created and groups have no coordinator.
"""

from __future__ import annotations

import contextlib
from typing import Final

from riverbed.configs import BrokerConfig
from riverbed.coordination.layout import NO_LEADER, BrokerRegistration
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.metadata_cache import MetadataCache, TopicMetadata
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.java_hash import java_string_hash

OFFSETS_TOPIC: Final = "__consumer_offsets"
INT32_MIN: Final = -(2**31)
# A FindCoordinator that created the topic waits this long for its leader to be known, so the
# first lookup usually answers at once instead of sending the client into a retry.
LEADER_WAIT_MS: Final = 1_000


def partition_for(group_id: str, partition_count: int) -> int:
    """The `__consumer_offsets` partition of `group_id` (Kafka's `partitionFor`)."""
    code = java_string_hash(group_id)
    # Kafka's Utils.abs: |n|, except that Integer.MIN_VALUE (which has no positive) gives 0.
    magnitude = 0 if code == INT32_MIN else abs(code)
    return magnitude % partition_count


def offsets_topic_configs(config: BrokerConfig) -> dict[str, str]:
    """The topic config overrides Kafka's GroupCoordinator gives `__consumer_offsets`."""
    return {
        "cleanup.policy": "compact",
        "segment.bytes": str(config.offsets_topic_segment_bytes),
        "compression.type": "producer",
    }


def not_available(message: str) -> KafkaError:
    return KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, message)


async def ensure_offsets_topic(
    cache: MetadataCache, store: ClusterMetadataStore, config: BrokerConfig
) -> TopicMetadata:
    """The topic's metadata, creating the topic first if it does not exist. Raises
    KafkaError(COORDINATOR_NOT_AVAILABLE) while it cannot be created or is not visible yet."""
    topic = cache.topic(OFFSETS_TOPIC)
    if topic is not None:
        return topic
    live = sorted(cache.brokers())
    wanted = config.offsets_topic_replication_factor
    if len(live) < wanted:
        raise not_available(
            f"{OFFSETS_TOPIC} needs offsets.topic.replication.factor={wanted} brokers, "
            f"{len(live)} registered"
        )
    try:
        await store.create_topic(
            OFFSETS_TOPIC,
            num_partitions=config.offsets_topic_num_partitions,
            replication_factor=wanted,
            configs=offsets_topic_configs(config),
            live_broker_ids=live,
        )
    except KafkaError as error:
        if error.code != ErrorCode.TOPIC_ALREADY_EXISTS:  # another broker created it first
            raise not_available(f"cannot create {OFFSETS_TOPIC}: {error}") from error
    with contextlib.suppress(TimeoutError):  # answered as not available yet; clients retry
        await cache.wait_until(_has_leaders, LEADER_WAIT_MS)
    topic = cache.topic(OFFSETS_TOPIC)
    if topic is None:
        raise not_available(f"{OFFSETS_TOPIC} is being created")
    return topic


def coordinator_of(cache: MetadataCache, topic: TopicMetadata, group_id: str) -> BrokerRegistration:
    """The live leader of the group's partition; KafkaError(COORDINATOR_NOT_AVAILABLE) if none."""
    index = partition_for(group_id, len(topic.partitions))
    state = topic.partitions.get(index)
    leader = None if state is None or state.leader == NO_LEADER else cache.broker(state.leader)
    if leader is None:
        raise not_available(f"{OFFSETS_TOPIC}-{index} has no live leader")
    return leader


def _has_leaders(cache: MetadataCache) -> bool:
    topic = cache.topic(OFFSETS_TOPIC)
    return topic is not None and all(
        cache.broker(state.leader) is not None for state in topic.partitions.values()
    )
