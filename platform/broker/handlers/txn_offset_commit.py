"""TxnOffsetCommit: a transactional producer commits a group's offsets inside its transaction.

The offsets are written to the group's `__consumer_offsets` partition in the producer's
transaction and become the group's committed offsets when the transaction's COMMIT marker lands
there (riverbed.broker.groups.coordinator). v0-1 clients predate KAFKA-7296 and may not retry
COORDINATOR_LOAD_IN_PROGRESS: they get COORDINATOR_NOT_AVAILABLE instead, as Kafka answers.
v2 adds the leader epoch, v3 the member's identity for fencing (KIP-447).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from riverbed.broker.groups.log_store import CommittedOffset, TransactionalProducer
from riverbed.broker.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

Response = m.TxnOffsetCommitResponse
# The first version whose clients retry COORDINATOR_LOAD_IN_PROGRESS (KAFKA-7296).
LOAD_IN_PROGRESS_MIN_VERSION: Final = 2


async def handle_txn_offset_commit(
    ctx: BrokerContext, request: m.TxnOffsetCommitRequest, version: int, access: Access
) -> m.TxnOffsetCommitResponse:
    """Needs WRITE on the transactional id (every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    otherwise), READ on the group (GROUP_AUTHORIZATION_FAILED) and READ on each topic (its
    partitions TOPIC_AUTHORIZATION_FAILED, the others committed), as Kafka's KafkaApis."""
    if not access.allows(
        AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id
    ):
        return _answer(request, version, lambda _: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not access.allows(AclOperation.READ, ResourceType.GROUP, request.group_id):
        return _answer(request, version, lambda _: ErrorCode.GROUP_AUTHORIZATION_FAILED)
    denied = access.denied(AclOperation.READ, ResourceType.TOPIC, (t.name for t in request.topics))
    now_ms = ctx.now_ms()
    offsets = {
        TopicPartition(topic.name, partition.partition_index): CommittedOffset(
            offset=partition.committed_offset,
            leader_epoch=partition.committed_leader_epoch,
            metadata=partition.committed_metadata or "",
            commit_timestamp_ms=now_ms,
        )
        for topic in request.topics
        if topic.name not in denied
        for partition in topic.partitions
    }
    codes: dict[TopicPartition, ErrorCode] = {}
    if offsets:
        codes = await ctx.groups.commit_transactional_offsets(
            request.group_id,
            TransactionalProducer(request.producer_id, request.producer_epoch),
            request.generation_id,
            request.member_id,
            request.group_instance_id,
            offsets,
        )
    return _answer(request, version, lambda tp: codes.get(tp, ErrorCode.TOPIC_AUTHORIZATION_FAILED))


def _answer(
    request: m.TxnOffsetCommitRequest, version: int, code: Callable[[TopicPartition], ErrorCode]
) -> m.TxnOffsetCommitResponse:
    def for_version(tp: TopicPartition) -> ErrorCode:
        error = code(tp)
        if (
            error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
            and version < LOAD_IN_PROGRESS_MIN_VERSION
        ):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        return error

    return Response(
        topics=[
            Response.TxnOffsetCommitResponseTopic(
                name=topic.name,
                partitions=[
                    Response.TxnOffsetCommitResponsePartition(
                        partition_index=partition.partition_index,
                        error_code=for_version(
                            TopicPartition(topic.name, partition.partition_index)
                        ),
                    )
                    for partition in topic.partitions
                ],
            )
            for topic in request.topics
        ]
    )
