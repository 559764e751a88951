"""OffsetFetch: a group's committed positions; v8 asks for several groups at once (KIP-709).

Per version: null topics (v2+) asks for every partition the group committed; a group-level error
is per partition in v0-1, top-level in v2-7 and per group in v8; v5+ carry the leader epoch.
A partition without a committed offset answers offset -1 and no error, as in Kafka. With
require_stable (v7+, KIP-447) a partition with a pending transactional offset answers offset -1
with UNSTABLE_OFFSET_COMMIT (the client retries until the transaction ends); without it the last
committed offset, as pending transactional offsets never show.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from riverbed.broker.groups.log_store import NO_LEADER_EPOCH, CommittedOffset
from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.handlers.groups import check_group
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

Response = m.OffsetFetchResponse
NO_OFFSET: Final = -1
NO_METADATA: Final = ""
# Stands for the offset of a partition the principal may not DESCRIBE (Kafka's
# OffsetFetchResponse.UNAUTHORIZED_PARTITION): -1 with TOPIC_AUTHORIZATION_FAILED.
UNAUTHORIZED: Final = CommittedOffset(
    offset=NO_OFFSET, leader_epoch=NO_LEADER_EPOCH, metadata=NO_METADATA, commit_timestamp_ms=-1
)
# Stands for the offset of a partition with a pending transactional offset when the request
# requires stable offsets: -1 with UNSTABLE_OFFSET_COMMIT.
UNSTABLE: Final = CommittedOffset(
    offset=NO_OFFSET, leader_epoch=NO_LEADER_EPOCH, metadata=NO_METADATA, commit_timestamp_ms=-1
)
# The code of a partition answered with one of the stand-ins above (compared by identity).
_STAND_IN_CODES: Final = {
    id(UNAUTHORIZED): ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    id(UNSTABLE): ErrorCode.UNSTABLE_OFFSET_COMMIT,
}

TopicT = TypeVar("TopicT")
PartitionT = TypeVar("PartitionT")
# (topic name, partition indexes) as a request names them, or None for all partitions.
Wanted = list[tuple[str, list[int]]] | None


async def handle_offset_fetch(
    ctx: BrokerContext, request: m.OffsetFetchRequest, version: int, access: Access
) -> m.OffsetFetchResponse:
    """Needs DESCRIBE on the group (GROUP_AUTHORIZATION_FAILED) and on each topic: a topic
    asked for by name that the principal may not DESCRIBE answers offset -1 with
    TOPIC_AUTHORIZATION_FAILED; asking for all (null topics) leaves such topics out."""
    stable = request.require_stable  # False below v7, where the field does not exist
    if version >= 8:
        return Response(
            groups=[_fetch_group(ctx, group, access, stable) for group in request.groups]
        )
    topics = request.topics
    wanted = None if topics is None else [(t.name, t.partition_indexes) for t in topics]
    try:
        offsets = _fetch(ctx, access, request.group_id, wanted, stable)
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
    ctx: BrokerContext,
    group: m.OffsetFetchRequest.OffsetFetchRequestGroup,
    access: Access,
    require_stable: bool,
) -> Response.OffsetFetchResponseGroup:
    topics = group.topics
    wanted = None if topics is None else [(t.name, t.partition_indexes) for t in topics]
    try:
        offsets = _fetch(ctx, access, group.group_id, wanted, require_stable)
    except KafkaError as error:
        return Response.OffsetFetchResponseGroup(group_id=group.group_id, error_code=error.code)
    return Response.OffsetFetchResponseGroup(
        group_id=group.group_id,
        topics=_topics(
            offsets, Response.OffsetFetchResponseTopics, Response.OffsetFetchResponsePartitions
        ),
    )


def _fetch(
    ctx: BrokerContext, access: Access, group_id: str, wanted: Wanted, require_stable: bool
) -> dict[TopicPartition, CommittedOffset | None]:
    """The group's offsets of the partitions `wanted` the principal may see; an unauthorized
    partition asked for by name maps to UNAUTHORIZED, and with `require_stable` a partition
    with a pending transactional offset to UNSTABLE."""
    offsets = _fetch_visible(ctx, access, group_id, wanted)
    if not require_stable:
        return offsets
    # No await since the fetch: the pending offsets are those of the same moment.
    unstable = ctx.groups.unstable_offsets(
        group_id, [tp for tp, committed in offsets.items() if committed is not UNAUTHORIZED]
    )
    return {tp: UNSTABLE if tp in unstable else c for tp, c in offsets.items()}


def _fetch_visible(
    ctx: BrokerContext, access: Access, group_id: str, wanted: Wanted
) -> dict[TopicPartition, CommittedOffset | None]:
    check_group(access, AclOperation.DESCRIBE, group_id)
    if not access.enabled:
        return ctx.groups.fetch_offsets(group_id, _partitions(wanted))
    if wanted is None:
        offsets = ctx.groups.fetch_offsets(group_id, None)
        hidden = access.denied(
            AclOperation.DESCRIBE, ResourceType.TOPIC, {tp.topic for tp in offsets}
        )
        return {tp: offset for tp, offset in offsets.items() if tp.topic not in hidden}
    denied = access.denied(AclOperation.DESCRIBE, ResourceType.TOPIC, (n for n, _ in wanted))
    allowed = [(name, indexes) for name, indexes in wanted if name not in denied]
    fetched = ctx.groups.fetch_offsets(group_id, _partitions(allowed)) if allowed else {}
    return {
        tp: UNAUTHORIZED if tp.topic in denied else fetched.get(tp)
        for tp in _partitions(wanted) or []
    }


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
        stand_in_code = None if committed is None else _STAND_IN_CODES.get(id(committed))
        found = None if stand_in_code is not None else committed
        by_topic.setdefault(tp.topic, []).append(
            make_partition(
                partition_index=tp.partition,
                committed_offset=NO_OFFSET if found is None else found.offset,
                committed_leader_epoch=NO_LEADER_EPOCH if found is None else found.leader_epoch,
                metadata=NO_METADATA if found is None else found.metadata,
                error_code=error_code if stand_in_code is None else stand_in_code,
            )
        )
    return [make_topic(name=name, partitions=partitions) for name, partitions in by_topic.items()]
