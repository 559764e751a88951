"""Judge a history against the log read back after healing: what acks=all with idempotence and
min.insync.replicas promise, and what a consumer may rely on.

    verdict = check(read_history(path), final_log)
    assert verdict.ok, verdict.report(of_kind(events, Fault), seed)

`final_log` maps partition -> [(offset, value)], read from offset 0 (no retention: the log
starts at 0) up to the high watermark. The rules, each a list of findings:

- lost: an acknowledged value is nowhere in the final log;
- duplicated: a value is in the final log more than once, acknowledged or not (every send has a
  value of its own, so a second copy is a retry the broker failed to de-duplicate);
- misplaced: an acknowledged value is in the final log, but not at the partition and offset its
  producer was told (the log's order must be the acknowledged order);
- changed_meaning: a consumer was served a value at a partition and offset that now holds
  another value, or no longer exists (it was served above a high watermark later truncated).

A value sent but never acknowledged (failed, or in flight when the run stopped) may be in the
log or not: it is counted, not judged. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from tests.faults.history import NO_OFFSET, Ack, Event, Fail, Fault, Served

# Findings of each rule shown in a report; the counts carry the rest.
EXAMPLES_MAX: Final = 10

FinalLog = Mapping[int, Sequence[tuple[int, str]]]


class Position(NamedTuple):
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"p{self.partition}@{self.offset}"


@dataclass(frozen=True, slots=True)
class Lost:
    value: str
    acknowledged_at: Position

    def __str__(self) -> str:
        return f"{self.value}: acknowledged at {self.acknowledged_at}, not in the log"


@dataclass(frozen=True, slots=True)
class Duplicated:
    value: str
    found_at: tuple[Position, ...]
    acknowledged: bool

    def __str__(self) -> str:
        what = "acknowledged" if self.acknowledged else "unacknowledged"
        return f"{self.value} ({what}): at {', '.join(map(str, self.found_at))}"


@dataclass(frozen=True, slots=True)
class Misplaced:
    value: str
    acknowledged_at: Position
    found_at: tuple[Position, ...]

    def __str__(self) -> str:
        found = ", ".join(map(str, self.found_at))
        return f"{self.value}: acknowledged at {self.acknowledged_at}, found at {found}"


@dataclass(frozen=True, slots=True)
class ChangedMeaning:
    consumer: str
    at: Position
    served: str
    final: str | None  # None: the offset is no longer in the log

    def __str__(self) -> str:
        now = "nothing (truncated)" if self.final is None else self.final
        return f"{self.at}: {self.consumer} was served {self.served}, the log now holds {now}"


@dataclass(frozen=True, slots=True)
class Verdict:
    acknowledged: int  # distinct values acknowledged
    failed: int  # distinct values failed and never acknowledged
    unacknowledged_present: int  # in the final log without an acknowledgement: allowed
    served: int  # served events
    acknowledged_by_producer: Mapping[str, int] = field(default_factory=dict)
    lost: tuple[Lost, ...] = ()
    duplicated: tuple[Duplicated, ...] = ()
    misplaced: tuple[Misplaced, ...] = ()
    changed_meaning: tuple[ChangedMeaning, ...] = ()

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.misplaced or self.changed_meaning)

    def summary(self) -> str:
        outcome = "ok" if self.ok else "FAILED"
        producers = ", ".join(f"{p} {n}" for p, n in sorted(self.acknowledged_by_producer.items()))
        return (
            f"{outcome}: lost {len(self.lost)}, duplicated {len(self.duplicated)}, "
            f"misplaced {len(self.misplaced)}, changed meaning {len(self.changed_meaning)}; "
            f"acknowledged {self.acknowledged} ({producers}), failed {self.failed}, "
            f"unacknowledged but present {self.unacknowledged_present} (allowed), "
            f"served {self.served}"
        )

    def report(self, schedule: Sequence[Fault], seed: int) -> str:
        """The verdict, its findings (EXAMPLES_MAX of each), the fault schedule (times from its
        first fault) and the seed: what a replay needs."""
        lines = [self.summary()]
        findings: tuple[tuple[str, Sequence[object]], ...] = (
            ("lost", self.lost),
            ("duplicated", self.duplicated),
            ("misplaced", self.misplaced),
            ("changed meaning", self.changed_meaning),
        )
        for name, found in findings:
            if found:
                lines.append(f"{name} ({len(found)}):")
                lines.extend(f"  {finding}" for finding in found[:EXAMPLES_MAX])
                if len(found) > EXAMPLES_MAX:
                    lines.append(f"  ... and {len(found) - EXAMPLES_MAX} more")
        lines.append(f"seed: {seed}")
        lines.append(f"fault schedule ({len(schedule)} events):")
        start_ms = schedule[0].t_ms if schedule else 0
        lines.extend(
            f"  +{(fault.t_ms - start_ms) / 1000:8.3f} s  {fault.name}  {fault.detail}"
            for fault in schedule
        )
        return "\n".join(lines)


def check(history_events: Iterable[Event], final_log: FinalLog) -> Verdict:
    """Judge the history against the final log (see the module's doc)."""
    found = _positions_of_values(final_log)
    by_position = {
        Position(partition, offset): value
        for partition, records in final_log.items()
        for offset, value in records
    }
    acks: dict[str, list[Ack]] = defaultdict(list)
    failed: set[str] = set()
    served: list[Served] = []
    for event in history_events:
        if isinstance(event, Ack):
            acks[event.value].append(event)
        elif isinstance(event, Fail):
            failed.add(event.value)
        elif isinstance(event, Served):
            served.append(event)
    by_producer = Counter(events[0].producer for events in acks.values())
    return Verdict(
        acknowledged=len(acks),
        failed=len(failed - acks.keys()),
        unacknowledged_present=len(found.keys() - acks.keys()),
        served=len(served),
        acknowledged_by_producer=dict(by_producer),
        lost=tuple(_lost(acks, found)),
        duplicated=tuple(_duplicated(found, acks.keys())),
        misplaced=tuple(_misplaced(acks, found)),
        changed_meaning=tuple(_changed_meaning(served, by_position)),
    )


def _positions_of_values(final_log: FinalLog) -> dict[str, list[Position]]:
    """value -> where it is in the log. Offsets must rise within a partition: the reader's
    promise, checked because a reader bug would pass for a broker bug."""
    found: dict[str, list[Position]] = defaultdict(list)
    for partition, records in sorted(final_log.items()):
        previous = -1
        for offset, value in records:
            if offset <= previous:
                raise ValueError(f"partition {partition}: offset {offset} after {previous}")
            previous = offset
            found[value].append(Position(partition, offset))
    return found


def _lost(acks: Mapping[str, list[Ack]], found: Mapping[str, list[Position]]) -> Iterable[Lost]:
    for value, events in sorted(acks.items()):
        if value not in found:
            yield Lost(value, Position(events[0].partition, events[0].offset))


def _duplicated(
    found: Mapping[str, list[Position]], acknowledged: Iterable[str]
) -> Iterable[Duplicated]:
    acked = frozenset(acknowledged)
    for value, positions in sorted(found.items()):
        if len(positions) > 1:
            yield Duplicated(value, tuple(positions), value in acked)


def _misplaced(
    acks: Mapping[str, list[Ack]], found: Mapping[str, list[Position]]
) -> Iterable[Misplaced]:
    # A value acknowledged twice (a client bug) is judged by each acknowledgement.
    for value, events in sorted(acks.items()):
        positions = found.get(value)
        if positions is None:
            continue  # lost
        for event in events:
            acked_at = Position(event.partition, event.offset)
            if event.offset == NO_OFFSET:
                if all(p.partition != event.partition for p in positions):
                    yield Misplaced(value, acked_at, tuple(positions))
            elif acked_at not in positions:
                yield Misplaced(value, acked_at, tuple(positions))


def _changed_meaning(
    served: Iterable[Served], by_position: Mapping[Position, str]
) -> Iterable[ChangedMeaning]:
    # A record served again (a consumer reset, a second consumer) is one finding.
    seen: set[tuple[Position, str]] = set()
    for event in served:
        at = Position(event.partition, event.offset)
        final = by_position.get(at)
        if final != event.value and (at, event.value) not in seen:
            seen.add((at, event.value))
            yield ChangedMeaning(event.consumer, at, event.value, final)
