"""The follower replication throttle's bookkeeping (riverbed.hot.replication.quota), with the
real metadata cache holding the configs and a clock the test moves."""

from __future__ import annotations

import uuid

from riverbed.coordination.metadata_cache import MetadataCache, PartitionMetadata, TopicMetadata
from riverbed.hot.replication.quota import ReplicationQuota

BROKER_ID = 2


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def cache_with(topic_configs: dict[str, str], broker_configs: dict[str, str]) -> MetadataCache:
    cache = MetadataCache()
    state = PartitionMetadata(replicas=(1, BROKER_ID), leader=1, leader_epoch=0, isr=(1,))
    cache.apply_topic(TopicMetadata("orders", uuid.uuid4(), {0: state, 1: state}, topic_configs))
    cache.apply_broker_default_configs(broker_configs)
    return cache


def test_which_replicas_are_throttled() -> None:
    listed = ReplicationQuota(
        BROKER_ID, cache_with({"follower.replication.throttled.replicas": "0:2,1:3"}, {})
    )
    assert listed.throttled("orders", 0)
    assert not listed.throttled("orders", 1)  # broker 3's replica, not ours
    assert not listed.throttled("other", 0)
    everything = ReplicationQuota(
        BROKER_ID, cache_with({"follower.replication.throttled.replicas": "*"}, {})
    )
    assert everything.throttled("orders", 1)
    assert not ReplicationQuota(BROKER_ID, cache_with({}, {})).throttled("orders", 0)


def test_fetches_wait_until_the_window_has_room() -> None:
    clock = Clock()
    quota = ReplicationQuota(
        BROKER_ID, cache_with({}, {"follower.replication.throttled.rate": "1000"}), clock
    )
    fetch_bytes = quota.fetch_max_bytes(1024 * 1024)
    assert fetch_bytes == 1000  # one window's worth at most
    assert quota.delay_s(fetch_bytes) == 0.0
    quota.record(600)
    clock.now_s += 0.25
    # 600 copied + up to 1000 more would exceed 1000 per second: wait for the 600 to age out.
    assert quota.delay_s(fetch_bytes) == 0.75
    assert quota.delay_s(400) == 0.0  # a smaller fetch fits
    clock.now_s += 0.75
    assert quota.delay_s(fetch_bytes) == 0.0


def test_unthrottled_by_default_and_changes_apply_at_once() -> None:
    cache = cache_with({}, {})
    quota = ReplicationQuota(BROKER_ID, cache, Clock())
    assert quota.rate_bytes_per_s() == 2**63 - 1
    assert quota.fetch_max_bytes(1024 * 1024) == 1024 * 1024
    cache.apply_broker_default_configs({"follower.replication.throttled.rate": "5000"})
    assert quota.fetch_max_bytes(1024 * 1024) == 5000
