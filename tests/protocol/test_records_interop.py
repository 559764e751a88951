"""Batches built by aiokafka and kafka-python decode identically with ours, and the reverse.

aiokafka is used as installed (its C extension when present); kafka-python is pure Python and
writes snappy in the xerial framing of Java producers.
"""

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka.record import default_records as aiokafka_records
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import (
    TIMESTAMP_TYPE_CREATE_TIME,
    CompressionType,
    Record,
    RecordInput,
    decode_batch,
    encode_batch,
    parse_batch_header,
    validate_records,
)

with warnings.catch_warnings():
    # kafka-python's package import reads its JSON schemas with a deprecated importlib API.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record import default_records as kafka_python_records

LIBRARIES = {"aiokafka": aiokafka_records, "kafka-python": kafka_python_records}
TP = TopicPartition("interop", 0)

fields = st.none() | st.binary(max_size=300)
record_inputs = st.lists(
    st.tuples(
        fields,
        fields,
        st.lists(st.tuples(st.text(max_size=10), fields), max_size=3),
        st.integers(0, 1 << 42),
    ),
    min_size=1,
    max_size=30,
)


def _theirs_build(library: Any, records: list[RecordInput], codec: CompressionType) -> bytes:
    builder = library.DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for offset, (key, value, headers, timestamp_ms) in enumerate(records):
        builder.append(offset, timestamp=timestamp_ms, key=key, value=value, headers=headers)
    return bytes(builder.build())


def _theirs_read(library: Any, batch: bytes) -> list[Record]:
    return [
        Record(
            *TP, r.offset, r.timestamp, TIMESTAMP_TYPE_CREATE_TIME, r.key, r.value, tuple(r.headers)
        )
        for r in library.DefaultRecordBatch(batch)
    ]


def _interop_cases() -> list[tuple[str, CompressionType]]:
    return [(name, codec) for name in LIBRARIES for codec in CompressionType]


def _check(
    records: list[RecordInput],
    write: Callable[[list[RecordInput]], bytes],
    read: Callable[[bytes], list[Record]],
) -> None:
    batch = write(records)
    assert read(batch) == [
        Record(*TP, offset, timestamp_ms, TIMESTAMP_TYPE_CREATE_TIME, key, value, tuple(headers))
        for offset, (key, value, headers, timestamp_ms) in enumerate(records)
    ]


@pytest.mark.parametrize(("library", "codec"), _interop_cases())
@settings(max_examples=25, deadline=None)
@given(records=record_inputs)
def test_their_batches_decode_with_ours(
    library: str, codec: CompressionType, records: list[RecordInput]
) -> None:
    def write(records: list[RecordInput]) -> bytes:
        batch = _theirs_build(LIBRARIES[library], records, codec)
        validate_records(memoryview(batch), len(batch))
        return batch

    _check(records, write, lambda batch: decode_batch(TP, batch, 0, parse_batch_header(batch)))


@pytest.mark.parametrize(("library", "codec"), _interop_cases())
@settings(max_examples=25, deadline=None)
@given(records=record_inputs)
def test_our_batches_decode_with_theirs(
    library: str, codec: CompressionType, records: list[RecordInput]
) -> None:
    def read(batch: bytes) -> list[Record]:
        reader = LIBRARIES[library].DefaultRecordBatch(batch)
        assert reader.validate_crc()
        assert reader.compression_type == codec
        return _theirs_read(LIBRARIES[library], batch)

    _check(records, lambda records: encode_batch(records, compression=codec), read)


# kafka-python leaves partitionLeaderEpoch at 0; aiokafka, like Java producers, writes -1.
@pytest.mark.parametrize(
    ("library", "partition_leader_epoch"), [("aiokafka", -1), ("kafka-python", 0)]
)
def test_uncompressed_batches_match_theirs_byte_for_byte(
    library: str, partition_leader_epoch: int
) -> None:
    records: list[RecordInput] = [
        (b"k", b"v" * 300, [("ключ", b"x"), ("n", None)], 1_000),
        (None, None, [], 999),
        (b"", b"", [], 1_000 + (1 << 20)),
    ]
    ours = encode_batch(records, partition_leader_epoch=partition_leader_epoch)
    assert ours == _theirs_build(LIBRARIES[library], records, CompressionType.NONE)
