"""One asyncio connection to one broker: version negotiation and pipelined requests.

Version negotiation lives here and only here: the connection sends ApiVersions once, keeps the
broker's ranges, and `request()` encodes each body at the highest version both sides support.
Responses are matched to requests by correlation id by a single reader task owned by the
connection; `close()` stops it and fails whatever is still waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from riverbed.protocol import messages as m
from riverbed.protocol.connection import (
    NEED_DATA,
    ClientConnection,
    ResponseReceived,
    supported_api_versions,
)
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.messages import RequestBody

READ_CHUNK_BYTES = 256 * 1024
# Requests written but not yet answered on one connection (Kafka's
# max.in.flight.requests.per.connection default is 5; admin traffic needs few).
IN_FLIGHT_REQUESTS_MAX = 16


class ConnectionClosedError(ConnectionError):
    """The broker closed the connection, or it was closed locally."""


class BrokerConnection:
    """A negotiated connection; create with `await BrokerConnection.open(...)`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client_id: str,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._protocol = ClientConnection(client_id=client_id)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._slots = asyncio.Semaphore(IN_FLIGHT_REQUESTS_MAX)
        self._broker_versions: dict[int, tuple[int, int]] = {}
        self._reader_task = asyncio.create_task(self._read_loop(), name="broker-connection-reader")
        self._closed = False

    @classmethod
    async def open(
        cls, host: str, port: int, *, client_id: str = "riverbed", timeout_ms: int = 10_000
    ) -> BrokerConnection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), timeout_ms / 1000
        )
        connection = cls(reader, writer, client_id)
        try:
            response = await connection._send(m.ApiVersionsRequest(), 0, timeout_ms)
            if response.error_code != ErrorCode.NONE:
                raise KafkaError(ErrorCode(response.error_code), "ApiVersions failed")
            connection._broker_versions = {
                k.api_key: (k.min_version, k.max_version) for k in response.api_keys
            }
        except BaseException:
            await connection.close()
            raise
        return connection

    def version_for(self, api_key: int) -> int:
        """The highest version of `api_key` both this client and the broker implement."""
        ours = supported_api_versions().get(api_key)
        theirs = self._broker_versions.get(api_key)
        if ours is None or theirs is None or max(ours[0], theirs[0]) > min(ours[1], theirs[1]):
            raise KafkaError(
                ErrorCode.UNSUPPORTED_VERSION, f"no common version for API key {api_key}"
            )
        return min(ours[1], theirs[1])

    async def request(self, body: RequestBody, *, timeout_ms: int = 30_000) -> Any:
        """Send `body` at the negotiated version and return the decoded response body."""
        return await self._send(body, self.version_for(body.API_KEY), timeout_ms)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task
        self._fail_pending(ConnectionClosedError("connection closed"))
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    async def _send(self, body: RequestBody, version: int, timeout_ms: int) -> Any:
        if self._closed:
            raise ConnectionClosedError("connection closed")
        async with self._slots:
            correlation_id, data = self._protocol.send_request(body, version)
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._pending[correlation_id] = future
            try:
                self._writer.write(data)
                await self._writer.drain()
                return await asyncio.wait_for(future, timeout_ms / 1000)
            finally:
                self._pending.pop(correlation_id, None)

    async def _read_loop(self) -> None:
        try:
            while True:
                event = self._protocol.next_response()
                if event is NEED_DATA:
                    data = await self._reader.read(READ_CHUNK_BYTES)
                    if not data:
                        raise ConnectionClosedError("broker closed the connection")
                    self._protocol.receive_data(data)
                elif isinstance(event, ResponseReceived):
                    future = self._pending.get(event.correlation_id)
                    if future is not None and not future.done():
                        future.set_result(event.body)
        except (ConnectionError, OSError) as error:
            self._fail_pending(error)

    def _fail_pending(self, error: BaseException) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
