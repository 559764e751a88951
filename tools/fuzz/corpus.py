"""Valid requests for every API version Riverbed advertises: fuzzing seeds and mutation bases.

Three messages per (api, version), built from the spec files so a new field or version is
covered without editing this file: all defaults; every array holding two elements and every
scalar a non-default value; and the same with every field that is nullable in that version set
to null.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, Final

from riverbed.protocol.codec import (
    RequestHeader,
    api_specs,
    data_specs,
    encode_request_header,
    request_header_version,
    write_request_body,
)
from riverbed.protocol.data_messages import DATA_CLASSES
from riverbed.protocol.messages import REQUEST_CLASSES, RequestBody
from riverbed.protocol.primitives import Output
from riverbed.protocol.records import CompressionType, encode_batch
from riverbed.protocol.schema import FieldSpec, StructSpec

ARRAY_ELEMENTS: Final = 2
SAMPLE_UUID: Final = uuid.UUID("0123456789abcdef0123456789abcdef")
_FILLED_SCALARS: Final[dict[str, Any]] = {
    "int8": 7,
    "int16": 300,
    "int32": 70_000,
    "int64": 5_000_000_000,
    "uint16": 65_000,
    "uint32": 4_000_000_000,
    "float64": 1.5,
    "bool": True,
    "string": "topic-é",
    "bytes": b"\x00\x01\xff",
    "uuid": SAMPLE_UUID,
}


def sample_batch() -> bytes:
    """Two small v2 record batches, the second gzip-compressed: a produce request's records."""
    records = [(b"key", b"value", [("h", b"v")], 1_700_000_000_000), (None, None, [], 1)]
    return encode_batch(records) + encode_batch(records, compression=CompressionType.GZIP)


def advertised_versions() -> list[tuple[int, int]]:
    """Every (api key, version) the broker advertises, in a stable order."""
    return [
        (key, version)
        for key, spec in sorted(api_specs().items())
        for version in range(spec.min_version, spec.max_version + 1)
    ]


def sample_requests(api_key: int, version: int) -> list[RequestBody]:
    spec = api_specs()[api_key]
    cls = REQUEST_CLASSES[api_key]
    return [
        cls(),
        _struct(spec.request, cls, cls, version, nulls=False),
        _struct(spec.request, cls, cls, version, nulls=True),
    ]


def sample_data(name: str, version: int) -> Any:
    """A data schema value (`specs/data/`) with every array of two elements, scalars set."""
    spec = data_specs()[name]
    cls = DATA_CLASSES[name]
    return _struct(spec.struct, cls, cls, version, nulls=False)


def request_frame(body: RequestBody, version: int, correlation_id: int = 1) -> bytes:
    """A whole request frame, size prefix included, as a client sends it."""
    header = RequestHeader(body.API_KEY, version, correlation_id, "fuzz-client")
    out = Output(framed=True)
    encode_request_header(out, header, request_header_version(body.API_KEY, version))
    write_request_body(out, body, version)
    return b"".join(chunk for chunk in out.chunks() if isinstance(chunk, bytes))


def seed_frames() -> Iterator[tuple[int, int, bytes]]:
    """(api key, version, frame) of every sample request."""
    for api_key, version in advertised_versions():
        for body in sample_requests(api_key, version):
            yield api_key, version, request_frame(body, version)


def _struct(
    spec: StructSpec, cls: type[Any], message_cls: type[Any], version: int, nulls: bool
) -> Any:
    values = {
        field.attr_name: _field(field, message_cls, version, nulls)
        for field in spec.fields
        if version in field.versions
    }
    return cls(**values)


def _field(field: FieldSpec, message_cls: type[Any], version: int, nulls: bool) -> Any:
    if nulls and field.nullable_in(version):
        return None
    if field.struct is not None:
        nested = getattr(message_cls, field.struct.name)
        element: Any = _struct(field.struct, nested, message_cls, version, nulls)
    elif field.type_name == "records":
        element = sample_batch()
    else:
        element = _FILLED_SCALARS[field.type_name]
    if field.is_array:
        if field.struct is not None:
            return [
                _struct(field.struct, type(element), message_cls, version, nulls)
                for _ in range(ARRAY_ELEMENTS)
            ]
        return [element] * ARRAY_ELEMENTS
    return element
