"""Topic configs set and read back through the admin clients of confluent-kafka (librdkafka),
aiokafka and kafka-python, each used as its docs say: AlterConfigs, IncrementalAlterConfigs and
DescribeConfigs on Riverbed, with Kafka's error codes for what Riverbed refuses."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import confluent_kafka
import kafka.admin
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from tests.support.broker import BrokerProcess

TIMEOUT_S = 20.0
REQUEST_TIMEOUT_MS = 15_000
INVALID_CONFIG = 40
INVALID_REQUEST = 42
SET, DELETE, APPEND, SUBTRACT = (
    AlterConfigOpType.SET,
    AlterConfigOpType.DELETE,
    AlterConfigOpType.APPEND,
    AlterConfigOpType.SUBTRACT,
)


def create_topic(broker: BrokerProcess, topic: str, configs: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.create_topics([NewTopic(topic, 1, 1, config=configs or {})])
    futures[topic].result(TIMEOUT_S)


def test_confluent_lists_every_topic(broker: BrokerProcess, topic: str) -> None:
    """AdminClient.list_topics() with no topic: librdkafka 2.16 puts three bytes after that
    Metadata v12 body, which Kafka ignores (a regression test: we used to close the
    connection)."""
    create_topic(broker, topic)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert topic in admin.list_topics(timeout=TIMEOUT_S).topics


class Confluent:
    """confluent-kafka's AdminClient on one topic (futures resolved at once, bounded)."""

    def __init__(self, broker: BrokerProcess, topic: str) -> None:
        self.admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        self.topic = topic

    def describe(self) -> dict[str, Any]:
        resource = ConfigResource(ResourceType.TOPIC, self.topic)
        entries: dict[str, Any] = self.admin.describe_configs([resource])[resource].result(
            TIMEOUT_S
        )
        return entries

    def values(self) -> dict[str, str | None]:
        return {name: entry.value for name, entry in self.describe().items()}

    def incremental(
        self,
        *ops: tuple[str, AlterConfigOpType, str | None],
        resource_type: ResourceType = ResourceType.TOPIC,
        name: str | None = None,
        validate_only: bool = False,
    ) -> None:
        entries = [ConfigEntry(key, value, incremental_operation=op) for key, op, value in ops]
        resource = ConfigResource(resource_type, name or self.topic, incremental_configs=entries)
        futures = self.admin.incremental_alter_configs([resource], validate_only=validate_only)
        futures[resource].result(TIMEOUT_S)

    def error(self, *ops: tuple[str, AlterConfigOpType, str | None], **kwargs: Any) -> Any:
        with pytest.raises(confluent_kafka.KafkaException) as failed:
            self.incremental(*ops, **kwargs)
        return failed.value.args[0]


def test_confluent_incremental_set_append_subtract_delete(
    broker: BrokerProcess, topic: str
) -> None:
    create_topic(broker, topic)
    client = Confluent(broker, topic)
    default = client.describe()["retention.ms"]
    assert default.source == ConfigSource.DEFAULT_CONFIG.value

    client.incremental(("retention.ms", SET, "60000"), ("cleanup.policy", APPEND, "compact"))
    entries = client.describe()
    assert entries["retention.ms"].value == "60000"
    assert entries["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert entries["cleanup.policy"].value == "delete,compact"

    client.incremental(("cleanup.policy", SUBTRACT, "delete"))
    assert client.values()["cleanup.policy"] == "compact"

    client.incremental(("retention.ms", DELETE, None))
    entries = client.describe()
    assert entries["retention.ms"].value == default.value
    assert entries["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["cleanup.policy"].value == "compact"


def test_confluent_sees_what_riverbed_refuses(broker: BrokerProcess, topic: str) -> None:
    create_topic(broker, topic)
    client = Confluent(broker, topic)
    before = client.values()

    bad_value = client.error(("retention.ms", SET, "soon"))
    assert bad_value.code() == INVALID_CONFIG
    assert "'retention.ms'" in bad_value.str()
    assert "integers >= -1" in bad_value.str()
    not_a_list = client.error(("retention.ms", APPEND, "5"))
    assert not_a_list.code() == INVALID_CONFIG
    assert "cleanup.policy" in not_a_list.str()
    unknown = client.error(("retention.msec", SET, "1"))
    assert unknown.code() == INVALID_CONFIG
    assert "'retention.msec'" in unknown.str()
    static = client.error(
        ("num.partitions", SET, "3"),
        resource_type=ResourceType.BROKER,
        name=str(broker.broker_id),
    )
    assert static.code() == INVALID_REQUEST
    assert "static" in static.str()

    client.incremental(("retention.ms", SET, "1000"), validate_only=True)
    assert client.values() == before


def test_confluent_alter_configs_replaces_every_override(broker: BrokerProcess, topic: str) -> None:
    create_topic(broker, topic, {"segment.ms": "600000"})
    client = Confluent(broker, topic)
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": "60000"})

    with pytest.deprecated_call():  # confluent-kafka steers users to the incremental form
        futures = client.admin.alter_configs([resource])
    futures[resource].result(TIMEOUT_S)

    entries = client.describe()
    assert entries["retention.ms"].value == "60000"
    # The legacy API sets the whole override set: what it did not name is back to its default.
    assert entries["segment.ms"].source == ConfigSource.DEFAULT_CONFIG.value


def test_a_changed_timestamp_type_applies_to_the_next_record(
    broker: BrokerProcess, topic: str
) -> None:
    create_topic(broker, topic)
    Confluent(broker, topic).incremental(("message.timestamp.type", SET, "LogAppendTime"))

    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(topic, b"v", timestamp=1_600_000_000_000)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "t", "enable.auto.commit": False}
    )
    consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
    try:
        message = consumer.poll(TIMEOUT_S)
    finally:
        consumer.close()
    assert message is not None
    assert message.error() is None
    timestamp_type, timestamp_ms = message.timestamp()
    assert timestamp_type == confluent_kafka.TIMESTAMP_LOG_APPEND_TIME
    assert abs(timestamp_ms - time.time() * 1000) < 60_000


async def _aiokafka_alter_and_describe(
    bootstrap: str, topic: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
    await admin.start()
    try:
        altered = await admin.alter_configs(
            [
                AioConfigResource(
                    AioConfigResourceType.TOPIC,
                    topic,
                    configs={"retention.ms": "60000", "cleanup.policy": "compact"},
                ),
                AioConfigResource(AioConfigResourceType.TOPIC, topic, configs={"bad": "1"}),
            ]
        )
        (described,) = await admin.describe_configs(
            [AioConfigResource(AioConfigResourceType.TOPIC, topic)]
        )
    finally:
        await admin.close()
    (response,) = altered
    results: list[dict[str, Any]] = response.to_object()["resources"]
    (result,) = described.to_object()["resources"]
    return results, result


def test_aiokafka_alter_configs_then_describe(broker: BrokerProcess, topic: str) -> None:
    create_topic(broker, topic)

    results, described = asyncio.run(
        asyncio.wait_for(_aiokafka_alter_and_describe(broker.bootstrap, topic), TIMEOUT_S)
    )

    assert [r["error_code"] for r in results] == [0, INVALID_CONFIG]
    assert "'bad'" in results[1]["error_message"]
    assert described["error_code"] == 0
    values = {e["config_names"]: e["config_value"] for e in described["config_entries"]}
    assert values["retention.ms"] == "60000"
    assert values["cleanup.policy"] == "compact"


@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "legacy"])
def test_kafka_python_alter_configs_then_describe(
    broker: BrokerProcess, topic: str, incremental: bool
) -> None:
    create_topic(broker, topic, {"segment.ms": "600000"})
    resource_type = kafka.admin.ConfigResourceType.TOPIC
    admin = kafka.admin.KafkaAdminClient(
        bootstrap_servers=broker.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    try:
        altered = admin.alter_configs(
            [kafka.admin.ConfigResource(resource_type, topic, {"retention.ms": "60000"})],
            incremental=incremental,
        )
        modified = admin.describe_configs([kafka.admin.ConfigResource(resource_type, topic)])
    finally:
        admin.close()

    assert altered == {"topic": {topic: "OK"}}
    # Both forms keep the other override: the legacy one because kafka-python re-sends it.
    assert {k: v["value"] for k, v in modified["topic"][topic].items()} == {
        "retention.ms": "60000",
        "segment.ms": "600000",
    }
