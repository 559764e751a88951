"""The values clients hand to users: topic-partitions, record metadata and consumed records."""

from __future__ import annotations

from dataclasses import dataclass

from riverbed.protocol.record_types import Headers, Record, TopicPartition
from riverbed.protocol.records import TIMESTAMP_TYPE_CREATE_TIME, TIMESTAMP_TYPE_LOG_APPEND_TIME

__all__ = [
    "TIMESTAMP_TYPE_CREATE_TIME",
    "TIMESTAMP_TYPE_LOG_APPEND_TIME",
    "Headers",
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
