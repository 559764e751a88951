"""The broker's fetch-session cache (KIP-227) on its own: sans-IO, no broker, no socket."""

from __future__ import annotations

import uuid

import pytest
from riverbed.broker.fetch_sessions import FetchSession, FetchSessionCache
from riverbed.hot.replication.fetch_watch import END_MOVED, HIGH_WATERMARK_MOVED, PartitionKey
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.fetch_session_ids import FINAL_EPOCH, next_epoch

EVICTION_MS = 1000
TOPIC_ID = uuid.uuid4()


def _wanted(index: int, offset: int = 0) -> m.FetchRequest.FetchPartition:
    return m.FetchRequest.FetchPartition(partition=index, fetch_offset=offset)


def _session(
    cache: FetchSessionCache,
    size: int,
    *,
    follower: bool = False,
    now_ms: int = 0,
    version: int = 12,
) -> FetchSession:
    session = cache.new_session(follower=follower, size=size, version=version, now_ms=now_ms)
    assert session is not None
    for index in range(size):
        session.put(("t", index), "t", TOPIC_ID, _wanted(index))
    return session


def _data(hw: int, error: int = 0) -> m.FetchResponse.PartitionData:
    return m.FetchResponse.PartitionData(
        error_code=error, high_watermark=hw, last_stable_offset=hw, log_start_offset=0
    )


def _answer_all(session: FetchSession, hw: int = 0) -> None:
    for key, _ in session.to_read():
        session.answer(key, _data(hw), records_size=0, more_to_read=False)


def test_epochs_wrap_to_one_and_the_final_epoch_stays() -> None:
    assert next_epoch(1) == 2
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


def test_an_incremental_request_needs_the_session_its_epoch_and_its_naming() -> None:
    cache = FetchSessionCache(10, EVICTION_MS, seed=1)
    session = _session(cache, 2)
    assert session.id != 0
    assert session.epoch == 1
    assert cache.open_incremental(session.id + 1, 1, 12) == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert cache.open_incremental(session.id, 2, 12) == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert cache.open_incremental(session.id, 1, 13) == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
    assert cache.open_incremental(session.id, 1, 12) is session
    assert cache.continued(session, 5)
    assert session.epoch == 2
    assert cache.incremental_fetches == 1
    assert cache.open_incremental(session.id, 1, 12) == ErrorCode.INVALID_FETCH_SESSION_EPOCH


def test_only_named_marked_and_owed_partitions_are_read() -> None:
    cache = FetchSessionCache(10, EVICTION_MS)
    session = _session(cache, 100)
    assert len(session.to_read()) == 100  # the full fetch reads them all
    _answer_all(session)
    assert session.to_read() == []  # nothing changed: nothing to read
    session.watch.mark("t", TOPIC_ID, 7, END_MOVED)
    session.put(("t", 3), "t", TOPIC_ID, _wanted(3, offset=5))
    assert [key for key, _ in session.to_read()] == [("t", 3), ("t", 7)]


class _CountedId(uuid.UUID):
    """A topic id that counts how often it is hashed (a session's keys are hashed with it)."""

    hashed = 0

    def __hash__(self) -> int:
        type(self).hashed += 1
        return super().__hash__()


def test_an_idle_request_touches_none_of_the_sessions_partitions() -> None:
    """What an incremental request reads costs what changed, not the session's size: with
    nothing owed or marked, no key of the session's 10,000 partitions is even hashed."""
    cache = FetchSessionCache(10, EVICTION_MS)
    session = cache.new_session(follower=True, size=10_000, version=13, now_ms=0)
    assert session is not None
    topic_id = _CountedId(int=TOPIC_ID.int)
    for index in range(10_000):
        session.put((topic_id, index), "", topic_id, _wanted(index))
    _answer_all(session)
    _CountedId.hashed = 0
    assert session.to_read() == []
    assert _CountedId.hashed == 0
    session.watch.mark("", topic_id, 7, END_MOVED)
    assert [key for key, _ in session.to_read()] == [(topic_id, 7)]
    assert _CountedId.hashed < 10


def test_an_incremental_answer_carries_only_news_and_rotates_partitions_with_records() -> None:
    cache = FetchSessionCache(10, EVICTION_MS)
    session = _session(cache, 3)
    _answer_all(session, hw=4)
    key: PartitionKey = ("t", 0)
    assert not session.answer(key, _data(4), records_size=0, more_to_read=False)
    assert session.answer(key, _data(5), records_size=0, more_to_read=False)  # HW moved
    assert not session.answer(key, _data(5), records_size=0, more_to_read=False)
    # Records: sent, owed again next time, and last in the rotation.
    assert session.answer(key, _data(5), records_size=100, more_to_read=False)
    assert [k for k, _ in session.to_read()] == [key]
    session.watch.mark("t", TOPIC_ID, 1, HIGH_WATERMARK_MOVED)
    session.watch.mark("t", TOPIC_ID, 2, HIGH_WATERMARK_MOVED)
    assert [k for k, _ in session.to_read()] == [("t", 1), ("t", 2), key]
    # An error is always sent, and the next good answer too (its HW was forgotten).
    assert session.answer(key, _data(-1, ErrorCode.NOT_LEADER_OR_FOLLOWER), 0, False)
    assert session.answer(key, _data(5), records_size=0, more_to_read=False)


def test_data_left_for_a_later_response_keeps_the_partition_owed() -> None:
    cache = FetchSessionCache(10, EVICTION_MS)
    session = _session(cache, 2)
    _answer_all(session)
    session.watch.mark("t", TOPIC_ID, 0, END_MOVED)
    ((key, _),) = session.to_read()
    session.answer(key, _data(0), records_size=0, more_to_read=True)  # budget used elsewhere
    assert [k for k, _ in session.to_read()] == [key]


def test_forgotten_partitions_leave_and_an_empty_session_closes() -> None:
    cache = FetchSessionCache(10, EVICTION_MS)
    session = _session(cache, 2)
    _answer_all(session)
    session.forget(("t", 0))
    assert list(session.partitions) == [("t", 1)]
    session.watch.mark("t", TOPIC_ID, 0, END_MOVED)  # a late mark of a forgotten partition
    assert session.to_read() == []
    session.forget(("t", 1))
    assert not cache.continued(session, 1)
    assert cache.get(session.id) is None
    assert not session.watch.open


def test_a_full_cache_refuses_a_consumer_until_a_session_goes_stale() -> None:
    cache = FetchSessionCache(1, EVICTION_MS)
    first = _session(cache, 5, now_ms=0)
    assert cache.new_session(follower=False, size=9, version=12, now_ms=EVICTION_MS) is None
    # Unused for longer than the eviction time: the least recently used goes.
    second = cache.new_session(follower=False, size=1, version=12, now_ms=EVICTION_MS + 1)
    assert second is not None
    assert cache.get(first.id) is None
    assert cache.evictions == 1
    assert not first.watch.open


def test_a_follower_evicts_a_young_consumer_session_but_not_a_follower_one() -> None:
    cache = FetchSessionCache(2, EVICTION_MS)
    consumer = _session(cache, 50, now_ms=0)
    follower = _session(cache, 10, follower=True, now_ms=0)
    cache.touch(consumer, 10)
    cache.touch(follower, 10)
    new = cache.new_session(follower=True, size=1, version=12, now_ms=20)
    assert new is not None
    assert cache.get(consumer.id) is None
    assert cache.get(follower.id)
    # Now two followers, both young: neither a consumer nor a follower gets a slot.
    assert cache.new_session(follower=True, size=100, version=12, now_ms=30) is None
    assert cache.new_session(follower=False, size=100, version=12, now_ms=30) is None


def test_old_sessions_are_evicted_smallest_first_and_only_by_a_larger_one() -> None:
    cache = FetchSessionCache(2, EVICTION_MS)
    small = _session(cache, 2, now_ms=0)
    large = _session(cache, 8, now_ms=0)
    now = EVICTION_MS + 1
    cache.touch(small, now)
    cache.touch(large, now)  # both used recently, both older than the eviction time
    assert cache.new_session(follower=False, size=1, version=12, now_ms=now) is None
    new = cache.new_session(follower=False, size=3, version=12, now_ms=now)
    assert new is not None
    assert cache.get(small.id) is None
    assert cache.get(large.id) is large


def test_zero_slots_turn_sessions_off() -> None:
    cache = FetchSessionCache(0, EVICTION_MS)
    assert cache.new_session(follower=True, size=1, version=12, now_ms=0) is None


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        FetchSessionCache(-1, EVICTION_MS)
