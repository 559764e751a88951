"""Tiering's background pools: their threads, and the threads those start (Parquet's writer),
yield the CPU to the event loop."""

from __future__ import annotations

import os
import threading

from riverbed.tiering.background import BACKGROUND_NICE, background_executor

# Linux caps nice values here.
NICE_MAX = 19


def test_background_threads_and_the_threads_they_start_run_at_a_lower_priority() -> None:
    def priorities() -> tuple[int, int]:
        started: list[int] = []

        def child() -> None:
            started.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

        thread = threading.Thread(target=child)
        thread.start()
        thread.join()
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), started[0]

    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with background_executor(1, "test-background") as pool:
        worker, its_child = pool.submit(priorities).result()
    expected = min(own + BACKGROUND_NICE, NICE_MAX)
    assert (worker, its_child) == (expected, expected)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own
