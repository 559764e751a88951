"""Produce and consume with each client library under a given security configuration, bounded
in time, returning plain values; the security tests are written once per behaviour with these."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from typing import Any, Final

import confluent_kafka
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.helpers import create_ssl_context
from riverbed import Consumer, Producer, TopicPartition

from tools.pki import Pki

KCAT: Final = "/usr/bin/kcat"
TIMEOUT_S: Final = 30.0
# Large values must fit a fetch whatever the client's defaults.
FETCH_BYTES_MAX: Final = 4 * 1024 * 1024
BEGINNING: Final = confluent_kafka.OFFSET_BEGINNING


async def riverbed_produce(address: str, topic: str, values: list[bytes], **settings: Any) -> None:
    async with Producer(bootstrap_servers=address, acks="all", **settings) as producer:
        for index, value in enumerate(values):
            await producer.send(topic, value, key=str(index).encode(), partition=0)
        await producer.flush()


async def riverbed_consume(address: str, topic: str, count: int, **settings: Any) -> list[bytes]:
    values: list[bytes] = []
    async with Consumer(bootstrap_servers=address, **settings) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
        async with asyncio.timeout(TIMEOUT_S):
            while len(values) < count:
                batches = await consumer.getmany(timeout_ms=500)
                values.extend(r.value or b"" for records in batches.values() for r in records)
    return values


def confluent_produce(conf: Mapping[str, str], topic: str, values: list[bytes]) -> None:
    failures: list[str] = []

    def delivered(error: confluent_kafka.KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer = confluent_kafka.Producer({**conf, "acks": "all", "message.timeout.ms": 20_000})
    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=delivered)
    remaining = producer.flush(TIMEOUT_S)
    assert remaining == 0, (remaining, failures)
    assert not failures, (remaining, failures)


def confluent_consume(conf: Mapping[str, str], topic: str, count: int) -> list[bytes]:
    consumer = confluent_kafka.Consumer(
        {
            **conf,
            "group.id": f"security-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "fetch.message.max.bytes": FETCH_BYTES_MAX,
        }
    )
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        values: list[bytes] = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            value = message.value()
            assert value is not None
            values.append(value)
        return values
    finally:
        consumer.close()


def confluent_error(conf: Mapping[str, str], topic: str) -> confluent_kafka.KafkaError:
    """The error librdkafka reports when it tries to read `topic` (authentication, ...): the
    first error of a consumer polling it, or of a metadata request."""
    errors: list[confluent_kafka.KafkaError] = []
    consumer = confluent_kafka.Consumer(
        {
            **conf,
            "group.id": f"security-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "error_cb": errors.append,
        }
    )
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        deadline = time.monotonic() + TIMEOUT_S
        while not errors and time.monotonic() < deadline:
            message = consumer.poll(0.3)
            if message is not None:
                error = message.error()
                assert error is not None, "a record was read"
                errors.append(error)
        assert errors, "no error reported"
        return errors[0]
    finally:
        consumer.close()


async def aiokafka_produce(address: str, topic: str, values: list[bytes], **security: Any) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=address, acks="all", **security)
    try:
        await producer.start()  # inside: a failed start must still be stopped
        for value in values:
            await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


async def aiokafka_consume(address: str, topic: str, count: int, **security: Any) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=address,
        enable_auto_commit=False,
        max_partition_fetch_bytes=FETCH_BYTES_MAX,
        **security,
    )
    try:
        await consumer.start()  # inside: a failed start must still be stopped
        partition = AioTopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        values: list[bytes] = []
        async with asyncio.timeout(TIMEOUT_S):
            while len(values) < count:
                batches = await consumer.getmany(timeout_ms=500)
                values.extend(r.value for records in batches.values() for r in records)
        return values
    finally:
        await consumer.stop()


def kcat(
    address: str, settings: Mapping[str, str], *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    options = [arg for key, value in settings.items() for arg in ("-X", f"{key}={value}")]
    return subprocess.run(
        [KCAT, "-b", address, *options, *args],
        input=stdin,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )


# -- SASL users and each library's settings for them -----------------------------------------------

User = tuple[str, str]  # (name, password)


def add_user(zk_connect: str, user: User, mechanism: str = "SCRAM-SHA-512") -> None:
    """`riverbed users add`, as an operator runs it."""
    name, password = user
    subprocess.run(
        [sys.executable, "-m", "riverbed.cli", "users", "add", name, "--mechanism", mechanism,
         "--password", password, "--zookeeper", zk_connect],
        check=True, capture_output=True, timeout=TIMEOUT_S,
    )  # fmt: skip


def librdkafka_scram(pki: Pki, user: User) -> dict[str, str]:
    """librdkafka (kcat, confluent-kafka): SCRAM-SHA-512 over SASL_SSL."""
    return {
        "security.protocol": "sasl_ssl",
        "ssl.ca.location": str(pki.ca),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user[0],
        "sasl.password": user[1],
    }


def aiokafka_plain(pki: Pki, user: User) -> dict[str, Any]:
    """aiokafka: PLAIN over TLS (SASL_SSL)."""
    return {
        "security_protocol": "SASL_SSL",
        "ssl_context": create_ssl_context(cafile=str(pki.ca)),
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": user[0],
        "sasl_plain_password": user[1],
    }


def riverbed_sasl(
    pki: Pki, user: User, mechanism: str = "SCRAM-SHA-512", tls: bool = True
) -> dict[str, Any]:
    """Riverbed's client: `mechanism` over SASL_SSL (or SASL_PLAINTEXT)."""
    settings: dict[str, Any] = {
        "security_protocol": "sasl_ssl" if tls else "sasl_plaintext",
        "sasl_mechanism": mechanism,
        "sasl_username": user[0],
        "sasl_password": user[1],
    }
    if tls:
        settings["ssl_ca_location"] = str(pki.ca)
    return settings
