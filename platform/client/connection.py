"""One asyncio connection to one broker: version negotiation and pipelined requests.

Version negotiation lives here and only here: the connection sends ApiVersions once, keeps the
broker's ranges, and `request()` encodes each body at the highest version both sides support.
Responses are matched to requests by correlation id by a single reader task owned by the
connection; `close()` stops it and fails whatever is still waiting.

The connection's life is `state` (an explicit enum, changed only in `_shut`): OPEN until it is
closed locally, the broker hangs up, the broker's bytes stop making sense, or a request times
out (as Kafka's clients do: a response that never came leaves the stream's state unknown). Then
it is CLOSED for good, every waiting request fails with ConnectionClosedError, and the
close callbacks run (the pool drops it and marks metadata stale).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from riverbed.errors import error_for
from riverbed.protocol import messages as m
from riverbed.protocol.connection import (
    NEED_DATA,
    ClientConnection,
    ResponseReceived,
    supported_api_versions,
)
from riverbed.protocol.errors import ErrorCode, KafkaError, ProtocolDecodeError
from riverbed.protocol.messages import RequestBody
from riverbed.security.client import PLAINTEXT, ConnectionSecurity, SaslCredentials
from riverbed.security.sasl_client import client_mechanism
from riverbed.security.scram import SaslClientError

READ_CHUNK_BYTES = 256 * 1024
# Requests written but not yet answered on one connection (Kafka's
# max.in.flight.requests.per.connection default is 5; admin traffic needs few).
IN_FLIGHT_REQUESTS_MAX = 16

ResponseT = TypeVar("ResponseT")
SASL_HANDSHAKE_KEY = m.SaslHandshakeRequest.API_KEY
SASL_AUTHENTICATE_KEY = m.SaslAuthenticateRequest.API_KEY


class ConnectionClosedError(ConnectionError):
    """The broker closed the connection, or it was closed locally."""


class ConnectionState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class BrokerConnection:
    """A negotiated connection; create with `await BrokerConnection.open(...)`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client_id: str,
        address: tuple[str, int] = ("", 0),
    ) -> None:
        self.address = address
        self.state = ConnectionState.OPEN
        self.close_reason: str | None = None
        self._reader = reader
        self._writer = writer
        self._protocol = ClientConnection(client_id=client_id)
        # correlation id -> (the response's future, the loop time it is late at, the request's
        # name and timeout for the error)
        self._pending: dict[int, tuple[asyncio.Future[Any], float, str, int]] = {}
        # Goes off at the earliest deadline armed (see _write); None while nothing waits.
        self._deadline_timer: asyncio.TimerHandle | None = None
        # acks=0 produce requests waiting for a full socket to drain (see _write).
        self._draining: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(IN_FLIGHT_REQUESTS_MAX)
        self._versions: dict[int, int] = {}  # api key -> negotiated version
        self._close_callbacks: list[Callable[[BrokerConnection], None]] = []
        self._reader_task = asyncio.create_task(self._read_loop(), name="broker-connection-reader")

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        client_id: str = "riverbed",
        timeout_ms: int = 10_000,
        security: ConnectionSecurity = PLAINTEXT,
    ) -> BrokerConnection:
        """Connect (with TLS if `security` says so), negotiate versions with ApiVersions, and
        authenticate with SASL if `security` says so; `timeout_ms` bounds each step."""
        async with asyncio.timeout(timeout_ms / 1000):
            reader, writer = await asyncio.open_connection(
                host,
                port,
                ssl=security.ssl_context,
                server_hostname=host if security.ssl_context is not None else None,
            )
        connection = cls(reader, writer, client_id, (host, port))
        try:
            response = await connection._send(m.ApiVersionsRequest(), 0, timeout_ms)
            if response.error_code != ErrorCode.NONE:
                raise KafkaError(ErrorCode(response.error_code), "ApiVersions failed")
            connection._negotiate(
                {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
            )
            if security.sasl is not None:
                await connection._authenticate(security.sasl, timeout_ms)
        except BaseException:
            await connection.close()
            raise
        return connection

    async def _authenticate(self, credentials: SaslCredentials, timeout_ms: int) -> None:
        """SaslHandshake v1, then SaslAuthenticate until the mechanism completes (KIP-152).
        AuthenticationError if the broker refuses; the connection is then unusable."""
        if not (self.supports(SASL_HANDSHAKE_KEY) and self.supports(SASL_AUTHENTICATE_KEY)):
            raise error_for(
                ErrorCode.UNSUPPORTED_SASL_MECHANISM,
                f"{self.address[0]}:{self.address[1]} does not speak SASL (SaslHandshake v1 and "
                "SaslAuthenticate): is it a SASL listener?",
            )
        mechanism = client_mechanism(
            credentials.mechanism, credentials.username, credentials.password
        )
        handshake = await self._send(
            m.SaslHandshakeRequest(mechanism=mechanism.name),
            self.version_for(SASL_HANDSHAKE_KEY),
            timeout_ms,
        )
        if handshake.error_code != ErrorCode.NONE:
            offered = ", ".join(handshake.mechanisms) or "none"
            raise error_for(
                ErrorCode(handshake.error_code),
                f"the broker refused SASL mechanism {mechanism.name} (it offers {offered})",
            )
        token: bytes | None = mechanism.initial_response()
        while token is not None:
            answer = await self._send(
                m.SaslAuthenticateRequest(auth_bytes=token),
                self.version_for(SASL_AUTHENTICATE_KEY),
                timeout_ms,
            )
            if answer.error_code != ErrorCode.NONE:
                raise error_for(
                    ErrorCode(answer.error_code),
                    answer.error_message or f"SASL {mechanism.name} authentication failed",
                )
            try:
                token = mechanism.evaluate_challenge(bytes(answer.auth_bytes))
            except SaslClientError as error:
                raise error_for(ErrorCode.SASL_AUTHENTICATION_FAILED, str(error)) from None

    @property
    def closed(self) -> bool:
        return self.state is ConnectionState.CLOSED

    @property
    def in_flight_count(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._pending)

    def _negotiate(self, broker_versions: dict[int, tuple[int, int]]) -> None:
        """Keep the highest common version of each API both sides implement (once: it is looked
        up for every request)."""
        self._versions = {}
        for api_key, (low, high) in supported_api_versions().items():
            theirs = broker_versions.get(api_key)
            if theirs is not None and max(low, theirs[0]) <= min(high, theirs[1]):
                self._versions[api_key] = min(high, theirs[1])

    def supports(self, api_key: int) -> bool:
        """Whether the broker and this client share a version of `api_key`."""
        return api_key in self._versions

    def version_for(self, api_key: int) -> int:
        """The highest version of `api_key` both this client and the broker implement."""
        version = self._versions.get(api_key)
        if version is None:
            raise KafkaError(
                ErrorCode.UNSUPPORTED_VERSION, f"no common version for API key {api_key}"
            )
        return version

    def add_close_callback(self, callback: Callable[[BrokerConnection], None]) -> None:
        """Call `callback(self)` once when the connection closes (at once if it already has)."""
        if self.closed:
            callback(self)
        else:
            self._close_callbacks.append(callback)

    async def request(self, body: RequestBody, *, timeout_ms: int = 30_000) -> Any:
        """Send `body` at the negotiated version and return the decoded response body.

        A ProduceRequest with acks=0 gets no response: this returns None once it is written.
        """
        return await self._send(body, self.version_for(body.API_KEY), timeout_ms)

    async def call(
        self, body: RequestBody, response_type: type[ResponseT], *, timeout_ms: int = 30_000
    ) -> ResponseT:
        """`request()` typed: the response must be a `response_type`."""
        response = await self.request(body, timeout_ms=timeout_ms)
        if not isinstance(response, response_type):
            raise ProtocolDecodeError(
                f"expected {response_type.__name__}, got {type(response).__name__}"
            )
        return response

    async def close(self) -> None:
        self._shut("closed locally")
        if self._reader_task is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    def send_nowait(self, body: RequestBody, *, timeout_ms: int) -> asyncio.Future[Any]:
        """Write `body` at the negotiated version now and return the future of its response.

        For a caller that bounds its own requests in flight (the producer's sender, at
        max.in.flight.requests.per.connection): no slot, no drain and no task per request, and
        requests leave in call order. A ProduceRequest with acks=0 gets no response: its future
        resolves to None once the socket took the bytes (at once, unless the transport holds
        more than its high-water mark). The future fails with ConnectionClosedError if the
        connection closes first, and with TimeoutError after `timeout_ms` (the connection is
        then shut, as after a request() that timed out).
        """
        return self._write(body, self.version_for(body.API_KEY), timeout_ms)[1]

    async def _send(self, body: RequestBody, version: int, timeout_ms: int) -> Any:
        async with self._slots:
            correlation_id, future = self._write(body, version, timeout_ms)
            try:
                try:
                    await self._writer.drain()
                except OSError as error:
                    self._shut(f"write failed: {error}")
                    raise ConnectionClosedError(f"connection closed: {error}") from error
                return await future
            finally:
                self._forget(correlation_id)

    def _write(
        self, body: RequestBody, version: int, timeout_ms: int
    ) -> tuple[int, asyncio.Future[Any]]:
        """Frame and write `body`; its response (or its timeout) resolves the future."""
        if self.closed:
            raise ConnectionClosedError(f"connection closed: {self.close_reason}")
        loop = asyncio.get_running_loop()
        correlation_id, data = self._protocol.send_request(body, version)
        future: asyncio.Future[Any] = loop.create_future()
        if isinstance(body, m.ProduceRequest) and body.acks == 0:
            self._writer.write(data)
            # Done once written, and written means the socket took it: past the transport's
            # high-water mark it is done when drained, so a full socket still holds the caller
            # back (its requests in flight stay counted until then).
            transport = self._writer.transport
            if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]:
                future.set_result(None)
            else:
                drained = loop.create_task(self._writer.drain())
                self._draining.add(drained)
                drained.add_done_callback(functools.partial(self._drained, future))
            return correlation_id, future
        deadline = loop.time() + timeout_ms / 1000
        self._pending[correlation_id] = (future, deadline, type(body).__name__, timeout_ms)
        # One timer for all requests, not one each: it is only moved earlier, and when it goes
        # off it times out what is late and re-arms for what is not.
        timer = self._deadline_timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._deadline_timer = loop.call_at(deadline, self._check_deadlines)
        self._writer.write(data)
        return correlation_id, future

    def _drained(self, future: asyncio.Future[None], drained: asyncio.Task[None]) -> None:
        self._draining.discard(drained)
        if future.done():
            return
        if drained.cancelled():
            future.set_exception(ConnectionClosedError(f"connection closed: {self.close_reason}"))
        elif (error := drained.exception()) is not None:
            self._shut(f"write failed: {error}")
            future.set_exception(ConnectionClosedError(f"connection closed: {error}"))
        else:
            future.set_result(None)

    def _check_deadlines(self) -> None:
        self._deadline_timer = None
        now = asyncio.get_running_loop().time()
        for future, deadline, request_name, timeout_ms in self._pending.values():
            if deadline <= now:
                # As Kafka's clients do: after a response that never came the stream's state
                # is unknown, so the connection is shut and every other request fails with it.
                reason = f"no response to {request_name} within {timeout_ms} ms"
                if not future.done():
                    future.set_exception(TimeoutError(reason))
                self._shut(reason)
                return
        if self._pending:
            earliest = min(entry[1] for entry in self._pending.values())
            self._deadline_timer = asyncio.get_running_loop().call_at(
                earliest, self._check_deadlines
            )

    def _forget(self, correlation_id: int) -> None:
        """Stop waiting for a response (its caller gave up, e.g. was cancelled)."""
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
                    entry = self._pending.pop(event.correlation_id, None)
                    if entry is not None:
                        future = entry[0]
                        if not future.done():
                            future.set_result(event.body)
        except (OSError, ProtocolDecodeError) as error:
            self._shut(str(error) or type(error).__name__)

    def _shut(self, reason: str) -> None:
        """The one place the state changes: OPEN -> CLOSED, synchronously; every request still
        waiting fails with ConnectionClosedError."""
        if self.closed:
            return
        self.state = ConnectionState.CLOSED
        self.close_reason = reason
        if self._reader_task is not asyncio.current_task():
            self._reader_task.cancel()
        error = ConnectionClosedError(f"connection to {self.address} closed: {reason}")
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        pending, self._pending = self._pending, {}
        for future, *_ in pending.values():
            if not future.done():
                future.set_exception(error)
        for drained in self._draining:
            drained.cancel()  # its acks=0 request fails in _drained
        self._writer.close()
        callbacks, self._close_callbacks = self._close_callbacks, []
        for callback in callbacks:
            callback(self)
