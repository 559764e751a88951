"""Version-prefixed data: an int16 schema version, then the data schema's body in that version.

That is how Kafka frames the consumer protocol (JoinGroup metadata, SyncGroup assignments) and the
`__consumer_offsets` record keys and values (Kafka's `MessageUtil.toVersionPrefixedBytes`). The
two differ on versions they do not know:

* the consumer protocol is forward compatible: new versions only append fields, so a version
  above the highest we know is read as our highest and the bytes after it are ignored
  (`decode_consumer_protocol`, like Kafka's `ConsumerProtocol.deserializeSubscription`);
* `__consumer_offsets` records must be in a version we know (`decode_versioned`); the key's
  version says what the record is: 0 and 1 an offset commit, 2 group metadata
  (`decode_record_key`).
"""

from __future__ import annotations

from typing import Final, TypeVar

from riverbed.protocol.codec import decode_data, encode_data, read_data
from riverbed.protocol.data_messages import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    DataBody,
    GroupMetadataKey,
    OffsetCommitKey,
)
from riverbed.protocol.errors import ProtocolDecodeError
from riverbed.protocol.primitives import INT16

Data = TypeVar("Data", bound=DataBody)
ConsumerProtocol = TypeVar(
    "ConsumerProtocol", ConsumerProtocolSubscription, ConsumerProtocolAssignment
)
RecordKey = OffsetCommitKey | GroupMetadataKey

_RECORD_KEY_CLASSES: Final[tuple[type[RecordKey], ...]] = (OffsetCommitKey, GroupMetadataKey)


def encode_versioned(value: DataBody, version: int) -> bytes:
    """The int16 `version`, then `value` encoded in that version."""
    return INT16.pack(version) + encode_data(value, version)


def read_version(buf: bytes | bytearray | memoryview) -> int:
    """The int16 version prefix of `buf`."""
    if len(buf) < INT16.size:
        raise ProtocolDecodeError("truncated version prefix")
    version: int = INT16.unpack_from(buf, 0)[0]
    return version


def decode_versioned(cls: type[Data], buf: bytes | bytearray | memoryview) -> Data:
    """The `cls` value after the version prefix: a version `cls` has, filling `buf` exactly."""
    return decode_data(cls, memoryview(buf)[INT16.size :], read_version(buf))


def decode_consumer_protocol(
    cls: type[ConsumerProtocol], buf: bytes | bytearray | memoryview
) -> ConsumerProtocol:
    """A subscription or assignment, forward compatible: a version above the highest we know is
    read as that highest, ignoring what follows the fields it has."""
    version = read_version(buf)
    if version <= cls.HIGHEST_SUPPORTED_VERSION:
        return decode_versioned(cls, buf)
    value, _end = read_data(cls, buf, cls.HIGHEST_SUPPORTED_VERSION, INT16.size)
    return value


def encode_record_key(key: RecordKey) -> bytes:
    """A `__consumer_offsets` record key in the version Kafka writes: its schema's highest."""
    return encode_versioned(key, key.HIGHEST_SUPPORTED_VERSION)


def decode_record_key(buf: bytes | bytearray | memoryview) -> RecordKey:
    """An offset commit or group metadata key, told apart by its version."""
    version = read_version(buf)
    for cls in _RECORD_KEY_CLASSES:
        if cls.LOWEST_SUPPORTED_VERSION <= version <= cls.HIGHEST_SUPPORTED_VERSION:
            return decode_versioned(cls, buf)
    raise ProtocolDecodeError(f"unknown __consumer_offsets key version {version}")
