"""A partition's remote log manifest: which Parquet objects hold which offsets, and where each
one is in its lifecycle. Pure data; `remote_metadata.py` stores it.

The manifest lives in the object store itself (docs/tiering.md has the format), so the bucket
alone is enough to read a topic's history: Spark, DuckDB or a script take the highest manifest
version and read the objects of its COPY_FINISHED segments.

Invariants, asserted whenever a manifest is built:
- segments are sorted by base offset and never overlap (a gap is allowed: a compacted or
  truncated log has them);
- every transition follows the lifecycle table, so a retried step is a no-op, never a fork;
- a key is named once: by a segment, a retired segment or a pending compaction's output.

Cold-tier compaction (riverbed.tiering.cold_compaction) adds three things, all absent (or at
their defaults) in a manifest that never saw one:
- `compaction`: at most one compaction in progress. It names, before any of them is written,
  the objects it will write and the segments each replaces, so a crash or an abort leaves a
  record of what to delete, and no other compaction can start;
- `retired`: segments a compaction replaced. They are out of `segments`, so readers that read
  this version or a later one never see them, while readers holding an older version can still
  read their objects until the grace period is over; then they go DELETE_STARTED -> deleted ->
  dropped, like any segment;
- `compacted_end_offset`: the cold tier's first dirty offset. Every record below it was compacted
  against every record below it (and against the records up to the high watermark when that
  pass ran).
The swap from the replaced segments to the compacted ones is one version: a reader of any
version sees either all of the old segments of a range or all of the new ones.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from riverbed.tiering.txn_ranges import NO_TRANSACTIONS, ObjectTransactions

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
    # Its aborted transactions and those crossing its edges (riverbed.tiering.txn_ranges).
    transactions: ObjectTransactions = NO_TRANSACTIONS

    def __post_init__(self) -> None:
        if not 0 <= self.base_offset <= self.last_offset:
            raise ManifestError(f"{self.key}: offsets {self.base_offset}..{self.last_offset}")

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class CompactionGroup:
    """Consecutive finished segments (`replaces`, their keys, oldest first) that a compaction
    rewrites into the one object `output`, covering the same offsets [base_offset,
    last_offset] (compaction leaves gaps inside, never moves a boundary)."""

    replaces: tuple[str, ...]
    output: str
    base_offset: int
    last_offset: int

    def __post_init__(self) -> None:
        if not self.replaces or not 0 <= self.base_offset <= self.last_offset:
            raise ManifestError(f"{self.output}: a group of {len(self.replaces)} segments")


@dataclass(frozen=True, slots=True)
class PendingCompaction:
    """A compaction claimed in the manifest and not swapped in yet.

    `owner` names who runs it (`broker-<id>`, or `spark-<application>` for the Spark job);
    `leader_epoch` is the manifest's epoch when it was claimed: a later leader aborts it, and
    its swap, a commit at that epoch, is fenced once a later leader has written. A Spark job's
    claim also ends at `lease_expires_ms` (0 for a broker's: it lasts as long as its epoch),
    after which the leader aborts it."""

    id: str
    owner: str
    leader_epoch: int
    started_ms: int
    lease_expires_ms: int
    groups: tuple[CompactionGroup, ...]

    def outputs(self) -> list[str]:
        return [group.output for group in self.groups]

    def replaced(self) -> list[str]:
        return [key for group in self.groups for key in group.replaces]

    def expired(self, now_ms: int) -> bool:
        return self.lease_expires_ms != 0 and now_ms >= self.lease_expires_ms


@dataclass(frozen=True, slots=True)
class RetiredSegment:
    """A segment a compaction replaced, since `retired_ms`: COPY_FINISHED while readers that
    listed an older manifest version may still read it, then DELETE_STARTED."""

    segment: RemoteSegment
    retired_ms: int


@dataclass(frozen=True, slots=True)
class Manifest:
    topic: str
    partition: int
    version: int
    leader_epoch: int  # of the leader that wrote this version
    log_start_offset: int
    segments: tuple[RemoteSegment, ...]
    # Cold compaction (module docstring): its first dirty offset, the one in progress, and the
    # segments it replaced that still wait to be deleted.
    compacted_end_offset: int = 0
    compaction: PendingCompaction | None = None
    retired: tuple[RetiredSegment, ...] = ()

    def __post_init__(self) -> None:
        where = f"{self.topic}-{self.partition} v{self.version}"
        previous: RemoteSegment | None = None
        for segment in self.segments:
            if previous is not None and segment.base_offset <= previous.last_offset:
                raise ManifestError(f"{where}: {segment.key} overlaps {previous.key}")
            previous = segment
        if self.log_start_offset < 0:
            raise ManifestError(f"{where}: log start {self.log_start_offset}")
        keys = [s.key for s in self.segments] + [r.segment.key for r in self.retired]
        if self.compaction is not None:
            keys += self.compaction.outputs()
        if len(keys) != len(set(keys)):
            raise ManifestError(f"{where}: an object key is named twice")
        if self.compacted_end_offset < 0:
            raise ManifestError(f"{where}: compacted end {self.compacted_end_offset}")

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

    def with_copy_finished(self, segment: RemoteSegment) -> Manifest:
        """COPY_STARTED -> COPY_FINISHED for `segment`'s key, whose entry becomes `segment`: a
        copy is recorded before its object is built, so only now are the object's size,
        records and timestamps known. Finishing it again is a retried step, a no-op."""
        if segment.state is not SegmentState.COPY_FINISHED:
            raise ManifestError(f"{segment.key}: a copy finishes in COPY_FINISHED")
        for slot, current in enumerate(self.segments):
            if current.key != segment.key:
                continue
            if current.state is SegmentState.COPY_FINISHED:
                return self
            if current.state is not SegmentState.COPY_STARTED:
                raise ManifestError(f"{segment.key}: {current.state.value} -> COPY_FINISHED")
            if (current.base_offset, current.last_offset) != (
                segment.base_offset,
                segment.last_offset,
            ):
                raise ManifestError(
                    f"{segment.key}: started as {current.base_offset}..{current.last_offset}, "
                    f"finished as {segment.base_offset}..{segment.last_offset}"
                )
            segments = (*self.segments[:slot], segment, *self.segments[slot + 1 :])
            return replace(self, segments=segments)
        raise ManifestError(f"{segment.key}: finished without a COPY_STARTED")

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

    # ---- cold compaction ----------------------------------------------------------------------
    def referenced_keys(self) -> set[str]:
        """Every object this version names: segments, retired segments, pending outputs (what
        the orphan sweep must leave alone)."""
        keys = {s.key for s in self.segments} | {r.segment.key for r in self.retired}
        if self.compaction is not None:
            keys.update(self.compaction.outputs())
        return keys

    def with_compaction_claimed(self, pending: PendingCompaction) -> Manifest:
        """Record `pending` before any of its outputs is written. ManifestError if another
        compaction is pending or a group does not match finished segments as they are now."""
        if self.compaction is not None:
            if self.compaction.id == pending.id:
                return self  # a retried step
            raise ManifestError(
                f"{self.topic}-{self.partition}: compaction {self.compaction.id} of "
                f"{self.compaction.owner} is in progress"
            )
        for group in pending.groups:
            self._group_run(group)
        return replace(self, compaction=pending)

    def with_compaction_swapped(
        self,
        compaction_id: str,
        written: Mapping[str, RemoteSegment],
        compacted_end_offset: int,
        now_ms: int,
    ) -> Manifest:
        """The swap: each group whose output was written (`written`: output key -> its
        finished segment) replaces its segments with that one; the replaced ones retire; groups
        not written (nothing in them changed) keep theirs. ManifestError, and no change, if the
        compaction is no longer pending (aborted) or a group's segments changed meanwhile
        (retention deleted some)."""
        pending = self.compaction
        if pending is None or pending.id != compaction_id:
            raise ManifestError(
                f"{self.topic}-{self.partition}: compaction {compaction_id} is not pending "
                "(aborted by the leader, or already swapped in)"
            )
        unknown = set(written) - set(pending.outputs())
        if unknown:
            raise ManifestError(f"compaction {compaction_id} did not plan {sorted(unknown)}")
        segments = list(self.segments)
        retired = list(self.retired)
        for group in pending.groups:
            output = written.get(group.output)
            if output is None:
                continue
            if (output.base_offset, output.last_offset, output.state) != (
                group.base_offset,
                group.last_offset,
                SegmentState.COPY_FINISHED,
            ):
                raise ManifestError(f"{output.key}: not the finished object of its group")
            first, end = self._group_run(group, segments)
            retired += [RetiredSegment(s, now_ms) for s in segments[first:end]]
            segments[first:end] = [output]
        return replace(
            self,
            segments=tuple(segments),
            retired=tuple(retired),
            compaction=None,
            compacted_end_offset=max(self.compacted_end_offset, compacted_end_offset),
        )

    def with_compaction_aborted(self, compaction_id: str) -> Manifest:
        """Drop the pending compaction `compaction_id` (its outputs are then deleted, or left
        to the orphan sweep); unchanged if it is not the pending one."""
        if self.compaction is None or self.compaction.id != compaction_id:
            return self
        return replace(self, compaction=None)

    def with_retired_state(self, keys: Iterable[str], state: SegmentState) -> Manifest:
        """Move retired segments along the lifecycle (to DELETE_STARTED, once their grace is
        over)."""
        wanted = set(keys)
        retired = []
        for entry in self.retired:
            segment = entry.segment
            if segment.key in wanted and segment.state is not state:
                if state not in _NEXT[segment.state]:
                    raise ManifestError(f"{segment.key}: {segment.state.value} -> {state.value}")
                entry = RetiredSegment(replace(segment, state=state), entry.retired_ms)
            retired.append(entry)
        return replace(self, retired=tuple(retired))

    def without_retired(self, keys: Iterable[str]) -> Manifest:
        """Drop retired segments whose objects are deleted (they must be DELETE_STARTED)."""
        gone = set(keys)
        for entry in self.retired:
            if entry.segment.key in gone and entry.segment.state is not SegmentState.DELETE_STARTED:
                raise ManifestError(f"{entry.segment.key}: deleted while {entry.segment.state}")
        return replace(self, retired=tuple(r for r in self.retired if r.segment.key not in gone))

    def _group_run(
        self, group: CompactionGroup, segments: list[RemoteSegment] | None = None
    ) -> tuple[int, int]:
        """The slots [first, end) of `group`'s segments: consecutive, finished, and spanning
        exactly the group's offsets; else ManifestError (the manifest changed under it)."""
        segments = list(self.segments) if segments is None else segments
        slots = {s.key: slot for slot, s in enumerate(segments)}
        first = slots.get(group.replaces[0])
        end = None if first is None else first + len(group.replaces)
        run = [] if first is None or end is None else segments[first:end]
        if (
            first is None
            or end is None
            or [s.key for s in run] != list(group.replaces)
            or any(s.state is not SegmentState.COPY_FINISHED for s in run)
            or (run[0].base_offset, run[-1].last_offset) != (group.base_offset, group.last_offset)
        ):
            raise ManifestError(
                f"{self.topic}-{self.partition} v{self.version}: the segments of "
                f"{group.output} are no longer finished segments as planned"
            )
        return first, end

    # ---- bytes --------------------------------------------------------------------------------
    def to_json(self) -> bytes:
        document: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "topic": self.topic,
            "partition": self.partition,
            "version": self.version,
            "leader_epoch": self.leader_epoch,
            "log_start_offset": self.log_start_offset,
            "segments": [_segment_json(s) for s in self.segments],
        }
        # Written only once cold compaction has run, so a manifest that never saw one keeps
        # its earlier form.
        if self.compacted_end_offset:
            document["compacted_end_offset"] = self.compacted_end_offset
        if self.compaction is not None:
            document["compaction"] = _pending_json(self.compaction)
        if self.retired:
            document["retired"] = [
                {**_segment_json(r.segment), "retired_ms": r.retired_ms} for r in self.retired
            ]
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
                segments=tuple(_segment_from(s) for s in document["segments"]),
                compacted_end_offset=int(document.get("compacted_end_offset", 0)),
                compaction=_pending_from(document.get("compaction")),
                retired=tuple(
                    RetiredSegment(_segment_from(r), int(r["retired_ms"]))
                    for r in document.get("retired", ())
                ),
            )
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ManifestError(f"{source}: not a manifest ({error!r})") from error


def _segment_json(s: RemoteSegment) -> dict[str, Any]:
    return {
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
        # Left out when there are none: most topics never see a transaction.
        **({"transactions": s.transactions.to_json()} if s.transactions else {}),
    }


def _segment_from(s: dict[str, Any]) -> RemoteSegment:
    return RemoteSegment(
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
        transactions=(
            ObjectTransactions.from_json(s["transactions"])
            if "transactions" in s
            else NO_TRANSACTIONS
        ),
    )


def _pending_json(p: PendingCompaction) -> dict[str, Any]:
    return {
        "id": p.id,
        "owner": p.owner,
        "leader_epoch": p.leader_epoch,
        "started_ms": p.started_ms,
        "lease_expires_ms": p.lease_expires_ms,
        "groups": [
            {
                "replaces": list(g.replaces),
                "output": g.output,
                "base_offset": g.base_offset,
                "last_offset": g.last_offset,
            }
            for g in p.groups
        ],
    }


def _pending_from(p: dict[str, Any] | None) -> PendingCompaction | None:
    if p is None:
        return None
    return PendingCompaction(
        id=str(p["id"]),
        owner=str(p["owner"]),
        leader_epoch=int(p["leader_epoch"]),
        started_ms=int(p["started_ms"]),
        lease_expires_ms=int(p["lease_expires_ms"]),
        groups=tuple(
            CompactionGroup(
                replaces=tuple(str(k) for k in g["replaces"]),
                output=str(g["output"]),
                base_offset=int(g["base_offset"]),
                last_offset=int(g["last_offset"]),
            )
            for g in p["groups"]
        ),
    )


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
