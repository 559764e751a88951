"""OffsetCommit: store a group's consumed positions (riverbed.groups stores and checks them).

Per version: v0 has no member or generation (a "simple" commit), v1 an optional commit time per
partition, v2-4 a retention time (the offset then expires at now + retention, KIP-211 aside),
v6 the leader epoch. A partition named twice is committed once, with its last value.
"""

from __future__ import annotations

from riverbed.groups.log_store import NO_TIMESTAMP, CommittedOffset
from riverbed.hot.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.record_types import TopicPartition

TopicResponse = m.OffsetCommitResponse.OffsetCommitResponseTopic
PartitionResponse = m.OffsetCommitResponse.OffsetCommitResponsePartition


async def handle_offset_commit(
    ctx: BrokerContext, request: m.OffsetCommitRequest
) -> m.OffsetCommitResponse:
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
        for partition in topic.partitions
    }
    codes = await ctx.groups.commit_offsets(
        request.group_id,
        request.generation_id,
        request.member_id,
        request.group_instance_id,
        offsets,
    )
    return m.OffsetCommitResponse(
        topics=[
            TopicResponse(
                name=topic.name,
                partitions=[
                    PartitionResponse(
                        partition_index=partition.partition_index,
                        error_code=codes[TopicPartition(topic.name, partition.partition_index)],
                    )
                    for partition in topic.partitions
                ],
            )
            for topic in request.topics
        ]
    )
