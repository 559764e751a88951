"""ListOffsets: earliest, latest, max-timestamp and by-timestamp offsets of partitions, and for
tiered topics the earliest local offset (KIP-405, v8) and the latest tiered offset (KIP-1005, v9:
-1 while nothing is tiered).

The isolation level bounds what is visible, as in Kafka: at read_committed (1) the latest offset
is the last stable offset and a timestamp lookup finds nothing at or past it; at
read_uncommitted the high watermark."""

from __future__ import annotations

from riverbed.broker.handlers.context import BrokerContext
from riverbed.hot.replication.partitions import Partition
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

TopicResponse = m.ListOffsetsResponse.ListOffsetsTopicResponse
PartitionResponse = m.ListOffsetsResponse.ListOffsetsPartitionResponse

# Kafka's special timestamps in ListOffsets requests.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
# Kafka's IsolationLevel.READ_COMMITTED.
READ_COMMITTED = 1


async def handle_list_offsets(
    ctx: BrokerContext, request: m.ListOffsetsRequest, access: Access
) -> m.ListOffsetsResponse:
    """Topics the principal may not DESCRIBE get TOPIC_AUTHORIZATION_FAILED."""
    denied = access.denied(
        AclOperation.DESCRIBE, ResourceType.TOPIC, (t.name for t in request.topics)
    )
    topics = []
    for topic in request.topics:
        if topic.name in denied:
            partitions = [
                PartitionResponse(
                    partition_index=wanted.partition_index,
                    error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    timestamp=-1,
                    offset=-1,
                )
                for wanted in topic.partitions
            ]
        else:
            partitions = [
                await _list_partition(ctx, topic.name, p, request.isolation_level)
                for p in topic.partitions
            ]
        topics.append(TopicResponse(name=topic.name, partitions=partitions))
    return m.ListOffsetsResponse(topics=topics)


async def _list_partition(
    ctx: BrokerContext,
    topic: str,
    wanted: m.ListOffsetsRequest.ListOffsetsPartition,
    isolation_level: int,
) -> PartitionResponse:
    response = PartitionResponse(partition_index=wanted.partition_index, timestamp=-1, offset=-1)
    try:
        partition = ctx.leader_partition(topic, wanted.partition_index, wanted.current_leader_epoch)
    except KafkaError as error:
        response.error_code = error.code
        return response
    response.leader_epoch = partition.leader_epoch
    try:
        await _answer(ctx, topic, partition, wanted.timestamp, response, isolation_level)
    except KafkaError as error:  # the remote tier could not be read: the client retries
        response.error_code = error.code
    return response


async def _answer(
    ctx: BrokerContext,
    topic: str,
    partition: Partition,
    timestamp: int,
    response: PartitionResponse,
    isolation_level: int,
) -> None:
    partition_log = partition.log
    visible_end = (
        partition.last_stable_offset
        if isolation_level == READ_COMMITTED
        else partition_log.high_watermark
    )
    if partition.high_watermark_behind_epoch():
        # Retriable: answering the stale HW would send a "latest" consumer back in the log.
        response.error_code = ErrorCode.OFFSET_NOT_AVAILABLE
    elif timestamp == LATEST_TIMESTAMP:
        response.offset = visible_end
    elif timestamp == EARLIEST_TIMESTAMP:
        response.offset = await ctx.log_start_offset(partition)
    elif timestamp == EARLIEST_LOCAL_TIMESTAMP:
        response.offset = partition_log.log_start_offset
    elif timestamp == LATEST_TIERED_TIMESTAMP:
        if ctx.tiering is not None and ctx.tiering.enabled_for(topic):
            response.offset, _ = await ctx.tiering.tiered_summary(partition)
    elif timestamp == MAX_TIMESTAMP:
        found = partition_log.max_timestamp_offset()
        if found is not None:
            response.offset, response.timestamp = found
    elif timestamp < 0:
        response.error_code = ErrorCode.INVALID_REQUEST
    else:
        at: tuple[int, int] | None = None
        if ctx.tiering is not None and ctx.tiering.enabled_for(topic):
            # The remote tier holds the oldest records: it is searched first.
            at = await ctx.tiering.offset_for_timestamp(partition, timestamp)
        if at is None:
            at = partition_log.offset_for_timestamp(timestamp)
        if at is not None and at[0] < visible_end:
            response.offset, response.timestamp = at
