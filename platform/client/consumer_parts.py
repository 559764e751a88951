"""What the consumer's two background parts share: the loop each runs, and what they report.

The fetch driver (fetch_driver.py) and the offset resetter (offset_reset.py) work the same way:
something changes (an assignment, a seek, an answer), the part is woken, looks at the positions
(positions.py) and starts the requests that are due as tasks of its own. `WakeupLoop` is that
loop and the owner of those tasks: `stop()` cancels every one of them and waits for them, so a
closed consumer leaves nothing running. `ConsumerEvents` is what a part tells the consumer it
works for (the consumer passes it on to the other part, or to a waiting `getmany`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any, Final, Protocol

# A consumer is not a replica (Fetch and ListOffsets replica_id).
CONSUMER_REPLICA_ID: Final = -1


class ConsumerEvents(Protocol):
    """What the fetch driver and the offset resetter tell the consumer they work for."""

    def readable(self) -> None:
        """Records, or a partition's error, may wait for `getmany` now."""
        ...

    def fetch_due(self) -> None:
        """Partitions got a position: the fetch driver has partitions to fetch."""
        ...

    def reset_due(self) -> None:
        """Partitions lost their position: the offset resetter has positions to find."""
        ...

    def failed(self, error: BaseException) -> None:
        """A failure the part retries by itself (kept as the consumer's `last_error`)."""
        ...

    def crashed(self, error: BaseException) -> None:
        """A task of the part ended with an error it does not handle: a bug."""
        ...


class WakeupLoop:
    """One task that calls `start_due()` whenever it is woken; the owner of what that spawns.

    `start_due()` runs synchronously, starts the work that is due with `spawn` and returns how
    long until a backoff ends (None: only a wakeup can bring new work). Spawned tasks and the
    loop itself report an unhandled error to `crashed`.
    """

    def __init__(
        self,
        name: str,
        start_due: Callable[[], float | None],
        crashed: Callable[[BaseException], None],
    ) -> None:
        self._name = name
        self._start_due = start_due
        self._crashed = crashed
        self._wakeup = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Start the loop; it runs a first pass at once. Call once."""
        self.spawn(self._run(), name=self._name)

    def wake(self) -> None:
        """Make the loop run `start_due()` again (soon, on its own task)."""
        self._wakeup.set()

    def spawn(self, coroutine: Coroutine[Any, Any, None], *, name: str | None = None) -> None:
        """Run `coroutine` as a task this loop owns until it ends or `stop()` cancels it."""
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    async def stop(self) -> None:
        """Cancel the loop and every task it spawned, and wait until they have all ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def _run(self) -> None:
        while True:
            # Cleared before the pass: a wake() during it (an answer, a seek) means another one.
            self._wakeup.clear()
            wait_s = self._start_due()
            if wait_s is None:
                await self._wakeup.wait()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._wakeup.wait()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._crashed(error)
