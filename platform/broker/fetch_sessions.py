"""The broker's fetch-session cache (KIP-227, Kafka's FetchSession.scala): sans-IO, no clock of
its own (every call is handed `now_ms`).

A fetch session remembers, per partition, what its client last asked (fetch offset, limits,
epochs) and what the broker last answered (high watermark, last stable offset, log start), so
that incremental requests name only what changed on the client's side and incremental
responses carry only what changed on the broker's: records, an error, or a moved offset.

Requests, by (session id, epoch), as Kafka reads them:
- epoch 0: a full fetch; it closes the named session (id != 0), and creates a new one if the
  cache has a free slot or can evict one (the response's session id; 0 if not);
- epoch -1: a full fetch without a session, closing the named one;
- any other epoch: an incremental fetch of the session with that id, which must exist
  (FETCH_SESSION_ID_NOT_FOUND), expect that epoch (INVALID_FETCH_SESSION_EPOCH) and name topics
  the way it was created, by id from Fetch v13 on or by name before
  (FETCH_SESSION_TOPIC_ID_ERROR). It adds or updates the partitions it names, drops its
  forgotten ones, and moves the session's epoch on; a session left empty is closed and the
  fetch answered sessionless.

Eviction, when a new session finds every slot taken (Kafka's rules): the least recently used
session goes if unused for `min.incremental.fetch.session.eviction.ms`; else a follower's new
session may evict any consumer session and any session older than that, a consumer's only
sessions older than that; of those, the one ranking lowest by (follower, partitions, id), and
only if the new session ranks at least as high. Kafka keeps sorted maps for the second rule;
here it is a scan of the sessions, done only when the cache is full and a session is wanted.

What makes an incremental fetch cheap is not the cache but its `FetchWatch`: partitions mark
the sessions that hold them when they change, so a session reads only its marked partitions,
those the request names and those it still owes an answer (see `FetchSession.to_read`).
"""

from __future__ import annotations

import random
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from riverbed.hot.replication.fetch_watch import FetchWatch, PartitionKey
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.fetch_session_ids import (
    NO_SESSION_ID,
    next_epoch,
)

# Kafka's defaults for max.incremental.fetch.session.cache.slots and
# min.incremental.fetch.session.eviction.ms (configs.py declares both).
SESSION_CACHE_SLOTS_DEFAULT: Final = 1000
SESSION_EVICTION_MS_DEFAULT: Final = 120_000

# The request's (session id, epoch) meanings: riverbed.protocol.fetch_session_ids.
INVALID_SESSION_ID: Final = NO_SESSION_ID
# Session ids are random positive int32s, so a restarted broker rarely reuses a live client's.
SESSION_ID_MAX: Final = 2**31 - 1
# Fetch v13 names topics by id (KIP-516); a session keeps the naming it was created with.
TOPIC_ID_VERSION_MIN: Final = 13
ZERO_UUID: Final = uuid.UUID(int=0)


@dataclass(slots=True, eq=False)
class CachedPartition:
    """One partition of a session: the client's last request for it and the broker's last
    answer about it (-1 answered: nothing yet, or an error, so the next answer is sent)."""

    topic: str  # the request's name (before v13; "" from v13 on, where the id names it)
    topic_id: uuid.UUID
    wanted: m.FetchRequest.FetchPartition
    order: int  # its place in the session's rotation: lower is read first
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1


@dataclass(slots=True, eq=False)
class FetchSession:
    """One client's session: created by a full fetch, moved on by incremental ones."""

    id: int
    follower: bool
    uses_topic_ids: bool
    created_ms: int
    last_used_ms: int
    watch: FetchWatch
    epoch: int = 1
    partitions: dict[PartitionKey, CachedPartition] = field(default_factory=dict)
    # Partitions read at the session's next request whatever marks they get: named by a
    # request, or answered last time with records or an error (Kafka answers those until the
    # client moves on or the error goes).
    owed: set[PartitionKey] = field(default_factory=set)
    _next_order: int = 0

    def __len__(self) -> int:
        return len(self.partitions)

    def put(
        self,
        key: PartitionKey,
        topic: str,
        topic_id: uuid.UUID,
        wanted: m.FetchRequest.FetchPartition,
    ) -> None:
        """The client names `key` (added, or its request parameters changed)."""
        cached = self.partitions.get(key)
        if cached is None:
            self.partitions[key] = CachedPartition(topic, topic_id, wanted, self._take_order())
        else:
            cached.wanted = wanted
        self.owed.add(key)

    def forget(self, key: PartitionKey) -> CachedPartition | None:
        self.owed.discard(key)
        return self.partitions.pop(key, None)

    def to_read(self) -> list[tuple[PartitionKey, CachedPartition]]:
        """The partitions this request must read, in rotation order: those owed an answer and
        those marked as changed since the last request; nothing else changed for the client."""
        keys = self.owed
        keys.update(self.watch.take_changed())
        found = []
        gone = []
        for key in keys:
            cached = self.partitions.get(key)
            if cached is None:
                gone.append(key)
            else:
                found.append((key, cached))
        # Not intersection_update(self.partitions): that hashes every partition of the session
        # (its topic id's UUID.__hash__ is Python code), which was most of an idle leader's CPU.
        keys.difference_update(gone)
        found.sort(key=lambda item: item[1].order)
        return found

    def answer(
        self,
        key: PartitionKey,
        data: m.FetchResponse.PartitionData,
        records_size: int,
        more_to_read: bool,
    ) -> bool:
        """Whether an incremental response must carry this partition (Kafka's
        maybeUpdateResponseData): records, an error, or a moved offset. The answer is
        remembered; a partition that got records goes to the end of the rotation, so the next
        response's byte budget serves the others first."""
        cached = self.partitions[key]
        changed = (
            data.high_watermark != cached.high_watermark
            or data.last_stable_offset != cached.last_stable_offset
            or data.log_start_offset != cached.log_start_offset
        )
        cached.high_watermark = data.high_watermark
        cached.last_stable_offset = data.last_stable_offset
        cached.log_start_offset = data.log_start_offset
        error = data.error_code != ErrorCode.NONE
        if error:
            cached.high_watermark = -1  # sent again once the error is gone
        if records_size > 0:
            cached.order = self._take_order()
        if records_size > 0 or error or more_to_read:
            self.owed.add(key)
        else:
            self.owed.discard(key)
        return records_size > 0 or error or changed

    def _take_order(self) -> int:
        order = self._next_order
        self._next_order += 1
        return order


class FetchSessionCache:
    """Every fetch session of one broker, at most `slots` of them."""

    def __init__(self, slots: int, eviction_ms: int, *, seed: int | None = None) -> None:
        if slots < 0 or eviction_ms < 0:
            raise ValueError(f"slots {slots} and eviction_ms {eviction_ms} must be >= 0")
        self.slots = slots
        self.eviction_ms = eviction_ms
        # By last use, least recent first (move_to_end on each use).
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._random = random.Random(seed)
        self.evictions = 0  # riverbed_fetch_session_evictions
        self.incremental_fetches = 0  # riverbed_incremental_fetches

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def partitions_cached(self) -> int:
        return sum(len(session) for session in self._sessions.values())

    def remove(self, session_id: int) -> FetchSession | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.watch.close()
        return session

    def touch(self, session: FetchSession, now_ms: int) -> None:
        session.last_used_ms = now_ms
        session.watch.last_fetch_ms = now_ms
        self._sessions.move_to_end(session.id)

    def open_incremental(
        self, session_id: int, epoch: int, version: int
    ) -> FetchSession | ErrorCode:
        """The session an incremental request (epoch > 0) continues, or why it cannot."""
        session = self._sessions.get(session_id)
        if session is None:
            return ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        if session.epoch != epoch:
            return ErrorCode.INVALID_FETCH_SESSION_EPOCH
        if session.uses_topic_ids != (version >= TOPIC_ID_VERSION_MIN):
            return ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
        return session

    def continued(self, session: FetchSession, now_ms: int) -> bool:
        """After an incremental request updated `session`: move its epoch on and count it as
        used, or close it when it holds nothing any more (False: answer sessionless)."""
        if not session.partitions:
            self.remove(session.id)
            return False
        self.touch(session, now_ms)
        session.epoch = next_epoch(session.epoch)
        self.incremental_fetches += 1
        return True

    def new_session(
        self, *, follower: bool, size: int, version: int, now_ms: int
    ) -> FetchSession | None:
        """A session for a full fetch of `size` partitions, if there is a slot or one can be
        freed (Kafka's maybeCreateSession); None: the fetch is answered without a session."""
        if len(self._sessions) >= self.slots and not self._evict_for(follower, size, now_ms):
            return None
        session_id = self._random.randint(1, SESSION_ID_MAX)
        while session_id in self._sessions:
            session_id = self._random.randint(1, SESSION_ID_MAX)
        uses_topic_ids = version >= TOPIC_ID_VERSION_MIN
        watch = FetchWatch(follower=follower, uses_topic_ids=uses_topic_ids, now_ms=now_ms)
        session = FetchSession(session_id, follower, uses_topic_ids, now_ms, now_ms, watch)
        self._sessions[session_id] = session
        return session

    def _evict_for(self, follower: bool, size: int, now_ms: int) -> bool:
        if not self._sessions:
            return False  # slots == 0: sessions are off
        least_recent = next(iter(self._sessions.values()))
        if now_ms - least_recent.last_used_ms > self.eviction_ms:
            self._evict(least_recent)
            return True
        candidates = [
            session
            for session in self._sessions.values()
            if now_ms - session.created_ms > self.eviction_ms or (follower and not session.follower)
        ]
        if not candidates:
            return False
        lowest = min(candidates, key=_rank)
        if (follower, size, 0) < _rank(lowest):
            return False
        self._evict(lowest)
        return True

    def _evict(self, session: FetchSession) -> None:
        self.remove(session.id)
        self.evictions += 1


def _rank(session: FetchSession) -> tuple[bool, int, int]:
    """Kafka's EvictableKey: consumers below followers, then smaller sessions, then lower ids."""
    return (session.follower, len(session), session.id)
