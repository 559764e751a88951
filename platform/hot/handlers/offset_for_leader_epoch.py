"""OffsetForLeaderEpoch: where a leader epoch ends in the leader's log (KIP-101, KIP-279).

A follower asks before fetching from a new leader, to cut a tail that diverged from the
leader's log; a consumer asks after a leader change to validate its position (KIP-320). Only
the leader answers, at the caller's `current_leader_epoch` if it sends one.
"""

from __future__ import annotations

from riverbed.hot.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import KafkaError

TopicResult = m.OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
EpochEndOffset = m.OffsetForLeaderEpochResponse.EpochEndOffset


async def handle_offset_for_leader_epoch(
    ctx: BrokerContext, request: m.OffsetForLeaderEpochRequest
) -> m.OffsetForLeaderEpochResponse:
    topics = [
        TopicResult(
            topic=topic.topic,
            partitions=[_end_offset(ctx, topic.topic, wanted) for wanted in topic.partitions],
        )
        for topic in request.topics
    ]
    return m.OffsetForLeaderEpochResponse(topics=topics)


def _end_offset(
    ctx: BrokerContext, topic: str, wanted: m.OffsetForLeaderEpochRequest.OffsetForLeaderPartition
) -> EpochEndOffset:
    try:
        partition = ctx.leader_partition(topic, wanted.partition, wanted.current_leader_epoch)
    except KafkaError as error:
        return EpochEndOffset(error_code=error.code, partition=wanted.partition)
    partition_log = partition.log
    epoch, end_offset = partition_log.leader_epochs.end_offset_for(
        wanted.leader_epoch, partition_log.log_end_offset
    )
    return EpochEndOffset(partition=wanted.partition, leader_epoch=epoch, end_offset=end_offset)
