"""ClusterMetadata (no I/O) and BrokerPool against a real broker."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from riverbed.client.cluster_metadata import ClusterMetadata
from riverbed.client.connection import ConnectionState
from riverbed.client.pool import BrokerPool
from riverbed.client.settings import AdminSettings
from riverbed.client.types import TopicPartition
from riverbed.common.backoff import backoff_ms
from riverbed.errors import UnknownTopicOrPartitionError
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

from tests.support.broker import BrokerFactory, BrokerProcess

R = m.MetadataResponse
TOPIC_ID = uuid.UUID(int=7)


def _response(*, leader: int = 1, topic_error: int = 0) -> m.MetadataResponse:
    partitions = [
        R.MetadataResponsePartition(
            error_code=0, partition_index=i, leader_id=leader, leader_epoch=3
        )
        for i in (1, 0)
    ]
    return R(
        brokers=[R.MetadataResponseBroker(node_id=1, host="127.0.0.1", port=9092)],
        controller_id=1,
        topics=[
            R.MetadataResponseTopic(
                error_code=topic_error,
                name="orders",
                topic_id=TOPIC_ID,
                partitions=[] if topic_error else partitions,
            )
        ],
    )


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cluster_folds_a_response() -> None:
    clock = FakeClock()
    cluster = ClusterMetadata(metadata_max_age_ms=1000, clock=clock)
    assert cluster.stale
    assert cluster.leader_for(TopicPartition("orders", 0)) is None
    cluster.update(_response())
    assert not cluster.stale
    assert cluster.partitions_for("orders") == (0, 1)
    assert cluster.leader_for(TopicPartition("orders", 1)) == 1
    assert cluster.leader_epoch(TopicPartition("orders", 1)) == 3
    assert cluster.topic_id("orders") == TOPIC_ID
    assert cluster.topic_name(TOPIC_ID) == "orders"
    assert cluster.controller_id == 1
    assert cluster.broker(1) is not None
    clock.now += 1.001
    assert cluster.stale_reason == "metadata_max_age_ms passed"
    cluster.update(_response())
    cluster.mark_stale("NOT_LEADER_OR_FOLLOWER")
    assert cluster.stale_reason == "NOT_LEADER_OR_FOLLOWER"


def test_cluster_keeps_topic_errors_and_unknown_leaders() -> None:
    cluster = ClusterMetadata(metadata_max_age_ms=1000)
    cluster.update(_response(leader=5))  # node 5 is not among the brokers
    assert cluster.leader_for(TopicPartition("orders", 0)) is None
    cluster.update(_response(topic_error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
    assert cluster.partitions_for("orders") is None
    assert cluster.topic_error("orders") == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    assert backoff_ms(0, 100, 1000) == 0
    assert 80 <= backoff_ms(1, 100, 1000) <= 120
    assert 160 <= backoff_ms(2, 100, 1000) <= 240
    assert 800 <= backoff_ms(50, 100, 1000) <= 1200


def _settings(broker: BrokerProcess) -> AdminSettings:
    settings: AdminSettings = AdminSettings.from_kwargs(
        {"bootstrap_servers": broker.bootstrap, "retry_backoff_ms": 10}
    )
    return settings


async def test_pool_refreshes_and_reconnects(broker: BrokerProcess) -> None:
    pool = BrokerPool(_settings(broker))
    try:
        cluster = await pool.refresh({"created-by-metadata"})
        assert cluster.partitions_for("created-by-metadata") is not None
        tp = TopicPartition("created-by-metadata", 0)
        connection = await pool.leader_connection(tp)
        assert connection.state is ConnectionState.OPEN
        await connection.close()  # as if the broker hung up
        assert cluster.stale
        again = await pool.leader_connection(tp)
        assert again is not connection
        assert not again.closed
        # Concurrent refreshes share one request.
        await asyncio.gather(*(pool.refresh() for _ in range(5)))
    finally:
        await pool.close()
    assert again.closed


async def test_pool_reports_unknown_topic(broker_factory: BrokerFactory) -> None:
    broker = broker_factory({"auto.create.topics.enable": "false"})
    pool = BrokerPool(_settings(broker))
    try:
        with pytest.raises(UnknownTopicOrPartitionError):
            await pool.leader_connection(TopicPartition("missing", 0))
    finally:
        await pool.close()
