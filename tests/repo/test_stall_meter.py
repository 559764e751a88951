"""The stall meter timing assertions allow for: a real stop of the whole process (SIGSTOP, then
SIGCONT from another process) is measured, and placed in time."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.support.stalls import StallMeter

STOPPED_S = 0.4


@pytest.mark.processes
def test_a_stopped_process_is_measured_as_stalled_for_that_long() -> None:
    with StallMeter() as stalls:
        time.sleep(0.05)
        waker = subprocess.Popen(["sh", "-c", f"sleep {STOPPED_S}; kill -CONT {os.getpid()}"])
        before = time.monotonic()
        os.kill(os.getpid(), signal.SIGSTOP)  # the whole process stops here until SIGCONT
        after = time.monotonic()
        time.sleep(0.05)
    waker.wait()
    assert after - before >= STOPPED_S * 0.9
    # Measured within the stop (a tick's length may fall on either side of it)...
    assert stalls.stalled_s_within(before, after) >= after - before - 0.05
    # ...and nowhere near a stretch before it.
    assert stalls.stalled_s_within(before - 10.0, before - 5.0) == 0.0
    assert stalls.stalled_s_total >= stalls.stalled_s_within(before, after)
