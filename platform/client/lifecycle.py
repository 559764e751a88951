"""The lifecycle every client shares: `start()`, `close()`, and `async with` around them."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncClient:
    """Base of Producer, Consumer and Admin: `async with client:` starts it and closes it."""

    async def start(self) -> None:
        """Connect and start background tasks (nothing to do by default)."""

    async def close(self) -> None:
        """Stop background tasks and close every connection. Idempotent."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
