"""OffsetForLeaderEpoch: where a leader epoch ends in the leader's log (KIP-101, KIP-279).

A follower asks before fetching from a new leader, to cut a tail that diverged from the
leader's log; a consumer asks after a leader change to validate its position (KIP-320). Only
the leader answers, at the caller's `current_leader_epoch` if it sends one.
"""

from __future__ import annotations

from riverbed.broker.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

TopicResult = m.OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
EpochEndOffset = m.OffsetForLeaderEpochResponse.EpochEndOffset


async def handle_offset_for_leader_epoch(
    ctx: BrokerContext, request: m.OffsetForLeaderEpochRequest, access: Access
) -> m.OffsetForLeaderEpochResponse:
    """Followers need CLUSTER_ACTION on the cluster, consumers DESCRIBE on each topic
    (TOPIC_AUTHORIZATION_FAILED), as in Kafka."""
    denied: frozenset[str] = frozenset()
    if not access.allows_cluster(AclOperation.CLUSTER_ACTION, log_denied=False):
        names = (topic.topic for topic in request.topics)
        denied = access.denied(AclOperation.DESCRIBE, ResourceType.TOPIC, names)
    topics = [
        TopicResult(
            topic=topic.topic,
            partitions=[
                EpochEndOffset(
                    error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, partition=wanted.partition
                )
                if topic.topic in denied
                else _end_offset(ctx, topic.topic, wanted)
                for wanted in topic.partitions
            ],
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
