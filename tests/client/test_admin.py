"""riverbed.client.admin.Admin against a real Riverbed broker: topics, configs and offsets."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import Producer
from riverbed.client.admin import Admin, ConfigSource
from riverbed.client.connection import ConnectionClosedError
from riverbed.client.types import TopicPartition
from riverbed.errors import (
    ConfigError,
    KafkaTimeoutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from riverbed.protocol.errors import ErrorCode

from tests.support.broker import BrokerFactory, BrokerProcess

FLUSH_TIMEOUT_S = 30
BASE_TIMESTAMP_MS = 1_700_000_000_000
HOUR_MS = 3_600_000


def new_topic() -> str:
    return f"admin-{uuid.uuid4().hex[:8]}"


def produce_with_timestamps(broker: BrokerProcess, topic: str, partition: int, count: int) -> None:
    """`count` records whose timestamps are BASE_TIMESTAMP_MS + 1000 * i, i = offset."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
    for i in range(count):
        producer.produce(topic, b"v", partition=partition, timestamp=BASE_TIMESTAMP_MS + 1000 * i)
    assert producer.flush(FLUSH_TIMEOUT_S) == 0


async def test_settings_are_checked_at_construction() -> None:
    with pytest.raises(TypeError, match="request_timeout_ms"):
        Admin(bootstrap_servers="127.0.0.1:9092", request_timeout_msx=5)
    with pytest.raises(ValueError, match="request_timeout_ms"):
        Admin(bootstrap_servers="127.0.0.1:9092", request_timeout_ms=-1)


async def test_create_list_describe_delete(broker: BrokerProcess) -> None:
    name = new_topic()
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        topic_id = await admin.create_topic(name, partitions=3, configs={"retention.ms": "60000"})
        with pytest.raises(TopicAlreadyExistsError) as exists:
            await admin.create_topic(name, partitions=3)
        assert exists.value.code == ErrorCode.TOPIC_ALREADY_EXISTS

        assert name in await admin.list_topics()
        described = await admin.describe_topic(name)
        assert described.topic_id == topic_id
        assert [p.partition for p in described.partitions] == [0, 1, 2]
        assert all(p.leader == broker.broker_id for p in described.partitions)
        assert described.configs["retention.ms"] == "60000"

        await admin.delete_topic(name)
        assert name not in await admin.list_topics()
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.describe_topic(name)
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.delete_topic(name)


async def test_describe_configs_reports_value_and_source(broker_factory: BrokerFactory) -> None:
    broker = broker_factory({"log.segment.bytes": "1048576"})
    name = new_topic()
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(name, partitions=1, configs={"retention.ms": "3600000"})
        configs = await admin.describe_configs(name)

    retention = configs["retention.ms"]
    assert (retention.value, retention.source) == ("3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    assert not retention.read_only
    assert not retention.sensitive
    segment_bytes = configs["segment.bytes"]
    assert (segment_bytes.value, segment_bytes.source) == (
        "1048576",
        ConfigSource.STATIC_BROKER_CONFIG,
    )
    assert configs["segment.ms"].source is ConfigSource.DEFAULT_CONFIG


async def test_alter_configs_sets_and_deletes_overrides(broker: BrokerProcess) -> None:
    name = new_topic()
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(name, partitions=1)
        default = (await admin.describe_configs(name))["retention.ms"]
        assert default.source is ConfigSource.DEFAULT_CONFIG

        await admin.alter_configs(
            name, set={"retention.ms": "1000", "message.timestamp.type": "LogAppendTime"}
        )
        configs = await admin.describe_configs(name)
        assert configs["retention.ms"].value == "1000"
        assert configs["retention.ms"].source is ConfigSource.DYNAMIC_TOPIC_CONFIG
        assert configs["message.timestamp.type"].value == "LogAppendTime"

        # Incremental: one key goes back to its default, the other override stays.
        await admin.alter_configs(name, delete=["retention.ms"])
        configs = await admin.describe_configs(name)
        assert configs["retention.ms"] == default
        assert configs["message.timestamp.type"].value == "LogAppendTime"


@pytest.mark.parametrize(
    ("change", "key", "allowed"),
    [
        ({"retention.ms": "soon"}, "retention.ms", "integers >= -1"),
        ({"cleanup.policy": "shred"}, "cleanup.policy", "compact, delete"),
        ({"retention.msec": "1"}, "retention.msec", "retention.ms"),
    ],
    ids=["bad-value", "bad-choice", "unknown-key"],
)
async def test_a_bad_config_is_invalid_config_naming_the_key(
    broker: BrokerProcess, change: dict[str, str], key: str, allowed: str
) -> None:
    name = new_topic()
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(name, partitions=1)
        before = await admin.describe_configs(name)
        with pytest.raises(ConfigError) as refused:
            await admin.alter_configs(name, set=change)
        assert await admin.describe_configs(name) == before

    assert refused.value.code == ErrorCode.INVALID_CONFIG
    assert repr(key) in str(refused.value)
    assert allowed in str(refused.value)


async def test_validate_only_checks_but_changes_nothing(broker: BrokerProcess) -> None:
    name = new_topic()
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(name, partitions=1, configs={"segment.ms": "600000"})
        before = await admin.describe_configs(name)

        await admin.alter_configs(
            name, set={"retention.ms": "1000"}, delete=["segment.ms"], validate_only=True
        )
        assert await admin.describe_configs(name) == before
        with pytest.raises(ConfigError, match=r"retention\.ms"):
            await admin.alter_configs(name, set={"retention.ms": "x"}, validate_only=True)


async def test_altering_what_cannot_be_altered(broker: BrokerProcess) -> None:
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.alter_configs(new_topic(), set={"retention.ms": "1000"})
        with pytest.raises(ValueError, match="both set and delete"):
            await admin.alter_configs("t", set={"retention.ms": "1"}, delete=["retention.ms"])


async def test_list_offsets_earliest_latest_and_by_timestamp(broker: BrokerProcess) -> None:
    name = new_topic()
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(name, partitions=2)
        await asyncio.to_thread(produce_with_timestamps, broker, name, 1, 5)
        empty, full = TopicPartition(name, 0), TopicPartition(name, 1)

        offsets = await admin.list_offsets({empty: "latest", full: "latest"})
        assert offsets[empty].offset == 0
        assert offsets[full].offset == 5

        assert (await admin.list_offsets({full: "earliest"}))[full].offset == 0
        found = (await admin.list_offsets({full: BASE_TIMESTAMP_MS + 2500}))[full]
        assert found == (3, BASE_TIMESTAMP_MS + 3000)
        assert (await admin.list_offsets({full: "max_timestamp"}))[full] == (
            4,
            BASE_TIMESTAMP_MS + 4000,
        )
        # No record at or after the timestamp: Kafka's answer, offset and timestamp -1.
        assert (await admin.list_offsets({full: BASE_TIMESTAMP_MS + HOUR_MS}))[full] == (-1, -1)
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.list_offsets({TopicPartition(name, 5): "earliest"})
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.list_offsets({TopicPartition(new_topic(), 0): "earliest"})
        with pytest.raises(ValueError, match="earliest"):
            await admin.list_offsets({full: "first"})  # type: ignore[dict-item]


async def test_the_admin_survives_a_broker_restart(broker: BrokerProcess) -> None:
    name = new_topic()
    async with Admin(bootstrap_servers=broker.bootstrap, retry_backoff_ms=50) as admin:
        await admin.create_topic(name, partitions=1)
        await asyncio.to_thread(broker.restart)  # every connection of the admin is now dead

        assert name in await admin.list_topics()
        assert (await admin.describe_configs(name))["retention.ms"].value is not None
        offsets = await admin.list_offsets({TopicPartition(name, 0): "latest"})
        assert offsets[TopicPartition(name, 0)].offset == 0


async def test_retries_follow_the_policy_without_a_broker() -> None:
    admin = Admin(bootstrap_servers="127.0.0.1:9", request_timeout_ms=300, retry_backoff_ms=10)
    failures = [ConnectionClosedError("dropped")]

    async def flaky() -> str:
        if failures:
            raise failures.pop()
        return "answered"

    # Before any broker answered, a connection failure is the caller's at once.
    with pytest.raises(ConnectionClosedError):
        await admin._retrying("probing", flaky)
    assert await admin._retrying("probing", flaky) == "answered"
    # Once the cluster has answered, it is retried until request_timeout_ms.
    failures.extend([ConnectionClosedError("dropped"), ConnectionClosedError("dropped")])
    assert await admin._retrying("probing", flaky) == "answered"

    async def never() -> str:
        raise ConnectionClosedError("down")

    with pytest.raises(KafkaTimeoutError, match="request_timeout_ms=300") as timed_out:
        await admin._retrying("probing", never)
    assert isinstance(timed_out.value.__cause__, ConnectionClosedError)
    await admin.close()
