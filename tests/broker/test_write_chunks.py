"""The server's response writer on real loopback sockets and real files: file regions go to the
socket with os.sendfile at once when it has room, through the loop when it is full, and the
client receives every byte in order either way; a response of several chunks leaves corked."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from riverbed.broker.network.server import write_chunks
from riverbed.protocol.regions import FileRegion


async def _connected() -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Any]:
    accepted: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
        asyncio.get_running_loop().create_future()
    )

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set_result((reader, writer))

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client_reader, client_writer = await asyncio.open_connection("127.0.0.1", port)
    _server_reader, server_writer = await accepted
    return client_reader, server_writer, (server, client_writer)


def _region(path: Path, position: int, size: int) -> FileRegion:
    return FileRegion(os.open(path, os.O_RDONLY), position, size)


@pytest.mark.parametrize("region_bytes", [170, 64 * 1024 * 1024])  # room, and a full socket
async def test_regions_arrive_whole_and_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, region_bytes: int
) -> None:
    data = os.urandom(1024) * (region_bytes // 1024 + 2)
    segment = tmp_path / "segment"
    segment.write_bytes(data)
    loop = asyncio.get_running_loop()
    through_loop: list[int] = []
    loop_sendfile = loop.sendfile

    async def counting_sendfile(transport: Any, file: Any, offset: int, count: int) -> int:
        through_loop.append(count)
        return await loop_sendfile(transport, file, offset, count)

    monkeypatch.setattr(loop, "sendfile", counting_sendfile)
    reader, writer, (server, client_writer) = await _connected()
    try:
        chunks: list[bytes | FileRegion] = [
            b"head",
            _region(segment, 100, region_bytes),
            b"mid",
            _region(segment, 7, 5),
        ]
        received = asyncio.ensure_future(reader.readexactly(4 + region_bytes + 3 + 5))
        await write_chunks(writer, [*chunks, b"tail"])
        expected = b"head" + data[100 : 100 + region_bytes] + b"mid" + data[7:12]
        assert await received == expected
        assert await reader.readexactly(4) == b"tail"
        if region_bytes <= 170:
            assert through_loop == []  # straight to the socket: no loop iteration per region
        else:
            assert through_loop
            assert through_loop[0] < region_bytes  # the rest, once it was full
    finally:
        writer.close()
        client_writer.close()
        server.close()
        await server.wait_closed()


async def test_a_response_of_several_chunks_leaves_corked_and_the_socket_is_uncorked_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Header, region and trailer go out as one delivery (TCP_CORK held while they are
    written), and nothing is held back afterwards."""
    data = os.urandom(4096)
    segment = tmp_path / "segment"
    segment.write_bytes(data)
    reader, writer, (server, client_writer) = await _connected()
    sock = writer.get_extra_info("socket")
    corked_at_sendfile: list[int] = []
    real_sendfile = os.sendfile

    def observing_sendfile(out_fd: int, in_fd: int, offset: int, count: int) -> int:
        corked_at_sendfile.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK))
        return real_sendfile(out_fd, in_fd, offset, count)

    monkeypatch.setattr(os, "sendfile", observing_sendfile)
    try:
        await write_chunks(writer, [b"head", _region(segment, 0, len(data)), b"tail"])
        assert corked_at_sendfile
        assert all(corked_at_sendfile)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
        received = await asyncio.wait_for(reader.readexactly(4 + len(data) + 4), timeout=5)
        assert received == b"head" + data + b"tail"
    finally:
        writer.close()
        client_writer.close()
        server.close()
        await server.wait_closed()
