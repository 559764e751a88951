"""Record batch v2 (magic 2) headers: the broker's hot path never looks past them.

Layout of a batch (big-endian), positions relative to the batch start:

    0  baseOffset int64          \\ LOG_OVERHEAD: the same in every message format,
    8  batchLength int32         /  batchLength counts the bytes after this field
   12  partitionLeaderEpoch int32
   16  magic int8                   at 16 in v0/v1 message sets too, so it is checked first
   17  crc uint32                   CRC-32C of attributes .. end of batch
   21  attributes int16             bits 0-2 codec, 3 timestamp type, 4 transactional, 5 control
   23  lastOffsetDelta int32
   27  baseTimestamp int64
   35  maxTimestamp int64
   43  producerId int64
   51  producerEpoch int16
   53  baseSequence int32
   57  recordsCount int32
   61  records (compressed as a whole when the codec is not NONE)

The CRC leaves out baseOffset and partitionLeaderEpoch so the broker can assign both in place
without recomputing it. Functions here take a buffer and a position (the log reads with
os.pread) and never copy or walk record data.
"""

import dataclasses
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.errors import ErrorCode, KafkaError

Bytes = bytes | bytearray | memoryview

MAGIC_V2 = 2

BASE_OFFSET_POSITION = 0
BATCH_LENGTH_POSITION = 8
PARTITION_LEADER_EPOCH_POSITION = 12
MAGIC_POSITION = 16
CRC_POSITION = 17
ATTRIBUTES_POSITION = 21
LAST_OFFSET_DELTA_POSITION = 23
BASE_TIMESTAMP_POSITION = 27
MAX_TIMESTAMP_POSITION = 35
PRODUCER_ID_POSITION = 43
PRODUCER_EPOCH_POSITION = 51
BASE_SEQUENCE_POSITION = 53
RECORDS_COUNT_POSITION = 57
RECORDS_POSITION = 61

LOG_OVERHEAD = 12
RECORD_BATCH_OVERHEAD = 61
# The smallest batchLength that still holds a whole v2 header.
BATCH_LENGTH_MIN = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD

COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20

TIMESTAMP_TYPE_CREATE_TIME = 0
TIMESTAMP_TYPE_LOG_APPEND_TIME = 1

NO_PRODUCER_ID = -1

HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_PARTITION_LEADER_EPOCH = struct.Struct(">i")
_MAGIC = struct.Struct(">b")


class CorruptRecordError(KafkaError):
    """These bytes are not a valid v2 record batch.

    `.code` names the Kafka error to report: CORRUPT_MESSAGE, or UNSUPPORTED_FOR_MESSAGE_FORMAT
    when the bytes are an older (magic 0 or 1) message set.
    """


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    def placed(self, base_offset: int, partition_leader_epoch: int) -> "BatchHeader":
        """This header with the two fields the leader assigns on append. Built field by field:
        dataclasses.replace looks every field up by name, on every produce."""
        return BatchHeader(
            base_offset,
            self.batch_length,
            partition_leader_epoch,
            self.magic,
            self.crc,
            self.attributes,
            self.last_offset_delta,
            self.base_timestamp,
            self.max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self.records_count,
        )

    @property
    def size_bytes(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def compression(self) -> CompressionType:
        """Raises CorruptRecordError for codec ids Kafka does not define (5-7)."""
        codec_id = self.attributes & COMPRESSION_CODEC_MASK
        if codec_id > CompressionType.ZSTD:
            raise CorruptRecordError(
                ErrorCode.CORRUPT_MESSAGE,
                f"record batch names unknown compression codec {codec_id}",
            )
        return CompressionType(codec_id)

    @property
    def timestamp_type(self) -> int:
        """TIMESTAMP_TYPE_CREATE_TIME (0) or TIMESTAMP_TYPE_LOG_APPEND_TIME (1)."""
        return (self.attributes & TIMESTAMP_TYPE_MASK) >> 3

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)


def parse_batch_header(buf: Bytes, position: int = 0) -> BatchHeader:
    """Read the header of the batch that starts at `position`; the records need not be present.

    Raises CorruptRecordError if fewer than RECORD_BATCH_OVERHEAD bytes remain, if the magic is
    not 2 (code UNSUPPORTED_FOR_MESSAGE_FORMAT), or if batchLength cannot hold a v2 header.
    """
    remaining = len(buf) - position
    if remaining <= MAGIC_POSITION:
        raise CorruptRecordError(
            ErrorCode.CORRUPT_MESSAGE,
            f"record batch at position {position} is truncated: {remaining} bytes left",
        )
    (magic,) = _MAGIC.unpack_from(buf, position + MAGIC_POSITION)
    if magic != MAGIC_V2:
        raise CorruptRecordError(
            ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
            f"record batch at position {position} has magic {magic}; only magic 2 is supported",
        )
    if remaining < RECORD_BATCH_OVERHEAD:
        raise CorruptRecordError(
            ErrorCode.CORRUPT_MESSAGE,
            f"record batch header at position {position} is truncated: {remaining} bytes left",
        )
    header = BatchHeader(*HEADER_STRUCT.unpack_from(buf, position))
    if header.batch_length < BATCH_LENGTH_MIN:
        raise CorruptRecordError(
            ErrorCode.CORRUPT_MESSAGE,
            f"record batch at position {position} has batchLength {header.batch_length}, "
            f"below the {BATCH_LENGTH_MIN} bytes of a v2 header",
        )
    return header


def batch_crc_ok(buf: Bytes, position: int, header: BatchHeader) -> bool:
    """True if the whole batch is in `buf` and its CRC-32C matches (attributes .. end of batch)."""
    end = position + header.size_bytes
    if end > len(buf):
        return False
    covered = memoryview(buf)[position + ATTRIBUTES_POSITION : end]
    return bool(crc32c.crc32c(covered) == header.crc)


def iter_batch_headers(buf: Bytes, position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of each whole batch from `position` on, without checking CRCs.

    Stops silently at the end of `buf` or at a batch that `buf` holds only part of: a reader of
    a file chunk then reads on from the end of the last batch yielded, and recovery truncates
    there. Raises CorruptRecordError for a header that is complete but invalid.
    """
    end = len(buf)
    while end - position >= RECORD_BATCH_OVERHEAD:
        header = parse_batch_header(buf, position)
        if position + header.size_bytes > end:
            return
        yield position, header
        position += header.size_bytes


def validate_records(buf: Bytes, max_message_bytes: int) -> list[BatchHeader]:
    """Check the records of one partition in a produce request; return their batch headers.

    Header-only (the CRC is computed in C over a memoryview): no record is decoded. Raises
    KafkaError with the code a Kafka broker returns:
    - UNSUPPORTED_FOR_MESSAGE_FORMAT: a batch with magic 0 or 1;
    - MESSAGE_TOO_LARGE: a batch larger than `max_message_bytes`;
    - CORRUPT_MESSAGE: no bytes at all, a truncated batch or trailing partial bytes, a
      batchLength too small for a header, an unknown codec, or a CRC mismatch. Kafka's own
      reader silently drops a partial tail; we refuse it, since no client sends one on purpose;
    - INVALID_RECORD: a batch Kafka's LogValidator refuses from a client (its InvalidRecord
      Exception): recordsCount <= 0, lastOffsetDelta != recordsCount - 1, a control batch, or
      a producer id without a base sequence. Any baseOffset is accepted, as Kafka does: the
      broker overwrites it.
    """
    headers = _intact_batches(buf, max_message_bytes)
    position = 0
    for header in headers:
        _check_client_batch(header, position)
        position += header.size_bytes
    return headers


def validate_replicated_records(buf: Bytes) -> list[BatchHeader]:
    """Check batches a follower fetched from its leader: intact (sizes, CRC, codec), but with
    the leader's offsets, epochs and control batches, which a client may not send."""
    return _intact_batches(buf, max_message_bytes=len(buf))


def _intact_batches(buf: Bytes, max_message_bytes: int) -> list[BatchHeader]:
    view = memoryview(buf)
    end = len(view)
    if end == 0:
        raise CorruptRecordError(ErrorCode.CORRUPT_MESSAGE, "no record batch to check")
    headers = []
    position = 0
    while position < end:
        header = parse_batch_header(view, position)
        if header.size_bytes > max_message_bytes:
            raise KafkaError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"record batch at position {position} is {header.size_bytes} bytes, "
                f"over max.message.bytes {max_message_bytes}",
            )
        if position + header.size_bytes > end:
            raise CorruptRecordError(
                ErrorCode.CORRUPT_MESSAGE,
                f"record batch at position {position} is truncated: {header.size_bytes} bytes "
                f"announced, {end - position} present",
            )
        if not batch_crc_ok(view, position, header):
            raise CorruptRecordError(
                ErrorCode.CORRUPT_MESSAGE, f"record batch at position {position} fails its CRC"
            )
        _ = header.compression  # raises CorruptRecordError for an unknown codec
        headers.append(header)
        position += header.size_bytes
    return headers


def _check_client_batch(header: BatchHeader, position: int) -> None:
    problem = None
    if header.records_count <= 0:
        problem = f"has recordsCount {header.records_count}"
    elif header.last_offset_delta != header.records_count - 1:
        problem = (
            f"has lastOffsetDelta {header.last_offset_delta} for {header.records_count} records"
        )
    elif header.is_control:
        problem = "is a control batch; clients may not write control records"
    elif header.producer_id != NO_PRODUCER_ID and header.base_sequence < 0:
        problem = f"has producerId {header.producer_id} but baseSequence {header.base_sequence}"
    if problem is not None:
        raise KafkaError(ErrorCode.INVALID_RECORD, f"record batch at position {position} {problem}")


def assign_offsets(
    buf: memoryview,
    headers: list[BatchHeader],
    first_offset: int,
    partition_leader_epoch: int,
) -> list[BatchHeader]:
    """Rewrite baseOffset and partitionLeaderEpoch of `headers` (as returned by
    validate_records for this same `buf`) in place; the CRC does not cover either field.

    Returns the updated headers; the batches get consecutive offsets from `first_offset`.
    """
    covered_bytes = sum(header.size_bytes for header in headers)
    if covered_bytes != len(buf):
        raise ValueError(
            f"headers cover {covered_bytes} bytes but the buffer holds {len(buf)}: "
            "they were not validated from this buffer"
        )
    position = 0
    next_offset = first_offset
    assigned = []
    for header in headers:
        _BASE_OFFSET.pack_into(buf, position + BASE_OFFSET_POSITION, next_offset)
        _PARTITION_LEADER_EPOCH.pack_into(
            buf, position + PARTITION_LEADER_EPOCH_POSITION, partition_leader_epoch
        )
        assigned.append(header.placed(next_offset, partition_leader_epoch))
        next_offset += header.last_offset_delta + 1
        position += header.size_bytes
    return assigned


_ATTRIBUTES = struct.Struct(">h")
_MAX_TIMESTAMP = struct.Struct(">q")
_CRC = struct.Struct(">I")


def stamp_log_append_time(
    buf: memoryview, headers: list[BatchHeader], append_time_ms: int
) -> list[BatchHeader]:
    """Turn validated batches into LogAppendTime batches in place (`message.timestamp.type`).

    Like Kafka for magic v2: set the timestamp-type bit and maxTimestamp in each batch header and
    recompute the CRC (both fields are covered by it). Records keep their deltas untouched:
    consumers take every record's timestamp from maxTimestamp when the bit is set.
    """
    position = 0
    stamped = []
    for header in headers:
        attributes = header.attributes | TIMESTAMP_TYPE_MASK
        _ATTRIBUTES.pack_into(buf, position + ATTRIBUTES_POSITION, attributes)
        _MAX_TIMESTAMP.pack_into(buf, position + MAX_TIMESTAMP_POSITION, append_time_ms)
        end = position + header.size_bytes
        crc = crc32c.crc32c(buf[position + ATTRIBUTES_POSITION : end])
        _CRC.pack_into(buf, position + CRC_POSITION, crc)
        stamped.append(
            dataclasses.replace(
                header, attributes=attributes, max_timestamp=append_time_ms, crc=crc
            )
        )
        position = end
    return stamped
