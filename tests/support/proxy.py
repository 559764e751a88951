"""A loopback TCP proxy that records the header of every request a client sends.

Start the broker with `advertised.listeners` pointing at the proxy, so that after bootstrapping
the client keeps talking through it; the proxy forwards bytes untouched in both directions and
parses the client's side with the sans-IO `ServerConnection` to note each request header.

With a `rewrite` it also decodes the broker's answers and lets a test change one before the
client sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from riverbed.protocol import messages as m
from riverbed.protocol.codec import (
    decode_response_body,
    decode_response_header,
    response_header_version,
)
from riverbed.protocol.connection import (
    RequestHeader,
    RequestReceived,
    ServerConnection,
    encode_response,
)
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.messages import ResponseBody

from tests.support.broker import HOST, BrokerFactory
from tests.support.ports import free_port

CHUNK_BYTES = 64 * 1024


# A rewrite: given the request's header and the broker's answer, the answer the client gets.
Rewrite = Callable[[RequestHeader, ResponseBody], ResponseBody]


@dataclass
class RecordingProxy:
    target_port: int = 0
    port: int = field(default_factory=free_port)
    requests: list[tuple[float, RequestHeader]] = field(default_factory=list)
    # Given a request's header and the broker's answer, the answer the client gets instead (an
    # error code a real broker gives only in a brief, hard-to-hold state, say). None: untouched.
    rewrite: Rewrite | None = None
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
        # This connection's requests by correlation id (ids are per connection).
        headers: dict[int, RequestHeader] = {}
        to_broker = asyncio.create_task(self._client_to_broker(reader, upstream_writer, headers))
        to_client = asyncio.create_task(self._broker_to_client(upstream_reader, writer, headers))
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
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        headers: dict[int, RequestHeader],
    ) -> None:
        parser = ServerConnection()
        while data := await reader.read(CHUNK_BYTES):
            parser.receive_data(data)
            # Record every complete request (before it leaves: its answer may be read next);
            # stop at NEED_DATA (or anything else).
            while isinstance(event := parser.next_event(), RequestReceived):
                self.requests.append((time.monotonic(), event.header))
                headers[event.header.correlation_id] = event.header
            writer.write(data)
            await writer.drain()

    async def _broker_to_client(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        headers: dict[int, RequestHeader],
    ) -> None:
        """Bytes as they come; with a `rewrite`, frame by frame: each answer decoded (by the
        request it answers: answers follow their requests in order on a connection), passed
        through `rewrite` and encoded again."""
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            if self.rewrite is None:
                while data := await reader.read(CHUNK_BYTES):
                    writer.write(data)
                    await writer.drain()
                return
            while True:
                size: int = struct.unpack(">i", await reader.readexactly(4))[0]
                frame = memoryview(await reader.readexactly(size))
                header = headers.pop(struct.unpack_from(">i", frame)[0])
                _, offset = decode_response_header(
                    frame, response_header_version(header.api_key, header.api_version)
                )
                body = decode_response_body(header.api_key, header.api_version, frame, offset)
                for chunk in encode_response(header, self.rewrite(header, body)):
                    assert isinstance(chunk, bytes | bytearray | memoryview)
                    writer.write(chunk)
                await writer.drain()


@asynccontextmanager
async def proxied_broker(
    broker_factory: BrokerFactory,
    rewrite: Rewrite | None = None,
    settings: Mapping[str, str] | None = None,
) -> AsyncIterator[RecordingProxy]:
    """A broker (with `settings`) advertising a proxy in front of it: clients bootstrapped at
    `proxy.port` talk to the broker only through it."""
    proxy = RecordingProxy(rewrite=rewrite)
    await proxy.start()
    advertised = {"advertised.listeners": f"PLAINTEXT://{HOST}:{proxy.port}"}
    broker = broker_factory({**(settings or {}), **advertised})
    proxy.target_port = broker.port
    try:
        yield proxy
    finally:
        await proxy.close()


class OffsetNotAvailable:
    """A rewrite: the first `answers` ListOffsets answers become OFFSET_NOT_AVAILABLE, what a
    new leader answers while its high watermark has not reached its epoch's start (KIP-207:
    brief and hard to hold)."""

    def __init__(self, answers: int) -> None:
        self.left = answers
        self.rewritten = 0

    def __call__(self, header: RequestHeader, body: ResponseBody) -> ResponseBody:
        if not isinstance(body, m.ListOffsetsResponse) or not self.left:
            return body
        self.left -= 1
        self.rewritten += 1
        for topic in body.topics:
            for partition in topic.partitions:
                partition.error_code = ErrorCode.OFFSET_NOT_AVAILABLE
                partition.offset = -1
        return body
