"""Running a test's coroutine on an event loop whose clock only moves when the loop is idle.

Tests of timer logic (session expiry, rebalance and produce timeouts) on real time fail whenever
the machine stalls the process for longer than their margins: on a shared CI host a
`sleep(0.05)` was seen to take 0.6 s, and a member heartbeating every 50 ms then missed its
300 ms session. On this loop, time advances only when every ready callback has run and the loop
would otherwise sleep: it then jumps straight to the next timer. A stall of the machine moves
no timer, so such a test sees the same sequence of events on any machine, and it runs without
sleeping.

Only for code that waits on nothing but the loop's own timers and futures: a thread or a socket
the loop waits on still takes real time, while the clock jumps ahead past its timeouts.
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

P = ParamSpec("P")


class _IdleAdvancingSelector(selectors.DefaultSelector):
    """Polls the real selector without waiting; a wait with a timeout becomes a jump of the
    loop's clock by that timeout (the loop computed it as the time to its next timer)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer at all: only another thread can wake the loop
            return super().select(None)
        assert self.loop is not None
        self.loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` starts at 0 and moves only by idle jumps."""

    def __init__(self) -> None:
        selector = _IdleAdvancingSelector()
        super().__init__(selector)
        selector.loop = self
        self._now_s = 0.0

    def time(self) -> float:
        return self._now_s

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self._now_s += seconds


def virtual_time(
    test: Callable[P, Coroutine[Any, Any, None]],
) -> Callable[P, None]:
    """Turns an `async def` test into a plain test that runs it on a `VirtualTimeLoop`."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(test(*args, **kwargs))

    return run


def loop_now_ms() -> int:
    """The running loop's clock in ms: what code under test that takes a `now_ms` is given, so
    that its notion of time and its timers agree on a virtual-time loop."""
    return int(asyncio.get_running_loop().time() * 1000)
