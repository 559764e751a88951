"""connections.max.idle.ms on a server connection's idle clock, on virtual time."""

from __future__ import annotations

import asyncio

import pytest
from riverbed.broker.network.connection_waits import IdleClock

from tests.support.virtual_time import virtual_time

IDLE_S = 10.0


async def at_eof_when(reader: asyncio.StreamReader) -> float:
    """The loop time at which `reader` reaches its end (failing after a long while)."""
    async with asyncio.timeout(IDLE_S * 10):
        assert await reader.read(100) == b""
    return asyncio.get_running_loop().time()


async def ended_after(clock: IdleClock, reader: asyncio.StreamReader, busy_s: float) -> float:
    """Busy for `busy_s` (a request being handled: no touch meanwhile), then answered and
    waiting for input: how long after the start the clock ended the input."""
    started = asyncio.get_running_loop().time()
    await asyncio.sleep(busy_s)
    assert not clock.expired
    assert not reader.at_eof()
    clock.touch()  # the answer
    clock.waiting = True
    ended = await at_eof_when(reader)
    assert clock.expired
    return ended - started


@virtual_time
async def test_a_connection_waiting_for_input_ends_idle_s_after_its_last_activity() -> None:
    reader = asyncio.StreamReader()
    clock = IdleClock(reader, IDLE_S, lambda: False)
    assert await ended_after(clock, reader, 4.0) == pytest.approx(4.0 + IDLE_S)


@virtual_time
async def test_a_busy_connection_is_not_idle_and_its_clock_restarts_at_its_answer() -> None:
    reader = asyncio.StreamReader()
    clock = IdleClock(reader, IDLE_S, lambda: False)
    # A long poll (or a deferred response) outlasts the idle time: not idleness.
    assert await ended_after(clock, reader, IDLE_S * 2.5) == pytest.approx(IDLE_S * 3.5)


@virtual_time
async def test_a_connection_that_waits_and_gets_no_request_ends_at_its_deadline() -> None:
    """Waiting from the start with no touch (a silent client, or one trickling bytes of a
    frame, which are not activity): ended idle_s after the connection opened."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    started = loop.time()
    clock = IdleClock(reader, IDLE_S, lambda: False)
    clock.waiting = True
    assert await at_eof_when(reader) - started == pytest.approx(IDLE_S)
    assert clock.expired


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
