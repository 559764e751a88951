"""A connection's deferred responses, written in request order from their completions' callbacks.

An acks=all produce is answered when its followers have its batches, while its connection goes on
reading the next requests. Its response is written by the done-callback of its future, as soon
as it and every response before it are complete: no task per response and no task reading the
socket beside it, and the answer leaves one loop iteration after the high watermark passed it.

Deferred responses are bytes (produce answers): a callback cannot wait for a full socket the way
sendfile must, and the transport buffers what the socket does not take at once. At most
RESPONSES_OWED_MAX responses are owed per connection (the server stops reading at that bound), so
that buffer stays small.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from riverbed.broker.network.connection_waits import IdleClock
from riverbed.protocol.regions import FileRegion

log = logging.getLogger(__name__)

Chunk = bytes | FileRegion
# A response's encoded chunks, or None when the request gets no response (Produce acks=0).
Response = list[Chunk] | None
# (request type name, seconds from its arrival to its response's last byte written).
ResponseTimer = Callable[[str, float], None]
# (request type name, its arrival as time.perf_counter()): the server's timing of an answer.
AnswerTimer = Callable[[str, float], None]


@dataclass(frozen=True, slots=True)
class Deferred:
    """A response still being completed; the request's ordered work (its appends) is done.

    `body` resolves to the response body and `encode` makes it bytes. Bytes only: see the module
    docstring."""

    body: asyncio.Future[Any]
    encode: Callable[[Any], Response]


@dataclass(frozen=True, slots=True)
class _Owed:
    deferred: Deferred
    request_type: str
    received_s: float  # time.perf_counter() at its arrival


class ResponseQueue:
    """The deferred responses one connection owes, oldest first."""

    def __init__(self, writer: asyncio.StreamWriter, idle: IdleClock, timed: AnswerTimer) -> None:
        self._writer = writer
        self._idle = idle
        self._timed = timed
        self._owed: deque[_Owed] = deque()
        self._shrunk: asyncio.Future[None] | None = None  # what `wait_below` sleeps on

    def __len__(self) -> int:
        return len(self._owed)

    def add(self, deferred: Deferred, request_type: str, received_s: float) -> None:
        self._owed.append(_Owed(deferred, request_type, received_s))
        deferred.body.add_done_callback(self._write_ready)

    async def wait_below(self, count: int) -> None:
        """Until fewer than `count` responses are owed (0 < count)."""
        while len(self._owed) >= count:
            self._shrunk = asyncio.get_running_loop().create_future()
            try:
                await self._shrunk
            finally:
                self._shrunk = None

    async def drained(self) -> None:
        """Until every owed response is written (earlier requests answer first)."""
        await self.wait_below(1)

    def cancel(self) -> None:
        """The connection ends: what is still owed is never written."""
        owed, self._owed = self._owed, deque()
        for entry in owed:
            entry.deferred.body.cancel()

    def _write_ready(self, _done: asyncio.Future[Any]) -> None:
        """Write the complete responses at the head, in order, with one write: a high
        watermark move completes every produce request whose batches it passed, and their
        answers in one send are one delivery to the client instead of one each."""
        owed = self._owed
        written: list[_Owed] = []
        data: list[bytes] = []
        failed = False
        try:
            while owed and owed[0].deferred.body.done():
                entry = owed.popleft()
                body = entry.deferred.body
                if body.cancelled():
                    continue
                data += _bytes_only(entry.deferred.encode(body.result()))
                written.append(entry)
        except Exception:
            # A bug in a handler's completion must cost one connection, never the broker (and
            # the responses behind it can no longer leave in order): those before it still go.
            log.exception("closing a connection after an unexpected error in a deferred response")
            failed = True
        if data:
            self._writer.write(data[0] if len(data) == 1 else b"".join(data))
        for entry in written:
            self._timed(entry.request_type, entry.received_s)
        if written:
            self._idle.touch()
        if failed:
            self.cancel()
            self._writer.close()
        if self._shrunk is not None and not self._shrunk.done():
            self._shrunk.set_result(None)


def _bytes_only(response: Response) -> list[bytes]:
    """A deferred response's chunks, which must all be bytes (see the module docstring)."""
    chunks = response or []
    data = [chunk for chunk in chunks if not isinstance(chunk, FileRegion)]
    if len(data) < len(chunks):
        for chunk in chunks:
            if isinstance(chunk, FileRegion):
                chunk.close()  # each owns its descriptor
        raise TypeError("a deferred response holds a file region")
    return data
