"""Fuzzing every request decoder, for every API key and version we advertise.

Structure-aware mutations of valid encodings (tools.fuzz.wire_map says where each length, count
and tag lies): lengths and counts set to huge, negative, null, off-by-one values; compact
varints too long, past 32 bits, not minimal, cut; tagged fields with bogus tags, counts and
sizes, and extra ones inserted; null markers where the field is never null; bools other than
0/1. Then bit flips, truncations, inserted and deleted bytes, and plain random bodies.

Whatever comes out goes through the whole server path (tools.fuzz.targets.check_server_stream):
a request that re-encodes and decodes back to itself, a clean CloseConnection for a
ProtocolDecodeError, or the KIP-511 event; nothing else. Data schemas (the consumer protocol a
JoinGroup carries, `__consumer_offsets` values) get the same treatment.

Derandomized, without an example database: CI runs the same examples every time (the
coverage-guided search is `make fuzz`).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from riverbed.protocol.codec import (
    api_specs,
    data_specs,
    decode_data,
    read_data,
)
from riverbed.protocol.data_messages import DATA_CLASSES
from riverbed.protocol.errors import ProtocolDecodeError
from riverbed.protocol.versioned import decode_consumer_protocol

from tools.fuzz.corpus import advertised_versions, request_frame, sample_data, sample_requests
from tools.fuzz.targets import check_request_body, check_server_stream
from tools.fuzz.wire_map import Slot, SlotKind, WireMap, encode_uvarint, map_struct

FUZZ: Final = settings(
    derandomize=True,
    database=None,
    deadline=1000,
    max_examples=20,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)
PAIRS: Final = advertised_versions()
PAIR_IDS: Final = [f"{api_specs()[key].name}-v{version}" for key, version in PAIRS]
_FRAME_PREFIX: Final = struct.Struct(">i")
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_CLIENT_ID_END: Final = 8 + 2 + len(b"fuzz-client")  # api key, version, correlation id, client id


# --- the map of a whole request (header included) -----------------------------------------------


def request_map(api_key: int, version: int, sample: int) -> WireMap:
    """The frame (without its size prefix) of a sample request, mapped: the header's client id
    length and tag count, then the body's slots."""
    spec = api_specs()[api_key]
    body = sample_requests(api_key, version)[sample]
    flexible = spec.is_flexible(version)
    body_map = map_struct(spec.request, body, version, flexible)
    frame = request_frame(body, version)[4:]
    header_end = _CLIENT_ID_END + (1 if flexible else 0)
    assert frame[header_end:] == body_map.data, "the wire map disagrees with the codec"
    slots = [Slot(8, 10, SlotKind.STRING_LENGTH, True, len(b"fuzz-client"))]
    if flexible:
        slots.append(Slot(_CLIENT_ID_END, header_end, SlotKind.TAG_COUNT, False, 0))
    slots += [
        Slot(s.start + header_end, s.end + header_end, s.kind, s.nullable, s.value)
        for s in body_map.slots
    ]
    return WireMap(frame, tuple(slots))


# --- mutations ----------------------------------------------------------------------------------


def _too_long_varint(value: int) -> bytes:
    return bytes([(value & 0x7F) | 0x80, 0x80, 0x80, 0x80, 0x80, 0x00])


def _not_minimal_varint(value: int) -> bytes:
    encoded = bytearray(encode_uvarint(value))
    encoded[-1] |= 0x80
    return bytes(encoded + b"\x00")


def slot_values(slot: Slot) -> st.SearchStrategy[bytes]:
    """What a lying slot may hold instead of its value."""
    value = slot.value
    if slot.kind is SlotKind.STRING_LENGTH:
        lengths = [-(2**15), -2, -1, 0, value - 1, value + 1, 2**15 - 1]
        return st.sampled_from(lengths).map(_INT16.pack) | st.integers(-(2**15), 2**15 - 1).map(
            _INT16.pack
        )
    if slot.kind is SlotKind.LENGTH:
        lengths = [-(2**31), -2, -1, 0, value - 1, value + 1, 2**30, 2**31 - 1]
        return st.sampled_from(lengths).map(_INT32.pack) | st.integers(-(2**31), 2**31 - 1).map(
            _INT32.pack
        )
    if slot.kind is SlotKind.BOOL:
        return st.integers(0, 255).map(lambda byte: bytes([byte]))
    wire_value = value + 1 if slot.kind is SlotKind.COMPACT_LENGTH else value
    special = [
        encode_uvarint(0),  # null (for a compact length), no tags, tag 0
        encode_uvarint(wire_value + 1),
        encode_uvarint(max(wire_value - 1, 0)),
        encode_uvarint(2**31),
        encode_uvarint(2**32 - 1),
        b"\x80\x80\x80\x80\x10",  # 2**32: past 32 bits
        b"\xff\xff\xff\xff\xff\x01",  # six bytes
        _too_long_varint(wire_value),
        _not_minimal_varint(wire_value),  # the same value in one more byte: valid
        b"\x80",  # cut
    ]
    return st.sampled_from(special) | st.integers(0, 2**32 - 1).map(encode_uvarint)


@st.composite
def mutated(draw: st.DrawFn, wire: WireMap) -> bytes:
    """`wire.data` with up to three slots lying, maybe a bogus tagged field, then up to two
    byte-level edits."""
    data = bytearray(wire.data)
    if wire.slots:
        chosen = draw(st.lists(st.sampled_from(wire.slots), min_size=1, max_size=3, unique=True))
        for slot in sorted(chosen, key=lambda s: s.start, reverse=True):  # later ones first
            replacement = draw(slot_values(slot))
            if slot.kind is SlotKind.TAG_COUNT and draw(st.booleans()):
                # One more tagged field than announced before: a bogus tag and size, then bytes.
                tag = draw(st.sampled_from([0, 1, 2, 3, 127, 128, 2**31]))
                payload = draw(st.binary(max_size=8))
                size = draw(st.sampled_from([len(payload), len(payload) + 1, 2**32 - 1]))
                replacement = encode_uvarint(slot.value + 1)
                replacement += encode_uvarint(tag) + encode_uvarint(size) + payload
            data[slot.start : slot.end] = replacement
    for _ in range(draw(st.integers(0, 2))):
        data = draw(byte_edits(bytes(data)))
    return bytes(data)


def byte_edits(data: bytes) -> st.SearchStrategy[bytearray]:
    def flip(position: int, bit: int) -> bytearray:
        out = bytearray(data)
        if out:
            out[position % len(out)] ^= 1 << bit
        return out

    def insert(position: int, inserted: bytes) -> bytearray:
        position %= len(data) + 1
        return bytearray(data[:position] + inserted + data[position:])

    def delete(position: int, length: int) -> bytearray:
        position %= len(data) + 1
        return bytearray(data[:position] + data[position + length :])

    positions = st.integers(0, 1 << 16)
    return st.one_of(
        st.builds(flip, positions, st.integers(0, 7)),
        st.builds(lambda cut: bytearray(data[: cut % (len(data) + 1)]), positions),
        st.builds(insert, positions, st.binary(min_size=1, max_size=8)),
        st.builds(delete, positions, st.integers(1, 8)),
    )


def frame_of(payload: bytes) -> bytes:
    return _FRAME_PREFIX.pack(len(payload)) + payload


# --- tests --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("api_key", "version"), PAIRS, ids=PAIR_IDS)
def test_the_wire_map_agrees_with_the_codec(api_key: int, version: int) -> None:
    for sample in range(3):
        wire = request_map(api_key, version, sample)
        for slot in wire.slots:
            assert 0 <= slot.start < slot.end <= len(wire.data)


@pytest.mark.parametrize(("api_key", "version"), PAIRS, ids=PAIR_IDS)
@FUZZ
@given(data=st.data())
def test_mutated_requests_decode_or_close_cleanly(
    api_key: int, version: int, data: st.DataObject
) -> None:
    wire = request_map(api_key, version, data.draw(st.integers(0, 2), label="sample"))
    header_end = _CLIENT_ID_END + (1 if api_specs()[api_key].is_flexible(version) else 0)
    if data.draw(st.integers(0, 4), label="random body") == 0:
        payload = wire.data[:header_end] + data.draw(st.binary(max_size=64), label="body")
    else:
        payload = data.draw(mutated(wire), label="payload")
    check_server_stream([frame_of(payload)])
    check_request_body(api_key, version, payload[header_end:])


@settings(FUZZ, max_examples=300)
@given(payload=st.binary(max_size=80))
def test_random_frames_decode_or_close_cleanly(payload: bytes) -> None:
    """Any api key and version: the unadvertised ones close, ApiVersions takes KIP-511."""
    check_server_stream([frame_of(payload)])


# --- data schemas -------------------------------------------------------------------------------

DATA_CASES: Final = [
    pytest.param(name, version, id=f"{name}-v{version}")
    for name, spec in sorted(data_specs().items())
    for version in range(spec.min_version, spec.max_version + 1)
]


def _decoded_or_refused(decode: Callable[[], object]) -> None:
    with contextlib.suppress(ProtocolDecodeError):
        decode()


@pytest.mark.parametrize(("name", "version"), DATA_CASES)
@FUZZ
@given(data=st.data())
def test_mutated_data_schemas_decode_or_raise_protocol_decode_error(
    name: str, version: int, data: st.DataObject
) -> None:
    spec = data_specs()[name]
    cls: type[Any] = DATA_CLASSES[name]  # a class of each schema, by name
    value = sample_data(name, version)
    wire = map_struct(spec.struct, value, version, spec.is_flexible(version))
    payload = data.draw(mutated(wire), label="payload")
    _decoded_or_refused(lambda: decode_data(cls, payload, version))
    _decoded_or_refused(lambda: read_data(cls, payload, version))
    if name.startswith("ConsumerProtocol"):
        prefixed = _INT16.pack(data.draw(st.integers(-(2**15), 2**15 - 1))) + payload
        _decoded_or_refused(lambda: decode_consumer_protocol(cls, prefixed))
