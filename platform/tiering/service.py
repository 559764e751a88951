"""The broker's tiered storage: the object store, the offloader, and cold reads, started and
stopped as one part of the broker (which owns it).

The rest of the broker asks it three things about a partition it leads: where the partition's
log really starts (the remote log start, below the local one once segments are tiered), the
record batches at an offset below the local log start, and the first offset at or after a
timestamp in the remote tier.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from riverbed.configs import BrokerConfig, TopicConfig
from riverbed.hot.partitions import Partition, PartitionManager
from riverbed.tiering.chunk_cache import ChunkCache
from riverbed.tiering.manifest import Manifest
from riverbed.tiering.offloader import Offloader, TieringSettings
from riverbed.tiering.remote_metadata import RemoteMetadata
from riverbed.tiering.segment_readers import SegmentReaders
from riverbed.tiering.store import ObjectStore
from riverbed.tiering.stores import open_store

log = logging.getLogger(__name__)

# Threads converting segments and rebuilding batches: Parquet work releases the GIL, and two
# keep one busy while the other waits on the store.
TIERING_THREADS = 2


class TieredStorage:
    def __init__(
        self,
        config: BrokerConfig,
        data_dir: Path,
        partitions: PartitionManager,
        topic_config: Callable[[str], TopicConfig | None],
        now_ms: Callable[[], int],
    ) -> None:
        assert config.remote_storage_url is not None
        self._config = config
        self._data_dir = data_dir
        self._partitions = partitions
        self._topic_config = topic_config
        self._now_ms = now_ms
        self._executor = ThreadPoolExecutor(TIERING_THREADS, thread_name_prefix="tiering")
        self._store: ObjectStore | None = None
        self._cache: ChunkCache | None = None
        self._readers: SegmentReaders | None = None
        self._offloader: Offloader | None = None
        # Manifests read for cold reads on partitions the offloader has not loaded yet.
        self._read_manifests: dict[tuple[str, int, int], Manifest] = {}

    async def start(self) -> None:
        url = self._config.remote_storage_url
        assert url is not None
        self._store = open_store(url, self._config.remote_storage_s3)
        self._cache = ChunkCache(
            self._store,
            self._data_dir / ".remote-cache",
            self._config.remote_fetch_cache_bytes,
            asyncio.get_running_loop(),
        )
        self._readers = SegmentReaders(self._cache)
        self._offloader = Offloader(
            self._store,
            self._partitions,
            self._topic_config,
            self._executor,
            TieringSettings(
                task_interval_ms=self._config.remote_log_manager_task_interval_ms,
                work_dir=self._data_dir / ".tiering",
            ),
            self._now_ms,
        )
        self._offloader.start()
        log.info("tiering to %s", self._store.url)

    async def stop(self) -> None:
        if self._offloader is not None:
            await self._offloader.stop()
        if self._readers is not None:
            await asyncio.to_thread(self._readers.close)
        if self._cache is not None:
            await asyncio.to_thread(self._cache.close)
        self._executor.shutdown(wait=True, cancel_futures=True)
        if self._store is not None:
            await self._store.close()

    @property
    def offloader(self) -> Offloader:
        assert self._offloader is not None, "TieredStorage.start() first"
        return self._offloader

    def enabled_for(self, topic: str) -> bool:
        config = self._topic_config(topic)
        return config is not None and config.remote_storage_enable

    async def manifest(self, partition: Partition) -> Manifest:
        """The partition's manifest: the offloader's when it has one, else read (and kept for
        the current leader epoch)."""
        loaded = self.offloader.manifest_of(partition.topic, partition.index)
        if loaded is not None:
            return loaded
        key = (partition.topic, partition.index, partition.leader_epoch)
        manifest = self._read_manifests.get(key)
        if manifest is None:
            assert self._store is not None
            metadata = RemoteMetadata(self._store, partition.topic, partition.index)
            manifest = await metadata.latest()
            self._read_manifests = {
                k: v for k, v in self._read_manifests.items() if k[:2] != key[:2]
            }
            self._read_manifests[key] = manifest
        return manifest

    def log_start_offset(self, partition: Partition) -> int:
        """The first offset of the partition's whole log: the remote log start when tiered
        segments hold offsets below the local log start."""
        local = partition.log.log_start_offset
        manifest = self.offloader.manifest_of(partition.topic, partition.index)
        if manifest is None or not manifest.finished():
            return local
        return min(local, manifest.log_start_offset)

    async def read(self, partition: Partition, offset: int, max_bytes: int) -> bytes | None:
        """Whole batches from the remote tier starting with the one holding `offset` (at least
        one batch, about `max_bytes`); None when the remote tier does not hold `offset`."""
        manifest = await self.manifest(partition)
        segment = manifest.segment_for(offset)
        if segment is None or (segment.base_offset > offset and offset < manifest.log_start_offset):
            return None
        readers = self._readers
        assert readers is not None
        start = max(offset, segment.base_offset)
        return await asyncio.get_running_loop().run_in_executor(
            self._executor,
            readers.use,
            segment.key,
            segment.size_bytes,
            lambda reader: reader.read_batches(start, max_bytes),
        )

    async def offset_for_timestamp(
        self, partition: Partition, timestamp_ms: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first remote record at or after `timestamp_ms`, or None
        when every remote record is older (the local log is searched next). Segments before
        the first whose max timestamp reaches it hold only older records, so one object is
        read."""
        manifest = await self.manifest(partition)
        readers = self._readers
        assert readers is not None
        start = manifest.log_start_offset
        for segment in manifest.finished():
            if segment.max_timestamp_ms < timestamp_ms or segment.next_offset <= start:
                continue
            found: tuple[int, int] | None = await asyncio.get_running_loop().run_in_executor(
                self._executor,
                readers.use,
                segment.key,
                segment.size_bytes,
                lambda reader: reader.first_offset_at_or_after(timestamp_ms, start),
            )
            if found is not None:
                return found
        return None
