"""Transaction markers: what Riverbed writes is what Kafka's clients read, and back."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch
from riverbed.protocol.control_records import ControlType, encode_marker_batch, read_marker
from riverbed.protocol.records import CorruptRecordError, encode_batch, parse_batch_header


@pytest.mark.parametrize("control_type", list(ControlType))
def test_marker_round_trip(control_type: ControlType) -> None:
    batch = encode_marker_batch(4711, 3, control_type, 17, 1_700_000_000_000)
    header = parse_batch_header(batch)
    assert header.is_control
    assert header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (4711, 3, -1)
    assert read_marker(batch, 0, header) == (control_type, 17)


def test_kafka_python_reads_our_marker_as_kafka_writes_it() -> None:
    batch = DefaultRecordBatch(encode_marker_batch(9, 1, ControlType.COMMIT, 5, 1000))
    assert batch.is_control_batch
    assert batch.is_transactional
    assert batch.validate_crc()
    (record,) = list(batch)
    assert record.key == b"\x00\x00\x00\x01"  # version 0, COMMIT
    assert record.value == b"\x00\x00\x00\x00\x00\x05"  # version 0, coordinator epoch 5


def test_a_data_batch_is_no_marker() -> None:
    batch = encode_batch([(b"k", b"v", (), 0)], producer_id=1, producer_epoch=0, base_sequence=0)
    with pytest.raises(CorruptRecordError, match="not a one-record control batch"):
        read_marker(batch, 0, parse_batch_header(batch))
