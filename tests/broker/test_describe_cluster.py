"""DescribeCluster's answer from a metadata cache, without a broker: brokers by listener with
their racks, the controller, the endpoint types Kafka's brokers refuse, and the authorized
operations with and without an authorizer. The real brokers and clients are in
tests/interop/test_describe_cluster.py."""

from __future__ import annotations

import warnings
from typing import Final

import pytest
from riverbed.broker.handlers.cluster_view import OPERATIONS_NOT_REQUESTED, brokers_on
from riverbed.broker.handlers.describe_cluster import describe_cluster
from riverbed.coordination.layout import BrokerRegistration
from riverbed.coordination.metadata_cache import MetadataCache
from riverbed.protocol import messages as m
from riverbed.protocol.codec import decode_request_body, encode_response_body
from riverbed.protocol.errors import ErrorCode
from riverbed.security.access import ALLOW_ALL, Access, AclAccess
from riverbed.security.acl import AclBinding, AclOperation, AclPermissionType, PatternType
from riverbed.security.acl import ResourceType as R
from riverbed.security.authorizer import Authorizer, AuthorizerSettings
from riverbed.security.session import KafkaPrincipal, Session

from tests.security.test_acl_model import snapshot_of

with warnings.catch_warnings():  # kafka-python 3 loads its schemas with a deprecated API
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.admin import cluster as kp_cluster

Op = AclOperation
Broker = m.DescribeClusterResponse.DescribeClusterBroker
CLUSTER_ID: Final = "q1Sh-9_ISia_zwGINzRvyQ"
# Every operation Kafka defines on the cluster: CREATE, ALTER, DESCRIBE, CLUSTER_ACTION,
# DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, as bits of their codes.
EVERY_CLUSTER_OPERATION_CODES: Final = {5, 7, 8, 9, 10, 11, 12}
EVERY_CLUSTER_OPERATION: Final = sum(1 << code for code in EVERY_CLUSTER_OPERATION_CODES)


def registration(broker_id: int, rack: str | None, *, sasl: bool = True) -> BrokerRegistration:
    endpoints = [f"PLAINTEXT://127.0.0.1:{9090 + broker_id}"]
    if sasl:
        endpoints.append(f"SASL_PLAINTEXT://10.0.0.{broker_id}:{9190 + broker_id}")
    return BrokerRegistration(
        broker_id=broker_id,
        host="127.0.0.1",
        port=9090 + broker_id,
        endpoints=tuple(endpoints),
        rack=rack,
        security_protocols={"SASL_PLAINTEXT": "SASL_PLAINTEXT"} if sasl else {},
    )


def cache_of(*brokers: BrokerRegistration, controller: int | None) -> MetadataCache:
    cache = MetadataCache()
    cache.apply_cluster_id(CLUSTER_ID)
    for broker in brokers:
        cache.apply_broker(broker.broker_id, broker)
    cache.apply_controller(controller)
    return cache


THREE_RACKS: Final = (registration(3, "rack-c"), registration(1, "rack-a"), registration(2, None))


def access_of(principal: str, *bindings: AclBinding, super_users: str = "") -> Access:
    snapshot = snapshot_of(list(bindings))
    supers = frozenset(filter(None, super_users.split(";")))
    authorizer = Authorizer(AuthorizerSettings(supers), lambda: snapshot)
    session = Session(KafkaPrincipal.parse(principal), "127.0.0.1")
    return AclAccess(authorizer, session, "DescribeCluster")


def cluster_grant(principal: str, operation: AclOperation) -> AclBinding:
    return AclBinding(
        R.CLUSTER, "kafka-cluster", PatternType.LITERAL, principal, "*", operation,
        AclPermissionType.ALLOW,
    )  # fmt: skip


def test_brokers_by_id_at_their_address_on_the_request_listener_with_racks() -> None:
    cache = cache_of(*THREE_RACKS, controller=2)
    request = m.DescribeClusterRequest()

    plaintext = describe_cluster(cache, request, ALLOW_ALL, "PLAINTEXT")
    sasl = describe_cluster(cache, request, ALLOW_ALL, "SASL_PLAINTEXT")

    assert plaintext == m.DescribeClusterResponse(
        error_code=ErrorCode.NONE,
        endpoint_type=1,
        cluster_id=CLUSTER_ID,
        controller_id=2,
        brokers=[
            Broker(broker_id=1, host="127.0.0.1", port=9091, rack="rack-a"),
            Broker(broker_id=2, host="127.0.0.1", port=9092, rack=None),
            Broker(broker_id=3, host="127.0.0.1", port=9093, rack="rack-c"),
        ],
        cluster_authorized_operations=OPERATIONS_NOT_REQUESTED,
    )
    assert [(b.host, b.port) for b in sasl.brokers] == [
        ("10.0.0.1", 9191),
        ("10.0.0.2", 9192),
        ("10.0.0.3", 9193),
    ]


def test_metadata_and_describe_cluster_list_the_same_brokers() -> None:
    cache = cache_of(*THREE_RACKS, registration(4, "rack-d", sasl=False), controller=1)
    answer = describe_cluster(cache, m.DescribeClusterRequest(), ALLOW_ALL, "SASL_PLAINTEXT")
    listed = brokers_on("SASL_PLAINTEXT", cache.brokers())
    assert [(b.broker_id, b.host, b.port, b.rack) for b in answer.brokers] == [
        (b.broker_id, b.host, b.port, b.rack) for b in listed
    ]
    assert [b.broker_id for b in listed] == [1, 2, 3]  # broker 4 has no such listener


@pytest.mark.parametrize(
    ("controller", "listener", "expected"),
    [
        (3, "PLAINTEXT", 3),
        (None, "PLAINTEXT", -1),  # no controller elected
        (4, "PLAINTEXT", 4),
        (4, "SASL_PLAINTEXT", -1),  # the controller has no endpoint on this listener
        (9, "PLAINTEXT", -1),  # an id the cache holds no registration of
    ],
)
def test_the_controller_is_one_of_the_listed_brokers_or_minus_one(
    controller: int | None, listener: str, expected: int
) -> None:
    cache = cache_of(*THREE_RACKS, registration(4, None, sasl=False), controller=controller)
    answer = describe_cluster(cache, m.DescribeClusterRequest(), ALLOW_ALL, listener)
    assert answer.controller_id == expected


@pytest.mark.parametrize(
    ("endpoint_type", "error"),
    [
        (2, ErrorCode.MISMATCHED_ENDPOINT_TYPE),  # controllers: this is a broker
        (0, ErrorCode.UNSUPPORTED_ENDPOINT_TYPE),
        (3, ErrorCode.UNSUPPORTED_ENDPOINT_TYPE),
        (-1, ErrorCode.UNSUPPORTED_ENDPOINT_TYPE),
    ],
)
def test_endpoint_types_other_than_brokers_are_refused_as_kafka_brokers_do(
    endpoint_type: int, error: ErrorCode
) -> None:
    cache = cache_of(*THREE_RACKS, controller=1)
    request = m.DescribeClusterRequest(endpoint_type=endpoint_type)
    answer = describe_cluster(cache, request, ALLOW_ALL, "PLAINTEXT")
    assert answer.error_code == error
    assert answer.error_message
    assert answer.brokers == []
    assert answer.controller_id == -1


def test_fenced_brokers_asked_for_add_nobody() -> None:
    cache = cache_of(*THREE_RACKS, controller=1)
    plain = describe_cluster(cache, m.DescribeClusterRequest(), ALLOW_ALL, "PLAINTEXT")
    fenced = m.DescribeClusterRequest(include_fenced_brokers=True)
    with_fenced = describe_cluster(cache, fenced, ALLOW_ALL, "PLAINTEXT")
    assert with_fenced == plain
    assert not any(b.is_fenced for b in with_fenced.brokers)


def test_authorized_operations_without_an_authorizer_are_every_cluster_operation() -> None:
    cache = cache_of(*THREE_RACKS, controller=1)
    request = m.DescribeClusterRequest(include_cluster_authorized_operations=True)
    answer = describe_cluster(cache, request, ALLOW_ALL, "PLAINTEXT")
    assert answer.cluster_authorized_operations == EVERY_CLUSTER_OPERATION


@pytest.mark.parametrize(
    ("access", "expected"),
    [
        (access_of("User:bob"), 0),  # no DESCRIBE on the cluster: 0, and no error
        (access_of("User:alice", cluster_grant("User:alice", Op.DESCRIBE)), 1 << Op.DESCRIBE),
        # ALTER implies DESCRIBE (Kafka's implied operations).
        (
            access_of("User:alice", cluster_grant("User:alice", Op.ALTER)),
            (1 << Op.ALTER) | (1 << Op.DESCRIBE),
        ),
        # DESCRIBE_CONFIGS alone does not pass the DESCRIBE check the bitfield needs.
        (access_of("User:alice", cluster_grant("User:alice", Op.DESCRIBE_CONFIGS)), 0),
        (access_of("User:admin", super_users="User:admin"), EVERY_CLUSTER_OPERATION),
    ],
    ids=["nothing", "describe", "alter", "describe-configs", "super-user"],
)
def test_authorized_operations_are_what_the_acls_allow(access: Access, expected: int) -> None:
    cache = cache_of(*THREE_RACKS, controller=1)
    asked = m.DescribeClusterRequest(include_cluster_authorized_operations=True)
    answer = describe_cluster(cache, asked, access, "PLAINTEXT")
    assert answer.error_code == ErrorCode.NONE
    assert [b.broker_id for b in answer.brokers] == [1, 2, 3]
    assert answer.cluster_authorized_operations == expected
    not_asked = describe_cluster(cache, m.DescribeClusterRequest(), access, "PLAINTEXT")
    assert not_asked.cluster_authorized_operations == OPERATIONS_NOT_REQUESTED


@pytest.mark.parametrize("version", [0, 1, 2])
def test_kafka_python_request_and_response_on_the_wire(version: int) -> None:
    """What kafka-python 3's KafkaAdminClient.describe_cluster() sends (authorized operations
    and fenced brokers asked for), decoded by us; our answer, decoded by kafka-python."""
    theirs = kp_cluster.DescribeClusterRequest(
        include_cluster_authorized_operations=True, include_fenced_brokers=True
    )
    request = decode_request_body(60, version, memoryview(theirs.encode(version=version)), 0)
    assert request == m.DescribeClusterRequest(
        include_cluster_authorized_operations=True, include_fenced_brokers=version >= 2
    )
    cache = cache_of(*THREE_RACKS, controller=3)
    assert isinstance(request, m.DescribeClusterRequest)
    answer = describe_cluster(cache, request, ALLOW_ALL, "PLAINTEXT")
    wire = b"".join(
        chunk
        for chunk in encode_response_body(answer, version)
        if isinstance(chunk, bytes)  # a response of plain fields only
    )
    decoded = kp_cluster.DescribeClusterResponse.decode(wire, version=version)
    assert decoded.cluster_id == CLUSTER_ID
    assert decoded.controller_id == 3
    assert decoded.authorized_operations == EVERY_CLUSTER_OPERATION_CODES  # a bitfield, as codes
    assert [(b.broker_id, b.host, b.port, b.rack) for b in decoded.brokers] == [
        (1, "127.0.0.1", 9091, "rack-a"),
        (2, "127.0.0.1", 9092, None),
        (3, "127.0.0.1", 9093, "rack-c"),
    ]
