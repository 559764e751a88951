"""The transactional APIs under the ACL authorizer, as Kafka's KafkaApis authorizes them: WRITE
on the transactional id for InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn,
DESCRIBE for FindCoordinator (key type 1) and DescribeTransactions; AddPartitionsToTxn also needs
WRITE on each topic, AddOffsetsToTxn READ on the group; ListTransactions lists only the ids the
principal may DESCRIBE. One real broker, ACLs written to ZooKeeper."""

from __future__ import annotations

from typing import Final

from riverbed import Admin
from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
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
from tests.transactions.txn_clients import ONE_BROKER_SETTINGS

Op = AclOperation
TID: Final = "secured-txn"
OTHER: Final = "other-txn"
TOPIC: Final = "secured-topic"
GROUP: Final = "secured-group"
DENIED: Final = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


async def find(c: BrokerConnection, key: str) -> int:
    request = m.FindCoordinatorRequest(key_type=1, coordinator_keys=[key])
    (coordinator,) = (await c.call(request, m.FindCoordinatorResponse)).coordinators
    return coordinator.error_code


async def init(c: BrokerConnection, tid: str) -> m.InitProducerIdResponse:
    request = m.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60_000)
    return await c.call(request, m.InitProducerIdResponse)


async def add_partitions(c: BrokerConnection, pid: int, epoch: int) -> set[int]:
    request = m.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=TID,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[m.AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(TOPIC, [0])],
    )
    response = await c.call(request, m.AddPartitionsToTxnResponse)
    return {
        p.partition_error_code
        for t in response.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


async def add_offsets(c: BrokerConnection, pid: int, epoch: int) -> int:
    request = m.AddOffsetsToTxnRequest(
        transactional_id=TID, producer_id=pid, producer_epoch=epoch, group_id=GROUP
    )
    return (await c.call(request, m.AddOffsetsToTxnResponse)).error_code


async def end(c: BrokerConnection, pid: int, epoch: int) -> int:
    request = m.EndTxnRequest(
        transactional_id=TID, producer_id=pid, producer_epoch=epoch, committed=False
    )
    return (await c.call(request, m.EndTxnResponse)).error_code


async def describe(
    c: BrokerConnection, tid: str
) -> m.DescribeTransactionsResponse.TransactionState:
    request = m.DescribeTransactionsRequest(transactional_ids=[tid])
    (state,) = (await c.call(request, m.DescribeTransactionsResponse)).transaction_states
    return state


async def listed(c: BrokerConnection) -> set[str]:
    response = await c.call(m.ListTransactionsRequest(), m.ListTransactionsResponse)
    assert response.error_code == ErrorCode.NONE
    return {t.transactional_id for t in response.transaction_states}


async def test_transactional_apis_need_kafkas_acls(broker_factory: BrokerFactory) -> None:
    broker = broker_factory({**SECURED, **ONE_BROKER_SETTINGS})
    connection = await connect(broker)
    try:
        async with zookeeper_acls(broker.zk_connect) as acls:
            create = cluster_acl(Op.CREATE)
            await acls.add(*create)
            async with Admin(bootstrap_servers=broker.bootstrap) as admin:

                async def created() -> bool:
                    try:
                        await admin.create_topic(TOPIC, partitions=1)
                    except Exception:
                        return False
                    return True

                await eventually(created)
            await acls.remove(*create)

            # Nothing granted on the transactional id: every API refuses it.
            assert await find(connection, TID) == DENIED
            assert (await init(connection, TID)).error_code == DENIED
            assert await add_partitions(connection, 1, 0) == {DENIED}
            assert await add_offsets(connection, 1, 0) == DENIED
            assert await end(connection, 1, 0) == DENIED
            assert (await describe(connection, TID)).error_code == DENIED

            # WRITE on the id (which implies DESCRIBE), and on a second id, later taken away.
            await acls.add(*acl(ResourceType.TRANSACTIONAL_ID, TID, Op.WRITE))
            await acls.add(*acl(ResourceType.TRANSACTIONAL_ID, OTHER, Op.WRITE))
            await eventually(lambda: _found(connection, TID))
            await eventually(lambda: _initialized(connection, OTHER))
            response = await init(connection, TID)
            assert response.error_code == ErrorCode.NONE
            pid, epoch = response.producer_id, response.producer_epoch
            # The topic and the group are still refused.
            assert await add_partitions(connection, pid, epoch) == {
                ErrorCode.TOPIC_AUTHORIZATION_FAILED
            }
            assert await add_offsets(connection, pid, epoch) == ErrorCode.GROUP_AUTHORIZATION_FAILED
            await acls.add(*acl(ResourceType.TOPIC, TOPIC, Op.WRITE))
            await acls.add(*acl(ResourceType.GROUP, GROUP, Op.READ))

            async def added() -> bool:
                return await add_partitions(connection, pid, epoch) == {ErrorCode.NONE}

            async def group_allowed() -> bool:
                # Each ACL reaches the broker's cache through its own watch: wait for both.
                return await add_offsets(connection, pid, epoch) == ErrorCode.NONE

            await eventually(added)
            await eventually(group_allowed)
            described = await describe(connection, TID)
            assert described.transaction_state == "Ongoing"
            # The offsets topic is not describable by this principal: left out.
            assert [(t.topic, t.partitions) for t in described.topics] == [(TOPIC, [0])]
            assert await listed(connection) == {TID, OTHER}
            await acls.remove(*acl(ResourceType.TRANSACTIONAL_ID, OTHER, Op.WRITE))

            async def hidden() -> bool:
                return await listed(connection) == {TID}

            await eventually(hidden)
            assert await end(connection, pid, epoch) == ErrorCode.NONE
    finally:
        await connection.close()


async def _found(connection: BrokerConnection, tid: str) -> bool:
    return await find(connection, tid) == ErrorCode.NONE


async def _initialized(connection: BrokerConnection, tid: str) -> bool:
    return (await init(connection, tid)).error_code == ErrorCode.NONE
