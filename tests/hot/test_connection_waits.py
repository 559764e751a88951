"""The idle clock and the wakeup a server connection's task sleeps on, on virtual time."""

from __future__ import annotations

import asyncio

import pytest
from riverbed.hot.connection_waits import IdleClock, Wakeup

from tests.support.virtual_time import virtual_time

IDLE_S = 10.0


async def at_eof_when(reader: asyncio.StreamReader) -> float:
    """The loop time at which `reader` reaches its end (failing after a long while)."""
    async with asyncio.timeout(IDLE_S * 10):
        assert await reader.read(100) == b""
    return asyncio.get_running_loop().time()


@virtual_time
async def test_a_connection_waiting_for_input_ends_idle_s_after_its_last_activity() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    clock = IdleClock(reader, IDLE_S)
    started = loop.time()
    await asyncio.sleep(4.0)
    clock.touch()  # a request
    clock.waiting = True
    ended = await at_eof_when(reader)
    assert ended - started == pytest.approx(4.0 + IDLE_S)
    assert clock.expired


@virtual_time
async def test_a_busy_connection_is_not_idle_and_its_clock_restarts_at_its_answer() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    clock = IdleClock(reader, IDLE_S)
    started = loop.time()
    # A long poll (or a deferred response) outlasts the idle time: not idleness.
    await asyncio.sleep(IDLE_S * 2.5)
    assert not clock.expired
    assert not reader.at_eof()
    clock.touch()  # its answer
    clock.waiting = True
    ended = await at_eof_when(reader)
    assert ended - started == pytest.approx(IDLE_S * 3.5)
    assert clock.expired


@virtual_time
async def test_input_that_is_no_complete_request_does_not_keep_a_connection() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    clock = IdleClock(reader, IDLE_S)
    clock.waiting = True
    started = loop.time()
    for _ in range(3):  # a trickle of bytes: the task wakes for each, then waits again
        await asyncio.sleep(IDLE_S / 4)
        clock.waiting = False
        clock.waiting = True
    await at_eof_when(reader)
    assert loop.time() - started == pytest.approx(IDLE_S)


@virtual_time
async def test_a_cancelled_clock_never_ends_its_connection() -> None:
    reader = asyncio.StreamReader()
    clock = IdleClock(reader, IDLE_S)
    clock.waiting = True
    clock.cancel()
    await asyncio.sleep(IDLE_S * 3)
    assert not reader.at_eof()
    assert not clock.expired


@virtual_time
async def test_a_wakeup_ends_when_any_watched_future_is_done() -> None:
    loop = asyncio.get_running_loop()
    wakeup = Wakeup()
    first, second = loop.create_future(), loop.create_future()
    wakeup.watch(first)
    wakeup.watch(second)
    loop.call_later(2.0, second.set_result, None)
    started = loop.time()
    await wakeup.wait()
    assert loop.time() - started == pytest.approx(2.0)
    # A watched future done while nobody sleeps wakes nothing later: the next wait is for the
    # next one.
    first.set_result(None)
    await asyncio.sleep(0)  # its callback runs
    third = loop.create_future()
    wakeup.watch(third)
    loop.call_later(3.0, third.set_result, None)
    started = loop.time()
    await wakeup.wait()
    assert loop.time() - started == pytest.approx(3.0)
