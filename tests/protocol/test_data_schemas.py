"""Data schemas (specs/data): the consumer protocol and the `__consumer_offsets` record formats.

Every schema x version round-trips; the consumer protocol bytes match kafka-python (which reads
Kafka's own JSON schemas) and aiokafka's hand-written v0 structs; the record formats match byte
vectors written by hand from Kafka's JSON field order. Values are drawn by the same schema-driven
hypothesis strategies as the API messages.
"""

from __future__ import annotations

import struct
import warnings
from typing import Any

import pytest
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment as AiokafkaAssignment,
)
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberMetadata as AiokafkaMetadata,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from riverbed.protocol.codec import decode_data, encode_data, read_data
from riverbed.protocol.data_messages import (
    DATA_CLASSES,
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
)
from riverbed.protocol.errors import ProtocolDecodeError, ProtocolEncodeError
from riverbed.protocol.schema import SpecError, load_data_specs, parse_data_spec
from riverbed.protocol.versioned import (
    decode_consumer_protocol,
    decode_record_key,
    decode_versioned,
    encode_record_key,
    encode_versioned,
)

from tests.protocol.test_codec import _struct_strategy

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.protocol.consumer import metadata as kp_metadata
    from kafka.protocol.old import consumer_protocol as kp_old

SPECS = load_data_specs()
CASES = [
    pytest.param(spec.name, version, id=f"{spec.name}-v{version}")
    for spec in SPECS.values()
    for version in range(spec.min_version, spec.max_version + 1)
]
CONSUMER_PROTOCOL_CASES = [c for c in CASES if str(c.values[0]).startswith("ConsumerProtocol")]
Subscription, Assignment = ConsumerProtocolSubscription, ConsumerProtocolAssignment
Member = GroupMetadataValue.MemberMetadata


def data_strategy(name: str, version: int) -> st.SearchStrategy[Any]:
    cls = DATA_CLASSES[name]
    return _struct_strategy(SPECS[name].struct, cls, cls, version)


# --- the specs and the generated module ---------------------------------------------------------


def test_data_schemas_and_their_versions() -> None:
    versions = {
        spec.name: (spec.min_version, spec.max_version, spec.flexible_min_version)
        for spec in SPECS.values()
    }
    assert versions == {
        "ConsumerProtocolSubscription": (0, 3, None),
        "ConsumerProtocolAssignment": (0, 3, None),
        "OffsetCommitKey": (0, 1, None),
        "OffsetCommitValue": (0, 4, 4),
        "GroupMetadataKey": (2, 2, None),
        "TransactionLogKey": (0, 0, None),
        "TransactionLogValue": (0, 1, 1),
        "EndTxnMarker": (0, 0, None),
        "GroupMetadataValue": (0, 4, 4),
    }
    assert set(DATA_CLASSES) == set(SPECS)
    for name, cls in DATA_CLASSES.items():
        assert versions[name][:2] == (cls.LOWEST_SUPPORTED_VERSION, cls.HIGHEST_SUPPORTED_VERSION)


DATA_SPEC = """\
data Example versions 1-4 flexible 3+

Name string
Items []Item 2+
  Id int32
  Note string 4 nullable default=null
"""


def test_data_spec_model() -> None:
    spec = parse_data_spec(DATA_SPEC, "example.spec")
    assert (spec.name, spec.min_version, spec.max_version) == ("Example", 1, 4)
    assert spec.is_flexible(3)
    assert not spec.is_flexible(2)
    assert spec.struct.name == "Example"
    name, items = spec.struct.fields
    assert name.type_name == "string"
    assert items.struct is not None
    assert items.struct.fields[1].nullable_in(4)
    assert items.struct.fields[1].null_default


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("api 1 Example versions 1-4 flexible none\nName string\n", ":1: expected `data <Name>"),
        ("data Example versions 4-1 flexible none\nName string\n", ":1: bad version range 4-1"),
        ("data Example versions 1-4 flexible none\n", "data schema Example has no fields"),
        ("data Example versions 1-4 flexible none\nBatch records\n", ":2: data schemas cannot"),
        ("data Example versions 1-4 flexible none\n  Name string\n", ":2: unexpected indent"),
    ],
)
def test_data_spec_errors(text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_data_spec(text, "example.spec")


# --- round trips --------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "version"), CASES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip(name: str, version: int, data: st.DataObject) -> None:
    value = data.draw(data_strategy(name, version))
    encoded = encode_data(value, version)
    assert decode_data(type(value), bytearray(encoded), version) == value
    prefixed = encode_versioned(value, version)
    assert prefixed == struct.pack(">h", version) + encoded
    assert decode_versioned(type(value), prefixed) == value


@pytest.mark.parametrize(("name", "version"), CASES)
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_truncated_input_raises(name: str, version: int, data: st.DataObject) -> None:
    value = data.draw(data_strategy(name, version))
    encoded = encode_data(value, version)
    # The decoder follows the same path through any prefix as through the whole encoding, so
    # every prefix runs out of bytes on the way.
    for end in range(len(encoded)):
        with pytest.raises(ProtocolDecodeError):
            decode_data(type(value), encoded[:end], version)
    with pytest.raises(ProtocolDecodeError, match="unexpected bytes"):
        decode_data(type(value), encoded + b"\x00", version)


def test_versions_outside_a_schema_are_refused() -> None:
    with pytest.raises(ProtocolEncodeError, match="no data schema version 5"):
        encode_data(OffsetCommitValue(), 5)
    with pytest.raises(ProtocolDecodeError, match="unsupported version 5 of OffsetCommitValue"):
        decode_versioned(OffsetCommitValue, b"\x00\x05" + encode_data(OffsetCommitValue(), 4))
    with pytest.raises(ProtocolDecodeError, match="not a data schema"):
        # A nested struct has no schema of its own (its type says so too: the misuse tested).
        decode_data(Member, b"", 0)  # type: ignore[type-var]
    with pytest.raises(ProtocolDecodeError, match="truncated version prefix"):
        decode_versioned(OffsetCommitValue, b"\x00")


# --- the consumer protocol ----------------------------------------------------------------------

KAFKA_PYTHON_CLASSES: dict[str, Any] = {
    "ConsumerProtocolSubscription": kp_metadata.ConsumerProtocolSubscription,
    "ConsumerProtocolAssignment": kp_metadata.ConsumerProtocolAssignment,
}


@pytest.mark.parametrize(("name", "version"), CONSUMER_PROTOCOL_CASES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_kafka_python_reads_and_rewrites_our_consumer_protocol(
    name: str, version: int, data: st.DataObject
) -> None:
    value = data.draw(data_strategy(name, version))
    encoded = encode_versioned(value, version)
    theirs = KAFKA_PYTHON_CLASSES[name].decode(encoded)
    assert theirs.encode(version=version) == encoded


def test_kafka_python_subscription_v3_decodes_field_by_field() -> None:
    theirs = kp_metadata.ConsumerProtocolSubscription(
        version=3,
        topics=["orders", "payments"],
        user_data=b"\x01\x02",
        owned_partitions=[
            kp_metadata.ConsumerProtocolSubscription.TopicPartition(
                topic="orders", partitions=[0, 2]
            )
        ],
        generation_id=7,
        rack_id="rack-a",
    )
    ours = decode_consumer_protocol(Subscription, theirs.encode(version=3))
    assert ours == Subscription(
        topics=["orders", "payments"],
        user_data=b"\x01\x02",
        owned_partitions=[Subscription.TopicPartition("orders", [0, 2])],
        generation_id=7,
        rack_id="rack-a",
    )


def test_kafka_python_assignment_v1_decodes_field_by_field() -> None:
    theirs = kp_metadata.ConsumerProtocolAssignment(
        version=1,
        assigned_partitions=[
            kp_metadata.ConsumerProtocolAssignment.TopicPartition(topic="t", partitions=[3, 1])
        ],
        user_data=None,
    )
    ours = decode_consumer_protocol(Assignment, theirs.encode(version=1))
    assert ours == Assignment([Assignment.TopicPartition("t", [3, 1])], user_data=None)


@pytest.mark.parametrize("user_data", [b"", b"sticky-state"])
def test_v0_structs_of_kafka_python_and_aiokafka_match_ours(user_data: bytes) -> None:
    subscription = Subscription(topics=["a", "bc"], user_data=user_data)
    assignment = Assignment([Assignment.TopicPartition("a", [0, 5])], user_data=user_data)
    for wire in (
        kp_old.ConsumerProtocolMemberMetadata_v0(0, ["a", "bc"], user_data).encode(),
        AiokafkaMetadata(0, ["a", "bc"], user_data).encode(),
    ):
        assert wire == encode_versioned(subscription, 0)
        assert decode_consumer_protocol(Subscription, wire) == subscription
    for wire in (
        kp_old.ConsumerProtocolMemberAssignment_v0(0, [("a", [0, 5])], user_data).encode(),
        AiokafkaAssignment(0, [("a", [0, 5])], user_data).encode(),
    ):
        assert wire == encode_versioned(assignment, 0)
        assert decode_consumer_protocol(Assignment, wire) == assignment
    theirs = AiokafkaAssignment.decode(encode_versioned(assignment, 0))
    assert theirs.partitions() == [("a", 0), ("a", 5)]


V3_SUBSCRIPTION = Subscription(
    topics=["orders"],
    user_data=b"u",
    owned_partitions=[Subscription.TopicPartition("orders", [1])],
    generation_id=4,
    rack_id="r1",
)


def test_a_v0_reader_reads_a_v3_subscription() -> None:
    body = encode_data(V3_SUBSCRIPTION, 3)
    as_v0, end = read_data(Subscription, body, 0)
    assert as_v0 == Subscription(topics=["orders"], user_data=b"u")
    assert end < len(body)  # the v1-3 fields follow, unread
    # kafka-python's own forward-compatible read of a v3 subscription as v0 agrees.
    theirs = kp_old.ConsumerProtocolMemberMetadata_v0.decode(encode_versioned(V3_SUBSCRIPTION, 3))
    assert (theirs.topics, theirs.user_data) == (as_v0.topics, as_v0.user_data)


def test_a_version_above_ours_is_read_as_our_highest() -> None:
    # A future v4 appends fields: we read the v3 fields and ignore the rest, as Kafka does.
    future = struct.pack(">h", 4) + encode_data(V3_SUBSCRIPTION, 3) + b"\x00\x00\x00\x2a"
    assert decode_consumer_protocol(Subscription, future) == V3_SUBSCRIPTION
    assignment = Assignment([Assignment.TopicPartition("orders", [1])])
    future = struct.pack(">h", 9) + encode_data(assignment, 3) + b"new fields"
    assert decode_consumer_protocol(Assignment, future) == assignment
    # A version we know must fill the bytes exactly; one below ours is refused.
    with pytest.raises(ProtocolDecodeError, match="unexpected bytes"):
        decode_consumer_protocol(Subscription, encode_versioned(V3_SUBSCRIPTION, 3) + b"x")
    with pytest.raises(ProtocolDecodeError, match="unsupported version -1"):
        decode_consumer_protocol(Subscription, b"\xff\xff" + encode_data(V3_SUBSCRIPTION, 0))


def test_truncated_consumer_protocol_raises() -> None:
    wire = encode_versioned(V3_SUBSCRIPTION, 3)
    for end in range(len(wire)):
        with pytest.raises(ProtocolDecodeError):
            decode_consumer_protocol(Subscription, wire[:end])
    future = struct.pack(">h", 4) + encode_data(V3_SUBSCRIPTION, 3)
    with pytest.raises(ProtocolDecodeError):
        decode_consumer_protocol(Subscription, future[:-1])


# --- __consumer_offsets records, against bytes written from Kafka's JSON ------------------------


def _int16(value: int) -> bytes:
    return struct.pack(">h", value)


def _int32(value: int) -> bytes:
    return struct.pack(">i", value)


def _int64(value: int) -> bytes:
    return struct.pack(">q", value)


def _string(text: str | None) -> bytes:
    return _int16(-1) if text is None else _int16(len(text.encode())) + text.encode()


def _blob(data: bytes) -> bytes:
    return _int32(len(data)) + data


def _compact(data: bytes | None) -> bytes:
    # Every compact length below is under 127: a one-byte unsigned varint of length + 1.
    return b"\x00" if data is None else bytes([len(data) + 1]) + data


NO_TAGS = b"\x00"


def test_offset_commit_key_vectors() -> None:
    wire = _int16(1) + _string("group-1") + _string("orders") + _int32(7)
    key = OffsetCommitKey(group="group-1", topic="orders", partition=7)
    assert encode_record_key(key) == wire
    assert decode_record_key(wire) == key
    assert decode_record_key(_int16(0) + wire[2:]) == key  # key v0 has the same layout


def test_group_metadata_key_vector() -> None:
    wire = _int16(2) + _string("group-1")
    assert encode_record_key(GroupMetadataKey(group="group-1")) == wire
    assert decode_record_key(wire) == GroupMetadataKey(group="group-1")


def test_unknown_record_key_versions_are_refused() -> None:
    with pytest.raises(ProtocolDecodeError, match="unknown __consumer_offsets key version 3"):
        decode_record_key(_int16(3) + _string("group-1"))
    with pytest.raises(ProtocolDecodeError, match="truncated"):
        decode_record_key(_int16(1) + _string("group-1"))


OFFSET_VALUE = OffsetCommitValue(
    offset=1234, leader_epoch=5, metadata="meta", commit_timestamp=1_700_000_000_000
)


@pytest.mark.parametrize(
    ("version", "wire", "value"),
    [
        pytest.param(
            0,
            _int64(1234) + _string("meta") + _int64(1_700_000_000_000),
            OffsetCommitValue(offset=1234, metadata="meta", commit_timestamp=1_700_000_000_000),
            id="v0",
        ),
        pytest.param(
            1,
            _int64(1234) + _string("meta") + _int64(1_700_000_000_000) + _int64(1_700_000_600_000),
            OffsetCommitValue(
                offset=1234,
                metadata="meta",
                commit_timestamp=1_700_000_000_000,
                expire_timestamp=1_700_000_600_000,
            ),
            id="v1-expire-timestamp",
        ),
        pytest.param(
            3,
            _int64(1234) + _int32(5) + _string("meta") + _int64(1_700_000_000_000),
            OFFSET_VALUE,
            id="v3",
        ),
        pytest.param(
            4,
            _int64(1234) + _int32(5) + _compact(b"meta") + _int64(1_700_000_000_000) + NO_TAGS,
            OFFSET_VALUE,
            id="v4-flexible",
        ),
    ],
)
def test_offset_commit_value_vectors(version: int, wire: bytes, value: OffsetCommitValue) -> None:
    assert encode_versioned(value, version) == _int16(version) + wire
    assert decode_versioned(OffsetCommitValue, _int16(version) + wire) == value


MEMBER = Member(
    member_id="m-1",
    group_instance_id="static-1",
    client_id="client",
    client_host="/127.0.0.1",
    rebalance_timeout=60_000,
    session_timeout=10_000,
    subscription=b"\x00\x03sub",
    assignment=b"\x00\x03asg",
)


STABLE_GROUP = GroupMetadataValue(
    protocol_type="consumer",
    generation=3,
    protocol="range",
    leader="m-1",
    current_state_timestamp=1_700_000_000_000,
    members=[MEMBER],
)


@pytest.mark.parametrize(
    ("version", "wire", "value"),
    [
        pytest.param(
            0,
            _string("consumer")
            + _int32(3)
            + _string("range")
            + _string("m-1")
            + _int32(1)  # members
            + _string("m-1")
            + _string("client")
            + _string("/127.0.0.1")
            + _int32(10_000)
            + _blob(b"\x00\x03sub")
            + _blob(b"\x00\x03asg"),
            GroupMetadataValue(
                "consumer",
                3,
                "range",
                "m-1",
                members=[
                    Member(
                        member_id="m-1",
                        client_id="client",
                        client_host="/127.0.0.1",
                        session_timeout=10_000,
                        subscription=b"\x00\x03sub",
                        assignment=b"\x00\x03asg",
                    )
                ],
            ),
            id="v0",
        ),
        # Version 3 is what the coordinator writes.
        pytest.param(
            3,
            _string("consumer")
            + _int32(3)
            + _string("range")
            + _string("m-1")
            + _int64(1_700_000_000_000)
            + _int32(1)  # members
            + _string("m-1")
            + _string("static-1")
            + _string("client")
            + _string("/127.0.0.1")
            + _int32(60_000)
            + _int32(10_000)
            + _blob(b"\x00\x03sub")
            + _blob(b"\x00\x03asg"),
            STABLE_GROUP,
            id="v3",
        ),
        # An Empty group: no protocol, no leader, no members.
        pytest.param(
            3,
            _string("consumer")
            + _int32(4)
            + _string(None)
            + _string(None)
            + _int64(-1)
            + _int32(0),
            GroupMetadataValue("consumer", generation=4, protocol=None, leader=None),
            id="v3-empty",
        ),
        pytest.param(
            4,
            _compact(b"consumer")
            + _int32(3)
            + _compact(b"range")
            + _compact(b"m-1")
            + _int64(1_700_000_000_000)
            + bytes([1 + 1])  # compact array of one member
            + _compact(b"m-1")
            + _compact(b"static-1")
            + _compact(b"client")
            + _compact(b"/127.0.0.1")
            + _int32(60_000)
            + _int32(10_000)
            + _compact(b"\x00\x03sub")
            + _compact(b"\x00\x03asg")
            + NO_TAGS  # the member's tagged fields
            + NO_TAGS,  # the value's tagged fields
            STABLE_GROUP,
            id="v4-flexible",
        ),
    ],
)
def test_group_metadata_value_vectors(version: int, wire: bytes, value: GroupMetadataValue) -> None:
    assert encode_versioned(value, version) == _int16(version) + wire
    assert decode_versioned(GroupMetadataValue, _int16(version) + wire) == value
