"""DeleteRecords (KIP-107): move partitions' log start offsets forward.

Per partition, on its leader, as Kafka's ReplicaManager does:
- offset -1 means the high watermark; any other negative offset, or one above the high watermark,
  is OFFSET_OUT_OF_RANGE (only committed records can be deleted);
- a topic whose `cleanup.policy` lacks `delete` (compact only) refuses with POLICY_VIOLATION;
- an offset at or below the current log start changes nothing and succeeds;
- otherwise the start moves, durably: on a tiered topic in the remote manifest first (so the next
  leader finds it), then in the local log (`log-start-offset-checkpoint`). Local segments wholly
  below it are deleted at once (on a tiered topic by the offloader, after the objects).

The answer waits, up to `timeout_ms`, until every in-sync replica reports a log start at or past
the offset (followers send theirs in each fetch and follow the leader's): REQUEST_TIMED_OUT
otherwise. The low watermark in the answer is the lowest log start among them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final

from riverbed.broker.handlers.context import BrokerContext
from riverbed.configs import topic_config
from riverbed.hot.replication.partitions import Partition
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

TopicResult = m.DeleteRecordsResponse.DeleteRecordsTopicResult
PartitionResult = m.DeleteRecordsResponse.DeleteRecordsPartitionResult

HIGH_WATERMARK: Final = -1  # Kafka's DeleteRecordsRequest.HIGH_WATERMARK
# Bounds the wait of a request that asks for a longer one.
DELETE_RECORDS_TIMEOUT_MS_MAX: Final = 300_000


@dataclass(slots=True)
class _Moved:
    result: PartitionResult
    partition: Partition
    offset: int


async def handle_delete_records(
    ctx: BrokerContext, request: m.DeleteRecordsRequest, access: Access
) -> m.DeleteRecordsResponse:
    """Topics the principal may not DELETE get TOPIC_AUTHORIZATION_FAILED."""
    topics = []
    moved: list[_Moved] = []
    denied = access.denied(
        AclOperation.DELETE, ResourceType.TOPIC, (t.name for t in request.topics)
    )
    for topic in request.topics:
        results = []
        for wanted in topic.partitions:
            result = PartitionResult(partition_index=wanted.partition_index, low_watermark=-1)
            results.append(result)
            if topic.name in denied:
                result.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                partition, offset = await _move(ctx, topic.name, wanted)
            except KafkaError as error:
                result.error_code = error.code
                continue
            moved.append(_Moved(result, partition, offset))
        topics.append(TopicResult(name=topic.name, partitions=results))
    if moved:
        timeout_ms = min(max(request.timeout_ms, 0), DELETE_RECORDS_TIMEOUT_MS_MAX)
        await _wait_for_replicas(ctx, moved, timeout_ms)
    return m.DeleteRecordsResponse(topics=topics)


async def _move(
    ctx: BrokerContext, topic: str, wanted: m.DeleteRecordsRequest.DeleteRecordsPartition
) -> tuple[Partition, int]:
    """Move one partition's log start; returns the partition and the offset it moved to."""
    partition = ctx.leader_partition(topic, wanted.partition_index)
    metadata = ctx.cache.topic(topic)
    overrides = {} if metadata is None else metadata.configs
    if not topic_config(ctx.config, overrides).delete:
        raise KafkaError(
            ErrorCode.POLICY_VIOLATION,
            f"{partition}: records cannot be deleted, cleanup.policy has no 'delete'",
        )
    partition_log = partition.log
    high_watermark = partition_log.high_watermark
    offset = high_watermark if wanted.offset == HIGH_WATERMARK else wanted.offset
    if not 0 <= offset <= high_watermark:
        raise KafkaError(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"{partition}: offset {wanted.offset} is not in [0, high watermark {high_watermark}]",
        )
    if offset <= partition_log.truncated_before:
        return partition, offset
    tiered = ctx.tiering is not None and ctx.tiering.enabled_for(topic)
    if tiered:
        assert ctx.tiering is not None
        try:
            await ctx.tiering.move_log_start(partition, offset)
        except KafkaError as error:
            if error.code == ErrorCode.FENCED_LEADER_EPOCH:
                raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, str(error)) from error
            raise
        partition.check_leader()  # the leadership may have moved while the store was written
    try:
        partition_log.advance_log_start_offset(offset)
        partition.log_start_moved()  # fetch sessions tell their followers and consumers
        if not tiered:
            partition_log.delete_segments_below(offset, reason="deleted records")
    except OSError as error:
        raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"{partition}: {error}") from error
    return partition, offset


async def _wait_for_replicas(ctx: BrokerContext, moved: list[_Moved], timeout_ms: int) -> None:
    waits = [item.partition.log_start_followed(item.offset) for item in moved]
    _, pending = await asyncio.wait(waits, timeout=timeout_ms / 1000)
    for future in pending:
        future.cancel()
    for item, future in zip(moved, waits, strict=True):
        if future in pending:
            item.result.error_code = ErrorCode.REQUEST_TIMED_OUT
        elif future.exception() is not None:
            error = future.exception()
            item.result.error_code = (
                error.code if isinstance(error, KafkaError) else ErrorCode.UNKNOWN_SERVER_ERROR
            )
        else:
            leader_start = await _leader_start(ctx, item.partition)
            item.result.low_watermark = item.partition.low_watermark(leader_start)


async def _leader_start(ctx: BrokerContext, partition: Partition) -> int:
    """The leader's log start as DeleteRecords counts it: the whole log's, tiers included."""
    try:
        return await ctx.log_start_offset(partition)
    except KafkaError:
        return partition.log.truncated_before  # the store is down: what this broker knows
