"""How an acks=all produce settles the commits it waits for: each partition's outcome lands in its
own response, whatever the others do, and the wait ends at the request's timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from riverbed.broker.handlers.produce import _Pending, when_committed
from riverbed.hot.replication.partitions import Partition
from riverbed.hot.storage.log import LogConfig, PartitionLog
from riverbed.hot.storage.producer_state import ProducerStateManager
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.messages import ProduceResponse
from riverbed.protocol.record_types import TopicPartition

from tests.support.virtual_time import virtual_time

PartitionResponse = ProduceResponse.PartitionProduceResponse
BROKER_ID = 1
MIN_INSYNC_REPLICAS = 2


@pytest.fixture
def partitions(tmp_path: Path) -> Iterator[Callable[..., Partition]]:
    """Real partitions, led by this broker, with an ISR of two or (`under_min_isr`) one."""
    logs: list[PartitionLog] = []

    def make(name: str, *, under_min_isr: bool = False) -> Partition:
        topic, index = name.rsplit("-", 1)
        tp = TopicPartition(topic, int(index))
        log = PartitionLog.open(
            tmp_path / name, tp, LogConfig(), recovery_point=None, now_ms=lambda: 0
        )
        logs.append(log)
        partition = Partition(*tp, log, ProducerStateManager(), BROKER_ID)
        isr = frozenset({BROKER_ID} if under_min_isr else {BROKER_ID, BROKER_ID + 1})
        partition.become_leader(0, (BROKER_ID, BROKER_ID + 1), isr, state_version=0, now_ms=0)
        partition.min_insync_replicas = MIN_INSYNC_REPLICAS
        return partition

    yield make
    for log in logs:
        log.close()


async def wait_for_commits(pending: list[_Pending], timeout_ms: int) -> None:
    settled = asyncio.get_running_loop().create_future()
    when_committed(pending, timeout_ms, lambda: settled.set_result(None))
    await settled


def _pending(partition: Partition) -> _Pending:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    response = PartitionResponse(index=partition.index, error_code=ErrorCode.NONE, base_offset=0)
    return _Pending(response, partition, future)


@virtual_time
async def test_each_partition_settles_on_its_own_and_the_wait_ends_at_the_timeout(
    partitions: Callable[..., Partition],
) -> None:
    committed, failed, shrunk, never, late = (
        _pending(partitions("t-0")),
        _pending(partitions("t-1")),
        _pending(partitions("t-2", under_min_isr=True)),
        _pending(partitions("t-3")),
        _pending(partitions("t-4")),
    )
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, committed.committed.set_result, None)
    loop.call_later(
        0.02, failed.committed.set_exception, KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")
    )
    loop.call_later(0.03, shrunk.committed.set_result, None)
    # `never` is never committed; `late` would be, after the timeout (and must not count).

    def commit_late() -> None:
        if not late.committed.done():
            late.committed.set_result(None)

    loop.call_later(0.5, commit_late)
    started = loop.time()
    await wait_for_commits([committed, failed, shrunk, never, late], timeout_ms=200)
    assert loop.time() - started == pytest.approx(0.2)  # virtual time: exactly the timeout
    assert committed.response.error_code == ErrorCode.NONE
    assert failed.response.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert shrunk.response.error_code == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
    for timed_out in (never, late):
        assert timed_out.response.error_code == ErrorCode.REQUEST_TIMED_OUT
        assert "not replicated to the ISR within 200 ms" in (timed_out.response.error_message or "")
        # Done (failed), so a later high watermark move skips it (CommitWaiters checks done()).
        assert timed_out.committed.done()


@virtual_time
async def test_the_wait_ends_as_soon_as_every_partition_is_committed(
    partitions: Callable[..., Partition],
) -> None:
    first, second = _pending(partitions("t-0")), _pending(partitions("t-1"))
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, second.committed.set_result, None)  # out of order
    loop.call_later(0.04, first.committed.set_result, None)
    started = loop.time()
    await wait_for_commits([first, second], timeout_ms=30_000)
    assert loop.time() - started == pytest.approx(0.04)  # the last commit, not the timeout
    assert first.response.error_code == second.response.error_code == ErrorCode.NONE


@virtual_time
async def test_appends_committed_already_settle_at_once(
    partitions: Callable[..., Partition],
) -> None:
    committed, failed = _pending(partitions("t-0")), _pending(partitions("t-1"))
    committed.committed.set_result(None)
    failed.committed.set_exception(KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved"))
    settled = []
    when_committed([committed, failed], 30_000, lambda: settled.append(True))
    assert settled == [True]  # synchronously: no timer, no callback round
    assert committed.response.error_code == ErrorCode.NONE
    assert failed.response.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
