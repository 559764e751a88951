"""The virtual-time loop the timer-logic tests run on: its clock jumps to the next timer when the
loop is idle, and a stall of the process moves no timer."""

from __future__ import annotations

import asyncio
import time

from tests.support.virtual_time import loop_now_ms, virtual_time


@virtual_time
async def test_an_idle_loop_jumps_to_its_next_timer_without_sleeping() -> None:
    loop = asyncio.get_running_loop()
    started_s, started_wall_s = loop.time(), time.monotonic()
    fired: list[float] = []
    loop.call_later(3_600, lambda: fired.append(loop.time()))
    await asyncio.sleep(7_200)
    assert fired == [started_s + 3_600]
    assert loop.time() - started_s == 7_200
    assert loop_now_ms() == int((started_s + 7_200) * 1000)
    assert time.monotonic() - started_wall_s < 5.0  # two hours of timers, no sleeping


@virtual_time
async def test_a_stalled_process_moves_no_timer() -> None:
    loop = asyncio.get_running_loop()
    expired = asyncio.Event()
    loop.call_later(0.05, expired.set)
    # The loop is blocked, as by a machine that stops the process for a while.
    time.sleep(0.2)  # noqa: ASYNC251 - blocking the loop is the stall under test
    await asyncio.sleep(0.01)
    assert not expired.is_set()  # only 10 ms have passed on the loop's clock
    async with asyncio.timeout(1.0):
        await expired.wait()
    assert loop.time() == 0.05


@virtual_time
async def test_ready_work_runs_before_the_clock_moves() -> None:
    loop = asyncio.get_running_loop()
    order: list[str] = []
    loop.call_later(1.0, order.append, "timer")
    for step in range(3):
        loop.call_soon(order.append, f"ready-{step}")
    await asyncio.sleep(0)
    assert loop.time() == 0.0
    await asyncio.sleep(2.0)
    assert order == ["ready-0", "ready-1", "ready-2", "timer"]
