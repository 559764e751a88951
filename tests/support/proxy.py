"""A loopback TCP proxy that records the header of every request a client sends.

Start the broker with `advertised.listeners` pointing at the proxy, so that after bootstrapping
the client keeps talking through it; the proxy forwards bytes untouched in both directions and
parses the client's side with the sans-IO `ServerConnection` to note each request header.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from riverbed.protocol.connection import RequestHeader, RequestReceived, ServerConnection

from tests.support.broker import HOST, free_port

CHUNK_BYTES = 64 * 1024


@dataclass
class RecordingProxy:
    target_port: int = 0
    port: int = field(default_factory=free_port)
    requests: list[tuple[float, RequestHeader]] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_client, HOST, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def api_keys(self, since_s: float = 0.0) -> list[int]:
        return [header.api_key for at, header in self.requests if at >= since_s]

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(HOST, self.target_port)
        to_broker = asyncio.create_task(self._client_to_broker(reader, upstream_writer))
        to_client = asyncio.create_task(_pump(upstream_reader, writer))
        self._tasks |= {to_broker, to_client}
        try:
            await asyncio.wait({to_broker, to_client}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (to_broker, to_client):
                task.cancel()
                self._tasks.discard(task)
            for w in (writer, upstream_writer):
                w.close()

    async def _client_to_broker(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        parser = ServerConnection()
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
            parser.receive_data(data)
            # Record every complete request; stop at NEED_DATA (or anything else).
            while isinstance(event := parser.next_event(), RequestReceived):
                self.requests.append((time.monotonic(), event.header))


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
