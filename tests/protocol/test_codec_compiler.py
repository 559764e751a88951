"""The generated codecs' own machinery, beyond what round trips of small messages reach: fused
runs of fixed-size fields around nested structs, structs nested past the inlining depth,
multi-byte lengths and long arrays, tagged fields, fresh defaults and the UUID cache."""

from __future__ import annotations

import struct
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.protocol import codec_compiler, codegen
from riverbed.protocol import messages as m
from riverbed.protocol.codec import (
    api_specs,
    data_specs,
    decode_request_body,
    decode_response_body,
    encode_data,
    encode_request_body,
    encode_response_body,
)
from riverbed.protocol.codec_compiler import Codec, ElementBudget, compile_struct
from riverbed.protocol.data_messages import DATA_CLASSES
from riverbed.protocol.errors import ProtocolDecodeError, ProtocolEncodeError
from riverbed.protocol.primitives import (
    UUID_CACHE_ENTRIES_MAX,
    Output,
    read_uvarint,
    uuid_cache,
    write_uvarint,
)
from riverbed.protocol.schema import ApiSpec, parse_spec

from tests.protocol.test_codec import message_strategy
from tools.fuzz.corpus import sample_data

# Fixed-size fields of every kind around a nested struct (which ends a run: runs never cross a
# struct's bounds, whose flexible versions end in a tagged-field section) and a string that
# exists from v1 on, so that in v0 `After` and `Tail` are one run.
FIXED_SPEC = """\
api 7 Fixed versions 0-2 flexible 2+

request
  Before int32
  Flag bool
  Id uuid
  Ratio float64
  Inner Inner
    X int16
    Y uint32
  After int16
  Name string 1+
  Tail int64

response
  ErrorCode int16
"""
# Deeper than any real spec, and than CPython compiles in one function (20 nested blocks): it
# only compiles because structs past STRUCT_INLINE_DEPTH_MAX are functions of their own.
DEEP_LEVELS = 24


def _deep_spec() -> str:
    lines = ["api 7 Deep versions 0-1 flexible 1+", "", "request", "  Values []int8"]
    for level in range(1, DEEP_LEVELS + 1):
        lines.append("  " * level + f"Next []Level{level}")
        lines.append("  " * (level + 1) + "Value int8")
    return "\n".join([*lines, "", "response", "  ErrorCode int16", ""])


@pytest.fixture
def synthetic(request: pytest.FixtureRequest) -> Iterator[tuple[ApiSpec, type[Any]]]:
    """The spec text of the test's parameter, parsed, and its generated request class."""
    spec = parse_spec(request.param, "synthetic.spec")
    module = types.ModuleType("synthetic_messages")
    sys.modules[module.__name__] = module  # dataclasses resolve ClassVar through the module
    try:
        exec(codegen.render_messages({spec.key: spec}), module.__dict__)
        yield spec, module.__dict__[spec.request.name]
    finally:
        del sys.modules[module.__name__]


def _codec(spec: ApiSpec, cls: type[Any], version: int) -> Codec:
    return compile_struct(spec.request, cls, cls, version, spec.is_flexible(version))


def _encode(codec: Codec, value: Any) -> bytes:
    out = Output()
    codec.write(out, value)
    return bytes(out.buffer)


def _decode(codec: Codec, data: bytes, elements_max: int = 1000) -> Any:
    value, end = codec.read(memoryview(data), 0, ElementBudget(elements_max))
    assert end == len(data)
    return value


# --- fused runs of fixed-size fields ------------------------------------------------------------

FIXED_ID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")


@pytest.mark.parametrize("synthetic", [FIXED_SPEC], indirect=True)
@pytest.mark.parametrize("version", [0, 1, 2])
def test_fixed_runs_stop_at_nested_structs(
    synthetic: tuple[ApiSpec, type[Any]], version: int
) -> None:
    spec, cls = synthetic
    value = cls(
        before=-5,
        flag=True,
        id=FIXED_ID,
        ratio=2.5,
        inner=cls.Inner(x=-2, y=0xFFFFFFFF),
        after=7,
        name="n" if version >= 1 else "",
        tail=-(2**63),
    )
    head = struct.pack(">i?16sd", -5, True, FIXED_ID.bytes, 2.5)
    inner = struct.pack(">hI", -2, 0xFFFFFFFF)
    name = {0: b"", 1: b"\x00\x01n", 2: b"\x02n"}[version]
    tags = b"\x00" if version >= 2 else b""
    expected = head + inner + tags + struct.pack(">h", 7) + name + struct.pack(">q", -(2**63))
    codec = _codec(spec, cls, version)
    assert _encode(codec, value) == expected + tags
    assert _decode(codec, expected + tags) == value
    for end in range(len(expected + tags)):
        with pytest.raises(ProtocolDecodeError, match=r"truncated|exceeds"):
            codec.read(memoryview((expected + tags)[:end]), 0, ElementBudget(0))


@pytest.mark.parametrize("synthetic", [FIXED_SPEC], indirect=True)
def test_a_fused_run_checks_each_bool_and_uuid(synthetic: tuple[ApiSpec, type[Any]]) -> None:
    spec, cls = synthetic
    codec = _codec(spec, cls, 0)
    with pytest.raises(TypeError, match="expected bool, got int"):
        _encode(codec, cls(flag=1))
    with pytest.raises(TypeError, match="expected UUID, got str"):
        _encode(codec, cls(id=str(FIXED_ID)))
    with pytest.raises(TypeError, match=r"expected FixedRequest\.Inner, got UUID"):
        _encode(codec, cls(inner=FIXED_ID))
    # Any non-zero byte is true, as Kafka's readers take it.
    data = bytearray(_encode(codec, cls(flag=True)))
    data[4] = 0x7F
    assert _decode(codec, bytes(data)).flag is True


# --- nesting past the inlining depth ------------------------------------------------------------


def _deep_value(cls: type[Any], level: int) -> list[Any]:
    """One element at each level, with the next level in it; two at the deepest."""
    element = getattr(cls, f"Level{level}")
    if level == DEEP_LEVELS:
        return [element(value=level), element(value=level)]
    return [element(value=level, next=_deep_value(cls, level + 1))]


def _deep_bytes(level: int, flexible: bool) -> bytes:
    count = 2 if level == DEEP_LEVELS else 1
    element = struct.pack(">b", level)
    if level < DEEP_LEVELS:
        element += _deep_bytes(level + 1, flexible)
    prefix = bytes([count + 1]) if flexible else struct.pack(">i", count)
    return prefix + (element + (b"\x00" if flexible else b"")) * count


@pytest.mark.parametrize("synthetic", [_deep_spec()], indirect=True)
@pytest.mark.parametrize("version", [0, 1])
def test_structs_nested_past_the_inlining_depth(
    synthetic: tuple[ApiSpec, type[Any]], version: int
) -> None:
    spec, cls = synthetic
    flexible = spec.is_flexible(version)
    value = cls(values=[1, 2], next=_deep_value(cls, 1))
    values = (b"\x03" if flexible else struct.pack(">i", 2)) + b"\x01\x02"
    expected = values + _deep_bytes(1, flexible) + (b"\x00" if flexible else b"")
    codec = _codec(spec, cls, version)
    assert _encode(codec, value) == expected
    assert _decode(codec, expected) == value
    # Every level's count is spent from the one budget, through every function.
    elements = 2 + DEEP_LEVELS + 1
    assert _decode(codec, expected, elements_max=elements) == value
    with pytest.raises(ProtocolDecodeError, match=f"more than {elements - 1} array elements"):
        _decode(codec, expected, elements_max=elements - 1)
    for end in range(len(expected)):
        with pytest.raises(ProtocolDecodeError):
            _decode(codec, expected[:end])


@pytest.mark.parametrize(("api_key", "version"), [(1, 16), (1, 11), (3, 12), (32, 4), (46, 0)])
@settings(max_examples=10)
@given(data=st.data())
def test_a_shallower_inlining_depth_encodes_the_same(
    api_key: int, version: int, data: st.DataObject
) -> None:
    """Structs read and written by calls (every struct below the message) or inline agree."""
    spec = api_specs()[api_key]
    flexible = spec.is_flexible(version)
    for is_response, message in ((False, spec.request), (True, spec.response)):
        body = data.draw(message_strategy(spec, version, is_response))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(codec_compiler, "STRUCT_INLINE_DEPTH_MAX", 1)
            codec = compile_struct(message, type(body), type(body), version, flexible)
        encode = encode_response_body if is_response else encode_request_body
        inline = b"".join(c for c in encode(body, version) if isinstance(c, bytes))
        assert _encode(codec, body) == inline
        assert _decode(codec, inline) == body


def test_data_schemas_agree_at_every_inlining_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec_compiler, "STRUCT_INLINE_DEPTH_MAX", 1)
    for name, spec in data_specs().items():
        cls = DATA_CLASSES[name]
        for version in range(spec.min_version, spec.max_version + 1):
            value = sample_data(name, version)
            codec = compile_struct(spec.struct, cls, cls, version, spec.is_flexible(version))
            assert _encode(codec, value) == encode_data(value, version)


# --- multi-byte lengths and long arrays ---------------------------------------------------------

Topic = m.MetadataResponse.MetadataResponseTopic
Partition = m.MetadataResponse.MetadataResponsePartition


@pytest.mark.parametrize("version", [8, 12])  # classic and flexible
def test_long_strings_and_arrays_round_trip(version: int) -> None:
    """Past one varint byte (127) and past the prebuilt formats of integer arrays (32)."""
    replicas = list(range(-1, 199))
    partitions = [Partition(partition_index=i, replica_nodes=replicas[: i * 5]) for i in range(130)]
    body = m.MetadataResponse(topics=[Topic(name="é" * 150, partitions=partitions)])
    encoded = b"".join(c for c in encode_response_body(body, version) if isinstance(c, bytes))
    assert decode_response_body(3, version, memoryview(encoded)) == body


@pytest.mark.parametrize("version", [8, 12])
def test_every_truncation_of_long_lengths_is_a_decode_error(version: int) -> None:
    body = m.MetadataResponse(
        topics=[Topic(name="t" * 200, partitions=[Partition(isr_nodes=list(range(140)))])]
    )
    encoded = b"".join(c for c in encode_response_body(body, version) if isinstance(c, bytes))
    for end in range(len(encoded)):
        with pytest.raises(ProtocolDecodeError):
            decode_response_body(3, version, memoryview(encoded[:end]))


def test_large_records_stay_a_view_of_the_frame() -> None:
    batch = bytes(range(256)) * 80  # 20 KiB: a 3-byte compact length
    body = m.ProduceRequest(
        acks=-1,
        topic_data=[
            m.ProduceRequest.TopicProduceData(
                "t", [m.ProduceRequest.PartitionProduceData(0, batch)]
            )
        ],
    )
    frame = bytearray(b"".join(c for c in encode_request_body(body, 9) if isinstance(c, bytes)))
    decoded = decode_request_body(0, 9, memoryview(frame))
    assert isinstance(decoded, m.ProduceRequest)
    records = decoded.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview)
    assert records.obj is frame
    assert records == batch


@pytest.mark.parametrize(
    "value", [0, 1, 127, 128, 16_383, 16_384, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**32 - 1]
)
def test_uvarints_of_every_length(value: int) -> None:
    encoded = bytearray()
    write_uvarint(encoded, value)
    assert read_uvarint(memoryview(b"\xff" + encoded + b"\x00"), 1) == (value, len(encoded) + 1)
    for end in range(len(encoded)):
        with pytest.raises(ProtocolDecodeError, match="truncated varint"):
            read_uvarint(memoryview(encoded[:end]), 0)


def test_uvarints_past_32_bits_are_refused() -> None:
    with pytest.raises(ProtocolDecodeError, match="exceeds 32 bits"):
        read_uvarint(memoryview(b"\xff\xff\xff\xff\x10"), 0)
    with pytest.raises(ProtocolDecodeError, match="longer than 5 bytes"):
        read_uvarint(memoryview(b"\x80\x80\x80\x80\x80\x00"), 0)


# --- tagged fields and defaults -----------------------------------------------------------------


def test_a_replica_fetch_writes_its_replica_state_as_a_tagged_field() -> None:
    body = m.FetchRequest(replica_state=m.FetchRequest.ReplicaState(replica_id=2, replica_epoch=9))
    encoded = b"".join(c for c in encode_request_body(body, 16) if isinstance(c, bytes))
    # one field: tag 1, 13 bytes (int32, int64, the struct's own empty tagged section)
    assert encoded.endswith(b"\x01\x01\x0d" + struct.pack(">iq", 2, 9) + b"\x00")
    assert decode_request_body(1, 16, memoryview(encoded)) == body


def _produce_response(leader: Any) -> bytes:
    partition = m.ProduceResponse.PartitionProduceResponse(index=1, current_leader=leader)
    topic = m.ProduceResponse.TopicProduceResponse("t", [partition])
    return b"".join(
        c for c in encode_response_body(m.ProduceResponse([topic]), 10) if isinstance(c, bytes)
    )


def test_tagged_structs_are_compared_with_their_default_by_value() -> None:
    Leader = m.ProduceResponse.LeaderIdAndEpoch
    plain = _produce_response(Leader())
    assert _produce_response(Leader(leader_id=-1, leader_epoch=-1)) == plain
    written = _produce_response(Leader(leader_id=3))
    assert written != plain
    decoded = decode_response_body(0, 10, memoryview(written))
    assert isinstance(decoded, m.ProduceResponse)
    assert decoded.responses[0].partition_responses[0].current_leader == Leader(leader_id=3)
    # An instance of another class is not the default, as dataclass equality says, and is refused.
    with pytest.raises(
        ProtocolEncodeError, match=r"ProduceResponse\.LeaderIdAndEpoch, got FetchResponse"
    ):
        _produce_response(m.FetchResponse.LeaderIdAndEpoch())


def test_a_tagged_field_must_fill_its_size_exactly() -> None:
    body = m.ApiVersionsResponse(finalized_features_epoch=5)
    encoded = b"".join(c for c in encode_response_body(body, 3) if isinstance(c, bytes))
    field = struct.pack(">q", 5)
    assert encoded.endswith(b"\x01\x01\x08" + field)  # one field: tag 1, 8 bytes
    head = encoded[: -len(field) - 3]
    assert decode_response_body(18, 3, memoryview(encoded)) == body
    for size, data in (
        (9, head + b"\x01\x01\x09" + field + b"\x00"),
        (7, head + b"\x01\x01\x07" + field),
    ):
        with pytest.raises(
            ProtocolDecodeError, match=f"tagged field 1 of {size} bytes decodes to 8"
        ):
            decode_response_body(18, 3, memoryview(data))


def test_decoded_messages_share_no_mutable_default() -> None:
    """Fields absent from the wire (tagged, or not in the version) get a fresh default each."""
    body = m.FetchResponse(
        responses=[
            m.FetchResponse.FetchableTopicResponse(
                topic_id=FIXED_ID, partitions=[m.FetchResponse.PartitionData(records=b"r")]
            )
        ]
    )
    for version in (11, 16):
        encoded = b"".join(c for c in encode_response_body(body, version) if isinstance(c, bytes))
        first, second = (decode_response_body(1, version, memoryview(encoded)) for _ in range(2))
        assert isinstance(first, m.FetchResponse)
        assert isinstance(second, m.FetchResponse)
        partition, other = first.responses[0].partitions[0], second.responses[0].partitions[0]
        assert partition == other
        partition.diverging_epoch.epoch = 5
        assert partition.aborted_transactions is not None
        partition.aborted_transactions.append(m.FetchResponse.AbortedTransaction())
        first.node_endpoints.append(m.FetchResponse.NodeEndpoint())
        assert other == m.FetchResponse.PartitionData(records=other.records)
        assert second.node_endpoints == []
        assert m.FetchResponse().node_endpoints == []


# --- the UUID cache -----------------------------------------------------------------------------


def _metadata_topic_ids(topic_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    body = m.MetadataResponse(topics=[Topic(name="t", topic_id=topic_id) for topic_id in topic_ids])
    encoded = b"".join(c for c in encode_response_body(body, 12) if isinstance(c, bytes))
    decoded = decode_response_body(3, 12, memoryview(encoded))
    assert isinstance(decoded, m.MetadataResponse)
    return [topic.topic_id for topic in decoded.topics]


def test_decoded_uuids_are_shared_through_a_bounded_cache() -> None:
    topic_id = uuid.uuid4()
    [first] = _metadata_topic_ids([topic_id])
    [again] = _metadata_topic_ids([topic_id])
    assert first == topic_id
    assert again is first
    others = [uuid.UUID(int=index + 1) for index in range(UUID_CACHE_ENTRIES_MAX + 10)]
    assert _metadata_topic_ids(others) == others
    assert len(uuid_cache) <= UUID_CACHE_ENTRIES_MAX
    [after] = _metadata_topic_ids([topic_id])
    assert after == topic_id
    assert after is not first  # it went out with the rest
