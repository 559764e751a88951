"""What fuzzing found (tools/fuzz, tests/protocol/test_fuzz_*.py), each kept as a test of the fix
at its cause. Every test names the oracle that caught it, how, and what the code did wrong."""

from __future__ import annotations

import base64
import struct

import pytest
from riverbed.client.fetched_records import PartitionFetch
from riverbed.client.types import TopicPartition
from riverbed.hot.storage.compaction import batch_keys
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import (
    CorruptRecordError,
    decode_batch,
    parse_batch_header,
    validate_records,
)

from tests.support.reference_decoder import reference_decode
from tools.fuzz.targets import (
    FUZZ_TP,
    build_batch,
    check_batch_decoders,
    check_fetched_records,
    fuzz_records,
)

INT32_MAX = (1 << 31) - 1


def header_fields(last_offset_delta: int = 0, records_count: int = 1) -> bytes:
    """A batch header: baseOffset 0, base timestamp 1000, no producer id (the length, magic and
    CRC are filled in by build_batch)."""
    return struct.pack(
        ">qiibIhiqqqhii", 0, 0, 0, 2, 0, 0, last_offset_delta, 1000, 1000, -1, -1, -1, records_count
    )


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
# with extreme deltas: the broker's decoder (ListOffsets by time, the group log), then a Python
# twin of the consumer's compiled one, accepted records the compiled one refuses, handing the
# broker an offset or a timestamp past int64 that no response can carry (encoding it raises, and
# the connection that asked is closed). The broker now decodes with the compiled decoder too;
# the Python one is the tests' oracle and checks what it checks.
PAST_THEIR_TYPE = {
    "offsetDelta past int32": record(offset_delta=zigzag(1 << 31)),
    "offsetDelta below int32": record(offset_delta=zigzag(-(1 << 31) - 1)),
    "timestamp past int64": record(timestamp_delta=zigzag((1 << 63) - 1)),
    "varint with a 65th bit": record(timestamp_delta=b"\xff" * 9 + b"\x02"),
}


@pytest.mark.parametrize("section", PAST_THEIR_TYPE.values(), ids=PAST_THEIR_TYPE.keys())
def test_decode_batch_refuses_values_past_their_type(section: bytes) -> None:
    batch = build_batch(header_fields(), section, CompressionType.NONE, compress_section=False)
    # The produce path reads headers only: the broker stores such a batch.
    assert validate_records(memoryview(bytearray(batch)), 1 << 20)
    with pytest.raises(CorruptRecordError) as refused:
        decode_batch(FUZZ_TP, batch, 0, parse_batch_header(batch))
    assert refused.value.code == ErrorCode.CORRUPT_MESSAGE
    with pytest.raises(CorruptRecordError):
        reference_decode(FUZZ_TP, batch)
    assert check_batch_decoders(batch) is False
    assert check_fetched_records(batch) == 0


def test_the_largest_values_that_fit_still_decode() -> None:
    section = record(
        timestamp_delta=zigzag((1 << 63) - 1 - 1000), offset_delta=zigzag((1 << 31) - 1)
    )
    fields = header_fields(last_offset_delta=INT32_MAX)
    batch = build_batch(fields, section, CompressionType.NONE, compress_section=False)
    [decoded] = decode_batch(FUZZ_TP, batch, 0, parse_batch_header(batch))
    assert (decoded.offset, decoded.timestamp_ms) == ((1 << 31) - 1, (1 << 63) - 1)
    assert check_batch_decoders(batch) is True


def record_at(offset_delta: int) -> bytes:
    return record(offset_delta=zigzag(offset_delta))


# atheris, records target (.fuzz/crashes/records/crash-170f9762...): a batch whose records'
# offset deltas are not 0, 1, 2... made the consumer hand out offsets out of order (and its
# position go backwards mid-batch); the log cleaner took them too. The broker stores such a batch
# (it reads headers only), so every decoder now refuses offsets that do not increase within
# [baseOffset, baseOffset + lastOffsetDelta], as tiering's decoder already did.
ATHERIS_RECORDS_OUT_OF_ORDER = base64.b64decode(
    "AjoAAAAAAAAAAAAAAFD///8AAAIkAAAABmtleQp2YWwA5QEAaAAAaOWD/88A/////////////////wAAAAIkAAAABmtl"
    "eQp2YWx1ZQICaAJ2Fi/9n6v++QIBAQAA"
)
OUT_OF_ORDER = {
    "backwards": ([1, 0], 1),
    "repeated": ([0, 0], 1),
    "past the batch": ([0, 5], 1),
    "before the batch": ([-1], 0),
}


def test_the_atheris_input_passes_the_records_target() -> None:
    fuzz_records(ATHERIS_RECORDS_OUT_OF_ORDER)


@pytest.mark.parametrize(
    ("deltas", "last_offset_delta"), OUT_OF_ORDER.values(), ids=OUT_OF_ORDER.keys()
)
def test_offsets_out_of_order_are_refused_by_every_decoder(
    deltas: list[int], last_offset_delta: int
) -> None:
    fields = header_fields(last_offset_delta, records_count=len(deltas))
    section = b"".join(record_at(delta) for delta in deltas)
    batch = build_batch(fields, section, CompressionType.NONE, compress_section=False)
    assert validate_records(memoryview(bytearray(batch)), 1 << 20)  # stored as it is
    with pytest.raises(CorruptRecordError, match="offset"):
        reference_decode(FUZZ_TP, batch)
    with pytest.raises(CorruptRecordError, match="offset"):
        PartitionFetch(TopicPartition("t", 0), batch, 0, 0).take(1)
    with pytest.raises(CorruptRecordError, match="offset"):
        batch_keys(batch, parse_batch_header(batch))
    assert check_batch_decoders(batch) is False


def test_gapped_offsets_within_the_batch_still_decode() -> None:
    fields = header_fields(last_offset_delta=6, records_count=3)
    section = record_at(0) + record_at(4) + record_at(6)
    batch = build_batch(fields, section, CompressionType.NONE, compress_section=False)
    assert [r.offset for r in PartitionFetch(TopicPartition("t", 0), batch, 0, 0).take(5)] == [
        0,
        4,
        6,
    ]
    assert check_batch_decoders(batch) is True
