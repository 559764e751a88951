"""Encode and decode message bodies and headers, interpreting the parsed spec files.

For each (api, version, request/response) the schema is compiled ONCE (cached) into a reader
and a writer per struct, generated as straight-line Python from its fields, that call small
closures for arrays, strings and bytes: the per-message work has no schema lookups. Decoding
`records` yields a zero-copy `memoryview` slice of the input buffer (the produce path rewrites
offsets in it in place); encoding emits a chunk list in which file regions stand for themselves
so the server can `sendfile` them.

Data schemas (`specs/data/`, classes in `data_messages`) go through the same compiled struct
codecs: `encode_data` / `decode_data` handle the bare body, `versioned` the int16 version prefix.
"""

from __future__ import annotations

import keyword
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, Final, TypeVar

from riverbed.protocol.data_messages import DATA_CLASSES, DataBody
from riverbed.protocol.errors import ProtocolDecodeError, ProtocolEncodeError
from riverbed.protocol.messages import (
    REQUEST_CLASSES,
    RESPONSE_CLASSES,
    RequestBody,
    ResponseBody,
)
from riverbed.protocol.primitives import (
    FLOAT64,
    INT8,
    INT16,
    INT32,
    INT64,
    UINT16,
    UINT32,
    Chunk,
    Output,
    check_span,
    decode_utf8,
    read_length,
    read_string_length,
    read_uuid,
    read_uvarint,
    write_uvarint,
)
from riverbed.protocol.regions import FileRegion
from riverbed.protocol.schema import (
    ApiSpec,
    DataSpec,
    FieldSpec,
    StructSpec,
    load_api_specs,
    load_data_specs,
)

Reader = Callable[[memoryview, int, "ElementBudget"], tuple[Any, int]]
Writer = Callable[[Output, Any], None]
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

_FIXED: Final = {
    "int8": INT8,
    "int16": INT16,
    "int32": INT32,
    "int64": INT64,
    "uint16": UINT16,
    "uint32": UINT32,
    "float64": FLOAT64,
}
# What a malformed value makes the standard library raise while encoding.
_ENCODE_ERRORS: Final = (struct.error, TypeError, ValueError, AttributeError, OverflowError)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """Request header v1 (v2 adds a tagged-fields section, always empty on our side)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class ElementBudget:
    """How many more array elements a decode may produce; spent as each array's count is read."""

    __slots__ = ("remaining", "total")

    def __init__(self, elements_max: int) -> None:
        self.total = elements_max
        self.remaining = elements_max

    def spend(self, count: int) -> None:
        self.remaining -= count
        if self.remaining < 0:
            raise ProtocolDecodeError(f"more than {self.total} array elements")


@dataclass(frozen=True, slots=True)
class _Codec:
    read: Reader
    write: Writer
    min_size: int  # the fewest bytes an encoding takes: bounds array counts before allocating
    fixed: struct.Struct | None = None  # a fixed-size value: struct codecs inline its packing


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
    body: RequestBody = _decode(codec, buf, offset, elements_max)[0]
    return body


def decode_response_body(
    api_key: int, api_version: int, buf: memoryview, offset: int = 0
) -> ResponseBody:
    """Decode the response body that fills `buf[offset:]` exactly."""
    codec = _message_codec(api_key, api_version, True)
    body: ResponseBody = _decode_exactly(codec, buf, offset, _UNBOUNDED)
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


def _decode_exactly(codec: _Codec, buf: memoryview, offset: int, elements_max: int) -> Any:
    value, end = _decode(codec, buf, offset, elements_max)
    if end != len(buf):
        raise ProtocolDecodeError(f"{len(buf) - end} unexpected bytes after the message body")
    return value


def _decode(codec: _Codec, buf: memoryview, offset: int, elements_max: int) -> tuple[Any, int]:
    try:
        return codec.read(buf, offset, ElementBudget(elements_max))
    except struct.error as exc:  # a fixed-size value ran past the end of the buffer
        raise ProtocolDecodeError(f"truncated message: {exc}") from exc


def _encode(codec: _Codec, out: Output, value: Any) -> None:
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
    value: Data = _decode_exactly(codec, memoryview(buf), 0, REQUEST_ARRAY_ELEMENTS_MAX)
    return value


def read_data(
    cls: type[Data], buf: bytes | bytearray | memoryview, version: int, offset: int = 0
) -> tuple[Data, int]:
    """Decode `version` of the `cls` data schema at `buf[offset:]`; returns it and its end."""
    value: Data
    codec = _checked_data_codec(cls, version)
    value, end = _decode(codec, memoryview(buf), offset, REQUEST_ARRAY_ELEMENTS_MAX)
    return value, end


def _checked_data_codec(cls: type[Any], version: int) -> _Codec:
    spec = data_specs().get(cls.__name__)
    if spec is None or DATA_CLASSES[spec.name] is not cls:
        raise ProtocolDecodeError(f"{cls.__qualname__} is not a data schema")
    if not spec.supports(version):
        raise ProtocolDecodeError(f"unsupported version {version} of {spec.name}")
    return _data_codec(spec.name, version)


@cache
def _data_codec(name: str, version: int) -> _Codec:
    spec, cls = data_specs()[name], DATA_CLASSES[name]
    return _struct_codec(spec.struct, cls, cls, version, spec.is_flexible(version))


# --- headers ------------------------------------------------------------------------------------


def decode_request_header(buf: memoryview, header_version: int) -> tuple[RequestHeader, int]:
    """Decode a request header (v1 or v2) at the start of `buf`; returns it and the body offset."""
    try:
        api_key, api_version, correlation_id = _REQUEST_HEADER_PREFIX.unpack_from(buf, 0)
    except struct.error as exc:
        raise ProtocolDecodeError("truncated request header") from exc
    # ClientId stays a non-compact nullable string even in the flexible header v2.
    client_id, offset = _NULLABLE_STRING.read(buf, _REQUEST_HEADER_PREFIX.size, _NO_ELEMENTS)
    if header_version >= 2:
        offset = _skip_tagged_fields(buf, offset)
    return RequestHeader(api_key, api_version, correlation_id, client_id), offset


def encode_request_header(out: Output, header: RequestHeader, header_version: int) -> None:
    out.buffer += _REQUEST_HEADER_PREFIX.pack(
        header.api_key, header.api_version, header.correlation_id
    )
    _NULLABLE_STRING.write(out, header.client_id)
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


def _skip_tagged_fields(buf: memoryview, offset: int) -> int:
    count, offset = read_uvarint(buf, offset)
    for _ in range(count):
        _tag, offset = read_uvarint(buf, offset)
        size, offset = read_uvarint(buf, offset)
        offset = check_span(buf, offset, size)
    return offset


# --- compilation --------------------------------------------------------------------------------


@cache
def _message_codec(api_key: int, api_version: int, is_response: bool) -> _Codec:
    spec = api_specs().get(api_key)
    if spec is None:
        raise ProtocolDecodeError(f"unknown api key {api_key}")
    if not spec.supports(api_version):
        raise ProtocolDecodeError(f"unsupported version {api_version} of {spec.name}")
    classes: dict[int, type[Any]] = RESPONSE_CLASSES if is_response else REQUEST_CLASSES
    message = spec.response if is_response else spec.request
    flexible = spec.is_flexible(api_version)
    return _struct_codec(message, classes[api_key], classes[api_key], api_version, flexible)


def _struct_codec(
    struct_spec: StructSpec, cls: type[Any], message_cls: type[Any], version: int, flexible: bool
) -> _Codec:
    present = [f for f in struct_spec.fields if version in f.versions]
    regular = [
        (f.attr_name, _field_codec(f, message_cls, version, flexible))
        for f in present
        if f.tag is None
    ]
    defaults = cls()
    tagged: _Tagged = {}
    for f in sorted(present, key=lambda f: f.tag or 0):
        if f.tag is not None:
            codec = _field_codec(f, message_cls, version, flexible)
            tagged[f.tag] = (f.attr_name, codec, getattr(defaults, f.attr_name))
    read, write = _compile_struct(cls, regular, tagged if flexible else None)
    min_size = sum(codec.min_size for _, codec in regular) + (1 if flexible else 0)
    return _Codec(read, write, min_size)


_Tagged = dict[int, tuple[str, _Codec, Any]]


def _compile_struct(
    cls: type[Any], regular: list[tuple[str, _Codec]], tagged: _Tagged | None
) -> tuple[Reader, Writer]:
    """A struct's reader and writer as straight-line functions generated from its fields (once
    per struct, api and version; `tagged` is None in a version that is not flexible).

    Generated rather than a loop over field closures: a fixed-size field is packed and unpacked
    in place, and the instance is built with keyword arguments instead of a dict. That halves
    the cost of encoding and decoding a message, which the broker and the clients pay on every
    request. Field names come from our own spec files and are checked to be identifiers.
    """
    namespace: dict[str, Any] = {
        "cls": cls,
        "tagged": tagged,
        "read_tagged": _read_tagged_fields,
        "write_tagged": _write_tagged_fields,
    }
    read_lines = ["def read(buf, offset, budget):"]
    write_lines = [
        "def write(out, value):",
        "    if type(value) is not cls:",
        "        raise TypeError(",
        "            f'expected {cls.__qualname__}, got {type(value).__qualname__}'",
        "        )",
        "    buffer = out.buffer",  # the same bytearray for the whole encoding
    ]
    arguments = []
    for index, (name, codec) in enumerate(regular):
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"field name {name!r} of {cls.__qualname__} is not an identifier")
        if codec.fixed is not None:
            namespace[f"unpack{index}"] = codec.fixed.unpack_from
            namespace[f"pack{index}"] = codec.fixed.pack
            read_lines.append(f"    v{index} = unpack{index}(buf, offset)[0]")
            read_lines.append(f"    offset += {codec.fixed.size}")
            write_lines.append(f"    buffer += pack{index}(value.{name})")
        else:
            namespace[f"read{index}"] = codec.read
            namespace[f"write{index}"] = codec.write
            read_lines.append(f"    v{index}, offset = read{index}(buf, offset, budget)")
            write_lines.append(f"    write{index}(out, value.{name})")
        arguments.append(f"{name}=v{index}")
    if tagged is not None:
        # Most structs carry no tagged field: an empty section is the single byte 0.
        read_lines.append("    extra = {}")
        read_lines.append("    if offset < len(buf) and buf[offset] == 0:")
        read_lines.append("        offset += 1")
        read_lines.append("    else:")
        read_lines.append("        offset = read_tagged(buf, offset, tagged, extra, budget)")
        arguments.append("**extra")
        if tagged:
            write_lines.append("    write_tagged(out, value, tagged)")
        else:
            write_lines.append("    buffer.append(0)")
    read_lines.append(f"    return cls({', '.join(arguments)}), offset")
    exec("\n".join([*read_lines, *write_lines]), namespace)
    return namespace["read"], namespace["write"]


def _read_tagged_fields(
    buf: memoryview, offset: int, tagged: _Tagged, values: dict[str, Any], budget: ElementBudget
) -> int:
    count, offset = read_uvarint(buf, offset)
    for _ in range(count):
        tag, offset = read_uvarint(buf, offset)
        size, offset = read_uvarint(buf, offset)
        end = check_span(buf, offset, size)
        known = tagged.get(tag)
        if known is not None:  # unknown tags are skipped: a newer peer may send them
            name, codec, _default = known
            values[name], read_end = codec.read(buf[:end], offset, budget)
            if read_end != end:
                raise ProtocolDecodeError(f"tagged field {tag} is {size} bytes but decodes shorter")
        offset = end
    return offset


def _write_tagged_fields(out: Output, value: Any, tagged: _Tagged) -> None:
    # Only values that differ from the default go on the wire, in ascending tag order.
    pending = []
    for tag, (name, codec, default) in tagged.items():
        field_value = getattr(value, name)
        if field_value != default:
            encoded = Output()
            codec.write(encoded, field_value)
            pending.append((tag, encoded))
    write_uvarint(out.buffer, len(pending))
    for tag, encoded in pending:
        write_uvarint(out.buffer, tag)
        write_uvarint(out.buffer, encoded.size)
        out.extend(encoded)


def _field_codec(field: FieldSpec, message_cls: type[Any], version: int, flexible: bool) -> _Codec:
    nullable = field.nullable_in(version)
    if field.struct is not None:
        struct_cls = getattr(message_cls, field.struct.name)
        element = _struct_codec(field.struct, struct_cls, message_cls, version, flexible)
    else:
        element = _primitive_codec(field.type_name, nullable and not field.is_array, flexible)
    if field.is_array:
        return _array_codec(element, nullable, flexible)
    return element


def _array_codec(element: _Codec, nullable: bool, flexible: bool) -> _Codec:
    element_size_min = max(element.min_size, 1)
    read_element, write_element = element.read, element.write

    def read(buf: memoryview, offset: int, budget: ElementBudget) -> tuple[Any, int]:
        count, offset = read_length(buf, offset, flexible)
        if count < 0:
            if count == -1 and nullable:
                return None, offset
            raise ProtocolDecodeError(f"invalid array length {count} at offset {offset}")
        if count * element_size_min > len(buf) - offset:
            raise ProtocolDecodeError(f"array of {count} elements exceeds the buffer")
        budget.spend(count)
        items = []
        for _ in range(count):
            item, offset = read_element(buf, offset, budget)
            items.append(item)
        return items, offset

    def write(out: Output, value: Any) -> None:
        if value is None:
            _write_null(out, nullable, flexible, "array")
            return
        _write_length(out, len(value), flexible)
        for item in value:
            write_element(out, item)

    return _Codec(read, write, 1 if flexible else 4)


def _write_length(out: Output, length: int, flexible: bool) -> None:
    if flexible:
        write_uvarint(out.buffer, length + 1)
    else:
        out.buffer += INT32.pack(length)


def _write_null(out: Output, nullable: bool, flexible: bool, what: str) -> None:
    if not nullable:
        raise ValueError(f"null {what} in a field that is not nullable in this version")
    _write_length(out, -1, flexible)


def _primitive_codec(type_name: str, nullable: bool, flexible: bool) -> _Codec:
    fixed = _FIXED.get(type_name)
    if fixed is not None:
        return _fixed_codec(fixed)
    if type_name == "bool":
        return _BOOL
    if type_name == "uuid":
        return _UUID
    if type_name == "string":
        return _string_codec(nullable, flexible)
    return _bytes_codec(nullable, flexible, zero_copy=type_name == "records")


def _fixed_codec(packer: struct.Struct) -> _Codec:
    unpack_from, pack, size = packer.unpack_from, packer.pack, packer.size

    def read(buf: memoryview, offset: int, _budget: ElementBudget) -> tuple[Any, int]:
        return unpack_from(buf, offset)[0], offset + size

    def write(out: Output, value: Any) -> None:
        out.buffer += pack(value)

    return _Codec(read, write, size, packer)


def _read_bool(buf: memoryview, offset: int, _budget: ElementBudget) -> tuple[Any, int]:
    if offset >= len(buf):
        raise ProtocolDecodeError("truncated bool")
    return buf[offset] != 0, offset + 1


def _write_bool(out: Output, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"expected bool, got {type(value).__name__}")
    out.buffer.append(1 if value else 0)


def _write_uuid(out: Output, value: Any) -> None:
    if not isinstance(value, uuid.UUID):
        raise TypeError(f"expected uuid.UUID, got {type(value).__name__}")
    out.buffer += value.bytes


_BOOL: Final = _Codec(_read_bool, _write_bool, 1)
_UUID: Final = _Codec(lambda buf, offset, _budget: read_uuid(buf, offset), _write_uuid, 16)


def _string_codec(nullable: bool, flexible: bool) -> _Codec:
    def read(buf: memoryview, offset: int, _budget: ElementBudget) -> tuple[Any, int]:
        length, offset = read_string_length(buf, offset, flexible)
        if length < 0:
            if length == -1 and nullable:
                return None, offset
            raise ProtocolDecodeError(f"invalid string length {length} at offset {offset}")
        end = check_span(buf, offset, length)
        return decode_utf8(buf, offset, end), end

    def write(out: Output, value: Any) -> None:
        if value is None:
            if not nullable:
                raise ValueError("null string in a field that is not nullable in this version")
            out.buffer += b"\x00" if flexible else b"\xff\xff"
            return
        data = value.encode()
        if flexible:
            write_uvarint(out.buffer, len(data) + 1)
        else:
            out.buffer += INT16.pack(len(data))
        out.buffer += data

    return _Codec(read, write, 1 if flexible else 2)


def _bytes_codec(nullable: bool, flexible: bool, zero_copy: bool) -> _Codec:
    def read(buf: memoryview, offset: int, _budget: ElementBudget) -> tuple[Any, int]:
        length, offset = read_length(buf, offset, flexible)
        if length < 0:
            if length == -1 and nullable:
                return None, offset
            raise ProtocolDecodeError(f"invalid bytes length {length} at offset {offset}")
        end = check_span(buf, offset, length)
        data = buf[offset:end]
        return (data if zero_copy else bytes(data)), end

    def write(out: Output, value: Any) -> None:
        if value is None:
            _write_null(out, nullable, flexible, "bytes")
        elif isinstance(value, FileRegion):
            _write_length(out, value.size, flexible)
            out.write_region(value)
        else:
            size = value.nbytes if isinstance(value, memoryview) else len(value)
            _write_length(out, size, flexible)
            out.buffer += value

    return _Codec(read, write, 1 if flexible else 4)


# The request header's ClientId: a nullable string that is never compact.
_NULLABLE_STRING: Final = _string_codec(nullable=True, flexible=False)
# For readers that hold no array.
_NO_ELEMENTS: Final = ElementBudget(0)
