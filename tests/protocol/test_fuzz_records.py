"""Fuzzing record batches on both sides of the broker.

- Produce (tools.fuzz.targets.check_produced_records): header and CRC validation, then the
  in-place offset and LogAppendTime rewrites. Any bytes are accepted with every byte in whole,
  CRC-intact batches that stay intact after the rewrites, or refused with the code Kafka uses.
- Fetch (check_fetched_records, check_batch_decoders): the compiled decoder (the consumer's and
  the broker's), the tests' Python oracle and the log cleaner's key reader, for every codec:
  records in offset order, or CORRUPT_MESSAGE; the three accept the same batches and agree.

Inputs: valid batches (every codec, transactional or not, LogAppendTime or not) with header
fields set to lying values, truncated, extended or bit-flipped; records sections edited and
wrapped back into a batch with a correct length and CRC, so the record parsers behind the CRC
check are reached, compressed by us (the decoders see the edit) or not (garbage under a codec).
Decompression bombs have their own tests (test_decompression_limits.py).
"""

from __future__ import annotations

import struct
from typing import Final

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from riverbed.protocol.compression import CompressionType, decompress
from riverbed.protocol.records import (
    ATTRIBUTES_POSITION,
    BATCH_LENGTH_POSITION,
    CRC_POSITION,
    LAST_OFFSET_DELTA_POSITION,
    MAGIC_POSITION,
    PRODUCER_ID_POSITION,
    RECORDS_COUNT_POSITION,
    RECORDS_POSITION,
    RecordInput,
    encode_batch,
    parse_batch_header,
)
from riverbed.protocol.records import BASE_OFFSET_POSITION as BASE_OFFSET
from riverbed.protocol.records import BASE_SEQUENCE_POSITION as BASE_SEQUENCE

from tools.fuzz.targets import (
    build_batch,
    check_batch_decoders,
    check_fetched_records,
    check_produced_records,
)

FUZZ: Final = settings(
    derandomize=True,
    database=None,
    deadline=1000,
    max_examples=250,
    suppress_health_check=[HealthCheck.too_slow],
)
TIMESTAMP_MS: Final = 1_700_000_000_000

fields = st.none() | st.binary(max_size=40)
headers = st.lists(st.tuples(st.text(max_size=6), fields), max_size=2)
records: st.SearchStrategy[list[RecordInput]] = st.lists(
    st.tuples(fields, fields, headers, st.integers(-1000, 1000).map(TIMESTAMP_MS.__add__)),
    min_size=1,
    max_size=6,
)


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    """One valid batch as a client writes it (any codec, idempotent or not)."""
    inputs: list[RecordInput] = draw(records)
    idempotent = draw(st.booleans())
    return encode_batch(
        inputs,
        compression=draw(st.sampled_from(CompressionType)),
        producer_id=draw(st.integers(0, 1 << 40)) if idempotent else -1,
        producer_epoch=draw(st.integers(0, 100)) if idempotent else -1,
        base_sequence=draw(st.integers(0, 1 << 20)) if idempotent else -1,
        timestamp_type=draw(st.sampled_from([0, 1])),
        is_transactional=idempotent and draw(st.booleans()),
    )


# Header fields and the values that lie in them.
_LIES: Final = [
    (BASE_OFFSET, ">q", [1, -1, 2**63 - 1]),
    (BATCH_LENGTH_POSITION, ">i", [-1, 0, 48, 49, 50, 2**31 - 1, 1 << 20]),
    (MAGIC_POSITION, ">b", [0, 1, 3, -1]),
    (CRC_POSITION, ">I", [0, 2**32 - 1]),
    (ATTRIBUTES_POSITION, ">h", [5, 6, 7, 0x20, 0x10, -1]),
    (LAST_OFFSET_DELTA_POSITION, ">i", [-1, 0, 1, 2**31 - 1]),
    (PRODUCER_ID_POSITION, ">q", [5, -2]),
    (BASE_SEQUENCE, ">i", [-1, 2**31 - 1]),
    (RECORDS_COUNT_POSITION, ">i", [-1, 0, 1, 2**31 - 1]),
]


@st.composite
def hostile_buffers(draw: st.DrawFn) -> bytes:
    """Valid batches, one to three, then up to three edits."""
    data = bytearray(b"".join(draw(st.lists(batches(), min_size=1, max_size=3))))
    for _ in range(draw(st.integers(0, 3))):
        edit = draw(st.integers(0, 4))
        position = draw(st.integers(0, len(data)))
        if edit == 0:  # a header field of the first batch set to a lie
            field, fmt, values = draw(st.sampled_from(_LIES))
            if field + struct.calcsize(fmt) <= len(data):
                struct.pack_into(fmt, data, field, draw(st.sampled_from(values)))
        elif edit == 1:
            del data[position:]
        elif edit == 2:
            data[position:position] = draw(st.binary(min_size=1, max_size=16))
        elif edit == 3 and position < len(data):
            data[position] ^= 1 << draw(st.integers(0, 7))
        else:
            data += draw(st.binary(max_size=70))
    return bytes(data)


@FUZZ
@given(data=hostile_buffers())
def test_produced_records_are_accepted_whole_or_refused_with_kafkas_code(data: bytes) -> None:
    check_produced_records(data)


@FUZZ
@given(data=st.binary(max_size=200), max_message_bytes=st.sampled_from([0, 61, 100, 1 << 20]))
def test_random_bytes_as_produced_records(data: bytes, max_message_bytes: int) -> None:
    check_produced_records(data, max_message_bytes)


@FUZZ
@given(batch=batches())
def test_valid_client_batches_are_accepted_and_decode_alike(batch: bytes) -> None:
    assert check_produced_records(batch)
    assert check_batch_decoders(batch)
    assert check_fetched_records(batch) == parse_batch_header(batch).records_count


@FUZZ
@given(data=hostile_buffers(), fetch_offset=st.integers(-2, 8), read_committed=st.booleans())
def test_fetched_records_decode_in_order_or_are_corrupt(
    data: bytes, fetch_offset: int, read_committed: bool
) -> None:
    check_fetched_records(data, fetch_offset, read_committed)
    if len(data) >= RECORDS_POSITION:
        check_batch_decoders(data)


@FUZZ
@given(
    batch=batches(),
    edits=st.lists(
        st.tuples(st.integers(0, 1 << 12), st.integers(0, 255), st.sampled_from("sidt")),
        min_size=1,
        max_size=4,
    ),
    codec=st.sampled_from(CompressionType),
)
def test_edited_sections_behind_a_valid_crc_decode_alike_or_are_corrupt(
    batch: bytes, edits: list[tuple[int, int, str]], codec: CompressionType
) -> None:
    """The records section, decompressed, edited, then compressed again under `codec` and
    wrapped with a correct length and CRC: the record parsers see exactly the edit."""
    header = parse_batch_header(batch)
    section = bytearray(decompress(header.compression, batch[RECORDS_POSITION:]))
    for at, byte, kind in edits:
        position = at % (len(section) + 1)
        if kind == "s" and position < len(section):
            section[position] = byte
        elif kind == "i":
            section.insert(position, byte)
        elif kind == "d" and position < len(section):
            del section[position]
        else:
            del section[position:]
    rebuilt = build_batch(batch[:RECORDS_POSITION], bytes(section), codec, compress_section=True)
    check_batch_decoders(rebuilt)
    check_fetched_records(rebuilt)
    check_produced_records(rebuilt)


@FUZZ
@given(
    batch=batches(),
    garbage=st.binary(max_size=120),
    codec=st.sampled_from(CompressionType),
)
def test_garbage_under_every_codec_is_corrupt(
    batch: bytes, garbage: bytes, codec: CompressionType
) -> None:
    """A section that claims a codec but holds garbage (maybe starting with the codec's magic)."""
    magic = {
        CompressionType.GZIP: b"\x1f\x8b\x08\x00",
        CompressionType.LZ4: b"\x04\x22\x4d\x18",
        CompressionType.ZSTD: b"\x28\xb5\x2f\xfd",
        CompressionType.SNAPPY: b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01",
    }.get(codec, b"")
    for section in (garbage, magic + garbage):
        rebuilt = build_batch(batch[:RECORDS_POSITION], section, codec, compress_section=False)
        check_batch_decoders(rebuilt)
        check_fetched_records(rebuilt)
