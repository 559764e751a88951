"""What a fetch session (KIP-227) hears from the partitions it holds, so that serving it costs
what changed rather than what it holds.

A `FetchWatch` belongs to one session on the leader. Each `Partition` keeps the watches of the
sessions that hold it and marks them when something a fetch would answer differently moves: an
append (the log end), the high watermark, the log start, or the partition's role. The session
then reads only the marked partitions (and those its request names) instead of all of them.

A follower's watch is also its clock: `last_fetch_ms` is when the session's latest request
arrived. A follower with a session fetches every partition in it on every request, also those
the request does not name (Kafka counts every session partition as fetched), so the leader's
view of a follower that is caught up on an idle partition moves with this clock, without a
per-partition update on each request (see FollowerTracker.before_end_moves).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Final

# What moved on a partition: whose parked fetches it wakes differs (followers read up to the
# log end, consumers up to the high watermark), as with Partition.end_waiters / data_waiters.
END_MOVED: Final = 1
HIGH_WATERMARK_MOVED: Final = 2
# The log start, the role or the partition itself: every reader's answer changes.
OTHER_CHANGE: Final = 3

# A partition in a session: (topic id, index) from Fetch v13 on, (topic name, index) before.
PartitionKey = tuple[uuid.UUID | str, int]


class FetchWatch:
    """The partitions of one fetch session that changed since the session last read them."""

    def __init__(self, *, follower: bool, uses_topic_ids: bool, now_ms: int) -> None:
        self.follower = follower
        self.uses_topic_ids = uses_topic_ids
        # Insertion-ordered set of the changed partitions' keys.
        self.changed: dict[PartitionKey, None] = {}
        # When the session's latest request arrived, and whether the session still exists (a
        # closed or evicted session fetches nothing more: partitions drop its watch lazily).
        self.last_fetch_ms = now_ms
        self.open = True
        self._parked: asyncio.Future[None] | None = None

    def mark(self, topic: str, topic_id: uuid.UUID, index: int, change: int) -> None:
        """A partition of this session changed; wake a parked fetch the change concerns."""
        key: PartitionKey = (topic_id if self.uses_topic_ids else topic, index)
        self.changed[key] = None
        future = self._parked
        if future is None or future.done():
            return
        if change == OTHER_CHANGE or (change == END_MOVED) == self.follower:
            future.set_result(None)

    def take_changed(self) -> list[PartitionKey]:
        changed = list(self.changed)
        self.changed.clear()
        return changed

    def park(self, future: asyncio.Future[None]) -> None:
        """The session's long poll waits on `future` (one request at a time per session)."""
        self._parked = future

    def unpark(self) -> None:
        self._parked = None

    def close(self) -> None:
        self.open = False
        self.changed.clear()
        future = self._parked
        if future is not None and not future.done():
            future.set_result(None)
