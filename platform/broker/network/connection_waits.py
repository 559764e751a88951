"""connections.max.idle.ms for a server connection, without a timeout around every read.

One timer per connection, re-armed only when it goes off: a timeout per read cost a Timeout
object, a timer and a cancellation to undo on every request of every connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class IdleClock:
    """Ends a connection's input (EOF on its reader) once the connection has waited `idle_s`
    for a request while owing nothing.

    `waiting` is True while the connection's task waits for input; `owes()` whether a response
    is still owed (a deferred one, answered by a callback meanwhile). A long poll or an owed
    response is activity until it is answered. `touch()` marks activity: a complete request, or
    a response written. Bytes of an incomplete request are not activity, so a client trickling a
    frame is ended too.
    """

    def __init__(
        self, reader: asyncio.StreamReader, idle_s: float, owes: Callable[[], bool]
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._reader = reader
        self._idle_s = idle_s
        self._owes = owes
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
        if self.waiting and not self._owes():
            deadline = self.last_activity_s + self._idle_s
            if now >= deadline:
                self.expired = True
                self._reader.feed_eof()
                return
            next_check_s = deadline
        else:
            # Busy: it is idle again only after a touch from now on, so idles out at now +
            # idle_s at the earliest.
            next_check_s = now + self._idle_s
        self._timer = self._loop.call_at(next_check_s, self._check)
