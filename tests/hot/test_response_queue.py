"""Deferred responses leave in request order, written by their completions' callbacks, over a
real socket pair."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from riverbed.broker.network.connection_waits import IdleClock
from riverbed.broker.network.response_queue import Deferred, Response, ResponseQueue
from riverbed.protocol.regions import FileRegion

# How long nothing must be written: the completions' callbacks run at the loop's next turn and
# the socket pair delivers at once, so anything wrongly written is in the client's buffer within
# a few turns. That nothing comes is the subject: there is no event to wait for instead.
NOTHING_WRITTEN_S = 0.05


class Pair:
    """A server end (what the queue writes to) and the client end reading it."""

    def __init__(
        self,
        server_reader: asyncio.StreamReader,
        server_writer: asyncio.StreamWriter,
        client: asyncio.StreamReader,
    ) -> None:
        self.server_reader = server_reader
        self.server_writer = server_writer
        self.client = client
        self.timed: list[str] = []
        self.idle = IdleClock(server_reader, 600.0, lambda: False)
        self.queue = ResponseQueue(
            server_writer,
            self.idle,
            lambda request_type, _received_s: self.timed.append(request_type),
        )

    async def received(self, size: int) -> bytes:
        async with asyncio.timeout(5):
            return await self.client.readexactly(size)


@pytest_asyncio.fixture
async def pair() -> AsyncIterator[Pair]:
    server_sock, client_sock = socket.socketpair()
    server_reader, server_writer = await asyncio.open_connection(sock=server_sock)
    client_reader, client_writer = await asyncio.open_connection(sock=client_sock)
    made = Pair(server_reader, server_writer, client_reader)
    yield made
    made.idle.cancel()
    made.queue.cancel()
    for writer in (server_writer, client_writer):
        writer.close()


def deferred(encode: Callable[[Any], Response] = lambda body: [body]) -> Deferred:
    return Deferred(asyncio.get_running_loop().create_future(), encode)


async def test_responses_leave_in_request_order_as_soon_as_the_earlier_ones_did(
    pair: Pair,
) -> None:
    first, second, third = deferred(), deferred(), deferred()
    for name, item in (("A", first), ("B", second), ("C", third)):
        pair.queue.add(item, name, 0.0)
    second.body.set_result(b"second;")  # done before the first: it must wait for it
    await asyncio.sleep(NOTHING_WRITTEN_S)
    assert pair.client._buffer == b""  # type: ignore[attr-defined]  # nothing left yet
    first.body.set_result(b"first;")
    assert await pair.received(len(b"first;second;")) == b"first;second;"
    assert pair.timed == ["A", "B"]
    assert len(pair.queue) == 1
    third.body.set_result(b"third;")
    assert await pair.received(len(b"third;")) == b"third;"
    assert pair.timed == ["A", "B", "C"]
    await pair.queue.drained()  # nothing owed: returns at once


async def test_wait_below_holds_the_reader_at_the_bound_until_the_head_is_written(
    pair: Pair,
) -> None:
    items = [deferred() for _ in range(3)]
    for index, item in enumerate(items):
        pair.queue.add(item, f"R{index}", 0.0)
    waiting = asyncio.create_task(pair.queue.wait_below(3))
    await asyncio.sleep(NOTHING_WRITTEN_S)
    assert not waiting.done()
    items[1].body.set_result(b"1")  # not the head: still 3 owed
    await asyncio.sleep(NOTHING_WRITTEN_S)
    assert not waiting.done()
    items[0].body.set_result(b"0")
    async with asyncio.timeout(5):
        await waiting
    assert len(pair.queue) == 1
    assert await pair.received(2) == b"01"


async def test_cancel_writes_nothing_more(pair: Pair) -> None:
    first, second = deferred(), deferred()
    pair.queue.add(first, "A", 0.0)
    pair.queue.add(second, "B", 0.0)
    pair.queue.cancel()
    assert first.body.cancelled()
    assert second.body.cancelled()
    assert len(pair.queue) == 0
    await asyncio.sleep(NOTHING_WRITTEN_S)
    assert pair.timed == []


async def test_an_error_completing_a_response_closes_the_connection(
    pair: Pair, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    # A file region cannot be written from a callback: refused, and its descriptor closed.
    fd = os.open(tmp_path / "segment", os.O_CREAT | os.O_RDWR)
    region = FileRegion(fd, 0, 0)

    def encode_region(_body: Any) -> Response:
        return [b"head", region]

    broken, behind = deferred(encode_region), deferred()
    pair.queue.add(broken, "A", 0.0)
    pair.queue.add(behind, "B", 0.0)
    broken.body.set_result(None)
    async with asyncio.timeout(5):
        assert await pair.client.read() == b""  # the end: the connection was closed
    assert behind.body.cancelled()
    with pytest.raises(OSError, match=rf"\[Errno {errno.EBADF}\]"):  # closed
        os.fstat(fd)
    assert "unexpected error in a deferred response" in caplog.text


async def test_answers_completed_together_leave_in_one_write(pair: Pair) -> None:
    """One high watermark move completes several produce requests: their answers are one send
    (one delivery to the client), in request order."""
    writes: list[bytes] = []
    real_write = pair.server_writer.write

    def counted(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        real_write(data)

    pair.server_writer.write = counted  # type: ignore[method-assign]
    items = [deferred() for _ in range(3)]
    for name, item in zip("ABC", items, strict=True):
        pair.queue.add(item, name, 0.0)
    for index, item in enumerate(items):  # all done before any callback runs
        item.body.set_result(f"{index};".encode())
    assert await pair.received(6) == b"0;1;2;"
    assert writes == [b"0;1;2;"]
    assert pair.timed == ["A", "B", "C"]


async def test_answers_before_a_failing_one_still_leave(
    pair: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_encode(_body: Any) -> Response:
        raise RuntimeError("a bug in the completion")

    good, broken = deferred(), deferred(broken_encode)
    pair.queue.add(good, "A", 0.0)
    pair.queue.add(broken, "B", 0.0)
    good.body.set_result(b"good;")
    broken.body.set_result(None)
    async with asyncio.timeout(5):
        assert await pair.client.read() == b"good;"
        assert await pair.client.read() == b""  # then the connection is closed
    assert pair.timed == ["A"]
    assert "unexpected error in a deferred response" in caplog.text
