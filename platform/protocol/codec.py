"""Encode and decode message bodies and headers, interpreting the parsed spec files.

Each (api, version, request/response) is compiled ONCE (cached) by `codec_compiler` into one
generated reader and one writer, so the per-message work has no schema lookups and few calls.
Decoding `records` yields a zero-copy `memoryview` slice of the input buffer (the produce path
rewrites offsets in it in place); encoding emits a chunk list in which file regions stand for
themselves so the server can `sendfile` them.

Data schemas (`specs/data/`, classes in `data_messages`) are compiled the same way:
`encode_data` / `decode_data` handle the bare body, `versioned` the int16 version prefix.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, TypeVar

from riverbed.protocol.codec_compiler import (
    Codec,
    ElementBudget,
    Reader,
    compile_field,
    compile_struct,
)
from riverbed.protocol.data_messages import DATA_CLASSES, DataBody
from riverbed.protocol.errors import ProtocolDecodeError, ProtocolEncodeError
from riverbed.protocol.messages import (
    REQUEST_CLASSES,
    RESPONSE_CLASSES,
    RequestBody,
    ResponseBody,
)
from riverbed.protocol.primitives import INT32, Chunk, Output, check_span, read_uvarint
from riverbed.protocol.schema import (
    ApiSpec,
    DataSpec,
    FieldSpec,
    VersionRange,
    load_api_specs,
    load_data_specs,
)

__all__ = [
    "API_VERSIONS_KEY",
    "REQUEST_ARRAY_ELEMENTS_MAX",
    "ElementBudget",
    "RequestHeader",
    "api_specs",
    "data_specs",
    "decode_data",
    "decode_request_body",
    "decode_request_header",
    "decode_response_body",
    "decode_response_header",
    "encode_data",
    "encode_request_body",
    "encode_request_header",
    "encode_response_body",
    "encode_response_header",
    "read_data",
    "request_header_version",
    "response_header_version",
    "write_request_body",
    "write_response_body",
]

Data = TypeVar("Data", bound=DataBody)

API_VERSIONS_KEY: Final = 18

# The most array elements one decoded request may hold, over all its arrays. Each element becomes
# Python objects of 40 to 200 bytes (a struct, an int, the empty list of a nested array) made
# from as little as one byte of the frame: a 100 MiB request of empty Fetch topics would decode
# into 33 million objects, some 4 GiB and over a minute of the broker's event loop. Real
# requests hold far fewer: a reassignment of a whole 200,000-partition cluster in one request is
# about 800,000 (each partition and its three replicas). Data schemas take the same budget: the
# consumer protocol a JoinGroup carries is a client's bytes too, which the broker decodes (offset
# expiry reads every stable group's subscriptions).
REQUEST_ARRAY_ELEMENTS_MAX: Final = 1_000_000
# Responses are bounded by their frame alone: a client chose its broker, and a Metadata response
# of a large cluster holds more (each partition with its replicas and ISR).
_UNBOUNDED: Final = 2**63

# What a malformed value makes the standard library raise while encoding.
_ENCODE_ERRORS: Final = (struct.error, TypeError, ValueError, AttributeError, OverflowError)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """Request header v1 (v2 adds a tagged-fields section, always empty on our side)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def api_specs() -> dict[int, ApiSpec]:
    return load_api_specs()


def request_header_version(api_key: int, api_version: int) -> int:
    return 2 if api_specs()[api_key].is_flexible(api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    # ApiVersions responses always use header v0, so that a client that sent a version the broker
    # does not know can still read the error and the broker's version ranges (KIP-511).
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if api_specs()[api_key].is_flexible(api_version) else 0


# --- bodies -------------------------------------------------------------------------------------


def decode_request_body(
    api_key: int,
    api_version: int,
    buf: memoryview,
    offset: int = 0,
    elements_max: int = REQUEST_ARRAY_ELEMENTS_MAX,
) -> RequestBody:
    """Decode the request body at `buf[offset:]`. Bytes after it are ignored, as Kafka's broker
    ignores them: librdkafka 2.16's AdminClient.list_topics() sends three after its Metadata v12
    body, and refusing them cut off every such client. A body of more than `elements_max`
    array elements raises ProtocolDecodeError."""
    codec = _message_codec(api_key, api_version, False)
    body: RequestBody = codec.read(buf, offset, ElementBudget(elements_max))[0]
    return body


def decode_response_body(
    api_key: int, api_version: int, buf: memoryview, offset: int = 0
) -> ResponseBody:
    """Decode the response body that fills `buf[offset:]` exactly."""
    codec = _message_codec(api_key, api_version, True)
    body: ResponseBody = _decode_exactly(codec.read, buf, offset, _UNBOUNDED)
    return body


def encode_request_body(body: RequestBody, api_version: int) -> list[Chunk]:
    out = Output()
    write_request_body(out, body, api_version)
    return out.chunks()


def encode_response_body(body: ResponseBody, api_version: int) -> list[Chunk]:
    out = Output()
    write_response_body(out, body, api_version)
    return out.chunks()


def write_request_body(out: Output, body: RequestBody, api_version: int) -> None:
    """Append the encoding of `body` to `out` (frames put a header in front of it)."""
    _encode(_message_codec(body.API_KEY, api_version, False), out, body)


def write_response_body(out: Output, body: ResponseBody, api_version: int) -> None:
    _encode(_message_codec(body.API_KEY, api_version, True), out, body)


def _decode_exactly(read: Reader, buf: memoryview, offset: int, elements_max: int) -> Any:
    value, end = read(buf, offset, ElementBudget(elements_max))
    if end != len(buf):
        raise ProtocolDecodeError(f"{len(buf) - end} unexpected bytes after the message body")
    return value


def _encode(codec: Codec, out: Output, value: Any) -> None:
    try:
        codec.write(out, value)
    except _ENCODE_ERRORS as exc:
        raise ProtocolEncodeError(f"cannot encode {type(value).__name__}: {exc}") from exc


# --- data schemas -------------------------------------------------------------------------------


def data_specs() -> dict[str, DataSpec]:
    return load_data_specs()


def encode_data(value: DataBody, version: int) -> bytes:
    """`value` encoded as `version` of its data schema, without a version prefix."""
    spec = data_specs().get(type(value).__name__)
    if spec is None or not spec.supports(version):
        raise ProtocolEncodeError(
            f"{type(value).__qualname__} has no data schema version {version}"
        )
    out = Output()
    _encode(_data_codec(spec.name, version), out, value)
    return bytes(out.buffer)  # data schemas hold no `records`, so no file region was written


def decode_data(cls: type[Data], buf: bytes | bytearray | memoryview, version: int) -> Data:
    """Decode `version` of the `cls` data schema from `buf`, which it must fill exactly."""
    codec = _checked_data_codec(cls, version)
    value: Data = _decode_exactly(codec.read, memoryview(buf), 0, REQUEST_ARRAY_ELEMENTS_MAX)
    return value


def read_data(
    cls: type[Data], buf: bytes | bytearray | memoryview, version: int, offset: int = 0
) -> tuple[Data, int]:
    """Decode `version` of the `cls` data schema at `buf[offset:]`; returns it and its end."""
    value: Data
    codec = _checked_data_codec(cls, version)
    value, end = codec.read(memoryview(buf), offset, ElementBudget(REQUEST_ARRAY_ELEMENTS_MAX))
    return value, end


def _checked_data_codec(cls: type[Any], version: int) -> Codec:
    spec = data_specs().get(cls.__name__)
    if spec is None or DATA_CLASSES[spec.name] is not cls:
        raise ProtocolDecodeError(f"{cls.__qualname__} is not a data schema")
    if not spec.supports(version):
        raise ProtocolDecodeError(f"unsupported version {version} of {spec.name}")
    return _data_codec(spec.name, version)


@cache
def _data_codec(name: str, version: int) -> Codec:
    spec, cls = data_specs()[name], DATA_CLASSES[name]
    return compile_struct(spec.struct, cls, cls, version, spec.is_flexible(version))


# --- headers ------------------------------------------------------------------------------------


def decode_request_header(buf: memoryview, header_version: int) -> tuple[RequestHeader, int]:
    """Decode a request header (v1 or v2) at the start of `buf`; returns it and the body offset."""
    try:
        api_key, api_version, correlation_id = _REQUEST_HEADER_PREFIX.unpack_from(buf, 0)
    except struct.error as exc:
        raise ProtocolDecodeError("truncated request header") from exc
    client_id, offset = _CLIENT_ID.read(buf, _REQUEST_HEADER_PREFIX.size, _NO_ELEMENTS)
    if header_version >= 2:
        offset = _skip_tagged_fields(buf, offset)
    return RequestHeader(api_key, api_version, correlation_id, client_id), offset


def encode_request_header(out: Output, header: RequestHeader, header_version: int) -> None:
    out.buffer += _REQUEST_HEADER_PREFIX.pack(
        header.api_key, header.api_version, header.correlation_id
    )
    _CLIENT_ID.write(out, header.client_id)
    if header_version >= 2:
        out.buffer.append(0)  # no tagged fields


def decode_response_header(buf: memoryview, header_version: int) -> tuple[int, int]:
    """The correlation id of the response header at the start of `buf`, and the body offset."""
    if len(buf) < INT32.size:
        raise ProtocolDecodeError("truncated response header")
    correlation_id: int = INT32.unpack_from(buf, 0)[0]
    offset = INT32.size
    if header_version >= 1:
        offset = _skip_tagged_fields(buf, offset)
    return correlation_id, offset


def encode_response_header(out: Output, correlation_id: int, header_version: int) -> None:
    out.buffer += INT32.pack(correlation_id)
    if header_version >= 1:
        out.buffer.append(0)  # no tagged fields


_REQUEST_HEADER_PREFIX: Final = struct.Struct(">hhi")
# ClientId stays a non-compact nullable string even in the flexible header v2.
_CLIENT_ID: Final = compile_field(
    FieldSpec(
        name="ClientId",
        type_name="string",
        is_array=False,
        versions=VersionRange(0, 0),
        nullable_versions=VersionRange(0, 0),
        tag=None,
        default=None,
        null_default=True,
        struct=None,
        line=0,
    ),
    RequestHeader,
    version=0,
    flexible=False,
)
# For readers that hold no array.
_NO_ELEMENTS: Final = ElementBudget(0)


def _skip_tagged_fields(buf: memoryview, offset: int) -> int:
    count, offset = read_uvarint(buf, offset)
    for _ in range(count):
        _tag, offset = read_uvarint(buf, offset)
        size, offset = read_uvarint(buf, offset)
        offset = check_span(buf, offset, size)
    return offset


# --- compilation --------------------------------------------------------------------------------


@cache
def _message_codec(api_key: int, api_version: int, is_response: bool) -> Codec:
    spec = api_specs().get(api_key)
    if spec is None:
        raise ProtocolDecodeError(f"unknown api key {api_key}")
    if not spec.supports(api_version):
        raise ProtocolDecodeError(f"unsupported version {api_version} of {spec.name}")
    classes: dict[int, type[Any]] = RESPONSE_CLASSES if is_response else REQUEST_CLASSES
    message = spec.response if is_response else spec.request
    flexible = spec.is_flexible(api_version)
    return compile_struct(message, classes[api_key], classes[api_key], api_version, flexible)
