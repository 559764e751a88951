"""The asyncio TCP server of one listener: moves bytes between sockets and the sans-IO protocol
connection.

Per connection, one task reads, asks the `ServerConnection` for complete requests and handles them
one at a time, in order, as Kafka does. One exception: a handler may answer with a `Deferred`
response — an acks=all produce whose batches are appended and which now only waits for its
followers. The connection then reads and handles its next request while that one waits (so a
pipelining producer keeps several appends replicating at once instead of one per replication
round trip), and responses still leave strictly in request order (a deferred one is written by its
completion's callback: response_queue.py). Work is bounded per connection: one frame
(`socket.request.max.bytes`), one read, and RESPONSES_OWED_MAX deferred responses.

Record data in Fetch responses arrives as `FileRegion`s and is written with `loop.sendfile`, which
uses `os.sendfile` on plaintext sockets: the kernel copies segment bytes straight to the socket.
On TLS listeners the bytes must pass through the encryption, so a region is read into one
reused buffer and written from it (`_write_region_tls`): one copy out of the page cache, no
per-chunk allocation, no thread hop.

Connections are bounded broker-wide and per IP address (`ConnectionQuotas`, shared by every
listener), and a connection that sends no complete request for `connections.max.idle.ms` while
it is owed nothing is closed: that also ends a slow-loris client trickling a frame's bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from riverbed.broker.network.connection_waits import IdleClock
from riverbed.broker.network.response_queue import (
    Chunk,
    Deferred,
    Response,
    ResponseQueue,
    ResponseTimer,
)
from riverbed.common.log_events import FieldValue
from riverbed.common.log_events import event as log_event
from riverbed.protocol import messages as m
from riverbed.protocol.connection import (
    NEED_DATA,
    CloseConnection,
    RequestHeader,
    RequestReceived,
    ServerConnection,
    UnsupportedApiVersionsRequest,
    encode_response,
    encode_unsupported_api_versions,
    supported_api_versions,
)
from riverbed.protocol.messages import RequestBody
from riverbed.protocol.regions import FileRegion
from riverbed.security.limits import ConnectionQuotas
from riverbed.security.listeners import Listener
from riverbed.security.sasl_server import (
    SASL_RECEIVE_BYTES_MAX,
    Allow,
    Close,
    Decision,
    Respond,
    RespondAndClose,
    SaslServerAuthenticator,
)
from riverbed.security.session import ANONYMOUS, Session
from riverbed.security.tls import certificate_principal

log = logging.getLogger(__name__)

# One socket read; bounded so a flood of pipelined requests cannot grow a Python buffer unboundedly
# (the protocol object holds at most one frame beyond this).
READ_CHUNK_BYTES = 256 * 1024
# How long a clean shutdown waits for in-flight requests before closing connections.
SHUTDOWN_GRACE_S = 5.0
# Deferred responses one connection may owe before it stops reading: above a producer's
# max.in.flight.requests.per.connection (5 with idempotence), so producers never hit it. With
# the one request being handled, this bounds a connection's requests in flight.
RESPONSES_OWED_MAX = 16
# A TLS handshake not finished in this time is dropped (asyncio's default is 60 s); handshakes
# happen before a connection counts against max.connections, so keep it short.
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# Bytes a TLS listener reads from a segment per write: large enough to amortise the encryption
# call, small enough to keep one buffer per connection cheap.
TLS_REGION_CHUNK_BYTES = 256 * 1024
# Linux's TCP_CORK (absent elsewhere: responses then leave uncorked).
_TCP_CORK = getattr(socket, "TCP_CORK", None)

# A fresh SASL authenticator per connection of a SASL listener.
AuthenticatorFactory = Callable[[], SaslServerAuthenticator]
# (header, body, session): the session names the connection's principal and the peer's IP address
# (which Kafka reports for group members, DescribeGroups' client host).
RequestHandler = Callable[[RequestHeader, RequestBody, Session], Awaitable[Response | Deferred]]


@dataclass(frozen=True, slots=True)
class ServerLimits:
    socket_request_max_bytes: int = 100 * 1024 * 1024
    idle_ms_max: int = 600_000  # connections.max.idle.ms


class KafkaServer:
    """Accepts connections on one listener and serves each with `handle_request`."""

    def __init__(
        self,
        listener: Listener,
        handle_request: RequestHandler,
        limits: ServerLimits,
        quotas: ConnectionQuotas,
        *,
        ssl_context: ssl.SSLContext | None = None,
        authenticators: AuthenticatorFactory | None = None,
        response_sent: ResponseTimer | None = None,
    ) -> None:
        if listener.protocol.uses_tls != (ssl_context is not None):
            raise ValueError(f"listener {listener.name} ({listener.protocol.value}): TLS mismatch")
        if listener.protocol.uses_sasl != (authenticators is not None):
            raise ValueError(f"listener {listener.name} ({listener.protocol.value}): SASL mismatch")
        self._authenticators = authenticators
        self._response_sent = response_sent
        self.listener = listener
        self._host = listener.host
        self._port = listener.port
        self._handle_request = handle_request
        self._limits = limits
        self._quotas = quotas
        self._ssl_context = ssl_context
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        # Every connection's reader: a shutdown ends each one's input, so connections stop
        # after the requests they are serving.
        self._readers: dict[asyncio.Task[None], asyncio.StreamReader] = {}
        self._stopping = False

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._on_connect,
            self._host,
            self._port,
            reuse_address=True,
            ssl=self._ssl_context,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if self._ssl_context else None,
        )

    async def stop(self) -> None:
        """Stop accepting, end every connection's input, give the requests being served a grace
        period to be answered, then close every connection."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for reader in self._readers.values():
            reader.feed_eof()  # a pending read returns end-of-stream
        if self._connections:
            _, pending = await asyncio.wait(set(self._connections), timeout=SHUTDOWN_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client_host = str(peer[0]) if isinstance(peer, tuple) else ""
        refused = self._quotas.admit(client_host)
        if refused is not None:
            self._log_client(logging.WARNING, "client.connection_refused", peer, reason=refused)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._readers[task] = reader
        try:
            await self._serve(reader, writer, self._session(writer, client_host))
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            log.debug("connection from %s ended: %s", peer, exc)
        except Exception:
            # A bug in a handler must cost one connection, never the broker.
            log.exception("closing connection from %s after an unexpected error", peer)
        finally:
            self._quotas.release(client_host)
            self._connections.discard(task)
            self._readers.pop(task, None)
            writer.close()
        # After the finally, not in it: see LeaderFetcher._run on mypyc and awaits in except or
        # finally blocks. A cancelled connection skips this wait; its transport is closed anyway.
        with contextlib.suppress(Exception):
            await writer.wait_closed()

    def _timed(self, request_type: str, received_s: float) -> None:
        if self._response_sent is not None:
            self._response_sent(request_type, time.perf_counter() - received_s)

    def _session(self, writer: asyncio.StreamWriter, client_host: str) -> Session:
        """The connection's identity before any SASL exchange: a TLS client certificate's
        subject on TLS listeners (Kafka's default principal builder), else ANONYMOUS."""
        principal = ANONYMOUS
        if self._ssl_context is not None:
            principal = certificate_principal(writer.get_extra_info("peercert"))
        return Session(principal, client_host, self.listener.name, self.listener.protocol)

    def _log_idle(self, peer: object) -> None:
        self._log_client(
            logging.INFO, "client.connection_idle", peer, idle_ms=self._limits.idle_ms_max
        )

    def _log_client(self, level: int, name: str, peer: object, **fields: FieldValue) -> None:
        """A structured event about one client connection of this listener."""
        log_event(log, level, name, client=str(peer), listener=self.listener.name, **fields)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session: Session
    ) -> None:
        connection = ServerConnection(max_frame_bytes=self._limits.socket_request_max_bytes)
        authenticator = None if self._authenticators is None else self._authenticators()
        if authenticator is not None:
            # Kafka's sasl.server.max.receive.size: small frames until the client is known.
            connection.limit_frame_bytes(SASL_RECEIVE_BYTES_MAX)
        peer = writer.get_extra_info("peername")
        authenticated = False
        idle = IdleClock(reader, self._limits.idle_ms_max / 1000, lambda: len(owed) > 0)
        owed = ResponseQueue(writer, idle, self._timed)  # deferred responses, in order
        try:
            while True:
                event = connection.next_event()
                if event is NEED_DATA:
                    if self._stopping:
                        break
                    # Deferred responses are written by their callbacks meanwhile, so only the
                    # client's bytes are awaited here.
                    idle.waiting = True
                    data = await reader.read(READ_CHUNK_BYTES)
                    idle.waiting = False
                    if not data:
                        break
                    connection.receive_data(data)
                elif isinstance(event, RequestReceived):
                    idle.touch()
                    if authenticator is not None and _sasl_gated(authenticator, event):
                        decision = await _decide(authenticator, event)
                        if not isinstance(decision, Allow):
                            await owed.drained()
                            if isinstance(decision, Respond | RespondAndClose):
                                await _write_response(
                                    writer, encode_response(event.header, decision.body)
                                )
                            if isinstance(decision, RespondAndClose | Close):
                                self._log_client(
                                    logging.WARNING,
                                    "client.authentication_failed",
                                    peer,
                                    reason=decision.reason,
                                )
                                break
                            if authenticator.principal is not None and not authenticated:
                                authenticated = True
                                session = dataclasses.replace(
                                    session, principal=authenticator.principal
                                )
                                connection.limit_frame_bytes(self._limits.socket_request_max_bytes)
                            continue
                    received_s = time.perf_counter()
                    request_type = type(event.body).__name__
                    outcome = await self._handle_request(event.header, event.body, session)
                    if isinstance(outcome, Deferred):
                        owed.add(outcome, request_type, received_s)
                        await owed.wait_below(RESPONSES_OWED_MAX)
                    else:
                        await owed.drained()  # earlier requests answer first
                        await _write_response(writer, outcome)
                        self._timed(request_type, received_s)
                        # A fetch long-polled past connections.max.idle.ms was activity until
                        # now: the idle clock starts from its answer, not from its request.
                        idle.touch()
                elif isinstance(event, UnsupportedApiVersionsRequest):
                    await owed.drained()
                    writer.write(
                        encode_unsupported_api_versions(
                            event.correlation_id, supported_api_versions()
                        )
                    )
                    await writer.drain()
                elif isinstance(event, CloseConnection):
                    self._log_client(
                        logging.WARNING, "client.connection_closed", peer, reason=event.reason
                    )
                    break
                else:  # pragma: no cover - the protocol object returns only the events above
                    raise TypeError(f"unexpected protocol event {event!r}")
            await owed.drained()  # answer what was accepted before the end
            if idle.expired:
                self._log_idle(peer)
        finally:
            idle.cancel()
            owed.cancel()


async def _write_response(writer: asyncio.StreamWriter, response: Response) -> None:
    if response is not None:
        await write_chunks(writer, response)


async def write_chunks(writer: asyncio.StreamWriter, chunks: list[Chunk]) -> None:
    """Write a response: bytes through the transport, file regions with sendfile (or, on TLS,
    through one reused buffer).

    Every region is closed afterwards whatever happens: its fd was duplicated for this response.
    """
    loop = asyncio.get_running_loop()
    tls = writer.get_extra_info("sslcontext") is not None
    buffer: bytearray | None = None
    corked = not tls and len(chunks) > 1 and _cork(writer.transport, True)
    try:
        for index, chunk in enumerate(chunks):
            if isinstance(chunk, FileRegion):
                if chunk.size == 0:
                    continue
                if tls:
                    buffer = buffer or bytearray(min(chunk.size, TLS_REGION_CHUNK_BYTES))
                    await _write_region_tls(writer, chunk, buffer)
                    continue
                # The region owns its fd (closed below); the file object only borrows it.
                # loop.sendfile seeks the fd, which is harmless: the log appends with O_APPEND
                # and reads with pread, never through the shared file offset.
                if writer.transport.is_closing():
                    # The client went away (loop.sendfile raises a bare RuntimeError for that).
                    raise ConnectionResetError("the client closed the connection")
                sent = _sendfile_now(writer.transport, chunk)
                if sent < chunk.size:  # the socket is full: let the loop wait for room
                    with os.fdopen(chunk.fd, "rb", buffering=0, closefd=False) as file:
                        await loop.sendfile(
                            writer.transport, file, chunk.position + sent, chunk.size - sent
                        )
            else:
                writer.write(chunk)
                # Only drain before a sendfile or at the end: small writes coalesce in the buffer.
                if index == len(chunks) - 1:
                    await writer.drain()
    finally:
        if corked:
            _cork(writer.transport, False)
        for chunk in chunks:
            if isinstance(chunk, FileRegion):
                chunk.close()


def _cork(transport: asyncio.WriteTransport, on: bool) -> bool:
    """Hold back the socket's partial segments (TCP_CORK), or send them: False where that is not
    possible (not Linux, or no socket left).

    A fetch response is its header bytes, a file region sent with sendfile and a few trailing
    bytes (tagged fields). Uncorked, each leaves as a segment of its own, and on loopback each
    segment is delivered (and its reader woken) inside the sending system call: corked, one
    delivery per response. Two setsockopt calls cost less than the two deliveries they save."""
    sock = transport.get_extra_info("socket")
    if _TCP_CORK is None or sock is None or (on and transport.is_closing()):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CORK, 1 if on else 0)
    except OSError:  # the peer is gone: the write that follows reports it
        return False
    return True


def _sendfile_now(transport: asyncio.WriteTransport, region: FileRegion) -> int:
    """Send what the socket takes of `region` right now; the bytes sent.

    asyncio's loop.sendfile always waits for the socket to be writable once more after its
    os.sendfile, even when everything went: a loop iteration, four epoll and lseek calls and
    its reading paused for each region, which is the time a follower waits for the records an
    acks=all produce waits for. With nothing queued in the transport (else those bytes go
    first, and loop.sendfile waits for them) the region goes straight to the socket, and only a
    full socket falls back to the loop.
    """
    if transport.get_write_buffer_size():
        return 0
    fd = transport.get_extra_info("socket").fileno()
    sent = 0
    with contextlib.suppress(BlockingIOError):
        while sent < region.size:
            just_sent = os.sendfile(fd, region.fd, region.position + sent, region.size - sent)
            if just_sent == 0:  # the file ends early: loop.sendfile meets the same end
                break
            sent += just_sent
    return sent


async def _write_region_tls(
    writer: asyncio.StreamWriter, region: FileRegion, buffer: bytearray
) -> None:
    """A file region through a TLS transport: pread into `buffer`, encrypt from it, repeat.

    The SSL transport encrypts what `write` is given before returning (asyncio's own sendfile
    fallback relies on the same), so the buffer can be refilled once the transport drained.
    """
    view = memoryview(buffer)
    position, remaining = region.position, region.size
    while remaining > 0:
        if writer.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        read = os.preadv(region.fd, [view[: min(remaining, len(view))]], position)
        if read == 0:
            # The segment is shorter than the region the handler measured: a truncation raced
            # the read. The frame's length is already on the wire, so the connection must end.
            raise ConnectionAbortedError(f"segment ended {remaining} bytes early")
        writer.write(view[:read])
        await writer.drain()
        position += read
        remaining -= read


async def _decide(authenticator: SaslServerAuthenticator, event: RequestReceived) -> Decision:
    """The authenticator's decision. A SASL token is evaluated in a worker thread: PLAIN runs
    a PBKDF2 per login (2 to 9 ms), which must not stall every other connection's requests.
    The authenticator is only used by this connection's task, one request at a time."""
    version = event.header.api_version
    if isinstance(event.body, m.SaslAuthenticateRequest):
        return await asyncio.to_thread(authenticator.receive, event.body, version)
    return authenticator.receive(event.body, version)


def _sasl_gated(authenticator: SaslServerAuthenticator, event: RequestReceived) -> bool:
    """Whether the authenticator decides on this request: every request until the connection is
    authenticated, and SASL requests after (they get ILLEGAL_SASL_STATE)."""
    if not authenticator.authenticated:
        return True
    return isinstance(event.body, m.SaslHandshakeRequest | m.SaslAuthenticateRequest)
