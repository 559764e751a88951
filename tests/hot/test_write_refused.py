"""After the disk refused a leader's write, the producer's next requests (already in flight)
get KAFKA_STORAGE_ERROR, not OUT_OF_ORDER_SEQUENCE_NUMBER: librdkafka answers the latter by
bumping its producer epoch and renumbering records that may already be in a log, which
duplicated records in a `make chaos` schedule (a full disk on a leader; log.py,
WRITE_REFUSED_BACKOFF_MS). A real full disk: a tmpfs filled up."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from riverbed.hot.replication.partitions import PartitionManager
from riverbed.hot.storage.log import WRITE_REFUSED_BACKOFF_MS, LogConfig
from riverbed.hot.storage.log_manager import LogManager
from riverbed.hot.storage.producer_state import DuplicateBatch
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records import encode_batch, validate_records

from tests.faults.disks import FullDisk

pytestmark = pytest.mark.processes

PRODUCER_ID = 7
DISK_BYTES = 4 * 1024 * 1024
# Larger than a page: an append into the tail page of a segment needs no new page, and a full
# tmpfs refuses only new pages.
VALUE = b"x" * 16_384


def produce(partitions: PartitionManager, seq: int, now_ms: int) -> int:
    partition = partitions.get_or_raise("t", 0)
    records = memoryview(
        bytearray(
            encode_batch(
                [(None, VALUE, (), now_ms)],
                producer_id=PRODUCER_ID,
                producer_epoch=0,
                base_sequence=seq,
            )
        )
    )
    result = partition.append_as_leader(records, validate_records(records, 1 << 20), now_ms)
    assert not isinstance(result, DuplicateBatch)
    return result.first_offset


def test_the_requests_behind_a_refused_write_get_a_storage_error(tmp_path: Path) -> None:
    clock = [1_000_000]
    with FullDisk(tmp_path / "disk", DISK_BYTES) as disk:
        logs = LogManager(disk.directory, LogConfig(), now_ms=lambda: clock[0])
        partitions = PartitionManager(logs, broker_id=1)
        partition = partitions.ensure("t", 0, LogConfig(), uuid.uuid4())
        partition.become_leader(0, (1,), frozenset({1}), 0, clock[0])
        assert produce(partitions, 0, clock[0]) == 0

        disk.fill()
        for seq in (1, 2, 3):  # the refused request, then two pipelined behind it
            with pytest.raises(KafkaError) as refused:
                produce(partitions, seq, clock[0])
            assert refused.value.code is ErrorCode.KAFKA_STORAGE_ERROR, refused.value

        disk.free()
        with pytest.raises(KafkaError) as still:  # within the backoff: not tried yet
            produce(partitions, 1, clock[0] + WRITE_REFUSED_BACKOFF_MS - 1)
        assert still.value.code is ErrorCode.KAFKA_STORAGE_ERROR
        clock[0] += WRITE_REFUSED_BACKOFF_MS
        # The producer's retries, in order, go on where the log left off: no gap, no epoch bump.
        assert [produce(partitions, seq, clock[0]) for seq in (1, 2, 3)] == [1, 2, 3]
        logs.close()
