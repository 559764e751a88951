"""ACLs across brokers: a change made through one broker is enforced by another within moments
(both follow ZooKeeper); replication needs the brokers' principal in super.users; a broker the
controller's ACLs refuse still stops promptly, and a single secured broker stops cleanly."""

from __future__ import annotations

import time
from typing import Final

from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records_codec import encode_batch
from riverbed.security.acl import AclOperation, ResourceType

from tests.security.acl_support import (
    SECURED,
    acl,
    cluster_acl,
    connect,
    eventually,
    zookeeper_acls,
)
from tests.support.broker import BrokerFactory

TOPIC: Final = "shared"
PROPAGATION_S_MAX: Final = 5.0
STOP_S_MAX: Final = 15.0


async def produce(connection: BrokerConnection, partition: int, acks: int = 1) -> int:
    batch = encode_batch([(None, b"v", (), 1_700_000_000_000)])
    request = m.ProduceRequest(
        acks=acks,
        timeout_ms=10_000,
        topic_data=[
            m.ProduceRequest.TopicProduceData(
                name=TOPIC,
                partition_data=[m.ProduceRequest.PartitionProduceData(partition, batch)],
            )
        ],
    )
    response = await connection.call(request, m.ProduceResponse)
    return response.responses[0].partition_responses[0].error_code


async def leaders(connection: BrokerConnection) -> dict[int, int]:
    request = m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name=TOPIC)])
    (topic,) = (await connection.call(request, m.MetadataResponse)).topics
    assert topic.error_code == ErrorCode.NONE
    return {p.partition_index: p.leader_id for p in topic.partitions}


async def test_an_acl_added_through_one_broker_holds_on_the_other(
    broker_factory: BrokerFactory,
) -> None:
    first = broker_factory(SECURED, broker_id=1)
    second = broker_factory(SECURED, broker_id=2)
    async with zookeeper_acls(first.zk_connect) as acls:
        await acls.add(*cluster_acl(AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.CREATE))
    via_first, via_second = await connect(first), await connect(second)
    try:
        create = m.CreateTopicsRequest(
            topics=[m.CreateTopicsRequest.CreatableTopic(TOPIC, 2, 1)], timeout_ms=10_000
        )

        async def created() -> bool:
            for connection in (via_first, via_second):  # whichever is the controller
                response = await connection.call(create, m.CreateTopicsResponse)
                if response.topics[0].error_code in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                    return True
            return False

        # Two partitions, one replica each: one of them is led by the second broker.
        await eventually(created)
        async with zookeeper_acls(first.zk_connect) as acls:
            await acls.remove(*cluster_acl(AclOperation.CREATE))
        assert await produce(via_second, 0) == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        assert await produce(via_second, 1) == ErrorCode.TOPIC_AUTHORIZATION_FAILED

        grant = acl(ResourceType.TOPIC, TOPIC, AclOperation.WRITE)
        creations = [
            m.CreateAclsRequest.AclCreation(
                resource_type=b.resource_type, resource_name=b.resource_name,
                resource_pattern_type=b.pattern_type, principal=b.principal, host=b.host,
                operation=b.operation, permission_type=b.permission,
            )
            for b in grant
        ]  # fmt: skip
        response = await via_first.call(
            m.CreateAclsRequest(creations=creations), m.CreateAclsResponse
        )
        assert [r.error_code for r in response.results] == [ErrorCode.NONE]
        added_at = time.monotonic()
        # Read-your-writes on the broker that took the change (the other may not have it yet).
        by_leader = {leader: p for p, leader in (await leaders(via_first)).items()}
        assert set(by_leader) == {1, 2}, "each broker leads one partition"

        async def second_allows() -> bool:
            return await produce(via_second, by_leader[2]) == ErrorCode.NONE

        await eventually(second_allows, interval_s=0.02)
        propagation_s = time.monotonic() - added_at
        print(f"the second broker enforced the new ACL {propagation_s * 1000:.0f} ms later")
        assert propagation_s < PROPAGATION_S_MAX
        everything = m.DescribeAclsRequest(
            resource_type_filter=2, resource_name_filter=TOPIC, pattern_type_filter=3,
            principal_filter=None, host_filter=None, operation=1, permission_type=1,
        )  # fmt: skip
        described = await via_second.call(everything, m.DescribeAclsResponse)
        assert [(r.resource_name, len(r.acls)) for r in described.resources] == [(TOPIC, 1)]

        # Removed through the second broker, refused by the first again.
        delete = m.DeleteAclsRequest(
            filters=[
                m.DeleteAclsRequest.DeleteAclsFilter(
                    resource_type_filter=2, resource_name_filter=TOPIC, pattern_type_filter=3,
                    principal_filter=None, host_filter=None, operation=1, permission_type=1,
                )
            ]
        )  # fmt: skip
        await via_second.call(delete, m.DeleteAclsResponse)

        async def first_refuses() -> bool:
            refused = await produce(via_first, by_leader[1])
            return refused == ErrorCode.TOPIC_AUTHORIZATION_FAILED

        await eventually(first_refuses, interval_s=0.02)
    finally:
        await via_first.close()
        await via_second.close()

    # The brokers connect to each other as User:ANONYMOUS, which may not CLUSTER_ACTION here:
    # the controller refuses the stopping broker's ControlledShutdown, and it stops anyway, at
    # once, saying why.
    controller_id = await controller(first.bootstrap)
    stopping = second if controller_id == 1 else first
    started = time.monotonic()
    assert stopping.terminate() == 0
    assert time.monotonic() - started < STOP_S_MAX
    assert "must be in super.users" in stopping.log_path.read_text()


async def controller(bootstrap: str) -> int:
    host, _, port = bootstrap.rpartition(":")
    connection = await BrokerConnection.open(host, int(port), client_id="acl-test")
    try:
        response = await connection.call(m.MetadataRequest(topics=[]), m.MetadataResponse)
        return response.controller_id
    finally:
        await connection.close()


async def test_replication_with_the_brokers_as_super_users(broker_factory: BrokerFactory) -> None:
    """Inter-broker traffic (follower fetches, ControlledShutdown) comes as User:ANONYMOUS over
    PLAINTEXT: in super.users it replicates; clients are still refused (no ACL for others)."""
    settings = {**SECURED, "super.users": "User:ANONYMOUS"}
    first = broker_factory(settings, broker_id=1)
    second = broker_factory(settings, broker_id=2)
    connection = await connect(first)
    try:
        create = m.CreateTopicsRequest(
            topics=[m.CreateTopicsRequest.CreatableTopic(TOPIC, 1, 2)], timeout_ms=10_000
        )
        other = await connect(second)
        try:

            async def created() -> bool:
                for target in (connection, other):  # whichever is the controller
                    answer = await target.call(create, m.CreateTopicsResponse)
                    if answer.topics[0].error_code in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                        return True
                return False

            await eventually(created)
        finally:
            await other.close()
        (leader,) = (await leaders(connection)).values()
        to_leader = await connect(first if leader == 1 else second)
        try:

            async def replicated() -> bool:
                return await produce(to_leader, 0, acks=-1) == ErrorCode.NONE

            await eventually(replicated)
        finally:
            await to_leader.close()
    finally:
        await connection.close()
    controller_id = await controller(first.bootstrap)
    stopping = second if controller_id == 1 else first
    assert stopping.terminate() == 0
    log = stopping.log_path.read_text()
    assert "controlled shutdown of broker" in log
    assert "succeeded" in log


def test_a_single_secured_broker_stops_cleanly(broker_factory: BrokerFactory) -> None:
    """Alone, the broker is its own controller: its controlled shutdown asks no one."""
    broker = broker_factory(SECURED)
    started = time.monotonic()
    assert broker.terminate() == 0
    assert time.monotonic() - started < STOP_S_MAX
    log = broker.log_path.read_text()
    assert "event=broker.stopped" in log
    assert "super.users" not in log


async def test_replication_is_refused_without_the_brokers_as_super_users(
    broker_factory: BrokerFactory,
) -> None:
    """Followers fetch as User:ANONYMOUS: without ClusterAction they are refused, retry, and the
    leader takes them out of the ISR."""
    settings = {**SECURED, "replica.lag.time.max.ms": "2000"}
    first = broker_factory(settings, broker_id=1)
    second = broker_factory(settings, broker_id=2)
    async with zookeeper_acls(first.zk_connect) as acls:
        await acls.add(*cluster_acl(AclOperation.CREATE))
        await acls.add(*acl(ResourceType.TOPIC, TOPIC, AclOperation.DESCRIBE))
    via_first, via_second = await connect(first), await connect(second)
    try:
        create = m.CreateTopicsRequest(
            topics=[m.CreateTopicsRequest.CreatableTopic(TOPIC, 1, 2)], timeout_ms=10_000
        )

        async def created() -> bool:
            for connection in (via_first, via_second):
                answer = await connection.call(create, m.CreateTopicsResponse)
                if answer.topics[0].error_code in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                    return True
            return False

        await eventually(created)

        async def isr() -> list[int]:
            request = m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name=TOPIC)])
            (topic,) = (await via_first.call(request, m.MetadataResponse)).topics
            return list(topic.partitions[0].isr_nodes) if topic.partitions else []

        async def shrunk() -> bool:
            return len(await isr()) == 1

        await eventually(shrunk)
        (leader,) = await isr()
        follower = second if leader == 1 else first
        assert "answered TOPIC_AUTHORIZATION_FAILED" in follower.log_path.read_text()
    finally:
        await via_first.close()
        await via_second.close()
