"""The pace of a background job's disk and network bytes: the hot log cleaner and the cold
compactor both keep to `log.cleaner.io.max.bytes.per.second` with a `Throttle`."""

from __future__ import annotations

import threading
import time


class StopRequested(Exception):
    """The job was asked to stop (shutdown) while it waited or between two steps."""


class Throttle:
    """Keeps a worker's bytes per second at or below `bytes_per_second`; sleeps on `stop`, so
    a shutdown is not held up by it (the wait ends with StopRequested)."""

    def __init__(self, bytes_per_second: float, stop: threading.Event) -> None:
        self._bytes_per_second = bytes_per_second
        self._stop = stop
        self._started = time.monotonic()
        self._bytes = 0

    def account(self, size_bytes: int) -> None:
        self._bytes += size_bytes
        ahead_s = self._bytes / self._bytes_per_second - (time.monotonic() - self._started)
        if ahead_s > 0:
            self._stop.wait(ahead_s)
        if self._stop.is_set():
            raise StopRequested
