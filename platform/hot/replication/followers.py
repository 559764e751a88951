"""What a partition's leader knows about its followers: how far each has fetched, and when it
last caught up. Pure bookkeeping (no I/O, no clock of its own): the high watermark and the ISR
changes follow from it.

Kafka's rules (kafka.cluster.Replica):
- a follower's fetch offset is its log end offset (it has everything below);
- it *caught up* at the time of a fetch whose offset reached the leader's log end offset as of
  that fetch, or at the time of its previous fetch if this one reached the leader's log end
  offset as of that previous fetch — so a follower that keeps fetching promptly behind a busy
  leader is never seen as lagging;
- it is out of sync when it has not caught up for `replica.lag.time.max.ms`;
- it may join the ISR once its log end offset reaches the high watermark and the start of the
  leader's current epoch (so it has truncated any divergent tail first).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from riverbed.hot.replication.fetch_watch import FetchWatch

UNKNOWN_OFFSET: Final = -1


@dataclass(slots=True)
class FollowerState:
    log_end_offset: int
    last_caught_up_ms: int
    last_fetch_ms: int
    leader_end_offset_at_last_fetch: int
    # What its fetches report (FetchRequest v5+): DeleteRecords waits for it to follow.
    log_start_offset: int = UNKNOWN_OFFSET
    # The fetch session its last fetch of this partition came through: while it is open, each
    # of its requests fetches this partition again at `log_end_offset`, named or not.
    watch: FetchWatch | None = None


class FollowerTracker:
    """The followers of one partition, reset whenever this broker becomes its leader."""

    def __init__(self, follower_ids: Iterable[int], in_sync: Iterable[int], now_ms: int) -> None:
        in_sync_ids = frozenset(in_sync)
        # As in Kafka, followers in the ISR get the benefit of the doubt at a leader change:
        # they count as caught up now; the others must prove it.
        self._followers = {
            follower_id: FollowerState(
                log_end_offset=UNKNOWN_OFFSET,
                last_caught_up_ms=now_ms if follower_id in in_sync_ids else 0,
                last_fetch_ms=0,
                leader_end_offset_at_last_fetch=UNKNOWN_OFFSET,
            )
            for follower_id in follower_ids
        }

    def set_followers(self, follower_ids: Iterable[int]) -> None:
        """The replica set changed within a leadership term (a reassignment): new followers
        start unknown and out of sync, as at a leader change; those that stay keep their
        progress."""
        wanted = frozenset(follower_ids)
        for follower_id in set(self._followers) - wanted:
            del self._followers[follower_id]
        for follower_id in wanted - set(self._followers):
            self._followers[follower_id] = FollowerState(
                log_end_offset=UNKNOWN_OFFSET,
                last_caught_up_ms=0,
                last_fetch_ms=0,
                leader_end_offset_at_last_fetch=UNKNOWN_OFFSET,
            )

    def __contains__(self, follower_id: int) -> bool:
        return follower_id in self._followers

    def log_end_offset(self, follower_id: int) -> int:
        return self._followers[follower_id].log_end_offset

    def on_fetch(
        self,
        follower_id: int,
        fetch_offset: int,
        leader_end_offset: int,
        now_ms: int,
        log_start_offset: int = UNKNOWN_OFFSET,
        watch: FetchWatch | None = None,
    ) -> bool:
        """Record a fetch from `fetch_offset` (through the fetch session of `watch`, if any);
        whether the follower's log end moved up (only then can the high watermark move because
        of it)."""
        state = self._followers[follower_id]
        state.log_start_offset = log_start_offset
        state.watch = watch
        if fetch_offset >= leader_end_offset:
            state.last_caught_up_ms = max(state.last_caught_up_ms, now_ms)
        elif fetch_offset >= state.leader_end_offset_at_last_fetch:
            state.last_caught_up_ms = max(state.last_caught_up_ms, state.last_fetch_ms)
        moved = fetch_offset > state.log_end_offset
        state.log_end_offset = fetch_offset
        state.leader_end_offset_at_last_fetch = leader_end_offset
        state.last_fetch_ms = now_ms
        return moved

    def before_end_moves(self, leader_end_offset: int) -> None:
        """The leader's log end is about to move past `leader_end_offset`. A follower with an
        open fetch session fetched this partition implicitly on every request since its last
        recorded fetch (the partition did not change, so the request did not name it and the
        leader did not read it): those fetches are recorded now, as one at the session's latest
        request, before the move makes the follower look behind. Without this, an append to a
        partition idle for longer than replica.lag.time.max.ms would drop every follower from
        its ISR; with it, a follower that stopped fetching still drops out, as its session's
        clock stopped."""
        for state in self._followers.values():
            watch = state.watch
            if watch is None or not watch.open or watch.last_fetch_ms <= state.last_fetch_ms:
                continue
            if state.log_end_offset >= leader_end_offset:
                state.last_caught_up_ms = max(state.last_caught_up_ms, watch.last_fetch_ms)
            state.leader_end_offset_at_last_fetch = leader_end_offset
            state.last_fetch_ms = watch.last_fetch_ms

    def out_of_sync(
        self, members: Iterable[int], leader_end_offset: int, now_ms: int, lag_max_ms: int
    ) -> frozenset[int]:
        """The followers among `members` that have not caught up within `lag_max_ms`."""
        lagging = set()
        for follower_id in members:
            state = self._followers.get(follower_id)
            if state is None:
                continue  # the leader itself
            if state.log_end_offset == leader_end_offset:
                continue
            if now_ms - state.last_caught_up_ms > lag_max_ms:
                lagging.add(follower_id)
        return frozenset(lagging)

    def ready_to_join(
        self, outside: Iterable[int], high_watermark: int, epoch_start_offset: int
    ) -> frozenset[int]:
        """The followers among `outside` (not in the ISR) that may join it now."""
        return frozenset(
            follower_id
            for follower_id in outside
            if follower_id in self._followers
            and self._followers[follower_id].log_end_offset >= max(high_watermark, 0)
            and self._followers[follower_id].log_end_offset >= epoch_start_offset
        )

    def low_watermark(self, members: Iterable[int], leader_start_offset: int) -> int:
        """The lowest log start among `members` (the leader's own included): DeleteRecords is
        done once it reaches the requested offset. UNKNOWN_OFFSET while one of them has not
        reported its log start since this leader began."""
        starts = (self._followers[m].log_start_offset for m in members if m in self._followers)
        return min([leader_start_offset, *starts])

    def high_watermark_bound(self, members: Iterable[int], leader_end_offset: int) -> int:
        """The highest offset every replica in `members` has (the leader's own log end offset
        included); UNKNOWN_OFFSET while one of them has not fetched since this leader began."""
        ends = (self._followers[m].log_end_offset for m in members if m in self._followers)
        return min([leader_end_offset, *ends])


def monotonic_ms() -> int:
    """The clock of follower bookkeeping: lag is a duration, immune to wall-clock steps."""
    return time.monotonic_ns() // 1_000_000
