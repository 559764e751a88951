"""ACLs managed with the admin clients of confluent-kafka (librdkafka) and kafka-python, used as
their docs say: create, describe (with filters) and delete against a broker with the authorizer
on, each seeing what the other and Riverbed's own Admin wrote; and SECURITY_DISABLED without
an authorizer."""

from __future__ import annotations

from typing import Any, Final

import confluent_kafka
import kafka.admin
import kafka.errors
import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)
from riverbed import AclBinding as RiverbedBinding
from riverbed import Admin

from tests.support.broker import BrokerFactory, BrokerProcess

TIMEOUT_S: Final = 20.0
# Every connection is User:ANONYMOUS until SASL: as a super user it may manage ACLs.
SETTINGS: Final = {
    "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
    "super.users": "User:ANONYMOUS",
}
SECURITY_DISABLED: Final = 54


def confluent_admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def resolved(futures: dict[Any, Any]) -> dict[Any, Any]:
    return {key: future.result(TIMEOUT_S) for key, future in futures.items()}


def acl_filter(
    restype: ResourceType,
    name: str | None,
    pattern_type: ResourcePatternType,
    principal: str | None,
    host: str | None,
    operation: AclOperation,
    permission_type: AclPermissionType,
) -> AclBindingFilter:
    """confluent-kafka's AclBindingFilter: None matches any name, principal or host, as its
    documentation says (its types, AclBinding's, leave None out)."""
    fields = (restype, name, pattern_type, principal, host, operation, permission_type)
    return AclBindingFilter(*fields)  # type: ignore[arg-type]


def confluent_triples(bindings: list[Any]) -> set[tuple[str, str, str, str, str, str, str]]:
    return {
        (b.restype.name, b.name, b.resource_pattern_type.name, b.principal, b.host,
         b.operation.name, b.permission_type.name)
        for b in bindings
    }  # fmt: skip


async def test_confluent_kafka_manages_acls(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SETTINGS)
    admin = confluent_admin(broker)
    read = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice",
                      "*", AclOperation.READ, AclPermissionType.ALLOW)  # fmt: skip
    deny = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:bob",
                      "10.0.0.1", AclOperation.WRITE, AclPermissionType.DENY)  # fmt: skip
    prefixed = AclBinding(ResourceType.GROUP, "team-", ResourcePatternType.PREFIXED, "User:alice",
                          "*", AclOperation.READ, AclPermissionType.ALLOW)  # fmt: skip
    assert set(resolved(admin.create_acls([read, deny, prefixed]))) == {read, deny, prefixed}
    everything = acl_filter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    described = admin.describe_acls(everything).result(TIMEOUT_S)
    assert confluent_triples(described) == confluent_triples([read, deny, prefixed])
    matching = acl_filter(ResourceType.GROUP, "team-blue", ResourcePatternType.MATCH, None,
                                None, AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    assert confluent_triples(admin.describe_acls(matching).result(TIMEOUT_S)) == (
        confluent_triples([prefixed])
    )
    # Riverbed's Admin reads what librdkafka wrote.
    async with Admin(bootstrap_servers=broker.bootstrap) as riverbed_admin:
        assert len(await riverbed_admin.describe_acls()) == 3
    bob = acl_filter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:bob", None,
                           AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    (deleted,) = resolved(admin.delete_acls([bob])).values()
    assert confluent_triples(deleted) == confluent_triples([deny])
    remaining = admin.describe_acls(everything).result(TIMEOUT_S)
    assert confluent_triples(remaining) == confluent_triples([read, prefixed])


def kafka_python_acl(
    principal: str, operation: Any, permission: Any, name: str, pattern_type: Any
) -> kafka.admin.ACL:
    return kafka.admin.ACL(
        principal=principal,
        host="*",
        operation=operation,
        permission_type=permission,
        resource_pattern=kafka.admin.ResourcePattern(
            kafka.admin.ResourceType.TOPIC, name, pattern_type
        ),
    )


async def test_kafka_python_manages_acls(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SETTINGS)
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        literal, prefixed = (
            kafka.admin.ACLResourcePatternType.LITERAL,
            kafka.admin.ACLResourcePatternType.PREFIXED,
        )
        allow = kafka.admin.ACLPermissionType.ALLOW
        write = kafka_python_acl("User:carol", kafka.admin.ACLOperation.WRITE, allow, "logs",
                                 literal)  # fmt: skip
        describe = kafka_python_acl("User:carol", kafka.admin.ACLOperation.DESCRIBE, allow, "log",
                                    prefixed)  # fmt: skip
        created = client.create_acls([write, describe])
        assert created["failed"] == []
        assert len(created["succeeded"]) == 2
        carol = kafka.admin.ACLFilter(
            principal="User:carol",
            host=None,
            operation=kafka.admin.ACLOperation.ANY,
            permission_type=kafka.admin.ACLPermissionType.ANY,
            resource_pattern=kafka.admin.ResourcePatternFilter(
                kafka.admin.ResourceType.ANY, None, kafka.admin.ACLResourcePatternType.ANY
            ),
        )
        found, error = client.describe_acls(carol)
        assert error is kafka.errors.NoError
        assert {(a.operation, a.resource_pattern.pattern_type) for a in found} == {
            (kafka.admin.ACLOperation.WRITE, literal),
            (kafka.admin.ACLOperation.DESCRIBE, prefixed),
        }
        # Riverbed's Admin and kafka-python see each other's ACLs.
        async with Admin(bootstrap_servers=broker.bootstrap) as riverbed_admin:
            added = RiverbedBinding.from_codes(2, "metrics", 3, "User:carol", "*", 3, 3)
            await riverbed_admin.create_acls([added])
        found, _ = client.describe_acls(carol)
        assert len(found) == 3
        ((_, deleted, delete_error),) = client.delete_acls([carol])
        assert delete_error is kafka.errors.NoError
        assert len(deleted) == 3
        assert client.describe_acls(carol)[0] == []
    finally:
        client.close()


def test_without_an_authorizer_clients_get_security_disabled(broker: BrokerProcess) -> None:
    admin = confluent_admin(broker)
    read = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice",
                      "*", AclOperation.READ, AclPermissionType.ALLOW)  # fmt: skip
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        resolved(admin.create_acls([read]))
    assert refused.value.args[0].code() == SECURITY_DISABLED
    # librdkafka (2.12-2.16) drops DescribeAcls' top-level error code: an empty listing, as
    # against Kafka itself; the broker's authorizer.class.name tells the two apart.
    everything = acl_filter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)  # fmt: skip
    assert admin.describe_acls(everything).result(TIMEOUT_S) == []
    resource = ConfigResource(ResourceType.BROKER, "1")
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    assert configs["authorizer.class.name"].value == ""
    client = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        with pytest.raises(kafka.errors.SecurityDisabledError):
            client.describe_acls(
                kafka.admin.ACLFilter(
                    principal=None,
                    host=None,
                    operation=kafka.admin.ACLOperation.ANY,
                    permission_type=kafka.admin.ACLPermissionType.ANY,
                    resource_pattern=kafka.admin.ResourcePatternFilter(
                        kafka.admin.ResourceType.ANY, None, kafka.admin.ACLResourcePatternType.ANY
                    ),
                )
            )
    finally:
        client.close()
