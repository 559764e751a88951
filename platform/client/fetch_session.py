"""The consumer's side of a fetch session (KIP-227) with one broker: which partitions a Fetch
must name, and what the answer does to the session (the Java client's FetchSessionHandler).
No I/O: the fetch driver builds requests with it and hands it every answer or failure.

The first Fetch is full, at epoch 0 (session id 0, or the old session's id to close it); a
response with a nonzero session id starts the session at epoch 1. Each following Fetch names
only partitions that joined or whose request changed (offset, leader epoch, max bytes, topic
id) and forgets those that left; the response then carries only partitions with news, and the
partitions it does not mention stay where they were. Any session error or failed Fetch makes
the next one full again: FETCH_SESSION_ID_NOT_FOUND without a session id, the others closing
the session they name. A response with session id 0 means no session: full fetches go on.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from riverbed.client.types import TopicPartition
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.fetch_session_ids import (
    INITIAL_EPOCH,
    NO_SESSION_ID,
    SESSION_ERRORS,
    next_epoch,
)

# What the broker's session holds for a partition: topic id, leader epoch, offset, max bytes.
_Entry = tuple[uuid.UUID, int, int, int]


@dataclass(frozen=True, slots=True)
class SessionFetch:
    """What one Fetch carries: its session id and epoch, the partitions it names and those it
    forgets (with the topic id the session knows them by)."""

    session_id: int
    epoch: int
    named: list[tuple[TopicPartition, uuid.UUID, m.FetchRequest.FetchPartition]]
    forgotten: list[tuple[TopicPartition, uuid.UUID]]


class FetchSessionHandler:
    """One broker connection's fetch session, as the consumer sees it."""

    def __init__(self) -> None:
        self.session_id = NO_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self._held: dict[TopicPartition, _Entry] = {}  # as the broker's session holds them
        self._next: dict[TopicPartition, _Entry] | None = None  # after the Fetch in flight

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH

    def build(
        self, wanted: list[tuple[TopicPartition, uuid.UUID, m.FetchRequest.FetchPartition]]
    ) -> SessionFetch:
        """The next Fetch for the partitions `wanted` now."""
        held = self._held
        after: dict[TopicPartition, _Entry] = {}
        named = []
        for tp, topic_id, partition in wanted:
            entry = (
                topic_id,
                partition.current_leader_epoch,
                partition.fetch_offset,
                partition.partition_max_bytes,
            )
            after[tp] = entry
            if self.full or held.get(tp) != entry:
                named.append((tp, topic_id, partition))
        forgotten = []
        if not self.full:
            for tp, entry in held.items():
                if tp not in after or after[tp][0] != entry[0]:  # left, or its topic id changed
                    forgotten.append((tp, entry[0]))
        self._next = after
        return SessionFetch(self.session_id, self.epoch, named, forgotten)

    def answered(self, error_code: int, session_id: int) -> None:
        """The broker answered the Fetch built last (with a top-level `error_code`)."""
        if error_code in SESSION_ERRORS:
            close = error_code != ErrorCode.FETCH_SESSION_ID_NOT_FOUND
            self._restart(close=close)
            return
        if error_code != ErrorCode.NONE or session_id == NO_SESSION_ID:
            self._restart(close=False)
            return
        if self.full:
            self.session_id, self.epoch = session_id, 1
        else:
            self.epoch = next_epoch(self.epoch)
        self._held = self._next or {}
        self._next = None

    def failed(self) -> None:
        """The Fetch got no answer (connection lost, timeout): start over, closing the
        session if the broker still has it."""
        self._restart(close=True)

    def _restart(self, *, close: bool) -> None:
        if not close:
            self.session_id = NO_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self._held = {}
        self._next = None
