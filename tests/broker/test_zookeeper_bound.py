"""`zookeeper_bound`, what request handlers wrap their ZooKeeper work in, against a real
ZooKeeper server and client: the bound is the request's timeout capped by the session timeout,
and a lost connection becomes the error code the handler names."""

from __future__ import annotations

import asyncio
import time
from typing import Final

import pytest
from riverbed.broker.handlers.zookeeper_bound import zookeeper_bound
from riverbed.configs import BrokerConfig
from riverbed.coordination.zk import AsyncZooKeeper, ConnectionState
from riverbed.protocol.errors import ErrorCode, KafkaError

from tests.support.stalls import StallMeter
from tests.support.waiting import eventually
from tests.support.zookeeper import DedicatedZooKeeper

SESSION_TIMEOUT_MS: Final = 1_500
CONFIG: Final = BrokerConfig.from_mapping(
    {"zookeeper.connect": "127.0.0.1:2181", "zookeeper.session.timeout.ms": "1500"}
)
# What a timeout may overrun on a loaded machine, besides stalls of the whole process.
LATE_S: Final = 1.0


async def test_a_call_that_answers_in_time_passes_through(zk_chroot: str) -> None:
    async with (
        AsyncZooKeeper(zk_chroot) as zk,
        zookeeper_bound(CONFIG, "reading", timeout_ms=5_000),
    ):
        await zk.create("/bound", b"x")
        data, _ = await zk.get("/bound")
    assert data == b"x"


@pytest.mark.parametrize(
    ("timeout_ms", "bound_ms"),
    [(400, 400), (None, SESSION_TIMEOUT_MS), (0, SESSION_TIMEOUT_MS), (60_000, SESSION_TIMEOUT_MS)],
)
async def test_zookeeper_down_times_out_at_the_bound(
    own_zookeeper: DedicatedZooKeeper, timeout_ms: int | None, bound_ms: int
) -> None:
    async with AsyncZooKeeper(f"{own_zookeeper.server.connect_string}/bound") as zk:
        await own_zookeeper.stop()
        # Once the client has seen the connection go, kazoo queues requests until it reconnects
        # (a request sent before that fails with ConnectionLoss: seen on a slow machine).
        await eventually(lambda: zk.state is ConnectionState.SUSPENDED)
        started = time.monotonic()
        with StallMeter() as stalls, pytest.raises(KafkaError) as raised:
            async with zookeeper_bound(CONFIG, "creating topic 'x'", timeout_ms=timeout_ms):
                await zk.get("/")
        took_s = time.monotonic() - started
    assert raised.value.code == ErrorCode.REQUEST_TIMED_OUT
    assert str(raised.value.message).startswith(
        f"creating topic 'x': ZooKeeper did not answer within {bound_ms} ms"
    )
    assert bound_ms / 1000 <= took_s < bound_ms / 1000 + LATE_S + stalls.stalled_s_total


async def test_the_bound_runs_from_when_the_request_started(
    own_zookeeper: DedicatedZooKeeper,
) -> None:
    async with AsyncZooKeeper(f"{own_zookeeper.server.connect_string}/bound") as zk:
        await own_zookeeper.stop()
        await eventually(lambda: zk.state is ConnectionState.SUSPENDED)
        started = asyncio.get_running_loop().time()
        with StallMeter() as stalls, pytest.raises(KafkaError) as raised:
            async with zookeeper_bound(CONFIG, "x", timeout_ms=1_000, started_s=started - 0.8):
                await zk.get("/")
        took_s = asyncio.get_running_loop().time() - started
    assert raised.value.code == ErrorCode.REQUEST_TIMED_OUT
    assert 0.2 <= took_s < 0.2 + LATE_S + stalls.stalled_s_total


async def test_a_lost_connection_is_the_code_given(zk_chroot: str) -> None:
    zk = AsyncZooKeeper(zk_chroot)
    await zk.start()
    await zk.stop()  # a closed client: every call fails as not connected
    with pytest.raises(KafkaError) as raised:
        async with zookeeper_bound(CONFIG, "deleting topic 'x'", lost=ErrorCode.NOT_CONTROLLER):
            await zk.get("/")
    assert raised.value.code == ErrorCode.NOT_CONTROLLER
    assert "deleting topic 'x': the connection to ZooKeeper was lost" in str(raised.value.message)


async def test_other_errors_and_timeouts_are_not_its_business(zk_chroot: str) -> None:
    async with AsyncZooKeeper(zk_chroot) as zk:

        async def a_timeout_of_the_caller() -> None:
            async with zookeeper_bound(CONFIG, "x"):
                await zk.get("/")
                raise TimeoutError("not ours")

        with pytest.raises(TimeoutError, match="not ours"):
            await a_timeout_of_the_caller()
