"""How an acks=all produce settles the commits it waits for: each partition's outcome lands in its
own response, whatever the others do, and the wait ends at the request's timeout."""

from __future__ import annotations

import asyncio

import pytest
from riverbed.hot.handlers.produce import _Pending, when_committed
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.messages import ProduceResponse

from tests.support.virtual_time import virtual_time

PartitionResponse = ProduceResponse.PartitionProduceResponse


class _Partition:
    """What the settling asks of a partition: whether its ISR is below min.insync.replicas."""

    def __init__(self, name: str, *, under_min_isr: bool = False) -> None:
        self.name = name
        self.below = under_min_isr

    def under_min_isr(self) -> bool:
        return self.below

    @property
    def min_insync_replicas(self) -> int:
        return 2

    def __str__(self) -> str:
        return self.name


async def wait_for_commits(pending: list[_Pending], timeout_ms: int) -> None:
    settled = asyncio.get_running_loop().create_future()
    when_committed(pending, timeout_ms, lambda: settled.set_result(None))
    await settled


def _pending(name: str, *, under_min_isr: bool = False) -> _Pending:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    response = PartitionResponse(index=0, error_code=ErrorCode.NONE, base_offset=0)
    return _Pending(response, _Partition(name, under_min_isr=under_min_isr), future)  # type: ignore[arg-type]


@virtual_time
async def test_each_partition_settles_on_its_own_and_the_wait_ends_at_the_timeout() -> None:
    committed, failed, shrunk, never, late = (
        _pending("t-0"),
        _pending("t-1"),
        _pending("t-2", under_min_isr=True),
        _pending("t-3"),
        _pending("t-4"),
    )
    loop = asyncio.get_running_loop()
    loop.call_later(0.01, committed.committed.set_result, None)
    loop.call_later(
        0.02, failed.committed.set_exception, KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")
    )
    loop.call_later(0.03, shrunk.committed.set_result, None)
    # `never` is never committed; `late` would be, after the timeout (and must not count).
    loop.call_later(0.5, lambda: late.committed.done() or late.committed.set_result(None))
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
async def test_the_wait_ends_as_soon_as_every_partition_is_committed() -> None:
    first, second = _pending("t-0"), _pending("t-1")
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, second.committed.set_result, None)  # out of order
    loop.call_later(0.04, first.committed.set_result, None)
    started = loop.time()
    await wait_for_commits([first, second], timeout_ms=30_000)
    assert loop.time() - started == pytest.approx(0.04)  # the last commit, not the timeout
    assert first.response.error_code == second.response.error_code == ErrorCode.NONE


@virtual_time
async def test_appends_committed_already_settle_at_once() -> None:
    committed, failed = _pending("t-0"), _pending("t-1")
    committed.committed.set_result(None)
    failed.committed.set_exception(KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved"))
    settled = []
    when_committed([committed, failed], 30_000, lambda: settled.append(True))
    assert settled == [True]  # synchronously: no timer, no callback round
    assert committed.response.error_code == ErrorCode.NONE
    assert failed.response.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
