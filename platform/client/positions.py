"""Where the consumer reads each assigned partition: a per-partition state machine, no I/O.

A partition is in one of three fetch states:

- AWAITING_RESET: it has no position yet (just assigned, or `seek_to_beginning/end`, or the
  broker answered OFFSET_OUT_OF_RANGE under an `auto_offset_reset` policy); the consumer looks
  its offset up with ListOffsets (`reset_timestamp` -2 = earliest, -1 = latest).
- FETCHING: it has a position and is fetched.
- FAILED: no offset to read from and `auto_offset_reset="none"` (never positioned, or the
  broker answered OFFSET_OUT_OF_RANGE); the error is raised to the application by `getmany`
  until a seek moves the partition on.

Transitions are the table `TRANSITIONS`; a pair absent from it is a bug and raises.

Two offsets per partition: `position`, the next record the application gets, and `fetch_offset`,
the next offset to ask the broker for. `fetch_offset` runs ahead of `position` by whatever is
buffered, so the next fetch is in flight while the application works through the last one.

Every seek or reset bumps `generation`. A fetch or offset lookup remembers the generation it was
sent at, and its answer is dropped if the partition has moved since: between an `await` and its
answer the application may have seeked.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from typing import Final

from riverbed.client.fetched_records import PartitionFetch
from riverbed.client.types import TopicPartition
from riverbed.errors import KafkaError

# ListOffsets' special timestamps.
EARLIEST_TIMESTAMP: Final = -2
LATEST_TIMESTAMP: Final = -1
# Completed fetches buffered per partition beyond the one being read: the next fetch runs while
# the application processes the last; more would only hold memory (fetch_max_bytes each).
PREFETCHED_FETCHES_MAX: Final = 1


class FetchState(enum.Enum):
    AWAITING_RESET = "awaiting_reset"
    FETCHING = "fetching"
    FAILED = "failed"


class PositionEvent(enum.Enum):
    SEEK = "seek"
    RESET_REQUESTED = "reset_requested"
    RESET_DONE = "reset_done"
    OUT_OF_RANGE_RESET = "out_of_range_reset"
    OUT_OF_RANGE_FAIL = "out_of_range_fail"
    NO_RESET_POLICY = "no_reset_policy"


_S, _E = FetchState, PositionEvent
TRANSITIONS: Final[dict[tuple[FetchState, PositionEvent], FetchState]] = {
    (_S.AWAITING_RESET, _E.SEEK): _S.FETCHING,
    (_S.AWAITING_RESET, _E.RESET_REQUESTED): _S.AWAITING_RESET,
    (_S.AWAITING_RESET, _E.RESET_DONE): _S.FETCHING,
    (_S.AWAITING_RESET, _E.NO_RESET_POLICY): _S.FAILED,
    (_S.FETCHING, _E.SEEK): _S.FETCHING,
    (_S.FETCHING, _E.RESET_REQUESTED): _S.AWAITING_RESET,
    (_S.FETCHING, _E.OUT_OF_RANGE_RESET): _S.AWAITING_RESET,
    (_S.FETCHING, _E.OUT_OF_RANGE_FAIL): _S.FAILED,
    (_S.FAILED, _E.SEEK): _S.FETCHING,
    (_S.FAILED, _E.RESET_REQUESTED): _S.AWAITING_RESET,
}


class IllegalTransitionError(RuntimeError):
    """A (state, event) pair the table does not allow: a bug in the consumer."""


class PartitionPosition:
    """The consumer's state for one assigned partition."""

    __slots__ = (
        "buffered",
        "error",
        "fetch_offset",
        "generation",
        "high_watermark",
        "last_stable_offset",
        "log_start_offset",
        "position",
        "reset_timestamp",
        "state",
    )

    def __init__(self, reset_timestamp: int | None) -> None:
        self.state = FetchState.AWAITING_RESET
        # EARLIEST_TIMESTAMP / LATEST_TIMESTAMP; None: no policy, the partition fails instead.
        self.reset_timestamp = reset_timestamp
        self.position = -1
        self.fetch_offset = -1
        self.generation = 0
        self.high_watermark = -1
        self.last_stable_offset = -1
        self.log_start_offset = -1
        # Raised to the application by the next getmany (OffsetOutOfRange, corrupt data, ...).
        self.error: KafkaError | None = None
        self.buffered: deque[PartitionFetch] = deque()

    def apply(self, event: PositionEvent) -> None:
        target = TRANSITIONS.get((self.state, event))
        if target is None:
            raise IllegalTransitionError(
                f"{event.value} is not allowed in state {self.state.value}"
            )
        self.state = target

    @property
    def fetchable(self) -> bool:
        """Worth a Fetch now: it has a position and room to buffer another response."""
        return (
            self.state is FetchState.FETCHING
            and self.error is None
            and len(self.buffered) <= PREFETCHED_FETCHES_MAX
        )


class Positions:
    """Every assigned partition's position; the consumer's only mutable view of them."""

    def __init__(self, default_reset_timestamp: int | None) -> None:
        # None: auto_offset_reset="none", a partition without an offset is an error.
        self._default_reset_timestamp = default_reset_timestamp
        self._partitions: dict[TopicPartition, PartitionPosition] = {}

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Replace the assignment; partitions kept keep their position and buffered data."""
        wanted = list(dict.fromkeys(partitions))
        kept = {tp: self._partitions[tp] for tp in wanted if tp in self._partitions}
        for tp in wanted:
            if tp not in kept:
                kept[tp] = PartitionPosition(self._default_reset_timestamp)
        self._partitions = kept

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(self._partitions)

    def items(self) -> list[tuple[TopicPartition, PartitionPosition]]:
        return list(self._partitions.items())

    def find(self, tp: TopicPartition) -> PartitionPosition | None:
        """The partition's position, None if it is not (or no longer) assigned."""
        return self._partitions.get(tp)

    def get(self, tp: TopicPartition) -> PartitionPosition:
        state = self._partitions.get(tp)
        if state is None:
            raise KeyError(f"{tp.topic}-{tp.partition} is not assigned to this consumer")
        return state

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        state = self.get(tp)
        state.apply(PositionEvent.SEEK)
        self._move(state, offset)

    def request_reset(self, tp: TopicPartition, timestamp: int) -> None:
        """Look the offset up again: EARLIEST_TIMESTAMP or LATEST_TIMESTAMP."""
        state = self.get(tp)
        state.apply(PositionEvent.RESET_REQUESTED)
        state.reset_timestamp = timestamp
        self._move(state, -1)

    def reset_done(self, tp: TopicPartition, generation: int, offset: int) -> bool:
        """Apply a lookup's answer unless the partition moved since; True if applied."""
        state = self._partitions.get(tp)
        if state is None or state.generation != generation:
            return False
        state.apply(PositionEvent.RESET_DONE)
        self._move(state, offset)
        return True

    def fail_without_policy(self, tp: TopicPartition, error: KafkaError) -> None:
        """A partition awaiting a reset that has no policy to reset by."""
        state = self.get(tp)
        state.apply(PositionEvent.NO_RESET_POLICY)
        state.error = error

    def out_of_range(self, tp: TopicPartition, generation: int, error: KafkaError) -> None:
        """OFFSET_OUT_OF_RANGE for a fetch sent at `generation`: reset or fail by policy."""
        state = self._partitions.get(tp)
        if state is None or state.generation != generation:
            return
        if self._default_reset_timestamp is None:
            state.apply(PositionEvent.OUT_OF_RANGE_FAIL)
            state.error = error
            self._move(state, state.position)
        else:
            state.apply(PositionEvent.OUT_OF_RANGE_RESET)
            state.reset_timestamp = self._default_reset_timestamp
            self._move(state, -1)

    @staticmethod
    def _move(state: PartitionPosition, offset: int) -> None:
        # Everything fetched or looked up before this point belongs to the old position.
        state.generation += 1
        state.position = offset
        state.fetch_offset = offset
        state.buffered.clear()
        if state.state is not FetchState.FAILED:
            state.error = None
