"""The leader's bookkeeping of its followers (Kafka's Replica rules) and parked acks=all appends."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from riverbed.hot.replication.fetch_watch import FetchWatch
from riverbed.hot.replication.followers import UNKNOWN_OFFSET, FollowerTracker
from riverbed.hot.replication.partitions import CommitWaiters, Partition
from riverbed.hot.storage.log import LogConfig, PartitionLog
from riverbed.hot.storage.producer_state import ProducerStateManager
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import encode_batch, validate_records

LAG_MAX_MS = 10_000


def test_isr_followers_start_caught_up_and_others_must_prove_it() -> None:
    tracker = FollowerTracker([2, 3], in_sync=[1, 2], now_ms=1_000)
    assert tracker.log_end_offset(2) == UNKNOWN_OFFSET
    # Within the lag bound, ISR member 2 is not out of sync even before its first fetch.
    assert not tracker.out_of_sync(
        [1, 2], leader_end_offset=50, now_ms=5_000, lag_max_ms=LAG_MAX_MS
    )
    assert not tracker.out_of_sync([2], 50, now_ms=1_000 + LAG_MAX_MS, lag_max_ms=LAG_MAX_MS)
    assert tracker.out_of_sync([2], 50, now_ms=1_001 + LAG_MAX_MS, lag_max_ms=LAG_MAX_MS) == {2}
    # Replica 3 (outside the ISR) has never caught up.
    assert tracker.out_of_sync([3], 50, now_ms=LAG_MAX_MS + 1, lag_max_ms=LAG_MAX_MS) == {3}


def test_caught_up_at_the_previous_fetch_when_it_reached_that_fetchs_leader_end() -> None:
    tracker = FollowerTracker([2], in_sync=[2], now_ms=0)
    tracker.on_fetch(2, fetch_offset=100, leader_end_offset=100, now_ms=1_000)  # caught up
    # Behind a busy leader, but it has everything the leader had at its previous fetch.
    tracker.on_fetch(2, fetch_offset=100, leader_end_offset=150, now_ms=2_000)
    tracker.on_fetch(2, fetch_offset=150, leader_end_offset=200, now_ms=3_000)
    lagging = tracker.out_of_sync([2], 200, now_ms=2_000 + LAG_MAX_MS, lag_max_ms=LAG_MAX_MS)
    assert not lagging  # last caught up at 2_000 (the previous fetch's time)
    # A follower stuck at one offset stops being caught up.
    tracker.on_fetch(2, fetch_offset=150, leader_end_offset=300, now_ms=4_000)
    tracker.on_fetch(2, fetch_offset=150, leader_end_offset=400, now_ms=5_000)
    assert tracker.out_of_sync([2], 400, 2_001 + LAG_MAX_MS, LAG_MAX_MS) == {2}


def test_a_follower_at_the_leader_end_is_never_out_of_sync() -> None:
    tracker = FollowerTracker([2], in_sync=[2], now_ms=0)
    tracker.on_fetch(2, fetch_offset=10, leader_end_offset=10, now_ms=0)
    assert not tracker.out_of_sync([2], 10, now_ms=10 * LAG_MAX_MS, lag_max_ms=LAG_MAX_MS)


def test_on_fetch_says_whether_the_follower_log_end_moved_up() -> None:
    """The partition advances its HW only on a move: a follower polling a partition nobody
    writes to costs no HW computation."""
    tracker = FollowerTracker([2], in_sync=[1, 2], now_ms=0)
    assert tracker.on_fetch(2, fetch_offset=0, leader_end_offset=5, now_ms=0)  # first: from -1
    assert tracker.on_fetch(2, fetch_offset=5, leader_end_offset=5, now_ms=1)
    assert not tracker.on_fetch(2, fetch_offset=5, leader_end_offset=5, now_ms=2)
    assert not tracker.on_fetch(2, fetch_offset=3, leader_end_offset=5, now_ms=3)  # truncated
    assert tracker.log_end_offset(2) == 3


def test_high_watermark_bound_is_the_smallest_isr_end_and_unknown_until_all_fetched() -> None:
    tracker = FollowerTracker([2, 3], in_sync=[1, 2, 3], now_ms=0)
    assert tracker.high_watermark_bound([1, 2, 3], leader_end_offset=80) == UNKNOWN_OFFSET
    tracker.on_fetch(2, 70, 80, 0)
    tracker.on_fetch(3, 60, 80, 0)
    assert tracker.high_watermark_bound([1, 2, 3], 80) == 60
    assert tracker.high_watermark_bound([1, 2], 80) == 70  # 3 left the ISR
    assert tracker.high_watermark_bound([1], 80) == 80  # the leader alone


def test_ready_to_join_needs_the_high_watermark_and_the_epoch_start() -> None:
    tracker = FollowerTracker([2, 3], in_sync=[1], now_ms=0)
    tracker.on_fetch(2, 50, 60, 0)
    tracker.on_fetch(3, 40, 60, 0)
    assert tracker.ready_to_join([2, 3], high_watermark=45, epoch_start_offset=0) == {2}
    assert tracker.ready_to_join([2, 3], high_watermark=45, epoch_start_offset=55) == set()


async def test_commit_waiters_release_in_offset_order_and_fail_on_resignation() -> None:
    waiters = CommitWaiters()
    first, second, third = waiters.park(10), waiters.park(20), waiters.park(20)
    waiters.release_up_to(19)
    assert first.done()
    assert not second.done()
    assert not third.done()
    waiters.release_up_to(20)
    assert second.done()
    assert third.done()
    pending = waiters.park(30)
    waiters.fail_all(KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved"))
    with pytest.raises(KafkaError) as error:
        await asyncio.wait_for(pending, 1)
    assert error.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert len(waiters) == 0


def test_a_new_leader_behind_its_epoch_start_says_so_until_followers_fetch(
    tmp_path: Path,
) -> None:
    """KIP-207: a leader elected with a stale HW (checkpointed before a crash) must not name
    offsets until its followers have shown what is committed."""
    tp = TopicPartition("t", 0)
    log = PartitionLog.open(
        tmp_path / "t-0", tp, LogConfig(), recovery_point=None, now_ms=lambda: 0
    )
    partition = Partition(*tp, log, ProducerStateManager(), broker_id=1)
    partition.become_leader(0, (1, 2), frozenset({1, 2}), state_version=0, now_ms=0)
    records = memoryview(bytearray(encode_batch([(None, b"v", (), 0)] * 3)))
    partition.append_as_leader(records, validate_records(records, 1 << 20), now_ms=0)
    assert log.high_watermark == 0  # follower 2 has not fetched
    assert not partition.high_watermark_behind_epoch()  # epoch 0 started at offset 0

    partition.become_follower(2, 1, (1, 2), frozenset({1, 2}))
    partition.become_leader(2, (1, 2), frozenset({1, 2}), state_version=2, now_ms=0)
    assert partition.high_watermark_behind_epoch()  # epoch 2 starts at 3, the HW is 0
    partition.record_follower_fetch(2, fetch_offset=3, now_ms=0)
    assert log.high_watermark == 3
    assert not partition.high_watermark_behind_epoch()
    log.close()


def test_a_follower_with_a_session_counts_as_fetching_what_it_does_not_name() -> None:
    """A follower caught up at offset 10 through a session, idle for far longer than the lag
    bound while its requests name nothing: an append must not make it look lagging, and one
    whose session clock stopped (it stopped fetching) must."""
    tracker = FollowerTracker([2, 3], in_sync=[1, 2, 3], now_ms=0)
    fetching = FetchWatch(follower=True, uses_topic_ids=True, now_ms=0)
    stopped = FetchWatch(follower=True, uses_topic_ids=True, now_ms=0)
    tracker.on_fetch(2, 10, leader_end_offset=10, now_ms=1_000, watch=fetching)
    tracker.on_fetch(3, 10, leader_end_offset=10, now_ms=1_000, watch=stopped)
    idle_until_ms = 1_000 + 5 * LAG_MAX_MS
    fetching.last_fetch_ms = idle_until_ms  # its latest request, naming nothing
    stopped.last_fetch_ms = 2_000  # its last request, long ago
    assert not tracker.out_of_sync([2, 3], 10, now_ms=idle_until_ms, lag_max_ms=LAG_MAX_MS)
    tracker.before_end_moves(10)  # an append moves the leader's end past 10
    after_append_ms = idle_until_ms + 50
    assert tracker.out_of_sync([2, 3], 11, now_ms=after_append_ms, lag_max_ms=LAG_MAX_MS) == {3}
    # Its next request names the partition (it was marked) at the old offset: still in sync by
    # the previous-fetch rule, then caught up once it copied the append.
    tracker.on_fetch(2, 10, leader_end_offset=11, now_ms=after_append_ms + 50, watch=fetching)
    assert not tracker.out_of_sync(
        [2], 11, now_ms=idle_until_ms + LAG_MAX_MS, lag_max_ms=LAG_MAX_MS
    )
    tracker.on_fetch(2, 11, leader_end_offset=11, now_ms=after_append_ms + 100, watch=fetching)
    assert tracker.log_end_offset(2) == 11


def test_a_closed_session_stops_counting_as_fetches() -> None:
    tracker = FollowerTracker([2], in_sync=[1, 2], now_ms=0)
    watch = FetchWatch(follower=True, uses_topic_ids=False, now_ms=0)
    tracker.on_fetch(2, 5, leader_end_offset=5, now_ms=100, watch=watch)
    watch.last_fetch_ms = 5 * LAG_MAX_MS
    watch.close()
    tracker.before_end_moves(5)
    assert tracker.out_of_sync([2], 6, now_ms=5 * LAG_MAX_MS, lag_max_ms=LAG_MAX_MS) == {2}
