"""Transaction markers: the control batches that end a transaction in a partition (KIP-98).

A marker is a batch of one record with the control and transactional attributes set, the
producer's id and epoch, and no sequence. Its record key is the control record key (version int16
0, type int16: 0 ABORT, 1 COMMIT); its value an `EndTxnMarker` (version int16 0, the coordinator
epoch int32), so a partition leader can refuse a marker from a coordinator older than the last one
it heard from. Clients skip control batches; read_committed consumers use them to know where an
aborted transaction ends.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

from riverbed.protocol.data_messages import EndTxnMarker
from riverbed.protocol.errors import ErrorCode, ProtocolDecodeError
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records_codec import decode_batch, encode_batch
from riverbed.protocol.records_header import BatchHeader, Bytes, CorruptRecordError
from riverbed.protocol.versioned import decode_versioned, encode_versioned

NO_SEQUENCE: Final = -1
CONTROL_KEY_VERSION: Final = 0
MARKER_VALUE_VERSION: Final = 0
_CONTROL_KEY: Final = struct.Struct(">hh")


class ControlType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1


def encode_marker_batch(
    producer_id: int,
    producer_epoch: int,
    control_type: ControlType,
    coordinator_epoch: int,
    timestamp_ms: int,
) -> bytes:
    """One marker batch at offset 0 (the log assigns its real offset on append)."""
    key = _CONTROL_KEY.pack(CONTROL_KEY_VERSION, control_type)
    marker = EndTxnMarker(coordinator_epoch=coordinator_epoch)
    value = encode_versioned(marker, MARKER_VALUE_VERSION)
    return encode_batch(
        [(key, value, (), timestamp_ms)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        is_transactional=True,
        is_control=True,
    )


def read_marker(buf: Bytes, position: int, header: BatchHeader) -> tuple[ControlType, int]:
    """(type, coordinator epoch) of the marker batch at `position` of `buf`. Raises
    CorruptRecordError for a control batch that is not a well-formed transaction marker."""
    tp = TopicPartition("", -1)  # only named in errors, which say the offset instead
    records = decode_batch(tp, buf, position, header)
    problem = None
    if not header.is_control or len(records) != 1:
        problem = "is not a one-record control batch"
    else:
        key, value = records[0].key, records[0].value
        if key is None or len(key) < _CONTROL_KEY.size:
            problem = "has no control record key"
        else:
            _, type_id = _CONTROL_KEY.unpack_from(key)
            if type_id not in (ControlType.ABORT, ControlType.COMMIT):
                problem = f"is a control batch of type {type_id}, not a transaction marker"
            elif value is None:
                problem = "has no marker value"
            else:
                try:
                    marker = decode_versioned(EndTxnMarker, value)
                except ProtocolDecodeError as error:
                    problem = f"has an unreadable marker value: {error}"
                else:
                    return ControlType(type_id), marker.coordinator_epoch
    raise CorruptRecordError(
        ErrorCode.CORRUPT_MESSAGE, f"batch at offset {header.base_offset} {problem}"
    )
