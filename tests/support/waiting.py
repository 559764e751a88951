"""Waiting in a test for something another task or process makes true, with a bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

WAIT_S = 10.0
POLL_S = 0.01


async def eventually(condition: Callable[[], bool], timeout_s: float = WAIT_S) -> float:
    """Seconds until `condition()` held; AssertionError once `timeout_s` passed without."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"condition not reached in {timeout_s} s")
        await asyncio.sleep(POLL_S)
    return time.monotonic() - started
