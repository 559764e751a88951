"""OffsetFetch: a group's committed positions; v8 asks for several groups at once (KIP-709).

Per version: null topics (v2+) asks for every partition the group committed; a group-level error
is per partition in v0-1, top-level in v2-7 and per group in v8; v5+ carry the leader epoch.
A partition without a committed offset answers offset -1 and no error, as in Kafka.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from riverbed.groups.log_store import NO_LEADER_EPOCH, CommittedOffset
from riverbed.hot.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition

Response = m.OffsetFetchResponse
NO_OFFSET: Final = -1
NO_METADATA: Final = ""

TopicT = TypeVar("TopicT")
PartitionT = TypeVar("PartitionT")
# (topic name, partition indexes) as a request names them, or None for all partitions.
Wanted = list[tuple[str, list[int]]] | None


async def handle_offset_fetch(
    ctx: BrokerContext, request: m.OffsetFetchRequest, version: int
) -> m.OffsetFetchResponse:
    if version >= 8:
        return Response(groups=[_fetch_group(ctx, group) for group in request.groups])
    topics = request.topics
    wanted = None if topics is None else [(t.name, t.partition_indexes) for t in topics]
    try:
        offsets = ctx.groups.fetch_offsets(request.group_id, _partitions(wanted))
    except KafkaError as error:
        if version >= 2:
            return Response(error_code=error.code)
        # v0-1 have no top-level error: every partition asked for carries it.
        failed = dict.fromkeys(_partitions(wanted) or [], None)
        return Response(
            topics=_topics(
                failed,
                Response.OffsetFetchResponseTopic,
                Response.OffsetFetchResponsePartition,
                error.code,
            )
        )
    return Response(
        topics=_topics(
            offsets, Response.OffsetFetchResponseTopic, Response.OffsetFetchResponsePartition
        )
    )


def _fetch_group(
    ctx: BrokerContext, group: m.OffsetFetchRequest.OffsetFetchRequestGroup
) -> Response.OffsetFetchResponseGroup:
    topics = group.topics
    wanted = None if topics is None else [(t.name, t.partition_indexes) for t in topics]
    try:
        offsets = ctx.groups.fetch_offsets(group.group_id, _partitions(wanted))
    except KafkaError as error:
        return Response.OffsetFetchResponseGroup(group_id=group.group_id, error_code=error.code)
    return Response.OffsetFetchResponseGroup(
        group_id=group.group_id,
        topics=_topics(
            offsets, Response.OffsetFetchResponseTopics, Response.OffsetFetchResponsePartitions
        ),
    )


def _partitions(wanted: Wanted) -> list[TopicPartition] | None:
    if wanted is None:
        return None
    return [TopicPartition(name, index) for name, indexes in wanted for index in indexes]


def _topics(
    offsets: dict[TopicPartition, CommittedOffset | None],
    make_topic: Callable[..., TopicT],
    make_partition: Callable[..., PartitionT],
    error_code: ErrorCode = ErrorCode.NONE,
) -> list[TopicT]:
    """The response's topics (v0-7 and v8 have twin structs under different names)."""
    by_topic: dict[str, list[PartitionT]] = {}
    for tp, committed in offsets.items():
        by_topic.setdefault(tp.topic, []).append(
            make_partition(
                partition_index=tp.partition,
                committed_offset=NO_OFFSET if committed is None else committed.offset,
                committed_leader_epoch=(
                    NO_LEADER_EPOCH if committed is None else committed.leader_epoch
                ),
                metadata=NO_METADATA if committed is None else committed.metadata,
                error_code=error_code,
            )
        )
    return [make_topic(name=name, partitions=partitions) for name, partitions in by_topic.items()]
