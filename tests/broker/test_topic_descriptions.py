"""Metadata's per-topic descriptions: built once per version of a topic and per set of live
brokers, rebuilt when either changes, and forgotten with the topic."""

from __future__ import annotations

import uuid

from riverbed.broker.handlers.topic_descriptions import TopicDescriptions
from riverbed.coordination.metadata_cache import MetadataCache, PartitionMetadata, TopicMetadata
from riverbed.protocol.errors import ErrorCode

PARTITIONS = 50


def state(leader: int, epoch: int = 0) -> PartitionMetadata:
    return PartitionMetadata(replicas=(1, 2), leader=leader, leader_epoch=epoch, isr=(1, 2))


def cache_with_topic() -> MetadataCache:
    cache = MetadataCache()
    partitions = {p: state(1 + p % 2) for p in range(PARTITIONS)}
    cache.apply_topic(TopicMetadata("orders", uuid.uuid4(), partitions, {}))
    return cache


def current(cache: MetadataCache) -> TopicMetadata:
    metadata = cache.topic("orders")
    assert metadata is not None
    return metadata


def test_an_unchanged_topic_is_described_once() -> None:
    cache = cache_with_topic()
    descriptions = TopicDescriptions()
    first = descriptions.describe(current(cache), frozenset({1, 2}))
    assert [p.leader_id for p in first.partitions] == [1 + p % 2 for p in range(PARTITIONS)]
    assert descriptions.describe(current(cache), frozenset({1, 2})) is first


def test_a_changed_partition_or_broker_set_is_described_anew() -> None:
    cache = cache_with_topic()
    descriptions = TopicDescriptions()
    first = descriptions.describe(current(cache), frozenset({1, 2}))

    cache.apply_partitions("orders", {7: state(1, epoch=1)})  # broker 2 lost partition 7
    moved = descriptions.describe(current(cache), frozenset({1, 2}))
    assert moved is not first
    assert (moved.partitions[7].leader_id, moved.partitions[7].leader_epoch) == (1, 1)
    assert first.partitions[7].leader_id == 2, "an answer already built is never changed"

    broker_2_gone = descriptions.describe(current(cache), frozenset({1}))
    odd = broker_2_gone.partitions[1]
    assert (odd.error_code, odd.leader_id, odd.offline_replicas) == (
        ErrorCode.LEADER_NOT_AVAILABLE,
        -1,
        [2],
    )


def test_a_full_listing_forgets_deleted_topics() -> None:
    cache = cache_with_topic()
    descriptions = TopicDescriptions()
    first = descriptions.describe(current(cache), frozenset({1, 2}))
    descriptions.keep_only(["orders"])
    assert descriptions.describe(current(cache), frozenset({1, 2})) is first
    descriptions.keep_only([])
    assert descriptions.describe(current(cache), frozenset({1, 2})) is not first
