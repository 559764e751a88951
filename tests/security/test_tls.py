"""TLS listeners with real brokers and real clients: Riverbed's, librdkafka (confluent-kafka and
kcat), aiokafka; client certificates; brokers replicating to each other over TLS; bad TLS
material as one-line errors."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, Final

import confluent_kafka
import confluent_kafka.admin
import pytest
from aiokafka.helpers import create_ssl_context
from riverbed import Admin, TopicPartition
from riverbed.client.connection import ConnectionClosedError

from tests.security.clients import (
    TIMEOUT_S,
    aiokafka_consume,
    confluent_consume,
    kcat,
    riverbed_consume,
    riverbed_produce,
)
from tests.support.broker import BrokerFactory, BrokerProcess, BrokerStartError
from tests.support.cluster import wait_for
from tools.pki import BROKER_KEY_PASSWORD, Pki

# Over one TLS chunk (256 KiB), so a fetch response's file region is written in several.
LARGE_VALUE: Final = os.urandom(700 * 1024)


def broker_tls(pki: Pki, **extra: str) -> dict[str, str]:
    return {
        "ssl.keystore.location": str(pki.broker),
        "ssl.truststore.location": str(pki.ca),
        **extra,
    }


def riverbed_tls(pki: Pki, **extra: Any) -> dict[str, Any]:
    return {"security_protocol": "ssl", "ssl_ca_location": str(pki.ca), **extra}


def librdkafka_tls(pki: Pki, **extra: str) -> dict[str, str]:
    return {"security.protocol": "ssl", "ssl.ca.location": str(pki.ca), **extra}


async def test_every_client_reads_and_writes_over_tls(
    broker_factory: BrokerFactory, pki: Pki
) -> None:
    broker = broker_factory(broker_tls(pki), listeners=("PLAINTEXT", "SSL"))
    tls_address = broker.address("SSL")
    values = [f"tls-{i}".encode() for i in range(200)] + [LARGE_VALUE]
    await riverbed_produce(tls_address, "secured", values, **riverbed_tls(pki))

    # Metadata over the TLS listener names every broker by its TLS address.
    admin = confluent_kafka.admin.AdminClient(
        {"bootstrap.servers": tls_address, **librdkafka_tls(pki)}
    )
    brokers = admin.list_topics(timeout=TIMEOUT_S).brokers
    assert [f"{b.host}:{b.port}" for b in brokers.values()] == [tls_address]

    assert (
        await riverbed_consume(tls_address, "secured", len(values), **riverbed_tls(pki)) == values
    )
    conf = {"bootstrap.servers": tls_address, **librdkafka_tls(pki)}
    assert await asyncio.to_thread(confluent_consume, conf, "secured", len(values)) == values
    context = create_ssl_context(cafile=str(pki.ca))
    aiokafka_tls = {"security_protocol": "SSL", "ssl_context": context}
    assert await aiokafka_consume(tls_address, "secured", len(values), **aiokafka_tls) == values
    read = kcat(tls_address, librdkafka_tls(pki), "-C", "-t", "secured", "-p", "0",
                "-o", "beginning", "-c", "200", "-q")  # fmt: skip
    assert read.returncode == 0, read.stderr.decode()
    assert read.stdout.split(b"\n")[:200] == values[:200]

    # The same records through the plaintext listener: the listeners serve one log.
    assert await riverbed_consume(broker.bootstrap, "secured", len(values)) == values


async def test_a_client_that_does_not_trust_the_broker_is_refused(
    broker_factory: BrokerFactory, pki: Pki
) -> None:
    broker = broker_factory(broker_tls(pki), listeners=("SSL",))
    rogue = riverbed_tls(pki, ssl_ca_location=str(pki.rogue_ca), request_timeout_ms=3000)
    async with Admin(bootstrap_servers=broker.bootstrap, **rogue) as admin:
        with pytest.raises(ConnectionClosedError, match="CERTIFICATE_VERIFY_FAILED"):
            await admin.list_topics()
    # Plaintext bytes to a TLS listener are not Kafka requests: the broker drops them and serves on.
    async with Admin(bootstrap_servers=broker.bootstrap, request_timeout_ms=3000) as admin:
        with pytest.raises((ConnectionClosedError, TimeoutError)):
            await admin.list_topics()
    async with Admin(bootstrap_servers=broker.bootstrap, **riverbed_tls(pki)) as admin:
        assert await admin.list_topics() == []


async def test_client_certificates_when_the_listener_requires_them(
    broker_factory: BrokerFactory, pki: Pki
) -> None:
    broker = broker_factory(broker_tls(pki, **{"ssl.client.auth": "required"}), listeners=("SSL",))
    without = riverbed_tls(pki, request_timeout_ms=3000)
    async with Admin(bootstrap_servers=broker.bootstrap, **without) as admin:
        with pytest.raises(ConnectionClosedError):
            await admin.list_topics()
    with_certificate = riverbed_tls(
        pki, ssl_certificate_location=str(pki.client_cert), ssl_key_location=str(pki.client_key)
    )
    await riverbed_produce(broker.bootstrap, "mutual", [b"a", b"b"], **with_certificate)
    conf = {
        "bootstrap.servers": broker.bootstrap,
        **librdkafka_tls(
            pki,
            **{
                "ssl.certificate.location": str(pki.client_cert),
                "ssl.key.location": str(pki.client_key),
            },
        ),
    }
    assert await asyncio.to_thread(confluent_consume, conf, "mutual", 2) == [b"a", b"b"]


async def test_brokers_replicate_to_each_other_over_tls(
    broker_factory: BrokerFactory, pki: Pki
) -> None:
    # Only TLS listeners, client certificates required: replica fetches and controlled shutdown
    # go broker to broker over TLS, each broker presenting its keystore.
    settings = broker_tls(pki, **{"ssl.client.auth": "required", "min.insync.replicas": "2"})
    first = broker_factory(settings, broker_id=1, listeners=("SSL",))
    second = broker_factory(settings, broker_id=2, listeners=("SSL",))
    client = riverbed_tls(
        pki, ssl_certificate_location=str(pki.client_cert), ssl_key_location=str(pki.client_key)
    )
    bootstrap = f"{first.bootstrap},{second.bootstrap}"
    async with Admin(bootstrap_servers=bootstrap, **client) as admin:

        async def both_registered() -> bool:
            return len((await admin.describe_cluster()).brokers) >= 2

        await wait_for(both_registered, TIMEOUT_S, what="both brokers registered")
        await admin.create_topic("replicated", partitions=1, replication_factor=2)
    values = [f"r{i}".encode() for i in range(50)]
    # acks=all with min.insync.replicas=2 succeeds only if the follower copies over TLS.
    await riverbed_produce(bootstrap, "replicated", values, **client)
    async with Admin(bootstrap_servers=bootstrap, **client) as admin:
        partition = (await admin.describe_cluster()).partitions[TopicPartition("replicated", 0)]
        assert sorted(partition.isr) == [1, 2]
    leader = first if partition.leader == 1 else second
    # A clean stop hands the leadership over through the controller, over TLS.
    assert leader.terminate() == 0
    survivor = second if leader is first else first
    assert await riverbed_consume(survivor.bootstrap, "replicated", len(values), **client) == values


def test_encrypted_broker_key_needs_its_password(broker_factory: BrokerFactory, pki: Pki) -> None:
    settings = broker_tls(pki, **{"ssl.keystore.location": str(pki.broker_encrypted)})
    with pytest.raises(BrokerStartError) as refused:
        broker_factory({**settings, "ssl.key.password": "wrong"}, listeners=("SSL",))
    assert "ssl.keystore.location" in str(refused.value)
    broker = broker_factory(
        {**settings, "ssl.key.password": BROKER_KEY_PASSWORD}, broker_id=2, listeners=("SSL",)
    )
    assert broker.running


@pytest.mark.parametrize(
    ("settings", "listeners", "named"),
    [
        ({}, ("SSL",), "ssl.keystore.location"),
        ({"ssl.keystore.location": "/nonexistent/broker.pem"}, ("SSL",), "ssl.keystore.location"),
        (
            {"ssl.keystore.location": "BROKER", "ssl.client.auth": "required"},
            ("SSL",),
            "ssl.truststore.location",
        ),
        ({"inter.broker.listener.name": "INTERNAL"}, ("PLAINTEXT",), "inter.broker.listener.name"),
    ],
)
def test_bad_tls_and_listener_settings_are_one_line_errors(
    pki: Pki,
    tmp_path: Path,
    zk_connect: str,
    settings: dict[str, str],
    listeners: tuple[str, ...],
    named: str,
) -> None:
    settings = {k: str(pki.broker) if v == "BROKER" else v for k, v in settings.items()}
    broker = BrokerProcess(
        broker_id=1,
        zk_connect=zk_connect,
        data_dir=tmp_path / "data",
        log_dir=tmp_path,
        settings=settings,
        listeners=listeners,
    )
    broker.start()
    try:
        with pytest.raises(BrokerStartError):
            broker.wait_ready(timeout_s=30)
        errors = [line for line in broker.log_tail().splitlines() if "riverbed: error:" in line]
        assert len(errors) == 1, broker.log_tail()
        assert named in errors[0], broker.log_tail()
    finally:
        broker.kill()
