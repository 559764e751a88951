"""One tiered, compacted partition led by this process, driven step by step with the broker's
own parts: a PartitionLog on disk, a leading Partition, TieredStorage (the offloader and the cold
compactor, their loops not started) on a file:// store, and the hot cleaner. Reads go the way a
consumer's fetches go through the broker: below the local log start through
TieredStorage.read, the rest from the local log.

The model (`Model`) is every record written, by offset: what a compacted log must agree with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from riverbed.configs import BrokerConfig, TopicConfig, topic_config
from riverbed.hot.replication.partitions import Partition
from riverbed.hot.storage.cleaner import CleanerSettings, clean_log
from riverbed.hot.storage.log import LogConfig, PartitionLog
from riverbed.hot.storage.producer_state import ProducerStateManager
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.record_types import Record, TopicPartition
from riverbed.protocol.records import (
    encode_batch,
    iter_batch_headers,
    validate_records,
)
from riverbed.tiering.cold_compactor import ColdCompactionResult
from riverbed.tiering.manifest import Manifest
from riverbed.tiering.service import TieredStorage

from tests.support.batches import records_in

NOW_MS = 10_000_000
DELETE_RETENTION_MS = 100_000
HORIZON_MS = NOW_MS - DELETE_RETENTION_MS
SEGMENT_BYTES = 600
TOPIC = "compacted"
LEADER_EPOCH = 1

KeyedRecord = tuple[bytes | None, bytes | None, int]  # key, value (None: tombstone), timestamp


@dataclass
class Model:
    records: dict[int, KeyedRecord] = field(default_factory=dict)

    def latest_offsets(self) -> dict[bytes, int]:
        last: dict[bytes, int] = {}
        for offset, (key, _, _) in sorted(self.records.items()):
            if key is not None:
                last[key] = offset
        return last

    def latest(self) -> dict[int, KeyedRecord]:
        """The latest record of each key, by offset, minus tombstones past the horizon: what a
        fully compacted log holds."""
        return {
            offset: self.records[offset]
            for offset in sorted(self.latest_offsets().values())
            if not (self.records[offset][1] is None and self.records[offset][2] < HORIZON_MS)
        }

    def folded(self, from_offset: int = 0) -> dict[bytes, bytes]:
        """key -> value of the keys whose latest record is at or after `from_offset` and not a
        tombstone."""
        return {
            key: value
            for key, offset in self.latest_offsets().items()
            if offset >= from_offset and (value := self.records[offset][1]) is not None
        }


def fold(records: list[Record]) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for record in records:
        if record.key is None:
            continue
        if record.value is None:
            state.pop(record.key, None)
        else:
            state[record.key] = record.value
    return state


def as_model(records: list[Record]) -> dict[int, KeyedRecord]:
    return {r.offset: (r.key, r.value, r.timestamp_ms) for r in records}


def topic_settings(**overrides: str) -> dict[str, str]:
    return {
        "cleanup.policy": "compact",
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "delete.retention.ms": str(DELETE_RETENTION_MS),
        "min.cleanable.dirty.ratio": "0.01",
        **overrides,
    }


class TieredPartition:
    """Open with `await TieredPartition.open(...)`; `close()` at the end."""

    def __init__(
        self,
        root: Path,
        *,
        map_bytes: int,
        topic_overrides: Mapping[str, str],
        broker_overrides: Mapping[str, str],
        leader_epoch: int,
    ) -> None:
        self.root = root
        self.store_root = root / "cold"
        self.broker = BrokerConfig.from_mapping(
            {
                "zookeeper.connect": "127.0.0.1:1",
                "broker.id": "1",
                "remote.storage.url": f"file://{self.store_root}",
                "log.cleaner.dedupe.buffer.size": str(max(map_bytes, 1 << 20)),
                **broker_overrides,
            }
        )
        self.map_bytes = map_bytes
        self.config: TopicConfig = topic_config(self.broker, topic_settings(**topic_overrides))
        self.log = self._open_log()
        self.partition = Partition(TOPIC, 0, self.log, ProducerStateManager(), broker_id=1)
        self.leader_epoch = leader_epoch
        self.partition.become_leader(leader_epoch, (1,), frozenset({1}), 0, NOW_MS)
        self.now_ms = NOW_MS  # the tiering parts' clock: a test may move it
        self.tiering = TieredStorage(
            self.broker, root / "data", [self.partition], self._config_of, lambda: self.now_ms
        )

    @classmethod
    async def open(
        cls,
        root: Path,
        *,
        map_bytes: int = 64 << 20,
        topic_overrides: Mapping[str, str] | None = None,
        broker_overrides: Mapping[str, str] | None = None,
        leader_epoch: int = LEADER_EPOCH,
    ) -> TieredPartition:
        opened = cls(
            root,
            map_bytes=map_bytes,
            topic_overrides=topic_overrides or {},
            broker_overrides=broker_overrides or {},
            leader_epoch=leader_epoch,
        )
        await opened.tiering.start(run_tasks=False)
        # A map smaller than the broker setting allows, for passes that stop where it is full.
        compactor = opened.tiering.compactor
        compactor.settings = replace(compactor.settings, dedupe_buffer_bytes=map_bytes)
        return opened

    async def close(self) -> None:
        await self.tiering.stop()
        self.log.close()

    def _open_log(self) -> PartitionLog:
        config = LogConfig(segment_bytes=SEGMENT_BYTES, index_interval_bytes=100)
        log = PartitionLog.open(
            self.root / "data" / f"{TOPIC}-0",
            TopicPartition(TOPIC, 0),
            config,
            recovery_point=None,
            now_ms=lambda: NOW_MS,
        )
        log.update_high_watermark(log.log_end_offset)
        return log

    def _config_of(self, topic: str) -> TopicConfig | None:
        return self.config if topic == TOPIC else None

    # -- steps -----------------------------------------------------------------------------

    def write(self, model: Model, records: list[KeyedRecord], codec: CompressionType) -> int:
        """Append one batch; returns its first offset."""
        batch = encode_batch([(k, v, (), ts) for k, v, ts in records], compression=codec)
        buf = memoryview(bytearray(batch))
        result = self.log.append(
            buf, validate_records(buf, 1 << 20), leader_epoch=self.leader_epoch
        )
        for offset, record in zip(
            range(result.first_offset, result.last_offset + 1), records, strict=True
        ):
            model.records[offset] = record
        self.log.update_high_watermark(self.log.log_end_offset)
        return result.first_offset

    def seal(self, model: Model, key: bytes = b"~seal") -> None:
        """A record big enough to roll the log: everything before it becomes sealed."""
        self.write(model, [(key, b"x" * (SEGMENT_BYTES + 100), NOW_MS)], CompressionType.NONE)

    async def tier(self) -> None:
        await self.tiering.offloader.run_once()

    async def compact_cold(self) -> ColdCompactionResult | None:
        return await self.tiering.compactor.run_once(force=True)

    def compact_hot(self) -> None:
        settings = CleanerSettings(
            dedupe_buffer_bytes=self.map_bytes, io_max_bytes_per_second=1e300
        )
        clean_log(self.log, self.config, settings, now_ms=NOW_MS, keep_tombstones=True, force=True)

    def cold_rows(self) -> list[tuple[int, bytes | None, bytes | None, int, bool]]:
        """(offset, key, value, timestamp, control) of every row of the finished objects, read
        straight from the store's Parquet files."""
        rows = []
        for segment in self.manifest().finished():
            table = pq.read_table(self.store_root / segment.key)
            for offset, key, value, timestamp, attributes in zip(
                table.column("offset").to_pylist(),
                table.column("key").to_pylist(),
                table.column("value").to_pylist(),
                table.column("timestamp").cast(pa.int64()).to_pylist(),
                table.column("batch_attributes").to_pylist(),
                strict=True,
            ):
                rows.append((offset, key, value, timestamp, bool(attributes & 32)))
        return rows

    def manifest(self) -> Manifest:
        manifest = self.tiering.offloader.manifest_of(TOPIC, 0)
        assert manifest is not None
        return manifest

    # -- reading as a consumer through the broker --------------------------------------------

    async def read_from(self, offset: int) -> list[Record]:
        """Every record from `offset` to the log end, fetch by fetch as the broker answers."""
        records: list[Record] = []
        while offset < self.log.high_watermark:
            data = await self._fetch(offset)
            assert data, f"an empty answer at offset {offset}: a consumer would be stuck"
            batches = list(iter_batch_headers(data))
            records += [r for r in records_in(self.log.tp, data) if r.offset >= offset]
            offset = batches[-1][1].last_offset + 1
        return records

    async def _fetch(self, offset: int) -> bytes:
        if offset < self.log.log_start_offset:
            data = await self.tiering.read(self.partition, offset, 1 << 20)
            assert data is not None, f"offset {offset} out of range"
            return data
        found = self.log.read(offset, 1 << 20, self.log.high_watermark)
        assert found is not None
        try:
            return os.pread(found.region.fd, found.region.size, found.region.position)
        finally:
            found.region.close()
