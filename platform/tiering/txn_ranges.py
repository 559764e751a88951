"""What a tiered object tells about transactions, so read_committed reads work from the cold tier.

A read_committed reader must leave out the records of aborted transactions. In the hot log the
broker keeps an aborted-transaction index per segment; a tiered object keeps the same facts in
its manifest entry, computed from the object's own batches when it is converted (each object on
its own, so conversions may run side by side):

- `ended`: each producer's first marker in the object (producer id, marker offset, aborted or
  not, and the producer's first transactional record before it in the object, if any). The
  object alone cannot tell whether that transaction began in it or in an older object (records
  before the marker may continue a transaction an older object left open); the walk below
  decides, from the older objects;
- `aborted`: transactions that start and abort inside the object after an earlier marker of
  their producer there (producer id, first offset, marker offset): those surely began here;
- `last_markers`: each producer's last marker offset in the object;
- `open`: transactions still open at the object's end (producer id, first offset in the object).

Committed transactions are listed only as a producer's first marker, so an entry stays small
(bounded by the producers that wrote to the object) however many transactions its segment holds.
`resolve` walks consecutive objects oldest first and gives every aborted transaction and the
transactions still open at the end of the walk (whose markers are not in these objects: a
reader must not decide on their records from the objects alone).

An aborted transaction whose marker is the first thing the walk knows of its producer starts,
as far as the walk tells, at the producer's first transactional record before the marker in
that object (at the marker if none): its records before the walk's first object are not part
of the walk. Kafka's read_committed consumers apply a range only to the producer's
transactional records, and a producer has one transaction at a time, so that hides nothing
else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from riverbed.protocol.control_records import ControlType


class AbortedRange(NamedTuple):
    """Kafka's AbortedTxn without its last stable offset: the producer's transactional records
    in [first_offset, last_offset] (the marker's offset) were aborted."""

    producer_id: int
    first_offset: int
    last_offset: int


class EndedTxn(NamedTuple):
    producer_id: int
    marker_offset: int
    aborted: bool
    # The producer's first transactional record before the marker in the object (None: none).
    first_offset: int | None = None


class OpenTxn(NamedTuple):
    producer_id: int
    first_offset: int


class LastMarker(NamedTuple):
    producer_id: int
    offset: int


@dataclass(frozen=True, slots=True)
class ObjectTransactions:
    aborted: tuple[AbortedRange, ...] = ()
    ended: tuple[EndedTxn, ...] = ()
    last_markers: tuple[LastMarker, ...] = ()
    open: tuple[OpenTxn, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.aborted or self.ended or self.last_markers or self.open)

    def to_json(self) -> dict[str, Any]:
        return {
            "aborted": [list(a) for a in self.aborted],
            "ended": [list(e) for e in self.ended],
            "last_markers": [list(m) for m in self.last_markers],
            "open": [list(o) for o in self.open],
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> ObjectTransactions:
        return cls(
            aborted=tuple(AbortedRange(int(p), int(f), int(x)) for p, f, x in document["aborted"]),
            ended=tuple(_ended_from(e) for e in document["ended"]),
            last_markers=tuple(LastMarker(int(p), int(m)) for p, m in document["last_markers"]),
            open=tuple(OpenTxn(int(p), int(f)) for p, f in document["open"]),
        )


def _ended_from(item: list[Any]) -> EndedTxn:
    producer_id, marker_offset, aborted, *first = item
    first_offset = first[0] if first else None
    return EndedTxn(
        int(producer_id),
        int(marker_offset),
        bool(aborted),
        None if first_offset is None else int(first_offset),
    )


NO_TRANSACTIONS = ObjectTransactions()


@dataclass(slots=True)
class TxnScanner:
    """Fed one object's batches in offset order; `result()` is its ObjectTransactions."""

    _open: dict[int, int] = field(default_factory=dict)  # producer id -> first offset here
    _aborted: list[AbortedRange] = field(default_factory=list)
    _ended: list[EndedTxn] = field(default_factory=list)
    _last_markers: dict[int, int] = field(default_factory=dict)

    def data(self, producer_id: int, base_offset: int) -> None:
        """A transactional data batch."""
        self._open.setdefault(producer_id, base_offset)

    def marker(self, producer_id: int, offset: int, control_type: ControlType) -> None:
        aborted = control_type is ControlType.ABORT
        first = self._open.pop(producer_id, None)
        if producer_id not in self._last_markers:
            # Its records before the marker here may continue a transaction an older object
            # left open: the walk decides where it began.
            self._ended.append(EndedTxn(producer_id, offset, aborted, first))
        elif aborted:
            self._aborted.append(
                AbortedRange(producer_id, offset if first is None else first, offset)
            )
        self._last_markers[producer_id] = offset

    def result(self) -> ObjectTransactions:
        return ObjectTransactions(
            tuple(self._aborted),
            tuple(self._ended),
            tuple(LastMarker(p, m) for p, m in self._last_markers.items()),
            tuple(sorted((OpenTxn(p, f) for p, f in self._open.items()), key=_first)),
        )


@dataclass(frozen=True, slots=True)
class Resolved:
    aborted: tuple[AbortedRange, ...]  # ordered by first offset
    open: tuple[OpenTxn, ...]  # open at the end of the walk, ordered by first offset

    @property
    def unstable_from(self) -> int | None:
        """The first offset a reader cannot decide on from the walked objects (None: none)."""
        return self.open[0].first_offset if self.open else None


NOTHING_RESOLVED = Resolved((), ())


def resolve(objects: Sequence[tuple[int, ObjectTransactions]]) -> Resolved:
    """Walk (base offset, transactions) of consecutive objects, oldest first."""
    if not objects:
        return Resolved((), ())
    group = merged(objects)
    # Transactions the walk sees no start of: they start, as far as these objects tell, at
    # their producer's first record in the walk (the module's docstring).
    older = [
        AbortedRange(e.producer_id, _first_or(e.first_offset, e.marker_offset), e.marker_offset)
        for e in group.ended
        if e.aborted
    ]
    return Resolved(tuple(sorted([*older, *group.aborted], key=_first)), group.open)


class LocalAbortedTxn(Protocol):
    """An entry of the hot log's transaction index (riverbed.hot.storage.transactions)."""

    @property
    def producer_id(self) -> int: ...
    @property
    def first_offset(self) -> int: ...
    @property
    def last_offset(self) -> int: ...


def with_local(resolved: Resolved, local: Iterable[LocalAbortedTxn]) -> list[AbortedRange]:
    """The aborted transactions of both tiers (Kafka's collectAbortedTxns over the remote and
    the local log): the walk's, then those of the local transaction index. A transaction open
    at the walk's end whose abort the local index holds starts where the walk saw its first
    record: the local index may know less (a follower that restarted its log above the remote
    tier does not know where it began). A transaction in both is listed twice, which hides
    nothing more."""
    open_first = {txn.producer_id: txn.first_offset for txn in resolved.open}
    found = list(resolved.aborted)
    for txn in local:
        first = min(txn.first_offset, open_first.pop(txn.producer_id, txn.first_offset))
        found.append(AbortedRange(txn.producer_id, first, txn.last_offset))
    return found


def merged(objects: Sequence[tuple[int, ObjectTransactions]]) -> ObjectTransactions:
    """The transactions of one object made of consecutive `objects` (a cold compaction's
    output): those resolved inside the group, and the edges it leaves on either side."""
    open_first: dict[int, int] = {}
    last_markers: dict[int, int] = {}
    aborted: list[AbortedRange] = []
    ended: list[EndedTxn] = []
    for _, txns in objects:
        for end in txns.ended:
            first = open_first.pop(end.producer_id, None)
            if first is None:
                first = end.first_offset
            if end.producer_id not in last_markers:
                # The producer's first marker in the group: its transaction may have begun
                # before the group, so it stays an edge (with where the group saw it begin).
                ended.append(EndedTxn(end.producer_id, end.marker_offset, end.aborted, first))
            elif end.aborted:
                # An older object of the group saw the previous transaction end: it began here.
                start = _first_or(first, end.marker_offset)
                aborted.append(AbortedRange(end.producer_id, start, end.marker_offset))
        aborted.extend(txns.aborted)
        last_markers.update(txns.last_markers)
        for opened in txns.open:
            open_first.setdefault(opened.producer_id, opened.first_offset)
    return ObjectTransactions(
        tuple(sorted(aborted, key=_first)),
        tuple(ended),
        tuple(LastMarker(p, m) for p, m in last_markers.items()),
        tuple(sorted((OpenTxn(p, f) for p, f in open_first.items()), key=_first)),
    )


def _first_or(first_offset: int | None, marker_offset: int) -> int:
    return marker_offset if first_offset is None else first_offset


def _first(txn: AbortedRange | OpenTxn) -> int:
    return txn.first_offset


def overlapping(
    aborted: Sequence[AbortedRange], start_offset: int, end_offset: int
) -> list[AbortedRange]:
    """Kafka's collectAbortedTxns for [start_offset, end_offset): the aborted transactions a
    reader of those offsets needs (marker at or after the start, first offset before the end)."""
    return [a for a in aborted if a.last_offset >= start_offset and a.first_offset < end_offset]
