"""How long the machine kept this process from running, measured beside a timing assertion.

A test that bounds how late something may happen (a timeout fires at its bound, a loop is never
blocked for long) fails on a shared host that stops the whole process for a while: such stalls
of 0.4-0.6 s were seen in CI and on the development machine. `StallMeter` runs a thread that
wakes every `TICK_S`; whatever it wakes late by was time nobody in the process could run. A test
then allows its own margin plus the stall it measured, and still fails when the code itself is
late.

What it cannot tell apart: C code that holds the GIL for a long time delays the meter's thread
too, so it counts as a stall. Code that blocks in a system call (a socket, a lock, a sleep)
releases the GIL and is not excused.
"""

from __future__ import annotations

import threading
import time
from typing import Final

TICK_S: Final = 0.005
# Wake-up jitter of a healthy machine (and a GIL hand-over, 5 ms by default): not a stall.
JITTER_S: Final = 0.01


class StallMeter:
    """`stalled_s_total`: all stalls added up; `stalled_s_within(start, end)`: the part of them
    that overlapped one stretch of `time.monotonic()`, to excuse exactly that stretch."""

    def __init__(self) -> None:
        self.stalled_s_total = 0.0
        self._stalls: list[tuple[float, float]] = []  # (start, end) in time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-meter", daemon=True)

    def __enter__(self) -> StallMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def stalled_s_within(self, start_s: float, end_s: float) -> float:
        assert not self._thread.is_alive(), "read once the meter has stopped"
        return sum(max(0.0, min(end, end_s) - max(start, start_s)) for start, end in self._stalls)

    def _run(self) -> None:
        while True:
            due_s = time.monotonic() + TICK_S
            if self._stop.wait(TICK_S):
                return
            woke_s = time.monotonic()
            if woke_s - due_s > JITTER_S:
                self._stalls.append((due_s, woke_s))
                self.stalled_s_total += woke_s - due_s
