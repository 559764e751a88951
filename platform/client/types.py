"""The values clients hand to users: topic-partitions, record metadata and consumed records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NamedTuple

Headers = tuple[tuple[str, bytes | None], ...]

TIMESTAMP_TYPE_CREATE_TIME: Final = 0
TIMESTAMP_TYPE_LOG_APPEND_TIME: Final = 1


class TopicPartition(NamedTuple):
    """One partition of one topic: the key of everything per partition."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced record was written. `offset` is -1 with acks=0 (nobody answered);
    `timestamp_ms` is the broker's clock when the topic uses LogAppendTime (timestamp_type 1)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    timestamp_type: int


class _RecordSlots:
    # The storage of Record: a plain slots class, so that `make_record` can fill it with plain
    # attribute stores before the object becomes a (frozen) Record.
    __slots__ = (
        "headers",
        "key",
        "offset",
        "partition",
        "timestamp_ms",
        "timestamp_type",
        "topic",
        "value",
    )


@dataclass(frozen=True)
class Record(_RecordSlots):
    """One consumed record. Immutable and without a `__dict__` (its slots live in the base).

    Build records on a hot path with `make_record`, not `Record(...)`: a frozen dataclass's
    `__init__` stores each field with `object.__setattr__` (~790 ns for these 8 fields on the
    reference machine), `make_record` takes ~170 ns.
    """

    __slots__ = ()

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: Headers


class _MutableRecord(_RecordSlots):
    __slots__ = ()

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int,
        timestamp_type: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp_ms = timestamp_ms
        self.timestamp_type = timestamp_type
        self.key = key
        self.value = value
        self.headers = headers


def make_record(
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    timestamp_type: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
) -> Record:
    """`Record(...)` at a quarter of the cost: fill a mutable twin sharing Record's memory layout
    (both only inherit `_RecordSlots`), then switch its class. Measured per call, 8 fields:
    Record(...) 785 ns, slot descriptors' __set__ 400 ns, this 167 ns (plain slots class 122 ns)."""
    record = _MutableRecord(
        topic, partition, offset, timestamp_ms, timestamp_type, key, value, headers
    )
    record.__class__ = Record  # type: ignore[assignment]
    return record  # type: ignore[return-value]
