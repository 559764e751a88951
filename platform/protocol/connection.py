"""Per-connection protocol state machines, h11-style: bytes in, events out, no I/O.

The server side turns received bytes into `RequestReceived` events, and `encode_response` turns
responses into chunk lists (bytes and file regions, frame prefix included); the client side
assigns correlation ids, frames requests and matches responses to them (Kafka answers the
requests of one connection in order).

    conn = ServerConnection()
    conn.receive_data(data)
    while (event := conn.next_event()) is not NEED_DATA: ...
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Final, Literal

from riverbed.protocol.codec import (
    API_VERSIONS_KEY,
    RequestHeader,
    api_specs,
    decode_request_body,
    decode_request_header,
    decode_response_body,
    decode_response_header,
    encode_request_header,
    encode_response_header,
    request_header_version,
    response_header_version,
    write_request_body,
    write_response_body,
)
from riverbed.protocol.errors import ErrorCode, ProtocolDecodeError, ProtocolEncodeError
from riverbed.protocol.messages import (
    ApiVersionsResponse,
    ProduceRequest,
    RequestBody,
    ResponseBody,
)
from riverbed.protocol.primitives import FRAME_PREFIX_BYTES, INT16, INT32, Chunk, Output
from riverbed.protocol.regions import FileRegion

__all__ = [
    "NEED_DATA",
    "ClientConnection",
    "CloseConnection",
    "NeedData",
    "RequestHeader",
    "RequestReceived",
    "ResponseReceived",
    "ServerConnection",
    "UnsupportedApiVersionsRequest",
    "encode_response",
    "encode_unsupported_api_versions",
    "supported_api_versions",
]

# Kafka's socket.request.max.bytes default: the largest request frame a broker accepts.
REQUEST_FRAME_BYTES_MAX: Final = 100 * 1024 * 1024
# A client accepts larger frames: a fetch response can carry fetch.max.bytes plus overhead.
RESPONSE_FRAME_BYTES_MAX: Final = 256 * 1024 * 1024
# api_key int16 + api_version int16 + correlation_id int32: needed to answer or route anything.
REQUEST_HEADER_PREFIX_BYTES: Final = 8
# Correlation ids are int32; the client wraps around instead of overflowing.
CORRELATION_ID_MAX: Final = 2**31 - 1


class NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA


@dataclass(frozen=True, slots=True)
class RequestReceived:
    header: RequestHeader
    body: RequestBody


@dataclass(frozen=True, slots=True)
class UnsupportedApiVersionsRequest:
    """An ApiVersions request of a version we do not know (KIP-511): answer it with
    `encode_unsupported_api_versions` (error UNSUPPORTED_VERSION, in a v0 body)."""

    correlation_id: int
    api_version: int


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """The peer broke the protocol; close the socket. The connection stays closed."""

    reason: str


@dataclass(frozen=True, slots=True)
class ResponseReceived:
    correlation_id: int
    body: ResponseBody


ServerEvent = RequestReceived | UnsupportedApiVersionsRequest | CloseConnection


def supported_api_versions() -> dict[int, tuple[int, int]]:
    """Every API key we serve with its (min, max) version: what ApiVersions advertises."""
    return {key: (spec.min_version, spec.max_version) for key, spec in sorted(api_specs().items())}


def encode_response(header: RequestHeader, body: ResponseBody) -> list[Chunk]:
    """The response frame to the request `header`: bytes and file regions to send in order."""
    if header.api_key != body.API_KEY:
        raise ProtocolEncodeError(
            f"{type(body).__name__} answers api key {body.API_KEY}, not {header.api_key}"
        )
    out = Output(framed=True)
    header_version = response_header_version(header.api_key, header.api_version)
    encode_response_header(out, header.correlation_id, header_version)
    write_response_body(out, body, header.api_version)
    return out.chunks()


def encode_unsupported_api_versions(
    correlation_id: int, api_ranges: dict[int, tuple[int, int]]
) -> bytes:
    """KIP-511: UNSUPPORTED_VERSION with our version ranges, in a v0 body and v0 header, which
    every client can read whatever ApiVersions version it asked for."""
    body = ApiVersionsResponse(
        error_code=ErrorCode.UNSUPPORTED_VERSION,
        api_keys=[
            ApiVersionsResponse.ApiVersion(key, low, high)
            for key, (low, high) in sorted(api_ranges.items())
        ],
    )
    out = Output(framed=True)
    encode_response_header(out, correlation_id, 0)
    write_response_body(out, body, 0)
    return b"".join(_memory_chunks(out.chunks()))


class _FrameError(Exception):
    pass


class _FrameBuffer:
    """Splits a byte stream into size-prefixed frames.

    Each frame handed out lives in its own bytearray that this object never touches again, so a
    memoryview into it (and a `records` slice of it) stays valid and writable while the request
    is processed, however much more data arrives.
    """

    def __init__(self, frame_bytes_max: int) -> None:
        if frame_bytes_max <= 0:
            raise ValueError(f"frame_bytes_max must be positive, got {frame_bytes_max}")
        self.frame_bytes_max = frame_bytes_max
        self._buffer = bytearray()
        self._position = 0  # the start of the next frame in _buffer

    def feed(self, data: bytes) -> None:
        if self._position:  # drop consumed frames before growing the buffer
            del self._buffer[: self._position]
            self._position = 0
        self._buffer += data

    def next_frame(self) -> memoryview | None:
        """The next whole frame without its size prefix, or None until more data arrives."""
        start = self._position
        available = len(self._buffer) - start
        if available < FRAME_PREFIX_BYTES:
            return None
        # Judge the size from the prefix alone, before buffering or allocating the frame.
        size: int = INT32.unpack_from(self._buffer, start)[0]
        if size < 0 or size > self.frame_bytes_max:
            raise _FrameError(f"frame size {size} outside 0..{self.frame_bytes_max}")
        end = start + FRAME_PREFIX_BYTES + size
        if end > len(self._buffer):
            return None
        if start == 0 and end == len(self._buffer):
            # The buffer holds exactly this frame (the usual case): hand it over without a copy.
            frame = self._buffer
            self._buffer = bytearray()
            self._position = 0
            return memoryview(frame)[FRAME_PREFIX_BYTES:]
        self._position = end
        return memoryview(self._buffer[start + FRAME_PREFIX_BYTES : end])


class ServerConnection:
    """The broker's side of one client connection."""

    def __init__(self, max_frame_bytes: int = REQUEST_FRAME_BYTES_MAX) -> None:
        self._frames = _FrameBuffer(max_frame_bytes)
        self._closed: CloseConnection | None = None

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def limit_frame_bytes(self, max_frame_bytes: int) -> None:
        """Change the largest frame accepted from now on (a SASL listener allows only small
        frames until the connection is authenticated)."""
        if max_frame_bytes <= 0:
            raise ValueError(f"max_frame_bytes must be positive, got {max_frame_bytes}")
        self._frames.frame_bytes_max = max_frame_bytes

    def receive_data(self, data: bytes) -> None:
        if self._closed is None:
            self._frames.feed(data)

    def next_event(self) -> ServerEvent | Literal[NeedData.NEED_DATA]:
        if self._closed is not None:
            return self._closed
        try:
            frame = self._frames.next_frame()
        except _FrameError as exc:
            return self._close(str(exc))
        if frame is None:
            return NEED_DATA
        return self._parse_request(frame)

    def _parse_request(self, frame: memoryview) -> ServerEvent:
        if len(frame) < REQUEST_HEADER_PREFIX_BYTES:
            return self._close(f"frame of {len(frame)} bytes is too short for a request header")
        api_key: int = INT16.unpack_from(frame, 0)[0]
        api_version: int = INT16.unpack_from(frame, 2)[0]
        spec = api_specs().get(api_key)
        if spec is None:
            return self._close(f"unknown api key {api_key}")
        if not spec.supports(api_version):
            if api_key == API_VERSIONS_KEY:
                correlation_id: int = INT32.unpack_from(frame, 4)[0]
                return UnsupportedApiVersionsRequest(correlation_id, api_version)
            return self._close(f"unsupported version {api_version} of {spec.name}")
        try:
            header, offset = decode_request_header(
                frame, request_header_version(api_key, api_version)
            )
            body = decode_request_body(api_key, api_version, frame, offset)
        except ProtocolDecodeError as exc:
            return self._close(f"malformed {spec.name} v{api_version} request: {exc}")
        return RequestReceived(header, body)

    def _close(self, reason: str) -> CloseConnection:
        self._closed = CloseConnection(reason)
        return self._closed


class ClientConnection:
    """A client's side of one broker connection."""

    def __init__(
        self, client_id: str | None, max_frame_bytes: int = RESPONSE_FRAME_BYTES_MAX
    ) -> None:
        self.client_id = client_id
        self._frames = _FrameBuffer(max_frame_bytes)
        self._next_correlation_id = 0
        # (correlation id, api key, api version) of each request awaiting its response, in order.
        self._in_flight: deque[tuple[int, int, int]] = deque()

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    def send_request(self, body: RequestBody, api_version: int) -> tuple[int, bytes]:
        """Frame `body` as `api_version`; returns its correlation id and the bytes to send."""
        spec = api_specs()[body.API_KEY]
        if not spec.supports(api_version):
            raise ProtocolEncodeError(f"{spec.name} v{api_version} is not supported")
        correlation_id = self._next_correlation_id
        header = RequestHeader(body.API_KEY, api_version, correlation_id, self.client_id)
        out = Output(framed=True)
        encode_request_header(out, header, request_header_version(body.API_KEY, api_version))
        write_request_body(out, body, api_version)
        data = b"".join(_memory_chunks(out.chunks()))
        self._next_correlation_id = (correlation_id + 1) % (CORRELATION_ID_MAX + 1)
        # A produce request with acks=0 gets no response at all.
        if not (isinstance(body, ProduceRequest) and body.acks == 0):
            self._in_flight.append((correlation_id, body.API_KEY, api_version))
        return correlation_id, data

    def receive_data(self, data: bytes) -> None:
        self._frames.feed(data)

    def next_response(self) -> ResponseReceived | Literal[NeedData.NEED_DATA]:
        """The next response, or NEED_DATA; raises ProtocolDecodeError if the broker's bytes are
        not the response we expect (the connection is then unusable)."""
        try:
            frame = self._frames.next_frame()
        except _FrameError as exc:
            raise ProtocolDecodeError(str(exc)) from exc
        if frame is None:
            return NEED_DATA
        if not self._in_flight:
            raise ProtocolDecodeError("received a response with no request in flight")
        expected_id, api_key, api_version = self._in_flight[0]
        correlation_id, offset = decode_response_header(
            frame, response_header_version(api_key, api_version)
        )
        if correlation_id != expected_id:
            raise ProtocolDecodeError(
                f"response correlation id {correlation_id}, expected {expected_id}"
            )
        self._in_flight.popleft()
        body_version = _response_body_version(api_key, api_version, frame, offset)
        return ResponseReceived(
            correlation_id, decode_response_body(api_key, body_version, frame, offset)
        )


def _response_body_version(api_key: int, api_version: int, frame: memoryview, offset: int) -> int:
    # KIP-511: a broker that does not know our ApiVersions version answers UNSUPPORTED_VERSION
    # in a v0 body. ErrorCode is the first field of every version.
    if (
        api_key == API_VERSIONS_KEY
        and len(frame) >= offset + INT16.size
        and INT16.unpack_from(frame, offset)[0] == ErrorCode.UNSUPPORTED_VERSION
    ):
        return 0
    return api_version


def _memory_chunks(chunks: list[Chunk]) -> list[bytes]:
    """The chunks of an encoding built from memory only (requests come from memory)."""
    data = [chunk for chunk in chunks if not isinstance(chunk, FileRegion)]
    if len(data) != len(chunks):
        raise ProtocolEncodeError("file regions can only be sent by the server")
    return data
