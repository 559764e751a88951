"""Background threads that yield the CPU to the broker's request path.

Segment conversion and cold compaction are bulk CPU work with no client waiting on them; the
event loop serves produce and fetch. On Linux a thread's nice value is its own and the threads
it starts inherit it (Parquet's writer thread, started by a conversion), so raising it in the
worker's initializer makes the whole of that work yield when a core is contended, while it
still has every idle cycle. The share it keeps when contended is what BACKGROUND_NICE buys: at
nice 5 the CFS weight is 335 against the loop's 1024 (about a quarter of a contended core),
enough that tiering keeps draining under a busy hot path.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)

BACKGROUND_NICE = 5


def background_executor(threads: int, name: str) -> ThreadPoolExecutor:
    """A pool whose threads run BACKGROUND_NICE below the process's priority."""
    return ThreadPoolExecutor(threads, thread_name_prefix=name, initializer=lower_priority)


def lower_priority() -> None:
    """Lower this thread's CPU priority by BACKGROUND_NICE (Linux: per thread; elsewhere the
    call would renice the whole process, so it does nothing)."""
    if sys.platform != "linux":
        return
    thread_id = threading.get_native_id()
    try:
        nice = os.getpriority(os.PRIO_PROCESS, thread_id)
        os.setpriority(os.PRIO_PROCESS, thread_id, nice + BACKGROUND_NICE)
    except OSError as error:  # a sandbox may forbid it: the work runs at normal priority
        log.warning("could not lower a background thread's priority: %s", error)
