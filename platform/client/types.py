"""The values clients hand to users: topic-partitions, record metadata, consumed records and
committed offsets."""

from __future__ import annotations

from dataclasses import dataclass

from riverbed.protocol.record_types import Headers, Record, TopicPartition
from riverbed.protocol.records import TIMESTAMP_TYPE_CREATE_TIME, TIMESTAMP_TYPE_LOG_APPEND_TIME

__all__ = [
    "TIMESTAMP_TYPE_CREATE_TIME",
    "TIMESTAMP_TYPE_LOG_APPEND_TIME",
    "ConsumerGroupMetadata",
    "Headers",
    "OffsetAndMetadata",
    "Record",
    "RecordMetadata",
    "TopicPartition",
]


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced record was written. `offset` is -1 with acks=0 (nobody answered);
    `timestamp_ms` is the broker's clock when the topic uses LogAppendTime (timestamp_type 1)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    timestamp_type: int


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A group's committed position in one partition: the offset of the next record to consume,
    the committer's metadata string and the leader epoch of the last record consumed (None if
    unknown), as Kafka's OffsetAndMetadata."""

    offset: int
    metadata: str = ""
    leader_epoch: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.offset, bool) or not isinstance(self.offset, int) or self.offset < 0:
            raise ValueError(f"a committed offset must be an int >= 0, got {self.offset!r}")


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """Who commits offsets inside a transaction (`Consumer.group_metadata()`, as Kafka's): the
    group, and the member's generation, member id and static instance id, so that the group
    coordinator refuses a commit from a member that lost its partitions (KIP-447). Built from
    the group id alone, generation -1 and no member id, it is the pre-KIP-447 form."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.group_id, str) or not self.group_id:
            raise ValueError(f"a group id must be a non-empty str, got {self.group_id!r}")
