"""Allocation bounds, measured with tracemalloc: hostile bytes never make the codec allocate more
than a small multiple of their own size, nor past a named limit.

- A length or count prefix is judged against the bytes that remain before anything is
  allocated: an array of 2**31-1 elements in a 20-byte frame allocates nothing.
- A frame's size is judged from its 4-byte prefix alone.
- A request that does hold its elements decodes into at most DECODED_BYTES_PER_FRAME_BYTE_MAX
  bytes of objects per byte of frame, and into at most REQUEST_ARRAY_ELEMENTS_MAX elements.
- Record batches: a recordsCount or header count of 2**31-1 allocates nothing.
(Decompression bombs: test_decompression_limits.py.)
"""

from __future__ import annotations

import contextlib
import struct
import tracemalloc
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, Final

import pytest
from riverbed.hot.storage.compaction import batch_keys
from riverbed.protocol.codec import (
    REQUEST_ARRAY_ELEMENTS_MAX,
    api_specs,
    decode_request_body,
    encode_request_body,
)
from riverbed.protocol.connection import (
    NEED_DATA,
    REQUEST_FRAME_BYTES_MAX,
    CloseConnection,
    ServerConnection,
)
from riverbed.protocol.data_messages import ConsumerProtocolSubscription
from riverbed.protocol.errors import ProtocolDecodeError
from riverbed.protocol.messages import REQUEST_CLASSES, FetchRequest
from riverbed.protocol.records import CompressionType, CorruptRecordError, parse_batch_header
from riverbed.protocol.schema import FieldSpec
from riverbed.protocol.versioned import decode_consumer_protocol

from tools.fuzz.corpus import advertised_versions, request_frame, sample_requests
from tools.fuzz.targets import build_batch, check_fetched_records
from tools.fuzz.wire_map import SlotKind, encode_uvarint, map_struct

KIB: Final = 1024
# What decoding may allocate when a length prefix lies: the exception and its message, never
# anything sized by the lie.
LYING_PREFIX_BYTES_MAX: Final = 16 * KIB
# Python objects per byte of a request frame, at worst: measured ~40 (a flexible array of
# structs holding a string and an empty array: 3 bytes on the wire, a struct, a list and a
# pointer in memory). Bounds the memory of any request to this multiple of
# socket.request.max.bytes, and of the largest ones, by REQUEST_ARRAY_ELEMENTS_MAX.
DECODED_BYTES_PER_FRAME_BYTE_MAX: Final = 64
INFLATION_ELEMENTS: Final = 1000
PAIRS: Final = advertised_versions()
PAIR_IDS: Final = [f"{api_specs()[key].name}-v{version}" for key, version in PAIRS]


def traced_peak(function: Callable[[], object]) -> int:
    """Bytes allocated at the peak of calling `function` (expected errors suppressed)."""
    tracemalloc.start()
    try:
        with contextlib.suppress(ProtocolDecodeError, CorruptRecordError):
            function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def max_length(kind: SlotKind) -> bytes:
    if kind is SlotKind.STRING_LENGTH:
        return struct.pack(">h", 0x7FFF)
    if kind is SlotKind.LENGTH:
        return struct.pack(">i", 0x7FFFFFFF)
    return encode_uvarint(0xFFFFFFFF)  # compact: 2**32-2 elements or bytes


@pytest.mark.parametrize(("api_key", "version"), PAIRS, ids=PAIR_IDS)
def test_lying_length_prefixes_allocate_nothing(api_key: int, version: int) -> None:
    """Every length, count and tag size of a request set to its largest value, the bytes cut
    20 past it: decoding refuses without allocating what the prefix announced."""
    spec = api_specs()[api_key]
    body = sample_requests(api_key, version)[1]
    wire = map_struct(spec.request, body, version, spec.is_flexible(version))
    decode_request_body(api_key, version, memoryview(wire.data))  # compile the codec first
    lengths = (SlotKind.STRING_LENGTH, SlotKind.LENGTH, SlotKind.COMPACT_LENGTH, SlotKind.TAG_SIZE)
    for slot in wire.slots:
        if slot.kind not in lengths:
            continue
        data = wire.data[: slot.start] + max_length(slot.kind) + wire.data[slot.end : slot.end + 20]
        view = memoryview(data)
        peak = traced_peak(partial(decode_request_body, api_key, version, view))
        assert peak <= LYING_PREFIX_BYTES_MAX, f"{slot} -> {peak} bytes"


@pytest.mark.parametrize("size", [REQUEST_FRAME_BYTES_MAX + 1, 2**31 - 1, -1, -(2**31)])
def test_a_frame_size_out_of_bounds_closes_before_allocating(size: int) -> None:
    server = ServerConnection()
    data = struct.pack(">i", size) + bytes(16)

    def receive() -> None:
        server.receive_data(data)
        server.next_event()

    peak = traced_peak(receive)
    assert isinstance(server.next_event(), CloseConnection)
    assert peak <= LYING_PREFIX_BYTES_MAX


def test_a_frame_size_in_bounds_waits_without_allocating_the_frame() -> None:
    server = ServerConnection()
    data = struct.pack(">i", REQUEST_FRAME_BYTES_MAX) + bytes(16)
    events: list[object] = []

    def receive() -> None:
        server.receive_data(data)
        events.append(server.next_event())

    peak = traced_peak(receive)
    assert events == [NEED_DATA]
    assert peak <= LYING_PREFIX_BYTES_MAX


def _decode_frame(frame: bytes) -> object:
    server = ServerConnection()
    server.receive_data(frame)
    return server.next_event()


def _hostile_elements(field: FieldSpec, message_cls: type[Any]) -> list[Any]:
    """INFLATION_ELEMENTS elements for `field` that cost the most memory per byte: default
    structs (each nested array an empty list), or distinct values no cache shares."""
    if field.struct is not None:
        return [getattr(message_cls, field.struct.name)() for _ in range(INFLATION_ELEMENTS)]
    type_name = field.type_name
    if type_name in ("int32", "int64", "uint32"):
        return [0x10000000 + index for index in range(INFLATION_ELEMENTS)]
    if type_name == "uuid":
        return [uuid.UUID(int=index + 1) for index in range(INFLATION_ELEMENTS)]
    one: dict[str, list[object]] = {"string": [""], "bytes": [b""], "bool": [True]}
    return one.get(type_name, [1]) * INFLATION_ELEMENTS


@pytest.mark.parametrize(("api_key", "version"), PAIRS, ids=PAIR_IDS)
def test_a_request_decodes_into_a_bounded_multiple_of_its_size(api_key: int, version: int) -> None:
    spec = api_specs()[api_key]
    cls: type[Any] = REQUEST_CLASSES[api_key]  # built from the spec's field names
    for field in spec.request.fields:
        if not field.is_array or field.tag is not None or version not in field.versions:
            continue
        frame = request_frame(cls(**{field.attr_name: _hostile_elements(field, cls)}), version)
        ServerConnection().receive_data(request_frame(cls(), version))  # compile the codec first
        peak = traced_peak(partial(_decode_frame, frame))
        # The frame is copied into the connection's buffer: count it as the frame's own bytes.
        ratio = (peak - len(frame)) / len(frame)
        assert ratio <= DECODED_BYTES_PER_FRAME_BYTE_MAX, f"{field.name}: {ratio:.1f}"


def _empty_fetch_topics(count: int) -> bytes:
    """A Fetch v12 body of `count` empty topics (3 bytes each: the cheapest structs to send)."""
    # replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level, session_id, session_epoch
    fixed = struct.pack(">iiiibii", -1, 0, 0, 0x7FFFFFFF, 0, 0, -1)
    topics = encode_uvarint(count + 1) + b"\x01\x01\x00" * count  # name "", partitions [], tags
    return fixed + topics + b"\x01" + b"\x01" + b"\x00"  # forgotten [], rack "", tags


def _body(request: FetchRequest) -> bytes:
    return b"".join(c for c in encode_request_body(request, 12) if isinstance(c, bytes))


def test_the_hand_built_fetch_body_is_what_the_codec_writes() -> None:
    assert _empty_fetch_topics(3) == _body(FetchRequest(topics=[FetchRequest.FetchTopic()] * 3))


def test_a_request_of_too_many_elements_closes_the_connection_before_building_them() -> None:
    """REQUEST_ARRAY_ELEMENTS_MAX + 1 empty Fetch topics: a 3 MB frame that would decode into
    a million structs and lists. It is refused when the count is read."""
    header = struct.pack(">hhih", 1, 12, 7, -1) + b"\x00"  # Fetch v12, no client id, no tags
    payload = header + _empty_fetch_topics(REQUEST_ARRAY_ELEMENTS_MAX + 1)
    decode_request_body(1, 12, memoryview(_empty_fetch_topics(1)))  # compile the codec first
    server = ServerConnection()
    server.receive_data(struct.pack(">i", len(payload)) + payload)
    events: list[object] = []
    peak = traced_peak(lambda: events.append(server.next_event()))
    [event] = events
    assert isinstance(event, CloseConnection)
    assert "array elements" in event.reason
    assert peak <= LYING_PREFIX_BYTES_MAX


def test_the_element_budget_counts_every_array_of_the_request() -> None:
    request = FetchRequest(
        topics=[FetchRequest.FetchTopic(partitions=[FetchRequest.FetchPartition()] * 3)] * 3
    )
    view = memoryview(_body(request))  # 3 topics, 9 partitions, and the empty forgotten topics
    assert decode_request_body(1, 12, view, elements_max=12) == request
    with pytest.raises(ProtocolDecodeError, match="more than 11 array elements"):
        decode_request_body(1, 12, view, elements_max=11)


def test_data_schemas_share_the_element_budget() -> None:
    """A JoinGroup's consumer protocol metadata (decoded by the broker for offset expiry) of
    REQUEST_ARRAY_ELEMENTS_MAX + 1 empty topic names: 2 MB that would be a million strings."""
    count = REQUEST_ARRAY_ELEMENTS_MAX + 1
    subscription = struct.pack(">hi", 0, count) + b"\x00\x00" * count + struct.pack(">i", -1)
    empty = struct.pack(">hii", 0, 0, -1)  # no topics, no user data: compiles the codec first
    assert decode_consumer_protocol(ConsumerProtocolSubscription, empty).topics == []
    with pytest.raises(ProtocolDecodeError, match="array elements"):
        decode_consumer_protocol(ConsumerProtocolSubscription, subscription)
    peak = traced_peak(lambda: decode_consumer_protocol(ConsumerProtocolSubscription, subscription))
    assert peak <= LYING_PREFIX_BYTES_MAX


@pytest.mark.parametrize("codec", list(CompressionType))
def test_a_records_count_past_the_section_allocates_nothing(codec: CompressionType) -> None:
    """A batch of one record claiming 2**31-1: decoding allocates no more than for a count of
    1 (what it allocates either way, such as decompression's first output buffer, is fixed)."""

    def batch(records_count: int) -> bytes:
        fields = struct.pack(">qiibIhiqqqhii", 0, 0, 0, 2, 0, 0, 0, 0, 0, -1, -1, -1, records_count)
        return build_batch(fields, b"\x10\x00\x00\x00\x02k\x02v\x00", codec, True)

    def cleaner_keys(batch: bytes) -> object:
        return batch_keys(batch, parse_batch_header(batch))

    honest, lying = batch(1), batch(0x7FFFFFFF)
    # The consumer's and the broker's decoder (one: decode_batch), and the log cleaner's reader.
    for decode in (check_fetched_records, cleaner_keys):
        decode(honest)  # warm up
        allowed = traced_peak(partial(decode, honest)) + LYING_PREFIX_BYTES_MAX
        assert traced_peak(partial(decode, lying)) <= allowed
