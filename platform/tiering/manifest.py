"""A partition's remote log manifest: which Parquet objects hold which offsets, and where each
one is in its lifecycle. Pure data; `remote_metadata.py` stores it.

The manifest lives in the object store itself (docs/tiering.md has the format), so the bucket
alone is enough to read a topic's history: Spark, DuckDB or a script take the highest manifest
version and read the objects of its COPY_FINISHED segments.

Invariants, asserted whenever a manifest is built:
- segments are sorted by base offset and never overlap (a gap is allowed: a compacted or
  truncated log has them);
- every transition follows the lifecycle table, so a retried step is a no-op, never a fork.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

MANIFEST_FORMAT = 1
OFFSET_DIGITS = 20  # as Kafka names segment files: `ls` and LIST sort them by offset


class SegmentState(enum.Enum):
    """Kafka's RemoteLogSegmentState, minus DELETE_SEGMENT_FINISHED: a deleted segment leaves
    the manifest."""

    COPY_STARTED = "COPY_STARTED"
    COPY_FINISHED = "COPY_FINISHED"
    DELETE_STARTED = "DELETE_STARTED"


# The lifecycle: state -> the states it may move to. Staying put is always allowed (idempotent
# retries); anything absent here is a bug, not a race.
_NEXT: dict[SegmentState, frozenset[SegmentState]] = {
    SegmentState.COPY_STARTED: frozenset({SegmentState.COPY_FINISHED, SegmentState.DELETE_STARTED}),
    SegmentState.COPY_FINISHED: frozenset({SegmentState.DELETE_STARTED}),
    SegmentState.DELETE_STARTED: frozenset(),
}


class ManifestError(ValueError):
    """A manifest that breaks an invariant, or bytes that are not a manifest."""


@dataclass(frozen=True, slots=True)
class RemoteSegment:
    """One object: a run of whole batches of one hot segment, offsets [base_offset, last_offset]."""

    key: str
    base_offset: int
    last_offset: int
    size_bytes: int  # of the object
    # Of the batches it holds as they were in the log: what retention.bytes counts, as in Kafka
    # (an object is several times smaller than its batches, so its size would keep more).
    log_bytes: int
    records: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    leader_epoch: int  # of the leader that uploaded it
    state: SegmentState

    def __post_init__(self) -> None:
        if not 0 <= self.base_offset <= self.last_offset:
            raise ManifestError(f"{self.key}: offsets {self.base_offset}..{self.last_offset}")

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class Manifest:
    topic: str
    partition: int
    version: int
    leader_epoch: int  # of the leader that wrote this version
    log_start_offset: int
    segments: tuple[RemoteSegment, ...]

    def __post_init__(self) -> None:
        previous: RemoteSegment | None = None
        for segment in self.segments:
            if previous is not None and segment.base_offset <= previous.last_offset:
                raise ManifestError(
                    f"{self.topic}-{self.partition} v{self.version}: {segment.key} overlaps "
                    f"{previous.key}"
                )
            previous = segment
        if self.log_start_offset < 0:
            raise ManifestError(
                f"{self.topic}-{self.partition} v{self.version}: log start {self.log_start_offset}"
            )

    @classmethod
    def empty(cls, topic: str, partition: int) -> Manifest:
        """Version 0: never stored; what a partition has before its first upload."""
        return cls(topic, partition, 0, -1, 0, ())

    # ---- reading ------------------------------------------------------------------------------
    def finished(self) -> list[RemoteSegment]:
        """The segments readers may use."""
        return [s for s in self.segments if s.state is SegmentState.COPY_FINISHED]

    @property
    def end_offset(self) -> int:
        """Where the next upload starts: one past the last segment being or done copying, or the
        log start (which retention moves past what it deletes). The range of a failed copy that
        was cleaned up (DELETE_STARTED without moving the log start) is uploaded again."""
        copying = [s for s in self.segments if s.state is not SegmentState.DELETE_STARTED]
        return max(self.log_start_offset, copying[-1].next_offset if copying else 0)

    @property
    def finished_end_offset(self) -> int:
        """One past the last offset readable from the remote tier."""
        finished = self.finished()
        return finished[-1].next_offset if finished else self.log_start_offset

    def segment_for(self, offset: int) -> RemoteSegment | None:
        """The finished segment holding `offset`, or the first one after it (gaps), or None."""
        if offset < self.log_start_offset:
            return None
        for segment in self.finished():
            if segment.last_offset >= offset:
                return segment
        return None

    # ---- transitions --------------------------------------------------------------------------
    def next_version(self, leader_epoch: int) -> Manifest:
        return replace(self, version=self.version + 1, leader_epoch=leader_epoch)

    def with_copy_started(self, segment: RemoteSegment) -> Manifest:
        if segment.state is not SegmentState.COPY_STARTED:
            raise ManifestError(f"{segment.key}: a copy starts in COPY_STARTED")
        if any(s.key == segment.key for s in self.segments):
            return self  # a retried step
        if segment.base_offset < self.end_offset:
            raise ManifestError(
                f"{segment.key} starts at {segment.base_offset}, below the remote log end "
                f"{self.end_offset}"
            )
        return replace(self, segments=(*self.segments, segment))

    def with_state(self, keys: Iterable[str], state: SegmentState) -> Manifest:
        wanted = set(keys)
        segments = []
        for segment in self.segments:
            if segment.key in wanted and segment.state is not state:
                if state not in _NEXT[segment.state]:
                    raise ManifestError(f"{segment.key}: {segment.state.value} -> {state.value}")
                segment = replace(segment, state=state)
            segments.append(segment)
        return replace(self, segments=tuple(segments))

    def without(self, keys: Iterable[str]) -> Manifest:
        """Drop segments whose objects are deleted (they must be DELETE_STARTED)."""
        gone = set(keys)
        for segment in self.segments:
            if segment.key in gone and segment.state is not SegmentState.DELETE_STARTED:
                raise ManifestError(f"{segment.key}: deleted while {segment.state.value}")
        return replace(self, segments=tuple(s for s in self.segments if s.key not in gone))

    def with_log_start_offset(self, offset: int) -> Manifest:
        """Move the remote log start forward (retention, DeleteRecords); never backward."""
        return replace(self, log_start_offset=max(self.log_start_offset, offset))

    # ---- bytes --------------------------------------------------------------------------------
    def to_json(self) -> bytes:
        document: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "topic": self.topic,
            "partition": self.partition,
            "version": self.version,
            "leader_epoch": self.leader_epoch,
            "log_start_offset": self.log_start_offset,
            "segments": [
                {
                    "key": s.key,
                    "base_offset": s.base_offset,
                    "last_offset": s.last_offset,
                    "size_bytes": s.size_bytes,
                    "log_bytes": s.log_bytes,
                    "records": s.records,
                    "min_timestamp_ms": s.min_timestamp_ms,
                    "max_timestamp_ms": s.max_timestamp_ms,
                    "leader_epoch": s.leader_epoch,
                    "state": s.state.value,
                }
                for s in self.segments
            ],
        }
        return json.dumps(document, indent=1).encode()

    @classmethod
    def from_json(cls, data: bytes, source: str) -> Manifest:
        try:
            document = json.loads(data)
            if document.get("format") != MANIFEST_FORMAT:
                raise ManifestError(f"{source}: manifest format {document.get('format')!r}")
            return cls(
                topic=str(document["topic"]),
                partition=int(document["partition"]),
                version=int(document["version"]),
                leader_epoch=int(document["leader_epoch"]),
                log_start_offset=int(document["log_start_offset"]),
                segments=tuple(
                    RemoteSegment(
                        key=str(s["key"]),
                        base_offset=int(s["base_offset"]),
                        last_offset=int(s["last_offset"]),
                        size_bytes=int(s["size_bytes"]),
                        log_bytes=int(s["log_bytes"]),
                        records=int(s["records"]),
                        min_timestamp_ms=int(s["min_timestamp_ms"]),
                        max_timestamp_ms=int(s["max_timestamp_ms"]),
                        leader_epoch=int(s["leader_epoch"]),
                        state=SegmentState(s["state"]),
                    )
                    for s in document["segments"]
                ),
            )
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ManifestError(f"{source}: not a manifest ({error!r})") from error


def partition_prefix(topic: str, partition: int) -> str:
    return f"{topic}/{partition}/"


def manifest_key(topic: str, partition: int, version: int) -> str:
    return f"{partition_prefix(topic, partition)}manifest/{version:0{OFFSET_DIGITS}d}.json"


def segment_key(topic: str, partition: int, base_offset: int, last_offset: int, tag: str) -> str:
    """A data object's key: unique per upload attempt (`tag`), so a retry never overwrites an
    object another leader's manifest may point to."""
    return (
        f"{partition_prefix(topic, partition)}segments/"
        f"{base_offset:0{OFFSET_DIGITS}d}-{last_offset:0{OFFSET_DIGITS}d}-{tag}.parquet"
    )
