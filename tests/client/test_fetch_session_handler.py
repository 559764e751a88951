"""The consumer's fetch-session bookkeeping (the Java client's FetchSessionHandler), sans-IO."""

from __future__ import annotations

import uuid

from riverbed.client.fetch_session import FetchSessionHandler
from riverbed.client.types import TopicPartition
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

TOPIC_ID = uuid.uuid4()


def _wanted(
    offsets: dict[int, int],
) -> list[tuple[TopicPartition, uuid.UUID, m.FetchRequest.FetchPartition]]:
    return [
        (
            TopicPartition("t", p),
            TOPIC_ID,
            m.FetchRequest.FetchPartition(partition=p, fetch_offset=o),
        )
        for p, o in offsets.items()
    ]


def test_full_then_incremental_then_restart_on_session_errors() -> None:
    handler = FetchSessionHandler()
    first = handler.build(_wanted({0: 0, 1: 0}))
    assert (first.session_id, first.epoch, len(first.named)) == (0, 0, 2)
    handler.answered(ErrorCode.NONE, 77)
    idle = handler.build(_wanted({0: 0, 1: 0}))
    assert (idle.session_id, idle.epoch, idle.named, idle.forgotten) == (77, 1, [], [])
    handler.answered(ErrorCode.NONE, 77)
    moved = handler.build(_wanted({0: 5}))
    assert [tp.partition for tp, _, _ in moved.named] == [0]
    assert moved.forgotten == [(TopicPartition("t", 1), TOPIC_ID)]
    assert moved.epoch == 2
    handler.answered(ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0)
    again = handler.build(_wanted({0: 5}))
    assert (again.session_id, again.epoch, len(again.named)) == (77, 0, 1)  # closes 77
    handler.answered(ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0)
    fresh = handler.build(_wanted({0: 5}))
    assert (fresh.session_id, fresh.epoch) == (0, 0)
    handler.answered(ErrorCode.NONE, 0)  # no session granted: full fetches go on
    assert handler.build(_wanted({0: 5})).epoch == 0


def test_a_failed_fetch_starts_a_new_session() -> None:
    handler = FetchSessionHandler()
    handler.build(_wanted({0: 0}))
    handler.answered(ErrorCode.NONE, 9)
    handler.build(_wanted({0: 1}))
    handler.failed()
    retry = handler.build(_wanted({0: 1}))
    assert (retry.session_id, retry.epoch, len(retry.named)) == (9, 0, 1)
