"""DescribeAcls, CreateAcls and DeleteAcls on a real broker: through the Admin client, raw (to
see per-binding errors and versions) and through `riverbed acls`; SECURITY_DISABLED without an
authorizer; the znodes they leave in ZooKeeper."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Final

import pytest
from riverbed import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    Admin,
    PatternType,
    ResourceType,
)
from riverbed.coordination.zk import AsyncZooKeeper
from riverbed.errors import AuthorizationError, SecurityDisabledError
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.security.acl import binding_order

from tests.security.acl_support import SECURED, connect
from tests.support.broker import BrokerFactory, BrokerProcess

Op, A, P, R = AclOperation, AclPermissionType, PatternType, ResourceType
# User:ANONYMOUS (every connection, until SASL) may manage ACLs here.
SUPER: Final = {**SECURED, "super.users": "User:admin;User:ANONYMOUS"}
BINDINGS: Final = [
    AclBinding(R.TOPIC, "orders", P.LITERAL, "User:alice", "*", Op.READ, A.ALLOW),
    AclBinding(R.TOPIC, "orders", P.LITERAL, "User:bob", "10.0.0.7", Op.WRITE, A.DENY),
    AclBinding(R.TOPIC, "ord", P.PREFIXED, "User:alice", "*", Op.DESCRIBE, A.ALLOW),
    AclBinding(R.TOPIC, "*", P.LITERAL, "User:*", "*", Op.DESCRIBE_CONFIGS, A.ALLOW),
    AclBinding(R.GROUP, "team-", P.PREFIXED, "User:alice", "*", Op.READ, A.ALLOW),
    AclBinding(R.CLUSTER, "kafka-cluster", P.LITERAL, "User:ops", "*", Op.ALTER, A.ALLOW),
    AclBinding(R.TRANSACTIONAL_ID, "tx", P.LITERAL, "User:alice", "*", Op.WRITE, A.ALLOW),
]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli", "acls", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_without_an_authorizer_acls_are_disabled(broker: BrokerProcess) -> None:
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        with pytest.raises(SecurityDisabledError, match="No Authorizer is configured"):
            await admin.describe_acls()
        with pytest.raises(SecurityDisabledError):
            await admin.create_acls(BINDINGS[:1])
        with pytest.raises(SecurityDisabledError):
            await admin.delete_acls([AclBindingFilter()])
    listed = cli("list", "--bootstrap-server", broker.bootstrap)
    assert listed.returncode == 1
    assert listed.stderr.strip() == (
        "riverbed: error: SECURITY_DISABLED: No Authorizer is configured on the broker"
    )


async def test_admin_round_trip(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SUPER)
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_acls(BINDINGS)
        await admin.create_acls(BINDINGS[:2])  # again: nothing changes
        described = await admin.describe_acls()
        assert described == sorted(BINDINGS, key=binding_order)
        # MATCH: what applies to the topic "orders" (literal, wildcard, prefix).
        applying = await admin.describe_acls(AclBindingFilter(R.TOPIC, "orders", P.MATCH))
        assert set(applying) == set(BINDINGS[:4])
        assert await admin.describe_acls(AclBindingFilter(principal="User:bob")) == [BINDINGS[1]]
        assert await admin.describe_acls(AclBindingFilter(R.GROUP, "team-x", P.LITERAL)) == []
        removed = await admin.delete_acls(
            [
                AclBindingFilter(R.TOPIC, "orders", P.MATCH, principal="User:alice"),
                AclBindingFilter(principal="User:alice"),
            ]
        )
        # Each removed binding is reported once, under the first filter that matches it.
        assert removed == [BINDINGS[0], BINDINGS[2], BINDINGS[4], BINDINGS[6]]
        assert set(await admin.describe_acls()) == {BINDINGS[1], BINDINGS[3], BINDINGS[5]}
    # Kafka's znodes: the last ACL of a pattern gone, its znode is gone too.
    async with AsyncZooKeeper(broker.zk_connect) as zk:
        assert sorted(await zk.get_children("/kafka-acl/Topic")) == ["*", "orders"]
        assert await zk.get_children("/kafka-acl-extended/prefixed/Topic") == []
        data, _ = await zk.get("/kafka-acl/Cluster/kafka-cluster")
        assert json.loads(data)["acls"] == [
            {"principal": "User:ops", "permissionType": "Allow", "operation": "Alter", "host": "*"}
        ]


async def test_per_binding_errors_and_versions(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SUPER)
    connection = await connect(broker)
    try:

        def creation(name: str, **fields: object) -> m.CreateAclsRequest.AclCreation:
            values: dict[str, object] = {
                "resource_type": 2, "resource_name": name, "resource_pattern_type": 3,
                "principal": "User:alice", "host": "*", "operation": 3, "permission_type": 3,
            }  # fmt: skip
            values.update(fields)
            return m.CreateAclsRequest.AclCreation(**values)  # type: ignore[arg-type]

        request = m.CreateAclsRequest(
            creations=[
                creation("ok"),
                creation("bad-op", operation=99),
                creation("kafka-cluster-not", resource_type=4),
                creation("", principal="User:x"),
                creation("no-principal", principal="alice"),
                creation("pre", resource_pattern_type=4),
            ]
        )
        response = await connection.call(request, m.CreateAclsResponse)
        results = [(r.error_code, r.error_message) for r in response.results]
        assert results[0] == (ErrorCode.NONE, None)
        assert results[5] == (ErrorCode.NONE, None)
        for code, message in results[1:5]:
            assert code == ErrorCode.INVALID_REQUEST
            assert message
        assert "unknown operation code 99" in str(results[1][1])
        assert "only valid name for the CLUSTER resource is kafka-cluster" in str(results[2][1])
        assert "empty resource name" in str(results[3][1])
        assert "Type:name" in str(results[4][1])
        # DescribeAcls v0 has no pattern type: it sees literal patterns only.
        connection._versions[m.DescribeAclsRequest.API_KEY] = 0
        everything = m.DescribeAclsRequest(
            resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
            principal_filter=None, host_filter=None, operation=1, permission_type=1,
        )  # fmt: skip
        v0 = await connection.call(everything, m.DescribeAclsResponse)
        assert [(r.resource_name, r.pattern_type) for r in v0.resources] == [("ok", 3)]
        connection._versions[m.DescribeAclsRequest.API_KEY] = 3
        latest = await connection.call(everything, m.DescribeAclsResponse)
        assert sorted((r.resource_name, r.pattern_type) for r in latest.resources) == [
            ("ok", 3),
            ("pre", 4),
        ]
        bad_filter = m.DescribeAclsRequest(resource_type_filter=42, operation=1, permission_type=1)
        refused = await connection.call(bad_filter, m.DescribeAclsResponse)
        assert refused.error_code == ErrorCode.INVALID_REQUEST
        assert refused.error_message == "unknown resource type code 42"
        delete = m.DeleteAclsRequest(
            filters=[
                m.DeleteAclsRequest.DeleteAclsFilter(
                    resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                    principal_filter=None, host_filter=None, operation=1, permission_type=0,
                ),
                m.DeleteAclsRequest.DeleteAclsFilter(
                    resource_type_filter=2, resource_name_filter="ok", pattern_type_filter=3,
                    principal_filter=None, host_filter=None, operation=1, permission_type=1,
                ),
            ]
        )  # fmt: skip
        deleted = await connection.call(delete, m.DeleteAclsResponse)
        first, second = deleted.filter_results
        assert first.error_code == ErrorCode.INVALID_REQUEST
        assert first.error_message == "unknown permission type code 0"
        assert second.error_code == ErrorCode.NONE
        assert [(a.resource_name, a.principal, a.error_code) for a in second.matching_acls] == [
            ("ok", "User:alice", ErrorCode.NONE)
        ]
    finally:
        await connection.close()


async def test_changing_acls_needs_alter_on_the_cluster(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SECURED)  # no super user, no ACL
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        with pytest.raises(AuthorizationError) as refused:
            await admin.create_acls(BINDINGS[:1])
        assert refused.value.code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        with pytest.raises(AuthorizationError):
            await admin.describe_acls()
        with pytest.raises(AuthorizationError):
            await admin.delete_acls([AclBindingFilter()])


def test_cli_add_list_remove(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SUPER)
    target = ("--bootstrap-server", broker.bootstrap)
    added = cli(
        "add", *target, "--allow-principal", "User:alice", "--allow-principal", "User:bob",
        "--operation", "read", "--operation", "DESCRIBE", "--topic", "orders", "--group", "g",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout.splitlines()[0].split() == [
        "RESOURCE_TYPE", "PATTERN_TYPE", "RESOURCE", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION",
    ]  # fmt: skip
    assert added.stdout.splitlines()[-1] == "added 8 ACLs"
    denied = cli(
        "add", "--zookeeper", broker.zk_connect, "--deny-principal", "User:mallory",
        "--deny-host", "10.0.0.9", "--operation", "All", "--cluster",
    )  # fmt: skip
    assert denied.returncode == 0, denied.stderr
    prefixed = cli(
        "add", *target, "--allow-principal", "User:*", "--operation", "Write",
        "--topic", "logs-", "--resource-pattern-type", "prefixed",
    )  # fmt: skip
    assert prefixed.returncode == 0, prefixed.stderr

    listed = cli("list", *target, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert len(rows) == 10
    assert rows[0] == {
        "resource_type": "Topic", "pattern_type": "literal", "resource": "orders",
        "principal": "User:alice", "host": "*", "operation": "Read", "permission": "Allow",
    }  # fmt: skip
    assert {"resource_type": "Cluster", "pattern_type": "literal", "resource": "kafka-cluster",
            "principal": "User:mallory", "host": "10.0.0.9", "operation": "All",
            "permission": "Deny"} in rows  # fmt: skip
    match = cli("list", *target, "--topic", "logs-app", "--resource-pattern-type", "match")
    assert [line.split()[2] for line in match.stdout.splitlines()[1:]] == ["logs-"]
    by_principal = cli(
        "list", "--zookeeper", broker.zk_connect, "--principal", "User:bob", "--json"
    )
    assert {row["principal"] for row in json.loads(by_principal.stdout)} == {"User:bob"}

    removed = cli("remove", *target, "--allow-principal", "User:bob", "--topic", "orders")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines()[-1] == "removed 2 ACLs"
    everything_on_g = cli("remove", *target, "--group", "g")
    assert everything_on_g.stdout.splitlines()[-1] == "removed 4 ACLs"
    assert len(json.loads(cli("list", *target, "--json").stdout)) == 4


@pytest.mark.processes
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("add", "--topic", "t"), "add needs --allow-principal or --deny-principal"),
        (("add", "--allow-principal", "User:a"), "add needs a resource"),
        (
            ("add", "--allow-principal", "User:a", "--topic", "t", "--resource-pattern-type",
             "match"),
            "literal or prefixed",
        ),
        (("remove", "--allow-host", "1.2.3.4", "--topic", "t"), "--allow-host needs"),
    ],
)  # fmt: skip
def test_cli_errors_are_one_line(args: tuple[str, ...], message: str) -> None:
    result = cli(*args, "--bootstrap-server", "127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert message in result.stderr


@pytest.mark.processes
def test_cli_refuses_a_malformed_principal() -> None:
    result = cli("add", "--allow-principal", "alice", "--topic", "t")
    assert result.returncode == 2
    assert "--allow-principal: invalid parse_principal value" in (result.stderr)
