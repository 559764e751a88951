"""Every API's authorization on a real broker, request by request, with Riverbed's own
connection so every error code is visible.

With the authorizer on and no ACL, each API is refused with its Kafka error. Then the ACLs
KafkaApis' table names are granted one at a time, and after each grant exactly the APIs whose
check it satisfies (implied operations included, as the authorizer decides) stop being refused:
an API checking the wrong operation or resource fails here."""

from __future__ import annotations

import asyncio
import functools
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import pytest
from riverbed import Admin
from riverbed.client.connection import BrokerConnection
from riverbed.errors import AuthorizationError
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records_codec import encode_batch
from riverbed.security.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from riverbed.security.authorizer import Authorizer, AuthorizerSettings

from tests.security.acl_support import (
    ANONYMOUS,
    SECURED,
    WAIT_S,
    acl,
    cluster_acl,
    connect,
    eventually,
    zookeeper_acls,
)
from tests.security.test_acl_model import snapshot_of
from tests.support.broker import BrokerFactory, BrokerProcess

Op = AclOperation
TOPIC: Final = "orders"
DOOMED: Final = "doomed"  # deleted by the DeleteTopics probe once it may
GROUP: Final = "g"
RESOURCE_TOPIC, RESOURCE_BROKER = 2, 4
AUTHORIZATION_ERRORS: Final = frozenset(
    {
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    }
)
Check = Callable[[Authorizer], bool]


def may(operation: AclOperation, resource_type: ResourceType, name: str) -> Check:
    return lambda authorizer: authorizer.authorize(
        ANONYMOUS, "127.0.0.1", operation, resource_type, name, log_denied=False
    )


def cluster_may(operation: AclOperation) -> Check:
    return may(operation, ResourceType.CLUSTER, "kafka-cluster")


def both(*checks: Check) -> Check:
    return lambda authorizer: all(check(authorizer) for check in checks)


def either(*checks: Check) -> Check:
    return lambda authorizer: any(check(authorizer) for check in checks)


@dataclass(frozen=True)
class Probe:
    """One API call; `refused` is the error it gets without `allowed`."""

    name: str
    refused: ErrorCode
    allowed: Check
    call: Callable[[BrokerConnection], Awaitable[set[int]]]


async def produce(c: BrokerConnection) -> set[int]:
    batch = encode_batch([(b"k", b"v", (), 1_700_000_000_000)])
    request = m.ProduceRequest(
        acks=1,
        timeout_ms=10_000,
        topic_data=[
            m.ProduceRequest.TopicProduceData(
                name=TOPIC, partition_data=[m.ProduceRequest.PartitionProduceData(0, batch)]
            )
        ],
    )
    response = await c.call(request, m.ProduceResponse)
    return {p.error_code for t in response.responses for p in t.partition_responses}


def fetch(replica_id: int) -> Callable[[BrokerConnection], Awaitable[set[int]]]:
    async def call(c: BrokerConnection) -> set[int]:
        c._versions[m.FetchRequest.API_KEY] = 12  # by topic name; replica_id is a field
        request = m.FetchRequest(
            replica_id=replica_id,
            max_wait_ms=0,
            max_bytes=1 << 20,
            topics=[
                m.FetchRequest.FetchTopic(
                    topic=TOPIC,
                    partitions=[m.FetchRequest.FetchPartition(partition_max_bytes=1 << 20)],
                )
            ],
        )
        response = await c.call(request, m.FetchResponse)
        return {p.error_code for t in response.responses for p in t.partitions}

    return call


async def list_offsets(c: BrokerConnection) -> set[int]:
    request = m.ListOffsetsRequest(
        replica_id=-1,
        topics=[
            m.ListOffsetsRequest.ListOffsetsTopic(
                name=TOPIC, partitions=[m.ListOffsetsRequest.ListOffsetsPartition(timestamp=-1)]
            )
        ],
    )
    response = await c.call(request, m.ListOffsetsResponse)
    return {p.error_code for t in response.topics for p in t.partitions}


async def metadata(c: BrokerConnection) -> set[int]:
    request = m.MetadataRequest(
        topics=[m.MetadataRequest.MetadataRequestTopic(name=TOPIC)],
        allow_auto_topic_creation=False,
    )
    response = await c.call(request, m.MetadataResponse)
    return {t.error_code for t in response.topics}


async def create_topic(c: BrokerConnection) -> set[int]:
    topic = m.CreateTopicsRequest.CreatableTopic(
        name="fresh", num_partitions=1, replication_factor=1
    )
    response = await c.call(
        m.CreateTopicsRequest(topics=[topic], validate_only=True), m.CreateTopicsResponse
    )
    return {t.error_code for t in response.topics}


async def delete_topic(c: BrokerConnection) -> set[int]:
    request = m.DeleteTopicsRequest(topics=[m.DeleteTopicsRequest.DeleteTopicState(name=DOOMED)])
    response = await c.call(request, m.DeleteTopicsResponse)
    return {t.error_code for t in response.responses}


async def create_partitions(c: BrokerConnection) -> set[int]:
    grown = m.CreatePartitionsRequest.CreatePartitionsTopic(name=TOPIC, count=2)
    request = m.CreatePartitionsRequest(topics=[grown], timeout_ms=10_000, validate_only=True)
    response = await c.call(request, m.CreatePartitionsResponse)
    return {result.error_code for result in response.results}


async def delete_records(c: BrokerConnection) -> set[int]:
    partition = m.DeleteRecordsRequest.DeleteRecordsPartition(partition_index=0, offset=-1)
    request = m.DeleteRecordsRequest(
        topics=[m.DeleteRecordsRequest.DeleteRecordsTopic(name=TOPIC, partitions=[partition])]
    )
    response = await c.call(request, m.DeleteRecordsResponse)
    return {p.error_code for t in response.topics for p in t.partitions}


def describe_configs(
    resource_type: int, name: str
) -> Callable[[BrokerConnection], Awaitable[set[int]]]:
    async def call(c: BrokerConnection) -> set[int]:
        resource = m.DescribeConfigsRequest.DescribeConfigsResource(
            resource_type=resource_type, resource_name=name, configuration_keys=None
        )
        request = m.DescribeConfigsRequest(resources=[resource])
        response = await c.call(request, m.DescribeConfigsResponse)
        return {r.error_code for r in response.results}

    return call


def alter_configs(
    resource_type: int, name: str, key: str, value: str, *, incremental: bool
) -> Callable[[BrokerConnection], Awaitable[set[int]]]:
    async def call(c: BrokerConnection) -> set[int]:
        if incremental:
            alterable = m.IncrementalAlterConfigsRequest.AlterableConfig(name=key, value=value)
            resource = m.IncrementalAlterConfigsRequest.AlterConfigsResource(
                resource_type=resource_type, resource_name=name, configs=[alterable]
            )
            request = m.IncrementalAlterConfigsRequest(resources=[resource], validate_only=True)
            response = await c.call(request, m.IncrementalAlterConfigsResponse)
            return {r.error_code for r in response.responses}
        plain = m.AlterConfigsRequest.AlterConfigsResource(
            resource_type=resource_type,
            resource_name=name,
            configs=[m.AlterConfigsRequest.AlterableConfig(name=key, value=value)],
        )
        alter = m.AlterConfigsRequest(resources=[plain], validate_only=True)
        return {r.error_code for r in (await c.call(alter, m.AlterConfigsResponse)).responses}

    return call


async def find_coordinator(c: BrokerConnection) -> set[int]:
    request = m.FindCoordinatorRequest(key=GROUP, coordinator_keys=[GROUP])
    response = await c.call(request, m.FindCoordinatorResponse)
    return {coordinator.error_code for coordinator in response.coordinators}


async def join_group(c: BrokerConnection) -> set[int]:
    request = m.JoinGroupRequest(
        group_id=GROUP,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        protocol_type="consumer",
        protocols=[m.JoinGroupRequest.JoinGroupRequestProtocol(name="range")],
    )
    return {(await c.call(request, m.JoinGroupResponse)).error_code}


async def sync_group(c: BrokerConnection) -> set[int]:
    request = m.SyncGroupRequest(group_id=GROUP, generation_id=1, member_id="nobody")
    return {(await c.call(request, m.SyncGroupResponse)).error_code}


async def heartbeat(c: BrokerConnection) -> set[int]:
    request = m.HeartbeatRequest(group_id=GROUP, generation_id=1, member_id="nobody")
    return {(await c.call(request, m.HeartbeatResponse)).error_code}


async def leave_group(c: BrokerConnection) -> set[int]:
    member = m.LeaveGroupRequest.MemberIdentity(member_id="nobody")
    response = await c.call(
        m.LeaveGroupRequest(group_id=GROUP, members=[member]), m.LeaveGroupResponse
    )
    return {response.error_code}


async def offset_commit(c: BrokerConnection) -> set[int]:
    partition = m.OffsetCommitRequest.OffsetCommitRequestPartition(committed_offset=0)
    request = m.OffsetCommitRequest(
        group_id=GROUP,
        generation_id=-1,
        topics=[m.OffsetCommitRequest.OffsetCommitRequestTopic(name=TOPIC, partitions=[partition])],
    )
    response = await c.call(request, m.OffsetCommitResponse)
    return {p.error_code for t in response.topics for p in t.partitions}


async def offset_fetch(c: BrokerConnection) -> set[int]:
    topics = [m.OffsetFetchRequest.OffsetFetchRequestTopics(name=TOPIC, partition_indexes=[0])]
    request = m.OffsetFetchRequest(
        groups=[m.OffsetFetchRequest.OffsetFetchRequestGroup(group_id=GROUP, topics=topics)]
    )
    response = await c.call(request, m.OffsetFetchResponse)
    (group,) = response.groups
    return {group.error_code} | {p.error_code for t in group.topics for p in t.partitions}


async def describe_groups(c: BrokerConnection) -> set[int]:
    response = await c.call(m.DescribeGroupsRequest(groups=[GROUP]), m.DescribeGroupsResponse)
    return {group.error_code for group in response.groups}


async def delete_groups(c: BrokerConnection) -> set[int]:
    response = await c.call(m.DeleteGroupsRequest(groups_names=[GROUP]), m.DeleteGroupsResponse)
    return {result.error_code for result in response.results}


async def init_producer_id(c: BrokerConnection) -> set[int]:
    request = m.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000)
    return {(await c.call(request, m.InitProducerIdResponse)).error_code}


async def controlled_shutdown(c: BrokerConnection) -> set[int]:
    request = m.ControlledShutdownRequest(broker_id=77)  # no such broker: nothing moves
    return {(await c.call(request, m.ControlledShutdownResponse)).error_code}


async def offset_for_leader_epoch(c: BrokerConnection) -> set[int]:
    partition = m.OffsetForLeaderEpochRequest.OffsetForLeaderPartition(leader_epoch=0)
    request = m.OffsetForLeaderEpochRequest(
        replica_id=-1,
        topics=[
            m.OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=TOPIC, partitions=[partition])
        ],
    )
    response = await c.call(request, m.OffsetForLeaderEpochResponse)
    return {p.error_code for t in response.topics for p in t.partitions}


async def alter_reassignments(c: BrokerConnection) -> set[int]:
    cancel = m.AlterPartitionReassignmentsRequest.ReassignablePartition(replicas=None)
    request = m.AlterPartitionReassignmentsRequest(
        topics=[
            m.AlterPartitionReassignmentsRequest.ReassignableTopic(name=TOPIC, partitions=[cancel])
        ]
    )
    response = await c.call(request, m.AlterPartitionReassignmentsResponse)
    return {response.error_code} | {p.error_code for t in response.responses for p in t.partitions}


async def list_reassignments(c: BrokerConnection) -> set[int]:
    request = m.ListPartitionReassignmentsRequest(topics=None)
    return {(await c.call(request, m.ListPartitionReassignmentsResponse)).error_code}


async def elect_leaders(c: BrokerConnection) -> set[int]:
    request = m.ElectLeadersRequest(
        topic_partitions=[m.ElectLeadersRequest.TopicPartitions(topic=TOPIC, partition_id=[0])]
    )
    response = await c.call(request, m.ElectLeadersResponse)
    return {response.error_code} | {
        p.error_code for t in response.replica_election_results for p in t.partition_result
    }


async def describe_log_dirs(c: BrokerConnection) -> set[int]:
    response = await c.call(m.DescribeLogDirsRequest(topics=None), m.DescribeLogDirsResponse)
    return {response.error_code}


async def describe_acls(c: BrokerConnection) -> set[int]:
    request = m.DescribeAclsRequest(
        resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
        principal_filter=None, host_filter=None, operation=1, permission_type=1,
    )  # fmt: skip
    return {(await c.call(request, m.DescribeAclsResponse)).error_code}


async def create_acls(c: BrokerConnection) -> set[int]:
    creation = m.CreateAclsRequest.AclCreation(
        resource_type=2, resource_name="x", resource_pattern_type=3, principal="User:nobody",
        host="*", operation=3, permission_type=3,
    )  # fmt: skip
    response = await c.call(m.CreateAclsRequest(creations=[creation]), m.CreateAclsResponse)
    return {result.error_code for result in response.results}


async def delete_acls(c: BrokerConnection) -> set[int]:
    wanted = m.DeleteAclsRequest.DeleteAclsFilter(
        resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
        principal_filter="User:nobody", host_filter=None, operation=1, permission_type=1,
    )  # fmt: skip
    response = await c.call(m.DeleteAclsRequest(filters=[wanted]), m.DeleteAclsResponse)
    return {result.error_code for result in response.filter_results}


T, G = ResourceType.TOPIC, ResourceType.GROUP
_E = ErrorCode
PROBES: Final = (
    Probe("Produce", _E.TOPIC_AUTHORIZATION_FAILED, may(Op.WRITE, T, TOPIC), produce),
    Probe("Fetch", _E.TOPIC_AUTHORIZATION_FAILED, may(Op.READ, T, TOPIC), fetch(-1)),
    Probe("Fetch (follower)", _E.TOPIC_AUTHORIZATION_FAILED, cluster_may(Op.CLUSTER_ACTION),
          fetch(1)),
    Probe("ListOffsets", _E.TOPIC_AUTHORIZATION_FAILED, may(Op.DESCRIBE, T, TOPIC), list_offsets),
    Probe("Metadata", _E.TOPIC_AUTHORIZATION_FAILED, may(Op.DESCRIBE, T, TOPIC), metadata),
    Probe("CreateTopics", _E.TOPIC_AUTHORIZATION_FAILED,
          either(cluster_may(Op.CREATE), may(Op.CREATE, T, "fresh")), create_topic),
    Probe("DeleteTopics", _E.TOPIC_AUTHORIZATION_FAILED, may(Op.DELETE, T, DOOMED), delete_topic),
    Probe("DeleteRecords", _E.TOPIC_AUTHORIZATION_FAILED, may(Op.DELETE, T, TOPIC), delete_records),
    Probe("CreatePartitions", _E.TOPIC_AUTHORIZATION_FAILED, may(Op.ALTER, T, TOPIC),
          create_partitions),
    Probe("DescribeConfigs (topic)", _E.TOPIC_AUTHORIZATION_FAILED,
          may(Op.DESCRIBE_CONFIGS, T, TOPIC), describe_configs(RESOURCE_TOPIC, TOPIC)),
    Probe("DescribeConfigs (broker)", _E.CLUSTER_AUTHORIZATION_FAILED,
          cluster_may(Op.DESCRIBE_CONFIGS), describe_configs(RESOURCE_BROKER, "1")),
    Probe("AlterConfigs (topic)", _E.TOPIC_AUTHORIZATION_FAILED, may(Op.ALTER_CONFIGS, T, TOPIC),
          alter_configs(RESOURCE_TOPIC, TOPIC, "retention.ms", "1000000", incremental=False)),
    Probe("IncrementalAlterConfigs (broker)", _E.CLUSTER_AUTHORIZATION_FAILED,
          cluster_may(Op.ALTER_CONFIGS),
          alter_configs(RESOURCE_BROKER, "", "follower.replication.throttled.rate", "1000000",
                        incremental=True)),
    Probe("FindCoordinator", _E.GROUP_AUTHORIZATION_FAILED, may(Op.DESCRIBE, G, GROUP),
          find_coordinator),
    Probe("JoinGroup", _E.GROUP_AUTHORIZATION_FAILED, may(Op.READ, G, GROUP), join_group),
    Probe("SyncGroup", _E.GROUP_AUTHORIZATION_FAILED, may(Op.READ, G, GROUP), sync_group),
    Probe("Heartbeat", _E.GROUP_AUTHORIZATION_FAILED, may(Op.READ, G, GROUP), heartbeat),
    Probe("LeaveGroup", _E.GROUP_AUTHORIZATION_FAILED, may(Op.READ, G, GROUP), leave_group),
    Probe("OffsetCommit", _E.GROUP_AUTHORIZATION_FAILED,
          both(may(Op.READ, G, GROUP), may(Op.READ, T, TOPIC)), offset_commit),
    Probe("OffsetFetch", _E.GROUP_AUTHORIZATION_FAILED,
          both(may(Op.DESCRIBE, G, GROUP), may(Op.DESCRIBE, T, TOPIC)), offset_fetch),
    Probe("DescribeGroups", _E.GROUP_AUTHORIZATION_FAILED, may(Op.DESCRIBE, G, GROUP),
          describe_groups),
    Probe("DeleteGroups", _E.GROUP_AUTHORIZATION_FAILED, may(Op.DELETE, G, GROUP), delete_groups),
    Probe("InitProducerId", _E.CLUSTER_AUTHORIZATION_FAILED,
          either(cluster_may(Op.IDEMPOTENT_WRITE), may(Op.WRITE, T, TOPIC)), init_producer_id),
    Probe("ControlledShutdown", _E.CLUSTER_AUTHORIZATION_FAILED, cluster_may(Op.CLUSTER_ACTION),
          controlled_shutdown),
    Probe("OffsetForLeaderEpoch", _E.TOPIC_AUTHORIZATION_FAILED,
          either(cluster_may(Op.CLUSTER_ACTION), may(Op.DESCRIBE, T, TOPIC)),
          offset_for_leader_epoch),
    Probe("AlterPartitionReassignments", _E.CLUSTER_AUTHORIZATION_FAILED,
          cluster_may(Op.ALTER), alter_reassignments),
    Probe("ListPartitionReassignments", _E.CLUSTER_AUTHORIZATION_FAILED,
          cluster_may(Op.DESCRIBE), list_reassignments),
    Probe("ElectLeaders", _E.CLUSTER_AUTHORIZATION_FAILED, cluster_may(Op.ALTER), elect_leaders),
    Probe("DescribeLogDirs", _E.CLUSTER_AUTHORIZATION_FAILED, cluster_may(Op.DESCRIBE),
          describe_log_dirs),
    Probe("DescribeAcls", _E.CLUSTER_AUTHORIZATION_FAILED, cluster_may(Op.DESCRIBE),
          describe_acls),
    Probe("CreateAcls", _E.CLUSTER_AUTHORIZATION_FAILED, cluster_may(Op.ALTER), create_acls),
    Probe("DeleteAcls", _E.CLUSTER_AUTHORIZATION_FAILED, cluster_may(Op.ALTER), delete_acls),
)  # fmt: skip
# Granted one after the other; the order separates operations one implies from the other.
GRANTS: Final[tuple[list[AclBinding], ...]] = (
    acl(T, TOPIC, Op.DESCRIBE),
    acl(G, GROUP, Op.DESCRIBE),
    acl(T, TOPIC, Op.WRITE),
    acl(T, TOPIC, Op.READ),
    acl(G, GROUP, Op.READ),
    acl(T, TOPIC, Op.DELETE),
    acl(T, DOOMED, Op.DELETE),
    acl(G, GROUP, Op.DELETE),
    acl(T, TOPIC, Op.DESCRIBE_CONFIGS),
    acl(T, TOPIC, Op.ALTER_CONFIGS),
    acl(T, TOPIC, Op.ALTER),
    acl(T, "fre", Op.CREATE, pattern_type=PatternType.PREFIXED),
    cluster_acl(Op.DESCRIBE_CONFIGS),
    cluster_acl(Op.ALTER_CONFIGS),
    cluster_acl(Op.DESCRIBE),
    cluster_acl(Op.ALTER),
    cluster_acl(Op.CLUSTER_ACTION),
)


async def create_topics(broker: BrokerProcess, names: Sequence[str]) -> None:
    """With a passing grant of CREATE on the cluster, taken back afterwards."""
    grant = cluster_acl(Op.CREATE)
    async with zookeeper_acls(broker.zk_connect) as acls:
        await acls.add(*grant)
        async with Admin(bootstrap_servers=broker.bootstrap) as admin:

            async def created() -> bool:
                try:
                    for name in names:
                        if name not in await admin.list_topics():
                            await admin.create_topic(name, partitions=1)
                except AuthorizationError:
                    return False
                return True

            await eventually(created)
        await acls.remove(*grant)


async def refused(connection: BrokerConnection, probe: Probe) -> bool:
    codes = await probe.call(connection)
    return bool(codes & AUTHORIZATION_ERRORS)


async def test_every_api_is_authorized_as_kafka_does(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SECURED)
    await create_topics(broker, [TOPIC, DOOMED])
    connection = await connect(broker)
    granted: list[AclBinding] = []
    try:
        # Without ACLs: every API refused, each with its own error. Once the broker has seen
        # create_topics' passing grant go: CreateTopics is the probe that grant allowed (Produce,
        # say, was refused all along, so its refusal says nothing about the removal).
        create = next(probe for probe in PROBES if probe.name == "CreateTopics")
        await eventually(lambda: refused(connection, create))
        for probe in PROBES:
            assert probe.refused in await probe.call(connection), probe.name
        async with zookeeper_acls(broker.zk_connect) as acls:
            for grant in GRANTS:
                await acls.add(*grant)
                granted.extend(grant)
                expected = refusals_expected(granted)
                await refusals_become(connection, expected)
        assert not any(expected.values()), "every API is allowed once every ACL is granted"
    finally:
        await connection.close()


def refusals_expected(granted: list[AclBinding]) -> dict[str, bool]:
    """Which probes the authorizer refuses with `granted` (the rules are tested on their own in
    test_authorizer; here they tell which API must follow which grant)."""
    snapshot = snapshot_of(granted)
    decide = Authorizer(AuthorizerSettings(), lambda: snapshot)
    return {probe.name: not probe.allowed(decide) for probe in PROBES}


async def refusals_become(connection: BrokerConnection, expected: dict[str, bool]) -> None:
    """Wait for the broker to follow the last grant; on timeout the assertion shows which APIs
    disagree."""
    deadline = time.monotonic() + WAIT_S
    while True:
        actual = {probe.name: await refused(connection, probe) for probe in PROBES}
        if actual == expected or time.monotonic() > deadline:
            assert actual == expected
            return
        await asyncio.sleep(0.1)


async def test_denials_are_logged_by_the_broker(
    broker_factory: BrokerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RIVERBED_LOG_FORMAT", "json")  # the broker inherits it
    broker = broker_factory(SECURED)
    connection = await connect(broker)
    try:
        assert await produce(connection) == {ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    finally:
        await connection.close()
    log = broker.log_path.read_text()
    assert re.search(
        r'"event":"authorizer.denied","principal":"User:ANONYMOUS","host":"127.0.0.1",'
        r'"operation":"Write","resource_type":"Topic","resource":"orders","api":"Produce"',
        log,
    ), log[-3000:]


async def test_metadata_hides_and_reports_operations(broker_factory: BrokerFactory) -> None:
    """Listing every topic leaves out those the principal may not DESCRIBE; asked by name they
    are refused (without their id); unknown ones need CREATE to be auto-created; the
    authorized-operations fields hold what the ACLs allow."""
    broker = broker_factory({**SECURED, "auto.create.topics.enable": "true"})
    await create_topics(broker, ["visible", "hidden"])
    async with zookeeper_acls(broker.zk_connect) as acls:
        await acls.add(*acl(T, "visible", Op.READ, Op.DESCRIBE_CONFIGS))
        connection = await connect(broker)
        try:

            async def listed() -> list[str | None]:
                request = m.MetadataRequest(topics=None, include_topic_authorized_operations=True)
                response = await connection.call(request, m.MetadataResponse)
                return [t.name for t in response.topics]

            async def only_visible() -> bool:
                return await listed() == ["visible"]

            await eventually(only_visible)
            request = m.MetadataRequest(
                topics=[
                    m.MetadataRequest.MetadataRequestTopic(name=name)
                    for name in ("visible", "hidden", "unknown-" + uuid.uuid4().hex[:6])
                ],
                include_topic_authorized_operations=True,
            )
            response = await connection.call(request, m.MetadataResponse)
            by_name = {t.name: t for t in response.topics}
            visible, hidden = by_name["visible"], by_name["hidden"]
            assert visible.error_code == ErrorCode.NONE
            assert visible.partitions
            # READ implies DESCRIBE; DESCRIBE_CONFIGS is granted as it is.
            assert visible.topic_authorized_operations == (1 << 3) | (1 << 8) | (1 << 10)
            assert hidden.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            assert hidden.topic_id == uuid.UUID(int=0)
            assert not hidden.partitions
            (unknown,) = [t for t in response.topics if str(t.name).startswith("unknown-")]
            assert unknown.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
            # With DESCRIBE and CREATE (by prefix) an unknown topic is auto-created.
            await acls.add(
                *acl(T, "auto-", Op.DESCRIBE, Op.CREATE, pattern_type=PatternType.PREFIXED)
            )
            name = "auto-" + uuid.uuid4().hex[:6]

            async def auto_created() -> bool:
                wanted = m.MetadataRequest(
                    topics=[m.MetadataRequest.MetadataRequestTopic(name=name)]
                )
                (topic,) = (await connection.call(wanted, m.MetadataResponse)).topics
                return topic.error_code == ErrorCode.NONE and bool(topic.partitions)

            await eventually(auto_created)
            # Cluster operations (v8-10): 0 without DESCRIBE on the cluster.
            connection._versions[m.MetadataRequest.API_KEY] = 10
            asked = m.MetadataRequest(topics=[], include_cluster_authorized_operations=True)
            response = await connection.call(asked, m.MetadataResponse)
            assert response.cluster_authorized_operations == 0
            await acls.add(*cluster_acl(Op.DESCRIBE, Op.ALTER))

            async def cluster_operations() -> bool:
                answer = await connection.call(asked, m.MetadataResponse)
                return answer.cluster_authorized_operations == (1 << 7) | (1 << 8)

            await eventually(cluster_operations)
        finally:
            await connection.close()


async def test_describe_cluster_needs_no_acl(broker_factory: BrokerFactory) -> None:
    """Not in PROBES: KafkaApis refuses nobody DescribeCluster. Without any ACL every version
    describes the cluster; the authorized operations, when asked for, are 0 without DESCRIBE on
    the cluster and then what the ACLs allow (tests/interop/test_describe_cluster.py has the
    clients and three brokers)."""
    broker = broker_factory(SECURED)
    connection = await connect(broker)
    asked = m.DescribeClusterRequest(include_cluster_authorized_operations=True)
    try:
        for version in (0, 1, 2):
            connection._versions[m.DescribeClusterRequest.API_KEY] = version
            answer = await connection.call(asked, m.DescribeClusterResponse)
            assert answer.error_code == ErrorCode.NONE
            assert [b.broker_id for b in answer.brokers] == [1]
            assert answer.cluster_authorized_operations == 0
        async with zookeeper_acls(broker.zk_connect) as acls:
            await acls.add(*cluster_acl(Op.DESCRIBE, Op.ALTER))

            async def cluster_operations() -> bool:
                answer = await connection.call(asked, m.DescribeClusterResponse)
                return answer.cluster_authorized_operations == (1 << 7) | (1 << 8)

            await eventually(cluster_operations)
    finally:
        await connection.close()


async def test_offsets_and_groups_of_unauthorized_topics(broker_factory: BrokerFactory) -> None:
    """OffsetFetch answers -1 with TOPIC_AUTHORIZATION_FAILED for a topic it may not DESCRIBE
    and leaves such topics out of an all-partitions fetch; OffsetCommit commits the topics it
    may READ only; ListGroups shows the groups it may DESCRIBE (all with cluster DESCRIBE)."""
    broker = broker_factory(SECURED)
    await create_topics(broker, ["mine", "theirs"])
    async with zookeeper_acls(broker.zk_connect) as acls:
        await acls.add(*acl(G, GROUP, Op.READ), *acl(T, "mine", Op.READ))
        await acls.add(*acl(T, "theirs", Op.READ), *acl(G, "other", Op.READ))
        connection = await connect(broker)
        try:

            async def commit(group: str) -> dict[str, int]:
                partition = m.OffsetCommitRequest.OffsetCommitRequestPartition(committed_offset=0)
                request = m.OffsetCommitRequest(
                    group_id=group,
                    generation_id=-1,
                    topics=[
                        m.OffsetCommitRequest.OffsetCommitRequestTopic(
                            name=n, partitions=[partition]
                        )
                        for n in ("mine", "theirs")
                    ],
                )
                response = await connection.call(request, m.OffsetCommitResponse)
                return {t.name: t.partitions[0].error_code for t in response.topics}

            async def committed_both() -> bool:
                # FindCoordinator creates __consumer_offsets on first use.
                for group in (GROUP, "other"):
                    found = m.FindCoordinatorRequest(key=group, coordinator_keys=[group])
                    await connection.call(found, m.FindCoordinatorResponse)
                return await commit(GROUP) == {"mine": 0, "theirs": 0} and await commit(
                    "other"
                ) == {"mine": 0, "theirs": 0}

            await eventually(committed_both)
            await acls.remove(*acl(T, "theirs", Op.READ), *acl(G, "other", Op.READ))

            async def refused_theirs() -> bool:
                return await commit(GROUP) == {
                    "mine": ErrorCode.NONE,
                    "theirs": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                }

            await eventually(refused_theirs)
            named = m.OffsetFetchRequest.OffsetFetchRequestGroup(
                group_id=GROUP,
                topics=[
                    m.OffsetFetchRequest.OffsetFetchRequestTopics(name=n, partition_indexes=[0])
                    for n in ("mine", "theirs")
                ],
            )
            everything = m.OffsetFetchRequest.OffsetFetchRequestGroup(group_id=GROUP, topics=None)
            response = await connection.call(
                m.OffsetFetchRequest(groups=[named, everything]), m.OffsetFetchResponse
            )
            by_name, all_of = response.groups
            assert {
                t.name: (p.committed_offset, p.error_code)
                for t in by_name.topics
                for p in t.partitions
            } == {"mine": (0, 0), "theirs": (-1, ErrorCode.TOPIC_AUTHORIZATION_FAILED)}
            assert [t.name for t in all_of.topics] == ["mine"]

            async def lists(groups: list[str]) -> bool:
                answer = await connection.call(m.ListGroupsRequest(), m.ListGroupsResponse)
                return sorted(g.group_id for g in answer.groups) == groups

            # "other" lost its ACL with "theirs"; the broker may apply the two a moment apart.
            await eventually(functools.partial(lists, [GROUP]))
            await acls.add(*cluster_acl(Op.DESCRIBE))

            await eventually(functools.partial(lists, [GROUP, "other"]))
        finally:
            await connection.close()


async def test_idempotent_producers_need_idempotent_write_or_write_on_a_topic(
    broker_factory: BrokerFactory,
) -> None:
    """KIP-679: WRITE on some topic is enough, unless a DENY on every topic takes it away;
    IDEMPOTENT_WRITE on the cluster is enough whatever the topic ACLs say."""
    broker = broker_factory(SECURED)
    connection = await connect(broker)

    async def answers(code: ErrorCode) -> bool:
        return await init_producer_id(connection) == {code}

    try:
        assert await answers(ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        async with zookeeper_acls(broker.zk_connect) as acls:
            await acls.add(*acl(T, "some-topic", Op.WRITE))
            await eventually(functools.partial(answers, ErrorCode.NONE))
            await acls.add(*acl(T, "*", Op.WRITE, permission=AclPermissionType.DENY))
            await eventually(functools.partial(answers, ErrorCode.CLUSTER_AUTHORIZATION_FAILED))
            await acls.add(*cluster_acl(Op.IDEMPOTENT_WRITE))
            await eventually(functools.partial(answers, ErrorCode.NONE))
    finally:
        await connection.close()
