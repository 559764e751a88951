"""A partition log and its replica on one broker, driven directly (no server): what the unit
tests of the partition side of transactions build on."""

from __future__ import annotations

from pathlib import Path

from riverbed.hot.replication.partitions import Partition
from riverbed.hot.storage.log import AppendResult, LogConfig, PartitionLog
from riverbed.hot.storage.producer_state import DuplicateBatch, load_producer_state
from riverbed.hot.storage.transactions import AppendOrigin
from riverbed.protocol.record_types import TopicPartition
from riverbed.protocol.records import encode_batch, validate_records

BROKER_ID = 1
# Small segments, so that transactions span rolls.
SMALL = LogConfig(segment_bytes=600, index_interval_bytes=100)
NOW_MS = 1_000


def open_partition(directory: Path, config: LogConfig = SMALL, *, leader: bool = True) -> Partition:
    """Open (or reopen) the log in `directory` as the broker does (PartitionManager.ensure)."""
    partition_log = PartitionLog.open(
        directory,
        TopicPartition("t", 0),
        config,
        recovery_point=None if not (directory / "clean").exists() else _clean_point(directory),
        now_ms=lambda: NOW_MS,
    )
    state = load_producer_state(
        directory,
        partition_log.log_end_offset,
        partition_log.batches_with_markers,
        replay_from_max=partition_log.recovered_from,
        on_aborted=partition_log.record_aborted_txn,
    )
    partition = Partition("t", 0, partition_log, state, BROKER_ID)
    if leader:
        partition.become_leader(1, (BROKER_ID,), frozenset({BROKER_ID}), 0, NOW_MS)
    return partition


def close_cleanly(partition: Partition) -> None:
    """A clean shutdown: producer state snapshot, log flushed, recovery point saved."""
    partition.snapshot_producer_state()
    partition.log.close()
    (partition.log.directory / "clean").write_text(str(partition.log.log_end_offset))


def _clean_point(directory: Path) -> int:
    point = int((directory / "clean").read_text())
    (directory / "clean").unlink()
    return point


def batch(
    producer_id: int,
    seq: int,
    count: int = 1,
    *,
    epoch: int = 0,
    transactional: bool = True,
    value: bytes = b"v",
) -> bytes:
    return encode_batch(
        [(b"k%d" % (seq + i), value, (), NOW_MS) for i in range(count)],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=transactional,
    )


def produce(
    partition: Partition, data: bytes, origin: AppendOrigin = AppendOrigin.CLIENT
) -> AppendResult | DuplicateBatch:
    records = memoryview(bytearray(data))
    headers = validate_records(records, 1 << 20)
    return partition.append_as_leader(records, headers, NOW_MS, origin)
