"""`__consumer_offsets`: which partition holds a group, and creating the topic on first use.

A group lives in partition `abs(hashCode(group_id)) % partitions`, as on a Kafka cluster, and its
coordinator is that partition's leader (riverbed.coordination.internal_topics, shared with
`__transaction_state`).

The topic is created by the first FindCoordinator, with Kafka's configs for it (compacted,
`offsets.topic.segment.bytes` segments, compression kept as written). Like Kafka, the replication
factor is strict: while fewer than `offsets.topic.replication.factor` brokers are registered the
topic is not created and groups have no coordinator.
"""

from __future__ import annotations

from typing import Final

from riverbed.configs import BrokerConfig
from riverbed.coordination.internal_topics import (
    InternalTopic,
    ensure_internal_topic,
    partition_for,
)
from riverbed.coordination.internal_topics import coordinator_of as coordinator_of
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.metadata_cache import MetadataCache, TopicMetadata

OFFSETS_TOPIC: Final = "__consumer_offsets"

__all__ = [
    "OFFSETS_TOPIC",
    "coordinator_of",
    "ensure_offsets_topic",
    "offsets_topic_configs",
    "partition_for",
]


def offsets_topic_configs(config: BrokerConfig) -> dict[str, str]:
    """The topic config overrides Kafka's GroupCoordinator gives `__consumer_offsets`."""
    return {
        "cleanup.policy": "compact",
        "segment.bytes": str(config.offsets_topic_segment_bytes),
        "compression.type": "producer",
    }


async def ensure_offsets_topic(
    cache: MetadataCache, store: ClusterMetadataStore, config: BrokerConfig
) -> TopicMetadata:
    """The topic's metadata, creating the topic first if it does not exist. Raises
    KafkaError(COORDINATOR_NOT_AVAILABLE) while it cannot be created or is not visible yet."""
    topic = InternalTopic(
        name=OFFSETS_TOPIC,
        num_partitions=config.offsets_topic_num_partitions,
        replication_factor=config.offsets_topic_replication_factor,
        replication_factor_config="offsets.topic.replication.factor",
        configs=offsets_topic_configs(config),
    )
    return await ensure_internal_topic(cache, store, topic)
