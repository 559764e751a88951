"""What fuzzing found (tools/fuzz, tests/protocol/test_fuzz_*.py), each kept as a test of the fix
at its cause. Every test names the oracle that caught it, how, and what the code did wrong."""

from __future__ import annotations

import struct

import pytest
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import CorruptRecordError, decode_batch, validate_records

from tools.fuzz.targets import build_batch, check_batch_decoders, check_fetched_records

# A batch header: baseOffset 0, producer id -1, one record, base timestamp 1000 (the length, magic
# and CRC are filled in by build_batch).
HEADER_FIELDS = struct.pack(">qiibIhiqqqhii", 0, 0, 0, 2, 0, 0, 0, 1000, 1000, -1, -1, -1, 1)


def zigzag(value: int) -> bytes:
    unsigned = (value << 1) ^ (value >> 63)
    out = bytearray()
    while unsigned > 0x7F:
        out.append(unsigned & 0x7F | 0x80)
        unsigned >>= 7
    return bytes(out + bytes([unsigned]))


def record(timestamp_delta: bytes = b"\x00", offset_delta: bytes = b"\x00") -> bytes:
    """One record with key b"k", value b"v", no headers; its deltas as raw varint bytes."""
    body = b"\x00" + timestamp_delta + offset_delta + b"\x02k\x02v\x00"
    return zigzag(len(body)) + body


# check_batch_decoders (the differential oracle of the records target), on hand-built records
# with extreme deltas: decode_batch (the broker's decoder: ListOffsets by time, the group log)
# accepted records the consumer's compiled decoder refuses, handing the broker an offset or a
# timestamp past int64 that no response can carry (encoding it raises, and the connection that
# asked is closed). The Python decoder now checks what records_fast checks.
PAST_THEIR_TYPE = {
    "offsetDelta past int32": record(offset_delta=zigzag(1 << 31)),
    "offsetDelta below int32": record(offset_delta=zigzag(-(1 << 31) - 1)),
    "timestamp past int64": record(timestamp_delta=zigzag((1 << 63) - 1)),
    "varint with a 65th bit": record(timestamp_delta=b"\xff" * 9 + b"\x02"),
}


@pytest.mark.parametrize("section", PAST_THEIR_TYPE.values(), ids=PAST_THEIR_TYPE.keys())
def test_decode_batch_refuses_values_past_their_type(section: bytes) -> None:
    batch = build_batch(HEADER_FIELDS, section, CompressionType.NONE, compress_section=False)
    # The produce path reads headers only: the broker stores such a batch.
    assert validate_records(memoryview(bytearray(batch)), 1 << 20)
    with pytest.raises(CorruptRecordError) as refused:
        decode_batch(batch)
    assert refused.value.code == ErrorCode.CORRUPT_MESSAGE
    assert check_batch_decoders(batch) is False
    assert check_fetched_records(batch) == 0


def test_the_largest_values_that_fit_still_decode() -> None:
    section = record(
        timestamp_delta=zigzag((1 << 63) - 1 - 1000), offset_delta=zigzag((1 << 31) - 1)
    )
    batch = build_batch(HEADER_FIELDS, section, CompressionType.NONE, compress_section=False)
    [decoded] = decode_batch(batch)[1]
    assert (decoded.offset, decoded.timestamp_ms) == ((1 << 31) - 1, (1 << 63) - 1)
    assert check_batch_decoders(batch) is True
