"""The connection layer over a raw socket: ApiVersions negotiation and pipelined requests."""

from __future__ import annotations

import time

from tests.interop import wire
from tests.interop.drivers import ConfluentKafka
from tests.support.broker import BrokerProcess

# The APIs every client in tests/interop needs; each must be advertised.
REQUIRED_API_KEYS = {0, 1, 2, 3, 18, 19, 20}
PIPELINE_ROUNDS = 5


def assert_advertises_required_apis(versions: wire.ApiVersions) -> None:
    assert versions.error_code == wire.ERROR_NONE
    assert {entry.api_key for entry in versions.ranges} >= REQUIRED_API_KEYS
    own = versions.range_of(wire.API_API_VERSIONS)
    assert own.min_version == 0
    assert own.max_version >= 3
    assert all(0 <= entry.min_version <= entry.max_version for entry in versions.ranges)


def test_api_versions_v0_and_v3_agree(broker: BrokerProcess) -> None:
    with wire.connect(broker.bootstrap) as sock:
        sock.sendall(wire.api_versions_request(1, 0))
        correlation_id, body = wire.read_response(sock)
        assert correlation_id == 1
        v0 = wire.parse_api_versions_v0(body)

        sock.sendall(wire.api_versions_request(2, 3))
        correlation_id, body = wire.read_response(sock)
        assert correlation_id == 2
        v3 = wire.parse_api_versions_v3(body)

    assert_advertises_required_apis(v0)
    assert_advertises_required_apis(v3)
    assert sorted(v0.ranges, key=lambda e: e.api_key) == sorted(v3.ranges, key=lambda e: e.api_key)


def test_unsupported_api_versions_version_gets_error_35_with_v0_body(
    broker: BrokerProcess,
) -> None:
    with wire.connect(broker.bootstrap) as sock:
        # A client newer than the broker: the broker answers in v0 so the client can downgrade.
        sock.sendall(wire.api_versions_request(7, 127))
        correlation_id, body = wire.read_response(sock)
        assert correlation_id == 7
        versions = wire.parse_api_versions_v0(body)
        assert versions.error_code == wire.ERROR_UNSUPPORTED_VERSION
        assert versions.range_of(wire.API_API_VERSIONS).max_version >= 3

        # ...and the connection stays usable for the retry.
        sock.sendall(wire.api_versions_request(8, 0))
        assert wire.read_response(sock)[0] == 8


def test_pipelined_requests_are_answered_in_request_order(
    broker: BrokerProcess, topic: str
) -> None:
    assert ConfluentKafka(broker.bootstrap).create_topic(topic, 1) == 0
    batch = wire.record_batch([b"pipelined"], timestamp_ms=int(time.time() * 1000))
    requests: list[bytes] = []
    produce_ids: list[int] = []
    for _ in range(PIPELINE_ROUNDS):
        # A slow request (produce, acks=all) between fast ones: answers must not overtake it.
        produce_ids.append(len(requests) + 3)
        requests += [
            wire.api_versions_request(len(requests) + 1, 0),
            wire.metadata_request_v1(len(requests) + 2),
            wire.produce_request_v3(len(requests) + 3, topic, 0, batch),
            wire.api_versions_request(len(requests) + 4, 3),
        ]

    with wire.connect(broker.bootstrap) as sock:
        sock.sendall(b"".join(requests))
        responses = [wire.read_response(sock) for _ in requests]

    assert [correlation_id for correlation_id, _ in responses] == list(range(1, len(requests) + 1))
    assert wire.produced(responses, produce_ids) == [
        [(wire.ERROR_NONE, offset)] for offset in range(PIPELINE_ROUNDS)
    ]
