"""The coordinator's records in `__consumer_offsets`: append them as the leader, replay them.

Records are Kafka's own, so Kafka tooling reads them: the key is an `OffsetCommitKey` (key
version 1) or a `GroupMetadataKey` (version 2), the value an `OffsetCommitValue` (version 3, or
1 when it carries an expire timestamp, as Kafka writes it) or a `GroupMetadataValue`, each
prefixed by its int16 version; a null value is a tombstone. They are written as one uncompressed
magic-v2 batch per write (CreateTime = now) and count only once the high watermark passes them: a
write the caller sees succeed is on every in-sync replica. A write has no producer id, except a
TxnOffsetCommit's: one transactional batch with the producer's id and epoch (base sequence 0, as
Kafka writes it), appended with the coordinator's origin so the log checks the epoch but no
sequence.

Loading reads the local log from its start to its end, batch by batch, and keeps the latest value
per key (tombstones delete), which is what compaction would leave. Offsets in a transactional
batch are pending until a control batch (the transaction's marker) of the same producer id
decides them: COMMIT makes them the committed offsets (unless a later record of the key already
is), ABORT drops them; see riverbed.broker.groups.txn_offsets.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from riverbed.broker.groups.txn_offsets import PendingTransactionalOffsets
from riverbed.hot.replication.partitions import Partition
from riverbed.hot.storage.transactions import AppendOrigin
from riverbed.protocol.control_records import ControlType, read_marker
from riverbed.protocol.data_messages import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
)
from riverbed.protocol.errors import ErrorCode, KafkaError, ProtocolDecodeError
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import (
    BatchHeader,
    CorruptRecordError,
    decode_batch,
    encode_batch,
    parse_batch_header,
    validate_records,
)
from riverbed.protocol.versioned import (
    decode_record_key,
    decode_versioned,
    encode_record_key,
    encode_versioned,
)

log = logging.getLogger(__name__)

# Kafka's offsets.load.buffer.size: how much of the log one load step reads (one batch at least).
LOAD_BUFFER_BYTES: Final = 5 * 1024 * 1024
OFFSET_VALUE_VERSION: Final = 3
# The only OffsetCommitValue version with an expire timestamp (OffsetCommit v2-4 retention).
OFFSET_VALUE_EXPIRING_VERSION: Final = 1
GROUP_VALUE_VERSION: Final = 3
NO_TIMESTAMP: Final = -1
NO_LEADER_EPOCH: Final = -1
# A TxnOffsetCommit batch's base sequence: the coordinator's origin skips sequence checks.
TXN_BASE_SEQUENCE: Final = 0

Entry = tuple[bytes, bytes | None]


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """One partition's committed offset, as the log holds it."""

    offset: int
    leader_epoch: int  # NO_LEADER_EPOCH when the client named none
    metadata: str
    commit_timestamp_ms: int
    expire_timestamp_ms: int = NO_TIMESTAMP  # only from OffsetCommit v2-4 with a retention time
    # Where the record sits in __consumer_offsets: of two values for a key the later one wins.
    record_offset: int = -1


@dataclass(frozen=True, slots=True)
class TransactionalProducer:
    """The transactional producer a TxnOffsetCommit's write belongs to."""

    producer_id: int
    producer_epoch: int


@dataclass(slots=True)
class LoadedPartition:
    """What a load found: the latest offsets and group metadata of every group in a partition,
    and the transactional offsets no marker decided yet."""

    offsets: dict[str, dict[TopicPartition, CommittedOffset]] = field(default_factory=dict)
    groups: dict[str, GroupMetadataValue] = field(default_factory=dict)
    transactional: PendingTransactionalOffsets = field(default_factory=PendingTransactionalOffsets)

    def group_ids(self) -> set[str]:
        return set(self.offsets) | set(self.groups) | self.transactional.group_ids()


# -- records ----------------------------------------------------------------------------------


def offset_commit_entry(group_id: str, tp: TopicPartition, committed: CommittedOffset) -> Entry:
    value_version = (
        OFFSET_VALUE_EXPIRING_VERSION
        if committed.expire_timestamp_ms != NO_TIMESTAMP
        else OFFSET_VALUE_VERSION
    )
    value = OffsetCommitValue(
        offset=committed.offset,
        leader_epoch=committed.leader_epoch,
        metadata=committed.metadata,
        commit_timestamp=committed.commit_timestamp_ms,
        expire_timestamp=committed.expire_timestamp_ms,
    )
    return _offset_key(group_id, tp), encode_versioned(value, value_version)


def offset_tombstone(group_id: str, tp: TopicPartition) -> Entry:
    return _offset_key(group_id, tp), None


def group_metadata_entry(group_id: str, value: GroupMetadataValue | None) -> Entry:
    key = encode_record_key(GroupMetadataKey(group=group_id))
    return key, None if value is None else encode_versioned(value, GROUP_VALUE_VERSION)


def _offset_key(group_id: str, tp: TopicPartition) -> bytes:
    return encode_record_key(
        OffsetCommitKey(group=group_id, topic=tp.topic, partition=tp.partition)
    )


# -- writing ----------------------------------------------------------------------------------


# Told the offset of the first entry as soon as the batch is in the local log (before it is
# committed), in the same synchronous stretch as the append.
OnAppended = Callable[[int], None]


async def append(
    partition: Partition,
    entries: Sequence[Entry],
    now_ms: int,
    timeout_ms: int,
    *,
    producer: TransactionalProducer | None = None,
    on_appended: OnAppended | None = None,
) -> int:
    """Append `entries` as one batch and wait until they are committed; return the offset of
    the first. With a `producer`, the batch is part of its transaction. Raises KafkaError with
    the storage's code (see `coordinator_error`)."""
    records = memoryview(bytearray(_encode(entries, now_ms, producer)))
    headers = validate_records(records, partition.log.config.max_message_bytes)
    if partition.under_min_isr():
        raise KafkaError(
            ErrorCode.NOT_ENOUGH_REPLICAS,
            f"{partition}: {len(partition.isr)} in-sync replicas, "
            f"min.insync.replicas is {partition.min_insync_replicas}",
        )
    result = partition.append_as_leader(records, headers, now_ms, origin=AppendOrigin.COORDINATOR)
    if on_appended is not None:
        on_appended(result.first_offset)
    try:
        async with asyncio.timeout(timeout_ms / 1000):
            await partition.committed(result.last_offset + 1)
    except TimeoutError:
        raise KafkaError(
            ErrorCode.REQUEST_TIMED_OUT,
            f"{partition}: not replicated to the ISR within {timeout_ms} ms",
        ) from None
    if partition.under_min_isr():
        raise KafkaError(
            ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            f"{partition}: the ISR shrank below min.insync.replicas after the append",
        )
    return result.first_offset


def _encode(entries: Sequence[Entry], now_ms: int, producer: TransactionalProducer | None) -> bytes:
    records = [(key, value, (), now_ms) for key, value in entries]
    if producer is None:
        return encode_batch(records)
    return encode_batch(
        records,
        producer_id=producer.producer_id,
        producer_epoch=producer.producer_epoch,
        base_sequence=TXN_BASE_SEQUENCE,
        is_transactional=True,
    )


# Kafka's mapping of a failed __consumer_offsets write to the code a group client understands.
_COORDINATOR_ERRORS: Final = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.REQUEST_TIMED_OUT: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
}
_TOO_LARGE: Final = frozenset(
    {ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_FETCH_SIZE}
)


def coordinator_error(error: KafkaError, *, commit: bool) -> KafkaError:
    """The error a client sees for a failed write: an offset commit too large for the log is
    INVALID_COMMIT_OFFSET_SIZE, any other write too large UNKNOWN_SERVER_ERROR."""
    if error.code in _TOO_LARGE:
        code = ErrorCode.INVALID_COMMIT_OFFSET_SIZE if commit else ErrorCode.UNKNOWN_SERVER_ERROR
    else:
        code = _COORDINATOR_ERRORS.get(error.code, error.code)
    return KafkaError(code, error.message)


# -- loading ----------------------------------------------------------------------------------


async def load(partition: Partition) -> LoadedPartition:
    """Replay the partition's local log from its start to its current end."""
    loaded = LoadedPartition()
    await replay_log(partition, lambda data: _replay(data, loaded, partition))
    return loaded


async def replay_log(partition: Partition, replay: Callable[[memoryview], int]) -> None:
    """Hand the partition's local log, from its start to its current end, to `replay` a chunk
    of whole batches at a time (`replay` returns the offset after the last batch it applied):
    a coordinator's load, of `__consumer_offsets` or `__transaction_state`.

    Yields to the event loop between reads (file reads run in a worker thread), so a large
    partition does not stall the broker; the caller cancels it when the leadership moves.
    """
    partition_log = partition.log
    offset = partition_log.log_start_offset
    end_offset = partition_log.log_end_offset
    while offset < end_offset:
        read = partition_log.read(offset, LOAD_BUFFER_BYTES, end_offset)
        if read is None:
            break
        region = read.region
        try:
            data = await asyncio.to_thread(os.pread, region.fd, region.size, region.position)
        finally:
            region.close()
        next_offset = replay(memoryview(data))
        if next_offset <= offset:
            break  # no whole batch in the region: the log ends in a torn batch
        offset = next_offset


def _replay(data: memoryview, loaded: LoadedPartition, partition: Partition) -> int:
    """Apply the whole batches in `data`; return the offset after the last one."""
    tp = TopicPartition(partition.topic, partition.index)
    position = 0
    next_offset = -1
    while position < len(data):
        try:
            header = parse_batch_header(data, position)
            records = decode_batch(tp, data, position, header)
        except CorruptRecordError:
            break  # a batch cut by the region's end (the next read starts at it)
        if header.is_control:
            _replay_marker(data, position, header, loaded, partition)
        position += header.size_bytes
        next_offset = header.last_offset + 1
        if header.is_control:
            continue
        producer_id = header.producer_id if header.is_transactional else None
        for record in records:
            try:
                _apply(loaded, record.offset, record.key, record.value, producer_id)
            except (ProtocolDecodeError, ValueError) as error:
                log.warning("%s: skipping record at offset %d: %s", partition, record.offset, error)
    return next_offset


def _replay_marker(
    data: memoryview,
    position: int,
    header: BatchHeader,
    loaded: LoadedPartition,
    partition: Partition,
) -> None:
    """A control batch: a marker decides its producer's pending offsets (COMMIT makes them
    committed, ABORT drops them); any other control batch is skipped."""
    try:
        control_type, _ = read_marker(data, position, header)
    except CorruptRecordError as error:
        log.warning(
            "%s: skipping control batch at offset %d: %s", partition, header.base_offset, error
        )
        return
    completed = loaded.transactional.complete(header.producer_id)
    if control_type is not ControlType.COMMIT:
        return
    for group_id, offsets in completed.items():
        current = loaded.offsets.setdefault(group_id, {})
        for tp, committed in offsets.items():
            existing = current.get(tp)
            # A later non-transactional commit of the key stays (Kafka keeps the later record).
            if existing is None or existing.record_offset < committed.record_offset:
                current[tp] = committed


def _apply(
    loaded: LoadedPartition,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    producer_id: int | None,
) -> None:
    """Apply one record; `producer_id`: of the transaction the record's batch belongs to."""
    if key is None:
        raise ValueError("a record without a key")
    record_key = decode_record_key(key)
    if isinstance(record_key, OffsetCommitKey):
        tp = TopicPartition(record_key.topic, record_key.partition)
        if value is None:
            offsets = loaded.offsets.get(record_key.group, {})
            offsets.pop(tp, None)
            if not offsets:
                loaded.offsets.pop(record_key.group, None)
            loaded.transactional.discard(record_key.group, tp, offset)
        else:
            committed = _committed(decode_versioned(OffsetCommitValue, value), offset)
            if producer_id is None:
                loaded.offsets.setdefault(record_key.group, {})[tp] = committed
            else:
                loaded.transactional.add(producer_id, record_key.group, tp, committed)
    elif value is None:
        loaded.groups.pop(record_key.group, None)
    else:
        loaded.groups[record_key.group] = decode_versioned(GroupMetadataValue, value)


def _committed(value: OffsetCommitValue, record_offset: int) -> CommittedOffset:
    return CommittedOffset(
        offset=value.offset,
        leader_epoch=value.leader_epoch,
        metadata=value.metadata,
        commit_timestamp_ms=value.commit_timestamp,
        expire_timestamp_ms=value.expire_timestamp,
        record_offset=record_offset,
    )
