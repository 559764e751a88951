"""Kafka request framing by hand, for tests that must send what no client library would.

Independent of Riverbed's codec on purpose: these bytes are written from Kafka's published message
layouts, so a shared misunderstanding cannot make both sides agree on a wrong encoding. Only the few
requests the raw-socket tests need are here, each at one fixed version.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Final

from kafka.record.default_records import DefaultRecordBatchBuilder

HOST: Final = "127.0.0.1"
IO_TIMEOUT_S: Final = 10.0
CLIENT_ID: Final = "riverbed-interop"

API_PRODUCE: Final = 0
API_METADATA: Final = 3
API_API_VERSIONS: Final = 18

ERROR_NONE: Final = 0
ERROR_CORRUPT_MESSAGE: Final = 2
ERROR_UNSUPPORTED_VERSION: Final = 35


def connect(bootstrap: str) -> socket.socket:
    host, port = bootstrap.rsplit(":", 1)
    if host != HOST:
        raise ValueError(f"raw-socket tests only talk to {HOST}, not {host}")
    sock = socket.create_connection((host, int(port)), timeout=IO_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def string(text: str | None) -> bytes:
    """Kafka's (nullable) STRING: int16 length, -1 for null."""
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def compact_string(text: str) -> bytes:
    data = text.encode()
    return uvarint(len(data) + 1) + data


NO_TAGGED_FIELDS: Final = uvarint(0)


def request(
    api_key: int, api_version: int, correlation_id: int, body: bytes, *, flexible: bool = False
) -> bytes:
    """A whole frame: size prefix, request header v1 (v2 when flexible), body."""
    header = struct.pack(">hhi", api_key, api_version, correlation_id) + string(CLIENT_ID)
    if flexible:
        header += NO_TAGGED_FIELDS
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(chunks)} of {size} bytes")
        chunks += chunk
    return bytes(chunks)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One response frame: (correlation id, the rest: header tags if any, then the body)."""
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    payload = recv_exact(sock, size)
    (correlation_id,) = struct.unpack_from(">i", payload)
    return correlation_id, payload[4:]


def closed_by_peer(sock: socket.socket, timeout_s: float = IO_TIMEOUT_S) -> bool:
    """True once the peer closes the connection (EOF or reset); False if it is still open."""
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True
    return False


@dataclass(frozen=True)
class ApiRange:
    api_key: int
    min_version: int
    max_version: int


@dataclass(frozen=True)
class ApiVersions:
    error_code: int
    ranges: tuple[ApiRange, ...]

    def range_of(self, api_key: int) -> ApiRange:
        for entry in self.ranges:
            if entry.api_key == api_key:
                return entry
        raise KeyError(f"api key {api_key} not advertised: {self.ranges}")


def api_versions_request(correlation_id: int, version: int) -> bytes:
    if version >= 3:
        body = compact_string("riverbed-tests") + compact_string("1.0") + NO_TAGGED_FIELDS
        return request(API_API_VERSIONS, version, correlation_id, body, flexible=True)
    return request(API_API_VERSIONS, version, correlation_id, b"")


def parse_api_versions_v0(body: bytes) -> ApiVersions:
    """ApiVersions response v0 (also what a broker sends for a version it does not support)."""
    error_code, count = struct.unpack_from(">hi", body)
    ranges = tuple(ApiRange(*struct.unpack_from(">hhh", body, 6 + 6 * i)) for i in range(count))
    if len(body) != 6 + 6 * count:
        raise ValueError(f"ApiVersions v0 body has {len(body) - 6 - 6 * count} trailing bytes")
    return ApiVersions(error_code, ranges)


def read_uvarint(buf: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def parse_api_versions_v3(body: bytes) -> ApiVersions:
    """ApiVersions response v3 (flexible body, but the response header stays v0)."""
    (error_code,) = struct.unpack_from(">h", body)
    count_plus_one, position = read_uvarint(body, 2)
    ranges = []
    for _ in range(count_plus_one - 1):
        ranges.append(ApiRange(*struct.unpack_from(">hhh", body, position)))
        tags, position = read_uvarint(body, position + 6)
        if tags != 0:
            raise ValueError("unexpected tagged fields in an ApiVersions entry")
    return ApiVersions(error_code, tuple(ranges))


def metadata_request_v1(correlation_id: int) -> bytes:
    """Metadata v1 for all topics (a null topic array)."""
    return request(API_METADATA, 1, correlation_id, struct.pack(">i", -1))


def produce_request_v3(
    correlation_id: int, topic: str, partition: int, records: bytes, *, acks: int = -1
) -> bytes:
    body = (
        string(None)  # transactional_id
        + struct.pack(">hi", acks, int(IO_TIMEOUT_S * 1000))
        + struct.pack(">i", 1)
        + string(topic)
        + struct.pack(">i", 1)
        + struct.pack(">ii", partition, len(records))
        + records
    )
    return request(API_PRODUCE, 3, correlation_id, body)


@dataclass(frozen=True)
class PartitionProduced:
    topic: str
    partition: int
    error_code: int
    base_offset: int


def parse_produce_response_v3(body: bytes) -> list[PartitionProduced]:
    out = []
    (topics,) = struct.unpack_from(">i", body)
    position = 4
    for _ in range(topics):
        (name_size,) = struct.unpack_from(">h", body, position)
        name = body[position + 2 : position + 2 + name_size].decode()
        position += 2 + name_size
        (partitions,) = struct.unpack_from(">i", body, position)
        position += 4
        for _ in range(partitions):
            index, error_code, base_offset, _append_time = struct.unpack_from(
                ">ihqq", body, position
            )
            position += 22
            out.append(PartitionProduced(name, index, error_code, base_offset))
    return out


def produced(
    responses: list[tuple[int, bytes]], produce_ids: list[int]
) -> list[list[tuple[int, int]]]:
    """(error code, base offset) of each partition of each v3 produce answer among
    `responses` (correlation id, body), in their order."""
    return [
        [(p.error_code, p.base_offset) for p in parse_produce_response_v3(body)]
        for correlation_id, body in responses
        if correlation_id in produce_ids
    ]


def record_batch(values: list[bytes], *, timestamp_ms: int) -> bytes:
    """A valid v2 record batch (built by kafka-python, not by Riverbed's encoder)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for offset, value in enumerate(values):
        builder.append(offset, timestamp=timestamp_ms, key=None, value=value, headers=[])
    return bytes(builder.build())
