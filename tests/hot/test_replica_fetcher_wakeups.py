"""A follower's fetcher never sleeps through a change made while it awaited its leader, and its
failures stay its own.

The leader here is scripted (the dialer hands out a connection object that answers from the test),
so the one interleaving that matters is reached every time: the partition's leader epoch moves
while the fetcher's OffsetForLeaderEpoch request is in flight. Against real brokers that happens
when a whole cluster restarts and the controller bumps every epoch while followers truncate; in
CI one follower once never fetched again and stayed out of the ISR.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

from riverbed.coordination.metadata_cache import MetadataCache, PartitionMetadata, TopicMetadata
from riverbed.hot.replication.inter_broker import InterBrokerDialer
from riverbed.hot.replication.partitions import Partition
from riverbed.hot.replication.quota import ReplicationQuota
from riverbed.hot.replication.replica_fetcher import LeaderFetcher
from riverbed.hot.storage.log import LogConfig, PartitionLog
from riverbed.hot.storage.producer_state import ProducerStateManager
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import encode_batch, validate_records

FOLLOWER, LEADER = 1, 3
WAIT_S = 5.0


class ScriptedLeader:
    """The leader's side of one connection: records each request; OffsetForLeaderEpoch answers
    wait for `release`, Fetch answers come at once and are empty."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.arrived = asyncio.Condition()
        self.release = asyncio.Event()
        self.closed = False

    async def call(self, request: Any, _response_type: type, *, timeout_ms: int) -> Any:
        await self._record(request)
        assert isinstance(request, m.OffsetForLeaderEpochRequest)
        await self.release.wait()
        return m.OffsetForLeaderEpochResponse(
            topics=[
                m.OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult(
                    topic=topic.topic,
                    partitions=[
                        # What a leader at epoch 1 says to a follower still at epoch 0.
                        m.OffsetForLeaderEpochResponse.EpochEndOffset(
                            error_code=ErrorCode.FENCED_LEADER_EPOCH
                            if asked.current_leader_epoch < 1
                            else ErrorCode.NONE,
                            partition=asked.partition,
                            leader_epoch=asked.leader_epoch,
                            end_offset=3,
                        )
                        for asked in topic.partitions
                    ],
                )
                for topic in request.topics
            ]
        )

    async def send_nowait(self, request: Any, *, timeout_ms: int) -> Any:
        await self._record(request)
        await asyncio.sleep(0.05)  # a leader's long poll, short
        return m.FetchResponse(session_id=0)

    async def close(self) -> None:
        self.closed = True

    async def _record(self, request: Any) -> None:
        async with self.arrived:
            self.requests.append(request)
            self.arrived.notify_all()

    async def wait_for(self, what: str, condition: Any) -> Any:
        try:
            async with self.arrived:
                await asyncio.wait_for(
                    self.arrived.wait_for(lambda: any(condition(r) for r in self.requests)), WAIT_S
                )
        except TimeoutError:
            raise AssertionError(f"no {what} within {WAIT_S} s: {self.requests}") from None
        return next(r for r in self.requests if condition(r))


class ScriptedDialer(InterBrokerDialer):
    def __init__(self, cache: MetadataCache, leader: ScriptedLeader) -> None:
        super().__init__(cache, "PLAINTEXT")
        self._leader = leader

    async def open(self, broker_id: int, *, client_id: str, timeout_ms: int) -> Any:
        assert broker_id == LEADER
        return self._leader


class RefusingDialer(InterBrokerDialer):
    async def open(self, broker_id: int, *, client_id: str, timeout_ms: int) -> Any:
        raise ConnectionRefusedError(111, "Connection refused")


def _epochs_asked(request: Any) -> list[int]:
    if not isinstance(request, m.OffsetForLeaderEpochRequest):
        return []
    return [p.current_leader_epoch for t in request.topics for p in t.partitions]


def _follower_partition(tmp_path: Path) -> Partition:
    tp = TopicPartition("t", 0)
    log = PartitionLog.open(
        tmp_path / "t-0", tp, LogConfig(), recovery_point=None, now_ms=lambda: 0
    )
    partition = Partition(*tp, log, ProducerStateManager(), broker_id=FOLLOWER)
    # Three records written at epoch 0 while this broker led: truncation must ask about them.
    partition.become_leader(0, (FOLLOWER, LEADER), frozenset({FOLLOWER}), state_version=0, now_ms=0)
    records = memoryview(bytearray(encode_batch([(None, b"v", (), 0)] * 3)))
    partition.append_as_leader(records, validate_records(records, 1 << 20), now_ms=0)
    partition.become_follower(LEADER, 0, (FOLLOWER, LEADER), frozenset({FOLLOWER, LEADER}))
    return partition


def _cache() -> MetadataCache:
    cache = MetadataCache()
    cache.apply_topic(
        TopicMetadata(
            name="t",
            topic_id=uuid.uuid4(),
            partitions={0: PartitionMetadata((FOLLOWER, LEADER), LEADER, 1, (LEADER,))},
            configs={},
        )
    )
    return cache


async def test_an_epoch_bump_during_truncation_is_truncated_and_fetched(tmp_path: Path) -> None:
    partition = _follower_partition(tmp_path)
    cache = _cache()
    leader = ScriptedLeader()
    fetcher = LeaderFetcher(
        LEADER, FOLLOWER, cache, ReplicationQuota(FOLLOWER, cache), ScriptedDialer(cache, leader)
    )
    try:
        fetcher.add(partition)
        await leader.wait_for("truncation at epoch 0", lambda r: _epochs_asked(r) == [0])
        # The controller's new epoch arrives while that request is in flight.
        partition.become_follower(LEADER, 1, (FOLLOWER, LEADER), frozenset({LEADER}))
        fetcher.add(partition)
        leader.release.set()  # epoch 0 is answered FENCED_LEADER_EPOCH, and is stale anyway

        await leader.wait_for("truncation at epoch 1", lambda r: _epochs_asked(r) == [1])
        fetch = await leader.wait_for("a fetch", lambda r: isinstance(r, m.FetchRequest))
        sent = [
            (p.current_leader_epoch, p.fetch_offset) for t in fetch.topics for p in t.partitions
        ]
        assert sent == [(1, 3)]
    finally:
        await fetcher.stop()
        partition.log.close()


async def test_a_refused_connection_stays_out_of_other_tasks_exception_state(
    tmp_path: Path,
) -> None:
    """While the fetcher backs off after a failure, another task sees no exception being handled
    (mypyc leaked it there from an await inside the except block, and compiled code elsewhere
    raised it again: see tests/broker/test_compiled_hot_path.py)."""
    partition = _follower_partition(tmp_path)
    cache = _cache()
    fetcher = LeaderFetcher(
        LEADER,
        FOLLOWER,
        cache,
        ReplicationQuota(FOLLOWER, cache),
        RefusingDialer(cache, "PLAINTEXT"),
    )
    seen: list[BaseException | None] = []
    try:
        fetcher.add(partition)
        for _ in range(30):  # 0.3 s, within the first back-off (REPLICA_FETCH_BACKOFF_MS)
            await asyncio.sleep(0.01)
            seen.append(sys.exc_info()[1])
    finally:
        await fetcher.stop()
        partition.log.close()
    assert seen == [None] * 30
