"""Record batch headers on the broker's hot path: parsing, validation, CRC, offset assignment."""

import struct
import warnings

import crc32c
import pytest
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import (
    ATTRIBUTES_POSITION,
    BASE_OFFSET_POSITION,
    BASE_SEQUENCE_POSITION,
    BATCH_LENGTH_POSITION,
    CRC_POSITION,
    LAST_OFFSET_DELTA_POSITION,
    LOG_OVERHEAD,
    MAGIC_POSITION,
    PARTITION_LEADER_EPOCH_POSITION,
    PRODUCER_ID_POSITION,
    RECORD_BATCH_OVERHEAD,
    RECORDS_COUNT_POSITION,
    BatchHeader,
    CompressionType,
    CorruptRecordError,
    assign_offsets,
    batch_crc_ok,
    decode_batch,
    encode_batch,
    iter_batch_headers,
    parse_batch_header,
    validate_records,
)

with warnings.catch_warnings():
    # kafka-python's package import reads its JSON schemas with a deprecated importlib API.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

MAX_MESSAGE_BYTES = 1 << 20


def _batch(
    count: int = 3,
    compression: CompressionType = CompressionType.NONE,
    *,
    producer_id: int = -1,
    base_sequence: int = -1,
) -> bytes:
    records = [(b"key-%d" % i, b"value-%d" % i, [("h", b"x")], 1_000 + i) for i in range(count)]
    return encode_batch(
        records,
        compression=compression,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
    )


def _with_field(batch: bytes, position: int, fmt: str, value: int) -> bytes:
    """`batch` with one header field rewritten and the CRC made valid again."""
    patched = bytearray(batch)
    struct.pack_into(fmt, patched, position, value)
    struct.pack_into(">I", patched, CRC_POSITION, crc32c.crc32c(patched[ATTRIBUTES_POSITION:]))
    return bytes(patched)


def _error_code(buf: bytes, max_message_bytes: int = MAX_MESSAGE_BYTES) -> ErrorCode | None:
    try:
        validate_records(memoryview(buf), max_message_bytes)
    except KafkaError as error:
        return error.code
    return None


def test_header_layout_constants() -> None:
    assert LOG_OVERHEAD == 12
    assert RECORD_BATCH_OVERHEAD == 61
    assert (MAGIC_POSITION, CRC_POSITION, ATTRIBUTES_POSITION) == (16, 17, 21)


def test_parse_batch_header_reads_every_field() -> None:
    batch = encode_batch(
        [(None, b"a", [], 5_000), (None, b"b", [], 7_000), (None, b"c", [], 6_000)],
        base_offset=40,
        compression=CompressionType.ZSTD,
        producer_id=9,
        producer_epoch=2,
        base_sequence=11,
        partition_leader_epoch=4,
        timestamp_type=1,
        is_transactional=True,
    )
    header = parse_batch_header(b"\xff" * 7 + batch, 7)
    assert (header.base_offset, header.last_offset, header.records_count) == (40, 42, 3)
    assert (header.base_timestamp, header.max_timestamp) == (5_000, 7_000)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 2, 11)
    assert (header.partition_leader_epoch, header.magic) == (4, 2)
    assert header.size_bytes == len(batch)
    assert header.compression is CompressionType.ZSTD
    assert header.timestamp_type == 1
    assert header.is_transactional
    assert not header.is_control


def test_parse_batch_header_needs_only_the_header() -> None:
    batch = _batch()
    header = parse_batch_header(batch[:RECORD_BATCH_OVERHEAD])
    assert header.size_bytes == len(batch)
    assert not batch_crc_ok(batch[:-1], 0, header)
    assert batch_crc_ok(batch, 0, header)


@pytest.mark.parametrize("size", [0, 5, MAGIC_POSITION, MAGIC_POSITION + 1, 60])
def test_parse_batch_header_refuses_a_short_buffer(size: int) -> None:
    with pytest.raises(CorruptRecordError) as raised:
        parse_batch_header(_batch()[:size])
    assert raised.value.code == ErrorCode.CORRUPT_MESSAGE


def test_parse_batch_header_refuses_batch_length_below_a_header() -> None:
    batch = _with_field(_batch(), BATCH_LENGTH_POSITION, ">i", RECORD_BATCH_OVERHEAD - 13)
    with pytest.raises(CorruptRecordError, match="batchLength 48"):
        parse_batch_header(batch)


def test_validate_records_returns_one_header_per_batch() -> None:
    batches = [_batch(2), _batch(5, CompressionType.LZ4), _batch(1)]
    headers = validate_records(memoryview(b"".join(batches)), MAX_MESSAGE_BYTES)
    assert [header.records_count for header in headers] == [2, 5, 1]
    assert [header.size_bytes for header in headers] == [len(batch) for batch in batches]


@pytest.mark.parametrize("compression", [CompressionType.NONE, CompressionType.SNAPPY])
def test_flipping_any_covered_bit_is_caught(compression: CompressionType) -> None:
    batch = _batch(4, compression)
    assert _error_code(batch) is None
    for position in range(len(batch)):
        for bit in range(8):
            tampered = bytearray(batch)
            tampered[position] ^= 1 << bit
            # No limit on size: a flipped batchLength must read as truncation, not as too large.
            code = _error_code(bytes(tampered), max_message_bytes=1 << 32)
            if position < BATCH_LENGTH_POSITION or (
                PARTITION_LEADER_EPOCH_POSITION <= position < MAGIC_POSITION
            ):
                # baseOffset and partitionLeaderEpoch are outside the CRC: the broker assigns
                # both (and, like Kafka, accepts any baseOffset a producer writes).
                assert code is None, position
            elif position == MAGIC_POSITION:
                assert code == ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT
            else:
                assert code == ErrorCode.CORRUPT_MESSAGE, (position, bit)


def test_truncated_batches_and_partial_tails_are_corrupt() -> None:
    first, second = _batch(2), _batch(3)
    both = first + second
    for cut in range(1, len(both)):
        if cut == len(first):
            continue
        assert _error_code(both[:cut]) == ErrorCode.CORRUPT_MESSAGE, cut
    assert _error_code(first + b"\x00" * 5) == ErrorCode.CORRUPT_MESSAGE


def test_empty_records_are_corrupt() -> None:
    assert _error_code(b"") == ErrorCode.CORRUPT_MESSAGE


def test_batch_over_max_message_bytes_is_too_large() -> None:
    batch = _batch(50)
    validate_records(memoryview(batch), len(batch))
    with pytest.raises(KafkaError) as raised:
        validate_records(memoryview(batch), len(batch) - 1)
    assert raised.value.code == ErrorCode.MESSAGE_TOO_LARGE


@pytest.mark.parametrize("magic", [0, 1])
def test_magic_0_and_1_message_sets_are_unsupported(magic: int) -> None:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
    for offset in range(3):
        builder.append(offset, timestamp=1_000 if magic else None, key=b"k", value=b"v")
    message_set = bytes(builder.build())
    assert message_set[MAGIC_POSITION] == magic
    assert _error_code(message_set) == ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT
    with pytest.raises(CorruptRecordError) as raised:
        parse_batch_header(message_set)
    assert raised.value.code == ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT


@pytest.mark.parametrize(
    ("position", "fmt", "value", "problem"),
    [
        (RECORDS_COUNT_POSITION, ">i", 0, "recordsCount 0"),
        (RECORDS_COUNT_POSITION, ">i", -1, "recordsCount -1"),
        (LAST_OFFSET_DELTA_POSITION, ">i", 5, "lastOffsetDelta 5 for 3 records"),
        (ATTRIBUTES_POSITION, ">h", 0x20, "control batch"),
        (PRODUCER_ID_POSITION, ">q", 77, "producerId 77 but baseSequence -1"),
    ],
)
def test_batches_kafka_refuses_from_a_client_are_invalid_records(
    position: int, fmt: str, value: int, problem: str
) -> None:
    with pytest.raises(KafkaError, match=problem) as raised:
        validate_records(memoryview(_with_field(_batch(), position, fmt, value)), MAX_MESSAGE_BYTES)
    assert raised.value.code == ErrorCode.INVALID_RECORD


def test_unknown_compression_codec_is_corrupt() -> None:
    batch = _with_field(_batch(), ATTRIBUTES_POSITION, ">h", 5)
    assert _error_code(batch) == ErrorCode.CORRUPT_MESSAGE


def test_idempotent_batch_with_base_sequence_is_valid() -> None:
    batch = _batch(producer_id=77, base_sequence=0)
    assert _error_code(batch) is None
    unsequenced = _with_field(batch, BASE_SEQUENCE_POSITION, ">i", -1)
    assert _error_code(unsequenced) == ErrorCode.INVALID_RECORD


def test_assign_offsets_rewrites_in_place_and_keeps_crcs_valid() -> None:
    batches = [_batch(2), _batch(4, CompressionType.GZIP), _batch(1)]
    buf = memoryview(bytearray(b"".join(batches)))
    headers = validate_records(buf, MAX_MESSAGE_BYTES)
    assigned = assign_offsets(buf, headers, first_offset=1_000, partition_leader_epoch=6)
    assert [(h.base_offset, h.last_offset) for h in assigned] == [
        (1_000, 1_001),
        (1_002, 1_005),
        (1_006, 1_006),
    ]
    assert all(h.partition_leader_epoch == 6 for h in assigned)
    positions = [position for position, _ in iter_batch_headers(buf)]
    for position, header in zip(positions, assigned, strict=True):
        assert parse_batch_header(buf, position) == header
        assert batch_crc_ok(buf, position, header)
        records = decode_batch(TopicPartition("t", 0), buf, position, header)
        assert [record.offset for record in records] == list(
            range(header.base_offset, header.last_offset + 1)
        )


def test_assign_offsets_refuses_headers_of_another_buffer() -> None:
    buf = memoryview(bytearray(_batch(2) + _batch(2)))
    headers = validate_records(memoryview(_batch(2)), MAX_MESSAGE_BYTES)
    with pytest.raises(ValueError, match="not validated from this buffer"):
        assign_offsets(buf, headers, 0, 0)
    assert bytes(buf[BASE_OFFSET_POSITION:LOG_OVERHEAD]) == _batch(2)[:LOG_OVERHEAD]


def test_iter_batch_headers_walks_whole_batches_and_stops_at_a_partial_one() -> None:
    batches = [_batch(1), _batch(7, CompressionType.ZSTD), _batch(2)]
    log = b"".join(batches)
    walked = list(iter_batch_headers(log + batches[0][:30]))
    starts = [0, len(batches[0]), len(batches[0]) + len(batches[1])]
    assert [position for position, _ in walked] == starts
    assert all(batch_crc_ok(log, position, header) for position, header in walked)
    assert [position for position, _ in iter_batch_headers(log[:-1], len(batches[0]))] == [
        starts[1]
    ]
    assert list(iter_batch_headers(log, len(log))) == []


def test_iter_batch_headers_raises_on_an_invalid_header() -> None:
    bad = _with_field(_batch(), BATCH_LENGTH_POSITION, ">i", 3)
    walked: list[tuple[int, BatchHeader]] = []
    with pytest.raises(CorruptRecordError):
        walked.extend(iter_batch_headers(_batch() + bad))
    assert [position for position, _ in walked] == [0]
