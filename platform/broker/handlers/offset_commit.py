"""OffsetCommit: store a group's consumed positions (riverbed.broker.groups stores and checks them).

Per version: v0 has no member or generation (a "simple" commit), v1 an optional commit time per
partition, v2-4 a retention time (the offset then expires at now + retention, KIP-211 aside),
v6 the leader epoch. A partition named twice is committed once, with its last value.
"""

from __future__ import annotations

from collections.abc import Callable

from riverbed.broker.groups.log_store import NO_TIMESTAMP, CommittedOffset
from riverbed.broker.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

TopicResponse = m.OffsetCommitResponse.OffsetCommitResponseTopic
PartitionResponse = m.OffsetCommitResponse.OffsetCommitResponsePartition


async def handle_offset_commit(
    ctx: BrokerContext, request: m.OffsetCommitRequest, access: Access
) -> m.OffsetCommitResponse:
    """Needs READ on the group (every partition GROUP_AUTHORIZATION_FAILED otherwise) and on
    each topic (its partitions TOPIC_AUTHORIZATION_FAILED, the others committed)."""
    if not access.allows(AclOperation.READ, ResourceType.GROUP, request.group_id):
        return _answer(request, lambda _: ErrorCode.GROUP_AUTHORIZATION_FAILED)
    denied = access.denied(AclOperation.READ, ResourceType.TOPIC, (t.name for t in request.topics))
    now_ms = ctx.now_ms()
    expire_timestamp_ms = (
        NO_TIMESTAMP
        if request.retention_time_ms == NO_TIMESTAMP
        else now_ms + request.retention_time_ms
    )
    offsets = {
        TopicPartition(topic.name, partition.partition_index): CommittedOffset(
            offset=partition.committed_offset,
            leader_epoch=partition.committed_leader_epoch,
            metadata=partition.committed_metadata or "",
            commit_timestamp_ms=(
                now_ms if partition.commit_timestamp == NO_TIMESTAMP else partition.commit_timestamp
            ),
            expire_timestamp_ms=expire_timestamp_ms,
        )
        for topic in request.topics
        if topic.name not in denied
        for partition in topic.partitions
    }
    codes: dict[TopicPartition, ErrorCode] = {}
    if offsets:
        codes = await ctx.groups.commit_offsets(
            request.group_id,
            request.generation_id,
            request.member_id,
            request.group_instance_id,
            offsets,
        )
    return _answer(request, lambda tp: codes.get(tp, ErrorCode.TOPIC_AUTHORIZATION_FAILED))


def _answer(
    request: m.OffsetCommitRequest, code: Callable[[TopicPartition], ErrorCode]
) -> m.OffsetCommitResponse:
    return m.OffsetCommitResponse(
        topics=[
            TopicResponse(
                name=topic.name,
                partitions=[
                    PartitionResponse(
                        partition_index=partition.partition_index,
                        error_code=code(TopicPartition(topic.name, partition.partition_index)),
                    )
                    for partition in topic.partitions
                ],
            )
            for topic in request.topics
        ]
    )
