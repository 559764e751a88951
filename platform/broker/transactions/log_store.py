"""The transaction coordinator's records in `__transaction_state`, and replaying them.

Records are Kafka's own, so Kafka tooling reads them: the key is a `TransactionLogKey` (key
version 0), the value a `TransactionLogValue` (version 1, flexible, as Kafka 3.x writes it), each
prefixed by its int16 version; a null value is a tombstone (the id expired). Kafka's states are
stored by id (riverbed.broker.transactions.state.TxnState). Writes go through the group
coordinator's `log_store.append` (one uncompressed batch, acknowledged once the ISR has it).

Loading reads the local log from its start to its end and keeps the latest value per key, which
is what compaction would leave.
"""

from __future__ import annotations

import logging
from typing import Final

from riverbed.broker.groups.log_store import Entry, replay_log
from riverbed.broker.transactions.state import (
    NO_PRODUCER_EPOCH,
    TxnMetadata,
    TxnState,
)
from riverbed.hot.replication.partitions import Partition
from riverbed.protocol.data_messages import TransactionLogKey, TransactionLogValue
from riverbed.protocol.errors import ProtocolDecodeError
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import CorruptRecordError, decode_batch, parse_batch_header
from riverbed.protocol.versioned import decode_versioned, encode_versioned, read_version

log = logging.getLogger(__name__)

KEY_VERSION: Final = 0
VALUE_VERSION: Final = 1

PartitionsSchema = TransactionLogValue.PartitionsSchema


# -- records ----------------------------------------------------------------------------------


def encode_key(transactional_id: str) -> bytes:
    return encode_versioned(TransactionLogKey(transactional_id=transactional_id), KEY_VERSION)


def decode_key(buf: bytes) -> str:
    version = read_version(buf)
    if version != KEY_VERSION:
        raise ProtocolDecodeError(f"unknown __transaction_state key version {version}")
    return decode_versioned(TransactionLogKey, buf).transactional_id


def encode_value(metadata: TxnMetadata) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(metadata.partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    value = TransactionLogValue(
        producer_id=metadata.producer_id,
        previous_producer_id=metadata.previous_producer_id,
        producer_epoch=metadata.producer_epoch,
        transaction_timeout_ms=metadata.timeout_ms,
        transaction_status=metadata.state.value,
        transaction_partitions=[
            PartitionsSchema(topic=topic, partition_ids=ids) for topic, ids in by_topic.items()
        ],
        transaction_last_update_timestamp_ms=metadata.last_update_timestamp_ms,
        transaction_start_timestamp_ms=metadata.start_timestamp_ms,
    )
    return encode_versioned(value, VALUE_VERSION)


def decode_value(transactional_id: str, buf: bytes) -> TxnMetadata:
    value = decode_versioned(TransactionLogValue, buf)
    try:
        state = TxnState(value.transaction_status)
    except ValueError:
        raise ProtocolDecodeError(
            f"unknown transaction status {value.transaction_status}"
        ) from None
    partitions = frozenset(
        TopicPartition(schema.topic, index)
        for schema in value.transaction_partitions or ()
        for index in schema.partition_ids
    )
    return TxnMetadata(
        transactional_id=transactional_id,
        producer_id=value.producer_id,
        producer_epoch=value.producer_epoch,
        timeout_ms=value.transaction_timeout_ms,
        state=state,
        partitions=partitions,
        start_timestamp_ms=value.transaction_start_timestamp_ms,
        last_update_timestamp_ms=value.transaction_last_update_timestamp_ms,
        previous_producer_id=value.previous_producer_id,
        last_producer_epoch=NO_PRODUCER_EPOCH,
    )


def entry(metadata: TxnMetadata) -> Entry:
    """The record of `metadata` (a tombstone for Dead: the id is forgotten)."""
    key = encode_key(metadata.transactional_id)
    if metadata.state is TxnState.DEAD:
        return key, None
    return key, encode_value(metadata)


# -- loading ----------------------------------------------------------------------------------


async def load(partition: Partition) -> dict[str, TxnMetadata]:
    """Replay the partition's local log from its start to its current end: the latest state of
    every transactional id in it (riverbed.broker.groups.log_store.replay_log reads it)."""
    loaded: dict[str, TxnMetadata] = {}
    await replay_log(partition, lambda data: _replay(data, loaded, partition))
    return loaded


def _replay(data: memoryview, loaded: dict[str, TxnMetadata], partition: Partition) -> int:
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
        position += header.size_bytes
        next_offset = header.last_offset + 1
        if header.is_control:
            continue
        for record in records:
            try:
                if record.key is None:
                    raise ValueError("a record without a key")
                transactional_id = decode_key(record.key)
                if record.value is None:
                    loaded.pop(transactional_id, None)
                else:
                    loaded[transactional_id] = decode_value(transactional_id, record.value)
            except (ProtocolDecodeError, ValueError) as error:
                log.warning("%s: skipping record at offset %d: %s", partition, record.offset, error)
    return next_offset
