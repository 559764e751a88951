"""Authentication and authorization together, with real brokers and real clients: users log in
with SASL (SCRAM-SHA-512 for kcat and confluent-kafka over SASL_SSL, PLAIN over TLS for aiokafka)
or with a TLS client certificate, and ACLs on their principals decide what they see. A topic or
group a user has no ACL for gets TOPIC_AUTHORIZATION_FAILED / GROUP_AUTHORIZATION_FAILED and no
record. The brokers log in to each other as a super user."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Final

import confluent_kafka
import confluent_kafka.admin
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from riverbed import Admin, TopicPartition
from riverbed.errors import AuthorizationError
from riverbed.security.acl import AclOperation, ResourceType

from tests.security.acl_support import acl
from tests.security.clients import (
    TIMEOUT_S,
    add_user,
    aiokafka_plain,
    kcat,
    librdkafka_scram,
    riverbed_consume,
    riverbed_produce,
    riverbed_sasl,
)
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.cluster import wait_for
from tools.pki import CLIENT_SUBJECT, Pki

ADMIN: Final = ("admin", "admin-secret")
ALICE: Final = ("alice", "alice-secret")
BOB: Final = ("bob", "bob-secret")
BROKER: Final = ("broker", "broker-secret")
E = confluent_kafka.KafkaError
R, W, D = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE


def add_users(zk_connect: str, *users: tuple[str, str]) -> None:
    for user in users:
        add_user(zk_connect, user)


def secured_broker(
    broker_factory: BrokerFactory, pki: Pki, broker_id: int = 1, **extra: str
) -> BrokerProcess:
    return broker_factory(
        {
            "ssl.keystore.location": str(pki.broker),
            "ssl.truststore.location": str(pki.ca),
            "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
            f'required username="{BROKER[0]}" password="{BROKER[1]}";',
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": f"User:{ADMIN[0]};User:{BROKER[0]}",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "2",
            "group.initial.rebalance.delay.ms": "0",
            **extra,
        },
        broker_id=broker_id,
        listeners=("SASL_SSL",),
    )


def confluent_produce_error(conf: dict[str, str], topic: str) -> int:
    reports: list[confluent_kafka.KafkaError | None] = []
    producer = confluent_kafka.Producer({**conf, "message.timeout.ms": 10_000})
    producer.produce(topic, b"intruder", partition=0, on_delivery=lambda e, _m: reports.append(e))
    producer.flush(TIMEOUT_S)
    (report,) = reports
    return 0 if report is None else int(report.code())


def confluent_group_errors(
    conf: dict[str, str], topic: str, group: str
) -> tuple[list[bytes], set[int]]:
    consumer = confluent_kafka.Consumer(
        {**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    values: list[bytes] = []
    errors: set[int] = set()
    consumer.subscribe([topic])
    deadline = time.monotonic() + 8.0
    try:
        while time.monotonic() < deadline and not errors and not values:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                errors.add(int(error.code()))
            else:
                values.append(message.value() or b"")
    finally:
        consumer.close()
    return values, errors


async def granted_cluster(pki: Pki, bootstrap: str) -> None:
    """As the super user: two topics with a record each; alice may use `alice-topic` and the
    group `alice-group`, bob nothing."""
    async with Admin(bootstrap_servers=bootstrap, **riverbed_sasl(pki, ADMIN)) as admin:
        for topic in ("alice-topic", "bob-topic"):
            await admin.create_topic(topic, partitions=1, replication_factor=1)
        await admin.create_acls(
            [
                *acl(ResourceType.TOPIC, "alice-topic", R, W, D, principal="User:alice"),
                *acl(ResourceType.GROUP, "alice-group", R, principal="User:alice"),
            ]
        )
    for topic in ("alice-topic", "bob-topic"):
        await riverbed_produce(
            bootstrap, topic, [f"{topic}-secret".encode()], **riverbed_sasl(pki, ADMIN)
        )


async def test_users_see_exactly_what_their_acls_allow(
    broker_factory: BrokerFactory, pki: Pki, zk_connect: str
) -> None:
    add_users(zk_connect, ADMIN, ALICE, BOB, BROKER)
    broker = secured_broker(broker_factory, pki)
    bootstrap = broker.address("SASL_SSL")
    await granted_cluster(pki, bootstrap)
    alice_rd = {"bootstrap.servers": bootstrap, **librdkafka_scram(pki, ALICE)}

    # kcat as alice (SCRAM-SHA-512 over SASL_SSL): her topic reads, the other is refused empty.
    own = kcat(bootstrap, librdkafka_scram(pki, ALICE), "-C", "-t", "alice-topic", "-p", "0",
               "-o", "beginning", "-c", "1", "-q")  # fmt: skip
    assert own.returncode == 0, own.stderr
    assert own.stdout.strip() == b"alice-topic-secret", own.stderr
    other = kcat(bootstrap, librdkafka_scram(pki, ALICE), "-C", "-t", "bob-topic", "-p", "0",
                 "-o", "beginning", "-e", "-q")  # fmt: skip
    assert other.returncode != 0
    assert other.stdout == b""
    assert b"authoriz" in other.stderr.lower(), other.stderr

    # confluent-kafka as alice: writes to her topic, refused on the other; her group works,
    # another group is refused.
    assert await asyncio.to_thread(confluent_produce_error, alice_rd, "alice-topic") == 0
    code = await asyncio.to_thread(confluent_produce_error, alice_rd, "bob-topic")
    assert code == E.TOPIC_AUTHORIZATION_FAILED
    values, errors = await asyncio.to_thread(
        confluent_group_errors, alice_rd, "alice-topic", "bob-group"
    )
    assert values == [], errors
    assert E.GROUP_AUTHORIZATION_FAILED in errors, errors
    values, errors = await asyncio.to_thread(
        confluent_group_errors, alice_rd, "bob-topic", "alice-group"
    )
    assert values == [], errors
    assert E.TOPIC_AUTHORIZATION_FAILED in errors, errors
    values, errors = await asyncio.to_thread(
        confluent_group_errors, alice_rd, "alice-topic", "alice-group"
    )
    assert values == [b"alice-topic-secret"], errors
    assert not errors, errors

    # aiokafka as alice, PLAIN over TLS: her group on her topic reads; the rest is refused.
    consumer = AIOKafkaConsumer(
        "alice-topic", bootstrap_servers=bootstrap, group_id="alice-group",
        auto_offset_reset="earliest", **aiokafka_plain(pki, ALICE),
    )  # fmt: skip
    try:
        await consumer.start()
        message = await asyncio.wait_for(consumer.getone(), TIMEOUT_S)
        assert message.value == b"alice-topic-secret"
    finally:
        await consumer.stop()

    async def start_and_read_one(consumer: AIOKafkaConsumer) -> None:
        await consumer.start()
        await asyncio.wait_for(consumer.getone(), TIMEOUT_S)

    for topic, group, refused in (
        ("bob-topic", "alice-group", TopicAuthorizationFailedError),
        ("alice-topic", "bob-group", GroupAuthorizationFailedError),
    ):
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
            **aiokafka_plain(pki, ALICE),
        )  # fmt: skip
        try:
            with pytest.raises(refused):  # at start (topic metadata) or at the group's join
                await start_and_read_one(consumer)
        finally:
            await consumer.stop()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **aiokafka_plain(pki, ALICE))
    try:
        await producer.start()
        with pytest.raises(TopicAuthorizationFailedError):
            await asyncio.wait_for(producer.send_and_wait("bob-topic", b"x"), TIMEOUT_S)
    finally:
        await producer.stop()

    # bob, authenticated but granted nothing: sees no topic, reads and writes nothing.
    bob_rd: dict[str, str | int | float | bool] = {
        "bootstrap.servers": bootstrap,
        **librdkafka_scram(pki, BOB),
    }
    listing = confluent_kafka.admin.AdminClient(bob_rd).list_topics(timeout=TIMEOUT_S)
    assert sorted(listing.topics) == []
    with pytest.raises(AuthorizationError):
        await riverbed_consume(bootstrap, "alice-topic", 1, **riverbed_sasl(pki, BOB))
    # Nothing the refused writers sent was stored: each topic holds the records granted ones wrote.
    async with Admin(bootstrap_servers=bootstrap, **riverbed_sasl(pki, ADMIN)) as admin:
        ends = await admin.list_offsets(
            {TopicPartition("alice-topic", 0): "latest", TopicPartition("bob-topic", 0): "latest"}
        )
    assert {tp.topic: found.offset for tp, found in ends.items()} == {
        "alice-topic": 2,  # the admin's record and alice's confluent-kafka record
        "bob-topic": 1,  # the admin's only
    }


async def test_the_cli_manages_acls_and_reads_through_a_secured_listener(
    broker_factory: BrokerFactory, pki: Pki, zk_connect: str, tmp_path: Path
) -> None:
    add_users(zk_connect, ADMIN, BOB, BROKER)
    broker = secured_broker(broker_factory, pki)
    bootstrap = broker.address("SASL_SSL")
    await granted_cluster(pki, bootstrap)

    def command_config(user: tuple[str, str]) -> str:
        path = tmp_path / f"{user[0]}.properties"
        path.write_text(
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
            "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{user[0]}" password="{user[1]}";\n'
            f"ssl.truststore.location={pki.ca}\nssl.truststore.type=PEM\n"
        )
        return str(path)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "riverbed.cli", *args], capture_output=True, text=True,
            timeout=TIMEOUT_S * 2,
        )  # fmt: skip

    consume = ["consume", "bob-topic", "--from-beginning", "--max", "1",
               "--bootstrap-server", bootstrap]  # fmt: skip
    refused = cli(*consume, "--command-config", command_config(BOB))
    assert refused.returncode == 1
    assert "TOPIC_AUTHORIZATION_FAILED" in refused.stderr
    assert refused.stdout == ""
    granted = cli("acls", "add", "--allow-principal", "User:bob", "--operation", "Read",
                  "--operation", "Describe", "--topic", "bob-topic", "--bootstrap-server",
                  bootstrap, "--command-config", command_config(ADMIN))  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    listed = cli("acls", "list", "--topic", "bob-topic", "--json", "--bootstrap-server",
                 bootstrap, "--command-config", command_config(ADMIN))  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert "User:bob" in listed.stdout, listed.stderr
    read = cli(*consume, "--command-config", command_config(BOB))
    assert read.returncode == 0, read.stderr
    assert "bob-topic-secret" in read.stdout


async def test_replication_between_brokers_logged_in_as_a_super_user(
    broker_factory: BrokerFactory, pki: Pki, zk_connect: str
) -> None:
    add_users(zk_connect, ADMIN, ALICE, BROKER)
    settings = {"min.insync.replicas": "2"}
    first = secured_broker(broker_factory, pki, 1, **settings)
    second = secured_broker(broker_factory, pki, 2, **settings)
    bootstrap = f"{first.address('SASL_SSL')},{second.address('SASL_SSL')}"
    async with Admin(bootstrap_servers=bootstrap, **riverbed_sasl(pki, ADMIN)) as admin:

        async def both_registered() -> bool:
            return len((await admin.describe_cluster()).brokers) >= 2

        await wait_for(both_registered, TIMEOUT_S, what="both brokers registered")
        await admin.create_topic("replicated", partitions=1, replication_factor=2)
        await admin.create_acls(acl(ResourceType.TOPIC, "replicated", R, W, principal="User:alice"))
    values = [f"r{i}".encode() for i in range(20)]
    # acks=all with min.insync.replicas=2: the follower fetched as User:broker (CLUSTER_ACTION).
    await riverbed_produce(bootstrap, "replicated", values, **riverbed_sasl(pki, ALICE))
    assert (
        await riverbed_consume(bootstrap, "replicated", 20, **riverbed_sasl(pki, ALICE)) == values
    )


async def test_a_client_certificate_is_the_principal_acls_name(
    broker_factory: BrokerFactory, pki: Pki
) -> None:
    broker = broker_factory(
        {
            "ssl.keystore.location": str(pki.broker),
            "ssl.truststore.location": str(pki.ca),
            "ssl.client.auth": "required",
            "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
            "super.users": "User:CN=broker,O=Riverbed Test",
        },
        listeners=("SSL",),
    )
    client = {
        "security_protocol": "ssl",
        "ssl_ca_location": str(pki.ca),
        "ssl_certificate_location": str(pki.client_cert),
        "ssl_key_location": str(pki.client_key),
    }
    topic = f"certified-{uuid.uuid4().hex[:6]}"
    # Nothing granted yet: alice's certificate may not even create the topic.
    with pytest.raises(AuthorizationError):
        await riverbed_produce(broker.bootstrap, topic, [b"x"], **client)
    # The broker's own certificate is a super user: it grants alice (by her subject) the topic.
    as_broker = {
        **client,
        "ssl_certificate_location": str(pki.broker),
        "ssl_key_location": str(pki.broker),
    }
    async with Admin(bootstrap_servers=broker.bootstrap, **as_broker) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=1)
        await admin.create_acls(
            acl(ResourceType.TOPIC, topic, R, W, D, principal=f"User:{CLIENT_SUBJECT}")
        )
    async with asyncio.timeout(TIMEOUT_S):
        while True:  # the ACL reaches the cache through its ZooKeeper watch
            try:
                await riverbed_produce(broker.bootstrap, topic, [b"signed"], **client)
                break
            except AuthorizationError:
                await asyncio.sleep(0.2)
    assert await riverbed_consume(broker.bootstrap, topic, 1, **client) == [b"signed"]
