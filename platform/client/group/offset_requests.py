"""Committed offsets on the wire: OffsetCommit and OffsetFetch requests built and their answers
read, without I/O.

An OffsetCommit names the member's generation so that the coordinator refuses commits from a
member that no longer owns the partitions (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
REBALANCE_IN_PROGRESS); a consumer that assigns its partitions itself commits with generation -1
and no member id (a "simple" commit, accepted while the group has no members).

OffsetFetch changed shape at version 8 (groups batched); requests fill both shapes, since the
codec writes only the fields of the version negotiated, and answers are read from either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple, Protocol

from riverbed.client.group.member import Generation
from riverbed.client.types import OffsetAndMetadata
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition

NO_LEADER_EPOCH = -1  # on the wire: unknown

__all__ = [
    "FetchedOffsets",
    "OffsetAndMetadata",
    "commit_errors",
    "commit_request",
    "fetch_request",
    "fetch_result",
]


def commit_request(
    group_id: str,
    generation: Generation,
    group_instance_id: str | None,
    offsets: Mapping[TopicPartition, OffsetAndMetadata],
) -> m.OffsetCommitRequest:
    topics: dict[str, m.OffsetCommitRequest.OffsetCommitRequestTopic] = {}
    for tp, committed in sorted(offsets.items()):
        topic = topics.setdefault(
            tp.topic, m.OffsetCommitRequest.OffsetCommitRequestTopic(tp.topic)
        )
        topic.partitions.append(
            m.OffsetCommitRequest.OffsetCommitRequestPartition(
                partition_index=tp.partition,
                committed_offset=committed.offset,
                committed_leader_epoch=NO_LEADER_EPOCH
                if committed.leader_epoch is None
                else committed.leader_epoch,
                committed_metadata=committed.metadata,
            )
        )
    return m.OffsetCommitRequest(
        group_id=group_id,
        generation_id=generation.generation_id,
        member_id=generation.member_id,
        group_instance_id=group_instance_id,
        topics=list(topics.values()),
    )


def commit_errors(response: m.OffsetCommitResponse) -> dict[TopicPartition, ErrorCode]:
    """The partitions whose commit failed, with their error codes."""
    return {
        TopicPartition(topic.name, partition.partition_index): _code(partition.error_code)
        for topic in response.topics
        for partition in topic.partitions
        if partition.error_code != ErrorCode.NONE
    }


def fetch_request(
    group_id: str, partitions: Iterable[TopicPartition], *, require_stable: bool
) -> m.OffsetFetchRequest:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(set(partitions)):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return m.OffsetFetchRequest(
        group_id=group_id,
        topics=[m.OffsetFetchRequest.OffsetFetchRequestTopic(t, p) for t, p in by_topic.items()],
        groups=[
            m.OffsetFetchRequest.OffsetFetchRequestGroup(
                group_id=group_id,
                topics=[
                    m.OffsetFetchRequest.OffsetFetchRequestTopics(t, p) for t, p in by_topic.items()
                ],
            )
        ],
        require_stable=require_stable,
    )


class FetchedOffsets(NamedTuple):
    """An OffsetFetch answer: the group-level error, each partition's committed offset (None if
    nothing was committed) and each partition's error."""

    error: ErrorCode
    offsets: dict[TopicPartition, OffsetAndMetadata | None]
    errors: dict[TopicPartition, ErrorCode]


class _PartitionAnswer(Protocol):
    """A partition of an OffsetFetch answer (its class differs between v0-7 and v8+)."""

    partition_index: int
    committed_offset: int
    committed_leader_epoch: int
    metadata: str | None
    error_code: int


def fetch_result(response: m.OffsetFetchResponse, group_id: str) -> FetchedOffsets:
    answers: list[tuple[str, _PartitionAnswer]]
    if response.groups:  # v8+
        group = next((g for g in response.groups if g.group_id == group_id), None)
        if group is None:
            return FetchedOffsets(ErrorCode.UNKNOWN_SERVER_ERROR, {}, {})
        error = _code(group.error_code)
        answers = [(t.name, p) for t in group.topics for p in t.partitions]
    else:
        error = _code(response.error_code)
        answers = [(t.name, p) for t in response.topics for p in t.partitions]
    offsets: dict[TopicPartition, OffsetAndMetadata | None] = {}
    errors: dict[TopicPartition, ErrorCode] = {}
    for topic, answer in answers:
        tp = TopicPartition(topic, answer.partition_index)
        if answer.error_code != ErrorCode.NONE:
            errors[tp] = _code(answer.error_code)
        elif answer.committed_offset < 0:
            offsets[tp] = None
        else:
            epoch = answer.committed_leader_epoch
            offsets[tp] = OffsetAndMetadata(
                answer.committed_offset, answer.metadata or "", None if epoch < 0 else epoch
            )
    return FetchedOffsets(error, offsets, errors)


def _code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR
