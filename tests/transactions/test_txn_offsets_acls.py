"""TxnOffsetCommit's authorization on a real broker with the ACL authorizer, as KafkaApis does it:
WRITE on the transactional id first (every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
then READ on the group (GROUP_AUTHORIZATION_FAILED), then READ on each topic (its partitions
TOPIC_AUTHORIZATION_FAILED, the other topics' committed). ACLs are granted one at a time.
"""

from __future__ import annotations

from typing import Final

from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition
from riverbed.security.acl import AclOperation, ResourceType

from tests.groups.test_coordinator_broker import find_coordinator
from tests.security.acl_support import SECURED, acl, connect, eventually, zookeeper_acls
from tests.security.test_acl_enforcement import create_topics
from tests.support.broker import BrokerFactory
from tests.transactions.test_txn_offsets_broker import GROUP, txn_commit

PRODUCER_ID: Final = 3000
TRANSACTIONAL_ID: Final = f"tid-{PRODUCER_ID}"  # as txn_commit names it
ALLOWED: Final = TopicPartition("orders", 0)
FORBIDDEN: Final = TopicPartition("secret", 0)


async def test_transactional_id_then_group_then_topics(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SECURED)
    await create_topics(broker, [ALLOWED.topic, FORBIDDEN.topic])
    connection = await connect(broker)
    offsets = {ALLOWED: 1, FORBIDDEN: 1}

    async def answered(expected: dict[TopicPartition, ErrorCode]) -> bool:
        if all(code == ErrorCode.NONE for tp, code in expected.items() if tp == ALLOWED):
            await find_coordinator(connection, GROUP)  # creates __consumer_offsets
        return await txn_commit(connection, PRODUCER_ID, offsets) == expected

    try:
        assert await txn_commit(connection, PRODUCER_ID, offsets) == dict.fromkeys(
            offsets, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        )
        async with zookeeper_acls(broker.zk_connect) as acls:
            await acls.add(
                *acl(ResourceType.TRANSACTIONAL_ID, TRANSACTIONAL_ID, AclOperation.WRITE)
            )
            group_refused = dict.fromkeys(offsets, ErrorCode.GROUP_AUTHORIZATION_FAILED)
            await eventually(lambda: answered(group_refused))

            await acls.add(*acl(ResourceType.GROUP, GROUP, AclOperation.READ))
            topics_refused = dict.fromkeys(offsets, ErrorCode.TOPIC_AUTHORIZATION_FAILED)
            await eventually(lambda: answered(topics_refused))

            await acls.add(*acl(ResourceType.TOPIC, ALLOWED.topic, AclOperation.READ))
            one_refused = {ALLOWED: ErrorCode.NONE, FORBIDDEN: ErrorCode.TOPIC_AUTHORIZATION_FAILED}
            await eventually(lambda: answered(one_refused))
    finally:
        await connection.close()
