"""The record values shared by the wire codec and the client: topic-partitions and records.

They live in the protocol layer because the compiled record decoder (records_fast) builds
`Record`s directly; the client re-exports them (`riverbed.TopicPartition`, `riverbed.Record`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

Headers = tuple[tuple[str, bytes | None], ...]


class TopicPartition(NamedTuple):
    """One partition of one topic: the key of everything per partition."""

    topic: str
    partition: int


class _RecordSlots:
    # The storage of Record: a plain slots class whose slot offsets the compiled decoder fills
    # directly (records_fast checks this layout at import).
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
    """One decoded record. Immutable and without a `__dict__` (its slots live in the base).

    Every decoded record, the consumer's and the broker's, is built by the compiled decoder
    (riverbed.protocol.records_fast), which fills the slots directly: a frozen dataclass's
    `__init__` stores each field with `object.__setattr__` (~790 ns for these 8 fields on the
    reference machine).
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
