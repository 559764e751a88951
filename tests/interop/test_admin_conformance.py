"""Admin answers that mean what Kafka's mean, through the admin clients of confluent-kafka
(librdkafka), kafka-python and aiokafka against three brokers:

- every topic config Kafka documents (tests/support/kafka_topic_configs.py) is accepted at a
  valid value, refused at an invalid one, and described with its source;
- IncrementalAlterConfigs SUBTRACT may empty a list config (`cleanup.policy`);
- CreateTopics and DeleteTopics answer once the answering broker's own Metadata shows the
  change: right after DeleteTopics, that broker no longer lists the topic; right after
  CreateTopics, it lists every partition with its leader.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import confluent_kafka
import kafka.admin
import kafka.errors
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from aiokafka.protocol.metadata import MetadataRequest as AioMetadataRequest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka.protocol.metadata import MetadataRequest
from riverbed.coordination.embedded_zk import EmbeddedZooKeeper

from tests.support.cluster import TestCluster, shared_cluster
from tests.support.kafka_topic_configs import KAFKA_TOPIC_CONFIGS

TIMEOUT_S = 30.0
REQUEST_TIMEOUT_MS = 20_000
INVALID_CONFIG = 40
# Topics created until one lands off the controller: with one replica on one of three brokers,
# the chance that all of them land on it is (1/3)^10.
PLACEMENT_ATTEMPTS = 10
# Delete-then-Metadata rounds per client: the window the fix closed was 15-60 ms wide.
ROUNDS = 3
VALID = {name: probe.valid for name, probe in KAFKA_TOPIC_CONFIGS.items()}
POLL_S = 0.02
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestCluster]:
    """Three brokers shared by this module's tests (each test uses topics of its own)."""
    with shared_cluster(zookeeper.connect_string, tmp_path_factory.mktemp("conformance")) as made:
        yield made


def new_name(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def confluent_admin(cluster: TestCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def confluent_create(admin: AdminClient, topic: str, configs: dict[str, str], **kw: Any) -> None:
    futures = admin.create_topics([NewTopic(topic, 1, 1, config=configs)], **kw)
    futures[topic].result(TIMEOUT_S)


def confluent_describe(admin: AdminClient, topic: str) -> dict[str, Any]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries: dict[str, Any] = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    return entries


def settled(read: Callable[[], T], expected: T, what: str) -> T:
    """Poll `read()` until it gives `expected`. A client sends a topic's DescribeConfigs to any
    broker, and brokers other than the one that made a change apply it a moment later (as in
    Kafka: only the answering broker is waited for)."""
    deadline = time.monotonic() + TIMEOUT_S
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = read()
        except (confluent_kafka.KafkaException, kafka.errors.KafkaError) as error:
            last = error  # UNKNOWN_TOPIC_OR_PARTITION from a broker that has not caught up
        if last == expected:
            return expected
        time.sleep(POLL_S)
    raise AssertionError(f"{what}: still {last!r} after {TIMEOUT_S} s")


def kafka_python_admin(cluster: TestCluster) -> kafka.admin.KafkaAdminClient:
    return kafka.admin.KafkaAdminClient(
        bootstrap_servers=cluster.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS
    )


def kafka_python_values(admin: kafka.admin.KafkaAdminClient, topic: str) -> dict[str, str]:
    resource = kafka.admin.ConfigResource(kafka.admin.ConfigResourceType.TOPIC, topic)
    described = admin.describe_configs([resource])  # the overrides (config_filter="modified")
    return {name: entry["value"] for name, entry in described["topic"][topic].items()}


def kafka_python_set(
    admin: kafka.admin.KafkaAdminClient, topic: str, configs: dict[str, Any], *, incremental: bool
) -> str:
    resource = kafka.admin.ConfigResource(kafka.admin.ConfigResourceType.TOPIC, topic, configs)
    altered = admin.alter_configs([resource], raise_on_unknown=False, incremental=incremental)
    result: str = altered["topic"][topic]
    return result


# -- every Kafka topic config ------------------------------------------------------------------


def test_confluent_creates_a_topic_with_every_kafka_topic_config_and_describes_them(
    cluster: TestCluster,
) -> None:
    admin = confluent_admin(cluster)
    topic = new_name("every-config")
    confluent_create(admin, topic, VALID)

    def described() -> dict[str, tuple[str, int]]:
        entries = confluent_describe(admin, topic)
        return {name: (entries[name].value, entries[name].source) for name in VALID}

    topic_source = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    wanted = {name: (value, topic_source) for name, value in VALID.items()}
    settled(described, wanted, "every config described with source DYNAMIC_TOPIC_CONFIG")
    # And one by one, as the examples: CreateTopics preallocate=false, then an
    # IncrementalAlterConfigs SET of segment.jitter.ms.
    plain = new_name("preallocate")
    confluent_create(admin, plain, {"preallocate": "false"})
    jitter = [ConfigEntry("segment.jitter.ms", "10", incremental_operation=AlterConfigOpType.SET)]
    resource = ConfigResource(ResourceType.TOPIC, plain, incremental_configs=jitter)
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)

    def two() -> tuple[str, str]:
        entries = confluent_describe(admin, plain)
        return entries["preallocate"].value, entries["segment.jitter.ms"].value

    settled(two, ("false", "10"), "preallocate and segment.jitter.ms described")


def test_confluent_is_refused_each_kafka_topic_config_at_an_invalid_value(
    cluster: TestCluster,
) -> None:
    admin = confluent_admin(cluster)
    topic = new_name("invalid-config")
    refused: dict[str, str] = {}
    for name, probe in KAFKA_TOPIC_CONFIGS.items():
        with pytest.raises(confluent_kafka.KafkaException) as failed:
            confluent_create(admin, topic, {name: probe.invalid}, validate_only=True)
        error = failed.value.args[0]
        assert error.code() == INVALID_CONFIG, (name, error)
        refused[name] = error.str()
    for name, message in refused.items():
        assert f"'{name}'" in message, message
    unknown = {"preallocated": "true"}
    with pytest.raises(confluent_kafka.KafkaException) as failed:
        confluent_create(admin, topic, unknown, validate_only=True)
    assert failed.value.args[0].code() == INVALID_CONFIG
    assert "unknown topic config 'preallocated'" in failed.value.args[0].str()


@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "legacy"])
def test_kafka_python_sets_every_kafka_topic_config_and_is_refused_invalid_ones(
    cluster: TestCluster, incremental: bool
) -> None:
    admin = kafka_python_admin(cluster)
    topic = new_name("kafka-python-configs")
    try:
        admin.create_topics([kafka.admin.NewTopic(topic, 1, 1)])
        # The example first: AlterConfigs file.delete.delay.ms=12345.
        alone = {"file.delete.delay.ms": "12345"}
        assert kafka_python_set(admin, topic, alone, incremental=incremental) == "OK"
        settled(lambda: kafka_python_values(admin, topic), alone, "the override described")
        assert kafka_python_set(admin, topic, VALID, incremental=incremental) == "OK"
        settled(lambda: kafka_python_values(admin, topic), VALID, "every override described")
        for name, probe in KAFKA_TOPIC_CONFIGS.items():
            result = kafka_python_set(admin, topic, {name: probe.invalid}, incremental=incremental)
            assert result.startswith("[Error 40] InvalidConfigurationError"), (name, result)
            assert f"'{name}'" in result
        assert kafka_python_values(admin, topic) == VALID  # the refusals changed nothing
        # (every broker had VALID before: the settled reads above, and a refusal writes nothing)
    finally:
        admin.close()


async def _aiokafka_every_config(bootstrap: str, topic: str) -> tuple[list[int], dict[str, str]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
    await admin.start()
    try:
        await admin.create_topics([AioNewTopic(topic, 1, 1)])
        resource = AioConfigResource(AioConfigResourceType.TOPIC, topic, configs=VALID)
        invalid = {name: probe.invalid for name, probe in KAFKA_TOPIC_CONFIGS.items()}
        refused = [
            AioConfigResource(AioConfigResourceType.TOPIC, topic, configs={name: value})
            for name, value in invalid.items()
        ]
        codes = []
        for response in await admin.alter_configs([resource, *refused]):
            codes += [r["error_code"] for r in response.to_object()["resources"]]
        values = await _aiokafka_values_once_known(admin, topic)
    finally:
        await admin.close()
    return codes, values


async def _aiokafka_values_once_known(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    """The topic's described configs, from a broker that knows every override (see settled())."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        (described,) = await admin.describe_configs(
            [AioConfigResource(AioConfigResourceType.TOPIC, topic)]
        )
        (result,) = described.to_object()["resources"]
        values = {e["config_names"]: e["config_value"] for e in result["config_entries"]}
        if all(values.get(name) == value for name, value in VALID.items()):
            return values
        assert time.monotonic() < deadline, f"configs still {values}"
        await asyncio.sleep(POLL_S)


def test_aiokafka_alters_every_kafka_topic_config(cluster: TestCluster) -> None:
    codes, values = asyncio.run(
        asyncio.wait_for(_aiokafka_every_config(cluster.bootstrap, new_name("aio")), TIMEOUT_S)
    )
    # The legacy AlterConfigs replaces a topic's overrides: the refused ones leave VALID in place.
    assert codes == [0] + [INVALID_CONFIG] * len(KAFKA_TOPIC_CONFIGS)
    assert {name: values[name] for name in VALID} == VALID


# -- SUBTRACT to an empty list -------------------------------------------------------------------


def test_subtract_may_empty_cleanup_policy(cluster: TestCluster) -> None:
    """Kafka 4: an empty cleanup.policy is valid (neither delete nor compact)."""
    admin = confluent_admin(cluster)
    topic = new_name("subtract")
    confluent_create(admin, topic, {"cleanup.policy": "delete"})
    subtract = [
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)
    ]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=subtract)
    admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)

    def policy() -> tuple[str, int]:
        entry = confluent_describe(admin, topic)["cleanup.policy"]
        return entry.value, entry.source

    settled(policy, ("", ConfigSource.DYNAMIC_TOPIC_CONFIG.value), "an empty cleanup.policy")

    python_admin = kafka_python_admin(cluster)
    try:
        ops = {"cleanup.policy": (kafka.admin.AlterConfigOp.APPEND, "compact")}
        assert kafka_python_set(python_admin, topic, ops, incremental=True) == "OK"
        compact = {"cleanup.policy": "compact"}
        settled(lambda: kafka_python_values(python_admin, topic), compact, "compact appended")
        ops = {"cleanup.policy": (kafka.admin.AlterConfigOp.SUBTRACT, "compact")}
        assert kafka_python_set(python_admin, topic, ops, incremental=True) == "OK"
        empty = {"cleanup.policy": ""}
        settled(lambda: kafka_python_values(python_admin, topic), empty, "compact subtracted")
    finally:
        python_admin.close()


# -- CreateTopics and DeleteTopics answer once the answering broker shows the change ------------


def controller_id(cluster: TestCluster) -> int:
    metadata = confluent_admin(cluster).list_topics(timeout=TIMEOUT_S)
    controller: int = metadata.controller_id
    return controller


class KafkaPython:
    """kafka-python's admin client (blocking, run on a thread); Metadata to a chosen broker."""

    def __init__(self, cluster: TestCluster) -> None:
        self.admin = kafka_python_admin(cluster)

    async def create(self, topic: str, partitions: int, replicas: int) -> None:
        new = kafka.admin.NewTopic(topic, partitions, replicas)
        await asyncio.to_thread(self.admin.create_topics, [new])

    async def delete(self, topic: str) -> None:
        await asyncio.to_thread(self.admin.delete_topics, [topic])

    async def metadata(self, node_id: int) -> dict[str, list[int]]:
        """Every topic that broker `node_id` lists, with its partitions' leaders."""
        request = MetadataRequest(topics=None, allow_auto_topic_creation=False)
        manager = self.admin._manager  # private: the public API picks the broker itself

        async def send() -> Any:
            return await manager.send(request, node_id=node_id)

        response = (await asyncio.to_thread(manager.run, send)).to_dict()
        return {t["name"]: [p["leader_id"] for p in t["partitions"]] for t in response["topics"]}

    async def close(self) -> None:
        await asyncio.to_thread(self.admin.close)


class AioKafka:
    """aiokafka's admin client; Metadata to a chosen broker."""

    def __init__(self, cluster: TestCluster) -> None:
        self.admin = AIOKafkaAdminClient(
            bootstrap_servers=cluster.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS
        )

    async def create(self, topic: str, partitions: int, replicas: int) -> None:
        response = await self.admin.create_topics([AioNewTopic(topic, partitions, replicas)])
        assert [t["error_code"] for t in response.to_object()["topic_errors"]] == [0]

    async def delete(self, topic: str) -> None:
        response = await self.admin.delete_topics([topic])
        assert [t["error_code"] for t in response.to_object()["topic_error_codes"]] == [0]

    async def metadata(self, node_id: int) -> dict[str, list[int]]:
        client = self.admin._client  # private: the public API picks the broker itself
        response = await client.send(node_id, AioMetadataRequest(None))
        topics = response.to_object()["topics"]
        return {t["topic"]: [p["leader"] for p in t["partitions"]] for t in topics}

    async def close(self) -> None:
        await self.admin.close()


@pytest.fixture(params=["kafka-python", "aiokafka"])
async def client(
    request: pytest.FixtureRequest, cluster: TestCluster
) -> AsyncIterator[KafkaPython | AioKafka]:
    if request.param == "kafka-python":
        made: KafkaPython | AioKafka = KafkaPython(cluster)
    else:
        made = AioKafka(cluster)
        await made.admin.start()
    try:
        yield made
    finally:
        await made.close()


async def test_created_topics_are_in_the_answering_brokers_metadata_with_leaders(
    cluster: TestCluster, client: KafkaPython | AioKafka
) -> None:
    controller = await asyncio.to_thread(controller_id, cluster)
    for _ in range(ROUNDS):
        topic = new_name("created")
        await client.create(topic, partitions=6, replicas=3)
        listed = await client.metadata(controller)
        assert topic in listed
        assert len(listed[topic]) == 6
        assert all(leader in cluster.brokers for leader in listed[topic]), listed[topic]


async def test_deleted_topics_are_gone_from_the_answering_brokers_metadata(
    cluster: TestCluster, client: KafkaPython | AioKafka
) -> None:
    controller = await asyncio.to_thread(controller_id, cluster)
    for _ in range(ROUNDS):
        # A topic the controller does not host: its own log deletion proved nothing before.
        for _ in range(PLACEMENT_ATTEMPTS):
            topic = new_name("deleted")
            await client.create(topic, partitions=1, replicas=1)
            if (await client.metadata(controller))[topic] != [controller]:
                break
            await client.delete(topic)
        else:
            pytest.fail(f"every topic landed on the controller (broker {controller})")
        await client.delete(topic)
        assert topic not in await client.metadata(controller)


def test_create_topics_answers_with_the_new_topics_configs(cluster: TestCluster) -> None:
    """CreateTopics v5+ carries the topic's effective configs, as Kafka's does (its Java admin
    client returns them from CreateTopicsResult.config(); kafka-python from create_topics())."""
    admin = kafka_python_admin(cluster)
    try:
        for validate_only in (True, False):
            topic = new_name("answered-configs")
            wanted = {
                "num_partitions": 1,
                "replication_factor": 1,
                "configs": {"preallocate": "true"},
            }
            result = admin.create_topics({topic: wanted}, validate_only=validate_only)
            (answer,) = result["topics"]
            configs = answer["configs"]
            assert set(configs) == set(KAFKA_TOPIC_CONFIGS)
            assert (configs["preallocate"]["value"], configs["preallocate"]["config_source"]) == (
                "true",
                "DYNAMIC_TOPIC_CONFIG",
            )
            default = configs["retention.ms"]
            assert (default["value"], default["config_source"]) == ("604800000", "DEFAULT_CONFIG")
    finally:
        admin.close()
