"""SASL with real brokers and real clients: kcat and confluent-kafka over SASL_SSL with
SCRAM-SHA-512, aiokafka with PLAIN over TLS, Riverbed's client with every mechanism; wrong
passwords and unknown users refused with SASL_AUTHENTICATION_FAILED and shown no data; brokers
authenticating to each other on a SASL_SSL inter-broker listener. Users are added with the
`riverbed users` command, as an operator would."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from typing import Any, Final

import confluent_kafka
import pytest
from aiokafka.errors import KafkaConnectionError
from riverbed import Admin, TopicPartition
from riverbed.errors import AuthenticationError

from tests.security.clients import (
    TIMEOUT_S,
    add_user,
    aiokafka_consume,
    aiokafka_plain,
    aiokafka_produce,
    confluent_consume,
    confluent_error,
    confluent_produce,
    kcat,
    librdkafka_scram,
    riverbed_consume,
    riverbed_produce,
    riverbed_sasl,
)
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.cluster import wait_for
from tools.pki import Pki

ALICE: Final = ("alice", "alice-secret")
BOB: Final = ("bob", "bob-secret")
BROKER_USER: Final = ("broker", "broker-secret")
EVERY_MECHANISM: Final = "SCRAM-SHA-512,SCRAM-SHA-256,PLAIN"
BROKER_JAAS: Final = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    f'username="{BROKER_USER[0]}" password="{BROKER_USER[1]}";'
)


def sasl_broker(
    broker_factory: BrokerFactory, pki: Pki, broker_id: int = 1, **settings: str
) -> BrokerProcess:
    return broker_factory(
        {
            "ssl.keystore.location": str(pki.broker),
            "ssl.truststore.location": str(pki.ca),
            "sasl.enabled.mechanisms": EVERY_MECHANISM,
            # The first listener, SASL_SSL, is the inter-broker one: brokers log in as `broker`.
            "sasl.jaas.config": BROKER_JAAS,
            **settings,
        },
        broker_id=broker_id,
        listeners=("SASL_SSL", "SASL_PLAINTEXT"),
    )


async def test_every_client_authenticates_and_round_trips(
    broker_factory: BrokerFactory, pki: Pki, zk_connect: str
) -> None:
    add_user(zk_connect, ALICE, "SCRAM-SHA-512")
    add_user(zk_connect, ALICE, "SCRAM-SHA-256")
    broker = sasl_broker(broker_factory, pki)
    tls, plain = broker.address("SASL_SSL"), broker.address("SASL_PLAINTEXT")

    # kcat over SASL_SSL with SCRAM-SHA-512: writes, then reads back byte-exact.
    lines = [f"kcat-{i}".encode() for i in range(100)]
    wrote = kcat(tls, librdkafka_scram(pki, ALICE), "-P", "-t", "kcat", "-p", "0",
                 stdin=b"\n".join(lines) + b"\n")  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr.decode()
    read = kcat(tls, librdkafka_scram(pki, ALICE), "-C", "-t", "kcat", "-p", "0",
                "-o", "beginning", "-c", "100", "-q")  # fmt: skip
    assert read.returncode == 0, read.stderr.decode()
    assert read.stdout.splitlines() == lines

    # confluent-kafka over SASL_SSL with SCRAM-SHA-512.
    values = [f"confluent-{i}".encode() for i in range(100)]
    conf = {"bootstrap.servers": tls, **librdkafka_scram(pki, ALICE)}
    await asyncio.to_thread(confluent_produce, conf, "confluent", values)
    assert await asyncio.to_thread(confluent_consume, conf, "confluent", 100) == values

    # aiokafka with SASL PLAIN over TLS: the password checked against the SCRAM credential.
    values = [f"aiokafka-{i}".encode() for i in range(100)]
    await aiokafka_produce(tls, "aiokafka", values, **aiokafka_plain(pki, ALICE))
    assert await aiokafka_consume(tls, "aiokafka", 100, **aiokafka_plain(pki, ALICE)) == values

    # Riverbed's client with each mechanism, over both SASL listeners, reading what the others
    # wrote: every listener serves the same log.
    for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
        for address, over_tls in ((tls, True), (plain, False)):
            settings = riverbed_sasl(pki, ALICE, mechanism, over_tls)
            topic = f"riverbed-{mechanism.lower()}-{over_tls}"
            await riverbed_produce(address, topic, [b"one", b"two"], **settings)
            assert await riverbed_consume(address, topic, 2, **settings) == [b"one", b"two"]
            assert await riverbed_consume(address, "kcat", 100, **settings) == lines


async def test_wrong_passwords_and_unknown_users_see_nothing(
    broker_factory: BrokerFactory, pki: Pki, zk_connect: str
) -> None:
    add_user(zk_connect, ALICE, "SCRAM-SHA-512")
    broker = sasl_broker(broker_factory, pki)
    tls = broker.address("SASL_SSL")
    await riverbed_produce(
        tls, "secret", [b"payroll"], **riverbed_sasl(pki, ALICE, "SCRAM-SHA-512", True)
    )

    for user in ((ALICE[0], "wrong"), ("mallory", "anything")):
        # librdkafka: an authentication error, never a record.
        error = await asyncio.to_thread(
            confluent_error, {"bootstrap.servers": tls, **librdkafka_scram(pki, user)}, "secret"
        )
        assert error.code() == confluent_kafka.KafkaError._AUTHENTICATION, error
        assert "SASL authentication error" in error.str(), error.str()
        # kcat fails and prints nothing.
        read = kcat(tls, librdkafka_scram(pki, user), "-C", "-t", "secret", "-p", "0", "-e", "-q")
        assert read.returncode != 0
        assert read.stdout == b""
        # aiokafka with PLAIN: the connection is refused during authentication.
        with pytest.raises(KafkaConnectionError):
            await aiokafka_consume(tls, "secret", 1, **aiokafka_plain(pki, user))
        # Riverbed: a typed AuthenticationError carrying SASL_AUTHENTICATION_FAILED.
        for mechanism in ("SCRAM-SHA-512", "PLAIN"):
            settings = riverbed_sasl(pki, user, mechanism, True)
            with pytest.raises(AuthenticationError) as refused:
                await riverbed_consume(tls, "secret", 1, **settings)
            assert refused.value.code.name == "SASL_AUTHENTICATION_FAILED"
            # Kafka's messages: SCRAM's names the mechanism, PLAIN's the pair.
            assert re.search("invalid credentials|Invalid username or password", str(refused.value))
    # Failures were logged by the broker, naming the reason only there.
    log = broker.log_tail(400)
    assert "event=client.authentication_failed" in log
    assert "mallory" in log


async def test_a_deleted_user_can_no_longer_authenticate(
    broker_factory: BrokerFactory, pki: Pki, zk_connect: str
) -> None:
    add_user(zk_connect, BOB, "SCRAM-SHA-256")
    broker = sasl_broker(broker_factory, pki)
    settings = riverbed_sasl(pki, BOB, "SCRAM-SHA-256", True)
    async with Admin(bootstrap_servers=broker.address("SASL_SSL"), **settings) as admin:
        assert await admin.list_topics() == []
    delete = ["users", "delete", BOB[0], "--zookeeper", zk_connect]
    await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "riverbed.cli", *delete],
        check=True,
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    # The broker's cache follows ZooKeeper's watch: soon every new connection is refused.
    async with asyncio.timeout(TIMEOUT_S):
        while True:
            try:
                async with Admin(bootstrap_servers=broker.address("SASL_SSL"), **settings) as admin:
                    await admin.list_topics()
            except AuthenticationError:
                break
            await asyncio.sleep(0.2)


async def test_brokers_authenticate_to_each_other(
    broker_factory: BrokerFactory, pki: Pki, zk_connect: str
) -> None:
    add_user(zk_connect, BROKER_USER, "SCRAM-SHA-512")
    add_user(zk_connect, ALICE, "SCRAM-SHA-512")
    settings = {
        "inter.broker.listener.name": "SASL_SSL",
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "min.insync.replicas": "2",
    }
    first = sasl_broker(broker_factory, pki, 1, **settings)
    second = sasl_broker(broker_factory, pki, 2, **settings)
    client = riverbed_sasl(pki, ALICE, "SCRAM-SHA-512", True)
    bootstrap = f"{first.address('SASL_SSL')},{second.address('SASL_SSL')}"
    async with Admin(bootstrap_servers=bootstrap, **client) as admin:

        async def both_registered() -> bool:
            return len((await admin.describe_cluster()).brokers) >= 2

        await wait_for(both_registered, TIMEOUT_S, what="both brokers registered")
        await admin.create_topic("replicated", partitions=1, replication_factor=2)
    values = [f"r{i}".encode() for i in range(50)]
    # acks=all with min.insync.replicas=2: only possible if the follower fetched, which it can
    # only do authenticated as `broker`.
    await riverbed_produce(bootstrap, "replicated", values, **client)
    async with Admin(bootstrap_servers=bootstrap, **client) as admin:
        cluster = await admin.describe_cluster()
    assert sorted(cluster.partitions[TopicPartition("replicated", 0)].isr) == [1, 2]
    # The broker that is not the controller must ask the controller over SASL_SSL to move its
    # leaderships (or followerships) away before it stops.
    leaving, survivor = (second, first) if cluster.controller_id == 1 else (first, second)
    assert leaving.terminate() == 0
    log = leaving.log_tail(400)
    assert f"controlled shutdown of broker {leaving.broker_id} succeeded" in log
    assert "attempt" not in log  # no failed attempt before it
    assert (
        await riverbed_consume(survivor.address("SASL_SSL"), "replicated", 50, **client) == values
    )


def test_inter_broker_sasl_needs_the_brokers_credentials(
    pki: Pki, tmp_path: Any, zk_connect: str
) -> None:
    broker = BrokerProcess(
        broker_id=1,
        zk_connect=zk_connect,
        data_dir=tmp_path / "data",
        log_dir=tmp_path,
        settings={
            "ssl.keystore.location": str(pki.broker),
            "inter.broker.listener.name": "SASL_SSL",
        },
        listeners=("SASL_SSL",),
    )
    broker.start()
    try:
        assert broker._require_process().wait(timeout=TIMEOUT_S) != 0
        errors = [line for line in broker.log_tail().splitlines() if "riverbed: error:" in line]
        assert len(errors) == 1, broker.log_tail()
        assert "sasl.jaas.config" in errors[0], broker.log_tail()
    finally:
        broker.kill()
