"""The loop the consumer's fetch driver and offset resetter run on (`WakeupLoop`), alone: when
it runs a pass, that it owns what it spawns, and that errors nobody handles are reported."""

from __future__ import annotations

import asyncio
import time

from riverbed.client.consumer_parts import WakeupLoop

from tests.support.waiting import eventually

STOP_BOUND_S = 2.0


async def test_a_pass_runs_at_start_on_each_wake_and_when_a_backoff_ends() -> None:
    waits: list[float | None] = [0.05, None, None]
    passes: list[float] = []

    def start_due() -> float | None:
        passes.append(time.monotonic())
        return waits[len(passes) - 1]

    crashes: list[BaseException] = []
    loop = WakeupLoop("test", start_due, crashes.append)
    loop.start()
    await eventually(lambda: len(passes) == 2)  # no wake: the 50 ms backoff ended
    assert passes[1] - passes[0] >= 0.049  # asyncio may run a timer one clock tick early
    await asyncio.sleep(0.2)
    assert len(passes) == 2  # nothing to wait for but a wake
    loop.wake()
    await eventually(lambda: len(passes) == 3)
    await loop.stop()
    assert crashes == []


async def test_stop_cancels_the_loop_and_every_task_it_spawned() -> None:
    cancelled: list[int] = []

    async def parked(number: int) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(number)
            raise

    passes = 0

    def start_due() -> None:
        nonlocal passes
        passes += 1
        if passes == 1:
            for number in range(3):
                loop.spawn(parked(number))

    loop = WakeupLoop("test", start_due, lambda error: None)
    loop.start()
    await eventually(lambda: passes == 1)
    await asyncio.sleep(0)  # the spawned tasks start
    async with asyncio.timeout(STOP_BOUND_S):  # the parked tasks would never end by themselves
        await loop.stop()
    assert sorted(cancelled) == [0, 1, 2]
    loop.wake()
    await asyncio.sleep(0.05)
    assert passes == 1  # the loop is gone too


async def test_an_unhandled_error_of_a_task_or_of_a_pass_is_a_crash() -> None:
    crashes: list[BaseException] = []
    passes = 0

    async def failing() -> None:
        raise ValueError("in a task")

    def start_due() -> None:
        nonlocal passes
        passes += 1
        if passes == 1:
            loop.spawn(failing())
        else:
            raise RuntimeError("in a pass")

    loop = WakeupLoop("test", start_due, crashes.append)
    loop.start()
    await eventually(lambda: len(crashes) == 1)
    assert isinstance(crashes[0], ValueError)
    loop.wake()
    await eventually(lambda: len(crashes) == 2)
    assert isinstance(crashes[1], RuntimeError)
    await loop.stop()
