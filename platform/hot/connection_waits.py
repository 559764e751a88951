"""What a server connection's task waits on, without a timer or a wait set per request.

`IdleClock` is connections.max.idle.ms: one timer per connection, re-armed only when it goes
off, instead of a timeout around every read (a Timeout object, a timer and a cancellation to
undo, on every request of every connection). `Wakeup` lets the task sleep until its next read or
its oldest deferred response is done, with a done-callback added once per task instead of
asyncio.wait adding and removing one on every future of its set at every wait.
"""

from __future__ import annotations

import asyncio
from typing import Any


class IdleClock:
    """Ends a connection's input (EOF on its reader) once the connection has waited
    `idle_s` for a request while owing nothing.

    `waiting` is True while the connection's task waits for input and owes no response; a long
    poll or a deferred response is activity until it is answered. `touch()` marks activity: a
    complete request, or a response written. Bytes of an incomplete request are not activity,
    so a client trickling a frame is ended too.
    """

    def __init__(self, reader: asyncio.StreamReader, idle_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader = reader
        self._idle_s = idle_s
        self.waiting = False
        self.expired = False
        self.last_activity_s = self._loop.time()
        self._timer = self._loop.call_at(self.last_activity_s + idle_s, self._check)

    def touch(self) -> None:
        self.last_activity_s = self._loop.time()

    def cancel(self) -> None:
        self._timer.cancel()

    def _check(self) -> None:
        now = self._loop.time()
        deadline = self.last_activity_s + self._idle_s
        if self.waiting:
            if now >= deadline:
                self.expired = True
                self._reader.feed_eof()
                return
            next_check_s = deadline
        else:
            # Busy: it waits again only after a touch from now on, so idles out at now + idle_s
            # at the earliest.
            next_check_s = now + self._idle_s
        self._timer = self._loop.call_at(next_check_s, self._check)


class Wakeup:
    """A one-shot future to sleep on, resolved by the done-callback of whatever the sleeper
    watches (`watch` once per task or future)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[None] | None = None

    def watch(self, awaitable: asyncio.Future[Any]) -> None:
        awaitable.add_done_callback(self._wake)

    async def wait(self) -> None:
        """Until a watched future is done. Early if one was done just before (its callback had
        not run yet): the caller looks at what it watches and sleeps again if need be."""
        self._future = self._loop.create_future()
        try:
            await self._future
        finally:
            self._future = None

    def _wake(self, _done: asyncio.Future[Any]) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(None)
