"""Real Kafka clients against a broker with the authorizer on: confluent-kafka (librdkafka),
aiokafka and kcat, used as their docs say, get Kafka's authorization errors and see no data
until ACLs (added with `riverbed acls` and the Admin client) let them, and then only what the
ACLs name: a topic, a group, a prefix, minus what a DENY takes back."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Final

import aiokafka.errors
import confluent_kafka
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from riverbed import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    Admin,
    PatternType,
    TopicPartition,
)
from riverbed import ResourceType as AclResource
from riverbed.errors import AuthorizationError

from tests.security.acl_support import SECURED, acl, eventually, zookeeper_acls
from tests.security.test_acl_enforcement import create_topics
from tests.support.broker import BrokerFactory, BrokerProcess

TOPIC_A: Final = "topic-a"
TOPIC_B: Final = "topic-b"
GROUP: Final = "group-g"
TIMEOUT_S: Final = 20.0
KCAT: Final = "/usr/bin/kcat"
E = confluent_kafka.KafkaError


# -- confluent-kafka ----------------------------------------------------------------------------


def confluent_produce(broker: BrokerProcess, topic: str, value: bytes) -> int:
    """The delivery report's error code (0: delivered)."""
    reports: list[confluent_kafka.KafkaError | None] = []
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 10_000}
    )
    producer.produce(topic, value, on_delivery=lambda error, _message: reports.append(error))
    producer.flush(TIMEOUT_S)
    (report,) = reports
    return 0 if report is None else int(report.code())


def confluent_consume(
    broker: BrokerProcess, topic: str, group: str
) -> tuple[list[bytes], set[int]]:
    """(values read, error codes seen) of a group consumer polling for a few seconds."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    values: list[bytes] = []
    errors: set[int] = set()
    consumer.subscribe([topic])
    deadline = time.monotonic() + 8.0
    try:
        while time.monotonic() < deadline and not values:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                errors.add(int(error.code()))
            else:
                values.append(message.value() or b"")
                consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()
    return values, errors


def confluent_admin_errors(broker: BrokerProcess) -> dict[str, int]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    codes = {}
    futures = {
        "create": admin.create_topics([NewTopic("topic-new", 1, 1)])["topic-new"],
        "delete": admin.delete_topics([TOPIC_A])[TOPIC_A],
    }
    resource = ConfigResource(ResourceType.TOPIC, TOPIC_A)
    futures["describe configs"] = admin.describe_configs([resource])[resource]
    for what, future in futures.items():
        try:
            future.result(TIMEOUT_S)
            codes[what] = 0
        except confluent_kafka.KafkaException as error:
            codes[what] = int(error.args[0].code())
    return codes


def confluent_topics(broker: BrokerProcess) -> list[str]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    return sorted(admin.list_topics(timeout=TIMEOUT_S).topics)


# -- aiokafka --------------------------------------------------------------------------------------


async def aiokafka_produce(broker: BrokerProcess, topic: str, value: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, request_timeout_ms=10_000)
    await producer.start()
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, value), TIMEOUT_S)
    finally:
        await producer.stop()


async def aiokafka_consume(broker: BrokerProcess, topic: str, group: str) -> bytes:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=broker.bootstrap, group_id=group, auto_offset_reset="earliest"
    )
    try:
        await consumer.start()
        message = await asyncio.wait_for(consumer.getone(), TIMEOUT_S)
        return message.value or b""
    finally:
        await consumer.stop()


# -- kcat ------------------------------------------------------------------------------------------


def kcat(
    broker: BrokerProcess, *args: str, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [KCAT, "-b", broker.bootstrap, *args], input=stdin, capture_output=True, timeout=60
    )


def riverbed_acls(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "riverbed.cli", "acls", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# -- the tests -------------------------------------------------------------------------------------


async def test_without_acls_clients_can_do_nothing(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SECURED)
    await create_topics(broker, [TOPIC_A])
    assert confluent_produce(broker, TOPIC_A, b"x") == E.TOPIC_AUTHORIZATION_FAILED
    values, errors = confluent_consume(broker, TOPIC_A, GROUP)
    assert values == []
    assert E.GROUP_AUTHORIZATION_FAILED in errors
    assert confluent_admin_errors(broker) == {
        "create": E.TOPIC_AUTHORIZATION_FAILED,
        "delete": E.TOPIC_AUTHORIZATION_FAILED,
        "describe configs": E.TOPIC_AUTHORIZATION_FAILED,
    }
    assert confluent_topics(broker) == []
    with pytest.raises(aiokafka.errors.TopicAuthorizationFailedError):
        await aiokafka_produce(broker, TOPIC_A, b"x")
    with pytest.raises(aiokafka.errors.TopicAuthorizationFailedError):
        await aiokafka_consume(broker, TOPIC_A, GROUP)
    produced = kcat(broker, "-P", "-t", TOPIC_A, stdin=b"hello\n")
    assert produced.returncode != 0
    assert b"Topic authorization failed" in produced.stderr
    consumed = kcat(broker, "-C", "-t", TOPIC_A, "-o", "beginning", "-e")
    assert consumed.returncode != 0
    assert b"Topic authorization failed" in consumed.stderr
    listed = kcat(broker, "-L")
    assert listed.returncode == 0
    assert b" 0 topics:" in listed.stdout
    # Nothing reached the log either: with every ACL a super user would see it empty.
    assert (await topic_end_offsets(broker, [TOPIC_A])) == {TOPIC_A: 0}


async def topic_end_offsets(broker: BrokerProcess, topics: Sequence[str]) -> dict[str, int]:
    """The high watermarks, read through a DESCRIBE grant taken back afterwards."""
    grants = [b for topic in topics for b in acl(AclResource.TOPIC, topic, AclOperation.DESCRIBE)]
    ends: dict[str, int] = {}
    async with zookeeper_acls(broker.zk_connect) as acls:
        await acls.add(*grants)
        async with Admin(bootstrap_servers=broker.bootstrap) as admin:

            async def listed() -> bool:
                try:
                    found = await admin.list_offsets(
                        {TopicPartition(t, 0): "latest" for t in topics}
                    )
                except AuthorizationError:
                    return False  # until the broker has the grant
                ends.update({tp.topic: offset.offset for tp, offset in found.items()})
                return True

            await eventually(listed)
        await acls.remove(*grants)
    return ends


async def test_acls_let_clients_use_what_they_name(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SECURED)
    await create_topics(broker, [TOPIC_A, TOPIC_B])
    # The first ACL goes straight to ZooKeeper (no principal may change ACLs yet): ALTER on the
    # cluster for User:ANONYMOUS, so the rest can go through the brokers.
    riverbed_acls(
        "add", "--zookeeper", broker.zk_connect, "--allow-principal", "User:ANONYMOUS",
        "--operation", "Alter", "--cluster",
    )  # fmt: skip

    async def may_alter_acls() -> bool:
        async with Admin(bootstrap_servers=broker.bootstrap) as admin:
            try:
                await admin.delete_acls([AclBindingFilter(principal="User:nobody")])
            except AuthorizationError:
                return False  # until the broker follows ZooKeeper
            return True

    await eventually(may_alter_acls)
    added = riverbed_acls(
        "add", "--bootstrap-server", broker.bootstrap, "--allow-principal", "User:ANONYMOUS",
        "--operation", "Write", "--operation", "Read", "--operation", "Describe",
        "--topic", TOPIC_A,
    )  # fmt: skip
    assert "added 3 ACLs" in added
    riverbed_acls(
        "add", "--bootstrap-server", broker.bootstrap, "--allow-principal", "User:ANONYMOUS",
        "--operation", "Read", "--group", GROUP,
    )  # fmt: skip

    # confluent-kafka: topic A and group G work, topic B and another group do not.
    assert confluent_produce(broker, TOPIC_A, b"from-confluent") == 0
    values, _ = confluent_consume(broker, TOPIC_A, GROUP)
    assert values == [b"from-confluent"]
    assert confluent_produce(broker, TOPIC_B, b"x") == E.TOPIC_AUTHORIZATION_FAILED
    values, errors = confluent_consume(broker, TOPIC_A, "group-other")
    assert values == []
    assert E.GROUP_AUTHORIZATION_FAILED in errors
    assert confluent_topics(broker) == [TOPIC_A]

    # aiokafka: the same.
    await aiokafka_produce(broker, TOPIC_A, b"from-aiokafka")
    # The group committed past the first record (confluent-kafka's consumer did).
    assert await aiokafka_consume(broker, TOPIC_A, GROUP) == b"from-aiokafka"
    with pytest.raises(aiokafka.errors.TopicAuthorizationFailedError):
        await aiokafka_produce(broker, TOPIC_B, b"x")
    with pytest.raises(aiokafka.errors.GroupAuthorizationFailedError):
        await aiokafka_consume(broker, TOPIC_A, "group-other")

    # kcat: produce and read A, not B; the listing shows A only.
    assert kcat(broker, "-P", "-t", TOPIC_A, stdin=b"from-kcat\n").returncode == 0
    consumed = kcat(broker, "-C", "-t", TOPIC_A, "-o", "beginning", "-e", "-q")
    assert consumed.stdout.splitlines() == [b"from-confluent", b"from-aiokafka", b"from-kcat"]
    assert kcat(broker, "-C", "-t", TOPIC_B, "-o", "beginning", "-e").returncode != 0
    listing = kcat(broker, "-L").stdout
    assert b' topic "topic-a"' in listing
    assert b"topic-b" not in listing

    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        # A prefixed ACL: every topic whose name starts with "pre-", created by the client.
        prefixed = [
            AclBinding(AclResource.TOPIC, "pre-", PatternType.PREFIXED, "User:ANONYMOUS", "*",
                       operation, AclPermissionType.ALLOW)
            for operation in (AclOperation.CREATE, AclOperation.WRITE, AclOperation.READ)
        ]  # fmt: skip
        await admin.create_acls(prefixed)
        name = f"pre-{uuid.uuid4().hex[:6]}"
        admin_client = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin_client.create_topics([NewTopic(name, 1, 1)])[name].result(TIMEOUT_S)
        assert kcat(broker, "-P", "-t", name, stdin=b"prefixed\n").returncode == 0
        assert kcat(broker, "-C", "-t", name, "-o", "beginning", "-e", "-q").stdout == b"prefixed\n"
        assert confluent_produce(broker, "prx-other", b"x") == E.TOPIC_AUTHORIZATION_FAILED

        # A DENY beats the ALLOW: nobody writes A any more, reading still works.
        deny = AclBinding(AclResource.TOPIC, TOPIC_A, PatternType.LITERAL, "User:*", "*",
                          AclOperation.WRITE, AclPermissionType.DENY)  # fmt: skip
        await admin.create_acls([deny])
        assert confluent_produce(broker, TOPIC_A, b"denied") == E.TOPIC_AUTHORIZATION_FAILED
        consumed = kcat(broker, "-C", "-t", TOPIC_A, "-o", "beginning", "-e", "-q")
        assert consumed.stdout.splitlines() == [b"from-confluent", b"from-aiokafka", b"from-kcat"]
        removed = await admin.delete_acls([AclBindingFilter(permission=AclPermissionType.DENY)])
        assert removed == [deny]
        assert confluent_produce(broker, TOPIC_A, b"allowed again") == 0
