"""SaslHandshake / SaslAuthenticate on a broker listener without SASL (what every listener is until
the SASL listener exists): advertised as v0-1 / v0-2, answered ILLEGAL_SASL_STATE as Kafka's request
handlers answer them, and the connection stays usable.

The client checks double as evidence that clients pick SaslHandshake v1: librdkafka, aiokafka and
kafka-python read our ApiVersions, pick a handshake version, and report the broker's
ILLEGAL_SASL_STATE answer. v0 is advertised only because librdkafka 2.0 will not start SASL with a
broker whose range lacks it; a SASL listener closes a connection that sends v0.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
import warnings

import confluent_kafka
import confluent_kafka.admin
import pytest
from aiokafka import AIOKafkaClient
from aiokafka import errors as aiokafka_errors

from tests.interop import wire
from tests.support.broker import BrokerProcess

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import KafkaAdminClient
    from kafka import errors as kafka_errors

API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE = 17, 36
ILLEGAL_SASL_STATE = 34
SASL_CLIENT_CONFIG = {"username": "alice", "password": "wonderland"}
CLIENT_WAIT_S = 20.0
# kafka-python retries the bootstrap until this passes; the handshake fails within milliseconds.
KAFKA_PYTHON_TIMEOUT_MS = 3000


def test_sasl_apis_are_advertised_and_answered_illegal_state(broker: BrokerProcess) -> None:
    with wire.connect(broker.bootstrap) as sock:
        sock.sendall(wire.api_versions_request(1, 3))
        _, body = wire.read_response(sock)
        versions = wire.parse_api_versions_v3(body)
        handshake = versions.range_of(API_SASL_HANDSHAKE)
        authenticate = versions.range_of(API_SASL_AUTHENTICATE)
        assert (handshake.min_version, handshake.max_version) == (0, 1)
        assert (authenticate.min_version, authenticate.max_version) == (0, 2)

        sock.sendall(wire.request(API_SASL_HANDSHAKE, 1, 2, wire.string("SCRAM-SHA-256")))
        correlation_id, body = wire.read_response(sock)
        assert correlation_id == 2
        assert struct.unpack_from(">hi", body) == (ILLEGAL_SASL_STATE, 0)  # no mechanisms

        # SaslAuthenticate v0: AuthBytes (int32-prefixed bytes); the response is ErrorCode,
        # ErrorMessage (nullable string), AuthBytes.
        token = b"n,,n=alice,r=abc"
        sock.sendall(
            wire.request(API_SASL_AUTHENTICATE, 0, 3, struct.pack(">i", len(token)) + token)
        )
        correlation_id, body = wire.read_response(sock)
        assert correlation_id == 3
        (error_code, message_length) = struct.unpack_from(">hh", body)
        message = body[4 : 4 + message_length].decode()
        assert error_code == ILLEGAL_SASL_STATE
        assert message == "SaslAuthenticate request received after successful authentication"

        sock.sendall(wire.api_versions_request(4, 0))  # still served
        assert wire.read_response(sock)[0] == 4


def test_librdkafka_sends_a_handshake_we_read(broker: BrokerProcess) -> None:
    errors: list[str] = []
    seen = threading.Event()

    def on_error(error: confluent_kafka.KafkaError) -> None:
        errors.append(str(error))
        if "SASL" in str(error):
            seen.set()

    admin = confluent_kafka.admin.AdminClient(
        {
            "bootstrap.servers": broker.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": SASL_CLIENT_CONFIG["username"],
            "sasl.password": SASL_CLIENT_CONFIG["password"],
            # confluent-kafka's type for the configuration leaves out its callbacks and logger.
            "error_cb": on_error,  # type: ignore[dict-item]
            "logger": logging.getLogger("librdkafka"),  # type: ignore[dict-item]  # FAIL lines: captured, not printed
            "reconnect.backoff.ms": 1000,
        }
    )
    deadline = time.monotonic() + CLIENT_WAIT_S
    while not seen.is_set() and time.monotonic() < deadline:
        admin.poll(0.2)  # serves error_cb
    assert seen.is_set(), errors
    handshake_errors = [e for e in errors if "handshake failed" in e]
    assert handshake_errors, errors
    assert "Request not valid in current SASL state" in handshake_errors[0]


async def test_aiokafka_sends_a_handshake_we_read(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    client = AIOKafkaClient(
        bootstrap_servers=broker.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username=SASL_CLIENT_CONFIG["username"],
        sasl_plain_password=SASL_CLIENT_CONFIG["password"],
    )
    try:
        with pytest.raises(aiokafka_errors.KafkaError):
            await asyncio.wait_for(client.bootstrap(), CLIENT_WAIT_S)
    finally:
        await client.close()
    assert "IllegalSaslStateError" in caplog.text  # what aiokafka logs for the failed bootstrap


def test_kafka_python_sends_a_handshake_we_read(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(kafka_errors.KafkaError):
        KafkaAdminClient(
            bootstrap_servers=broker.bootstrap,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-256",
            sasl_plain_username=SASL_CLIENT_CONFIG["username"],
            sasl_plain_password=SASL_CLIENT_CONFIG["password"],
            request_timeout_ms=KAFKA_PYTHON_TIMEOUT_MS,
            # It retries a failed bootstrap until this (30 s by default); the first failure is
            # what the test reads.
            bootstrap_timeout_ms=KAFKA_PYTHON_TIMEOUT_MS,
        )
    assert "SaslHandshake failed: IllegalSaslStateError" in caplog.text
