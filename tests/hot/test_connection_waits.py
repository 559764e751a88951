"""connections.max.idle.ms on a server connection's idle clock, on virtual time."""

from __future__ import annotations

import asyncio

import pytest
from riverbed.hot.connection_waits import IdleClock

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
    clock = IdleClock(reader, IDLE_S, lambda: False)
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
    clock = IdleClock(reader, IDLE_S, lambda: False)
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
    clock = IdleClock(reader, IDLE_S, lambda: False)
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
    clock = IdleClock(reader, IDLE_S, lambda: False)
    clock.waiting = True
    clock.cancel()
    await asyncio.sleep(IDLE_S * 3)
    assert not reader.at_eof()
    assert not clock.expired


@virtual_time
async def test_a_connection_owing_a_response_is_not_idle_while_it_waits_for_input() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    owed = [True]  # an acks=all answer its callback will write
    clock = IdleClock(reader, IDLE_S, lambda: bool(owed))
    clock.waiting = True
    started = loop.time()

    def answered() -> None:
        owed.clear()
        clock.touch()

    loop.call_later(IDLE_S * 1.5, answered)
    ended = await at_eof_when(reader)
    assert ended - started == pytest.approx(IDLE_S * 2.5)
