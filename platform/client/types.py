"""The values clients hand to users: topic-partitions, record metadata, consumed records and
committed offsets."""

from __future__ import annotations

from dataclasses import dataclass

from riverbed.protocol.record_types import Headers, Record, TopicPartition
from riverbed.protocol.records import TIMESTAMP_TYPE_CREATE_TIME, TIMESTAMP_TYPE_LOG_APPEND_TIME

__all__ = [
    "TIMESTAMP_TYPE_CREATE_TIME",
    "TIMESTAMP_TYPE_LOG_APPEND_TIME",
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
