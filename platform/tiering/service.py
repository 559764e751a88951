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
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from riverbed.configs import BrokerConfig, TopicConfig
from riverbed.hot.local_log import LocalPartition
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.tiering.background import background_executor
from riverbed.tiering.chunk_cache import ChunkCache
from riverbed.tiering.cold_compactor import ColdCompactionSettings, ColdCompactor, owner_name
from riverbed.tiering.manifest import Manifest, ManifestError, RemoteSegment
from riverbed.tiering.offloader import Offloader, TieringSettings
from riverbed.tiering.remote_metadata import RemoteMetadata
from riverbed.tiering.segment_readers import SegmentReaders
from riverbed.tiering.store import ObjectStore, ObjectStoreError
from riverbed.tiering.stores import open_store
from riverbed.tiering.txn_ranges import AbortedRange, overlapping, resolve, with_local

log = logging.getLogger(__name__)

# Threads converting segments (offloader.CONVERSIONS_AHEAD_MAX run at once) and, apart so that
# a cold read never queues behind a conversion, threads rebuilding batches for cold reads.
# Parquet work releases the GIL: two of each can use both cores.
CONVERSION_THREADS = 2
COLD_READ_THREADS = 2


class TieredStorage:
    def __init__(
        self,
        config: BrokerConfig,
        data_dir: Path,
        partitions: Iterable[LocalPartition],
        topic_config: Callable[[str], TopicConfig | None],
        now_ms: Callable[[], int],
    ) -> None:
        assert config.remote_storage_url is not None
        self._config = config
        self._data_dir = data_dir
        self._partitions = partitions
        self._topic_config = topic_config
        self._now_ms = now_ms
        self._conversions = background_executor(CONVERSION_THREADS, "tiering")
        self._cold_reads = ThreadPoolExecutor(COLD_READ_THREADS, thread_name_prefix="cold-read")
        self._store: ObjectStore | None = None
        self._cache: ChunkCache | None = None
        self._readers: SegmentReaders | None = None
        self._offloader: Offloader | None = None
        self._compactor: ColdCompactor | None = None
        # Manifests read for cold reads on partitions the offloader has not loaded yet.
        self._read_manifests: dict[tuple[str, int, int], Manifest] = {}

    async def start(self, *, run_tasks: bool = True) -> None:
        """Open the store and start the offloader's and the cold compactor's loops (without
        `run_tasks`, only get them ready: tests and benchmarks drive their rounds)."""
        url = self._config.remote_storage_url
        assert url is not None
        self._store = open_store(url, self._config.remote_storage_s3)
        # Now, not in the first tiering round or cold read: building an S3 client costs ~0.1 s
        # of CPU that would delay the first upload (and the fetch waiting on a cold read).
        await self._store.open()
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
            self._conversions,
            TieringSettings(
                task_interval_ms=self._config.remote_log_manager_task_interval_ms,
                work_dir=self._data_dir / ".tiering",
                orphan_grace_ms=self._config.remote_log_orphan_grace_ms,
            ),
            self._now_ms,
        )
        config = self._config
        self._compactor = ColdCompactor(
            self._store,
            self._offloader,
            self._partitions,
            self._topic_config,
            ColdCompactionSettings(
                backoff_ms=config.log_cleaner_backoff_ms,
                dedupe_buffer_bytes=config.log_cleaner_dedupe_buffer_size,
                io_max_bytes_per_second=config.log_cleaner_io_max_bytes_per_second,
                broker_max_bytes=config.remote_log_compaction_broker_max_bytes,
                grace_ms=config.remote_log_compaction_grace_ms,
                work_dir=self._data_dir / ".tiering" / "compaction",
                owner=owner_name(config.broker_id),
                passes_enabled=config.log_cleaner_enable,
            ),
            self._now_ms,
        )
        if run_tasks:
            self._offloader.start()
            self._compactor.start()
        else:
            self._offloader.prepare()
            self._compactor.prepare()
        log.info("tiering to %s", self._store.url)

    async def stop(self) -> None:
        # The compactor first: it commits through the offloader's manifest state.
        if self._compactor is not None:
            await self._compactor.stop()
        if self._offloader is not None:
            await self._offloader.stop()
        if self._readers is not None:
            await asyncio.to_thread(self._readers.close)
        if self._cache is not None:
            await asyncio.to_thread(self._cache.close)
        for executor in (self._conversions, self._cold_reads):
            executor.shutdown(wait=True, cancel_futures=True)
        if self._store is not None:
            await self._store.close()

    @property
    def offloader(self) -> Offloader:
        assert self._offloader is not None, "TieredStorage.start() first"
        return self._offloader

    @property
    def store(self) -> ObjectStore:
        assert self._store is not None, "TieredStorage.start() first"
        return self._store

    @property
    def compactor(self) -> ColdCompactor:
        assert self._compactor is not None, "TieredStorage.start() first"
        return self._compactor

    def cache_hits_misses(self) -> tuple[int, int]:
        """Chunk reads of cold fetches served from the local cache, and those that were not."""
        if self._cache is None:
            return 0, 0
        return self._cache.hits, self._cache.misses

    def wake(self) -> None:
        """Tier now (Offloader.wake); nothing before start()."""
        if self._offloader is not None:
            self._offloader.wake()

    def enabled_for(self, topic: str) -> bool:
        config = self._topic_config(topic)
        return config is not None and config.remote_storage_enable

    async def manifest(self, partition: LocalPartition) -> Manifest:
        """The partition's manifest: the offloader's when it has one, else read (and kept for
        the current leader epoch). KafkaError(KAFKA_STORAGE_ERROR) if it cannot be read."""
        loaded = self.offloader.manifest_of(partition.topic, partition.index)
        if loaded is not None:
            return loaded
        key = (partition.topic, partition.index, partition.leader_epoch)
        manifest = self._read_manifests.get(key)
        if manifest is None:
            assert self._store is not None
            metadata = RemoteMetadata(self._store, partition.topic, partition.index)
            with _storage_errors(partition):
                manifest = await metadata.latest()
            self._read_manifests = {
                k: v for k, v in self._read_manifests.items() if k[:2] != key[:2]
            }
            self._read_manifests[key] = manifest
        return manifest

    def known_log_start_offset(self, partition: LocalPartition) -> int:
        """The first offset of the partition's whole log as far as a manifest already in
        memory tells (the local log start when none is): for what is informational, such as
        a fetch response's log_start_offset. Decisions use `log_start_offset`."""
        key = (partition.topic, partition.index)
        manifest = self.offloader.manifest_of(*key) or self._read_manifests.get(
            (*key, partition.leader_epoch)
        )
        return _log_start_offset(partition, manifest)

    async def aborted_transactions(
        self, partition: LocalPartition, start_offset: int, end_offset: int
    ) -> list[AbortedRange]:
        """What a read_committed consumer reading [start_offset, end_offset) from the remote
        tier must know (Kafka's collectAbortedTxns over both tiers): the aborted transactions the
        manifest's objects resolve, then those of the local transaction index. A transaction
        open at the remote tier's end whose abort the local index holds starts where the objects
        saw its first record: the local index may know less (a follower that restarted its log
        above the remote tier does not know where it began). KafkaError(KAFKA_STORAGE_ERROR) if
        the manifest cannot be read."""
        manifest = await self.manifest(partition)
        resolved = resolve([(s.base_offset, s.transactions) for s in manifest.finished()])
        local_log = partition.log
        local = local_log.aborted_transactions(start_offset, local_log.log_end_offset)
        return overlapping(with_local(resolved, local), start_offset, end_offset)

    async def log_start_offset(self, partition: LocalPartition) -> int:
        """The first offset of the partition's whole log: the remote log start when tiered
        segments hold offsets below the local log start. Reads the manifest if the offloader
        has not loaded it yet (just after a restart or a leader change): the local log start
        would send consumers past every tiered record. KafkaError(KAFKA_STORAGE_ERROR) if the
        manifest is needed and cannot be read."""
        if partition.log.log_start_offset == 0:
            return 0  # nothing can be below: no need to ask the store (it may be down)
        return _log_start_offset(partition, await self.manifest(partition))

    async def tiered_summary(self, partition: LocalPartition) -> tuple[int, int]:
        """(last offset in the remote tier or -1 when it holds none, bytes it holds) of a
        partition led here; KafkaError(KAFKA_STORAGE_ERROR) if the manifest cannot be read."""
        manifest = await self.manifest(partition)
        readable = [s for s in manifest.finished() if s.next_offset > manifest.log_start_offset]
        last_offset = readable[-1].next_offset - 1 if readable else -1
        return last_offset, sum(s.size_bytes for s in readable)

    async def move_log_start(self, partition: LocalPartition, offset: int) -> None:
        """DeleteRecords on a partition led here: the remote tier's log start moves first, in
        the manifest (a commit fenced by the leader epoch: FENCED_LEADER_EPOCH if a newer leader
        wrote it), so the next leader finds it there; the offloader then deletes the objects
        wholly below it and the local segments."""
        assert self._store is not None
        metadata = RemoteMetadata(self._store, partition.topic, partition.index)
        with _storage_errors(partition):
            await metadata.commit(partition.leader_epoch, lambda m: m.with_log_start_offset(offset))
        self.offloader.wake()

    def backlog_bytes(self, partition: LocalPartition) -> int:
        """Sealed bytes of a partition led here not uploaded yet, as the offloader last saw;
        -1 before its first round over the partition."""
        return self.offloader.status.backlog_bytes.get((partition.topic, partition.index), -1)

    async def read(self, partition: LocalPartition, offset: int, max_bytes: int) -> bytes | None:
        """Whole batches from the remote tier starting with the one holding `offset` (at least
        one batch, about `max_bytes`); None when the remote tier does not hold `offset`.

        Compaction leaves objects whose offsets from `offset` on hold no record any more (a
        compacted object keeps the offsets of what it replaced): the read then goes on with the
        next object, and past the last one with the local log from its start, so a consumer
        never gets an empty answer it would ask again forever. All of one read comes from one
        manifest version."""
        if offset < partition.log.truncated_before:
            return None  # deleted by DeleteRecords, whatever the manifest still lists
        manifest = await self.manifest(partition)
        segment = manifest.segment_for(offset)
        if segment is None or (segment.base_offset > offset and offset < manifest.log_start_offset):
            return None
        for following in manifest.finished():
            if following.last_offset >= offset:
                batches = await self._read_object(partition, following, offset, max_bytes)
                if batches:
                    return batches
        return await self._read_local_start(partition, max_bytes)

    async def _read_object(
        self, partition: LocalPartition, segment: RemoteSegment, offset: int, max_bytes: int
    ) -> bytes:
        readers = self._readers
        assert readers is not None
        start = max(offset, segment.base_offset)
        with _storage_errors(partition):
            batches: bytes = await asyncio.get_running_loop().run_in_executor(
                self._cold_reads,
                readers.use,
                segment.key,
                segment.size_bytes,
                lambda reader: reader.read_batches(start, max_bytes),
            )
        return batches

    async def _read_local_start(self, partition: LocalPartition, max_bytes: int) -> bytes:
        """The local log's first batches (what follows the remote tier), b"" if none is
        committed yet."""
        partition_log = partition.log
        found = partition_log.read(
            partition_log.log_start_offset, max_bytes, partition_log.high_watermark
        )
        if found is None:
            return b""
        region = found.region
        try:
            return await asyncio.to_thread(os.pread, region.fd, region.size, region.position)
        finally:
            region.close()

    async def offset_for_timestamp(
        self, partition: LocalPartition, timestamp_ms: int
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first remote record at or after `timestamp_ms`, or None
        when every remote record is older (the local log is searched next). Segments before
        the first whose max timestamp reaches it hold only older records, so one object is
        read."""
        manifest = await self.manifest(partition)
        readers = self._readers
        assert readers is not None
        start = max(manifest.log_start_offset, partition.log.truncated_before)
        for segment in manifest.finished():
            if segment.max_timestamp_ms < timestamp_ms or segment.next_offset <= start:
                continue
            with _storage_errors(partition):
                found: tuple[int, int] | None = await asyncio.get_running_loop().run_in_executor(
                    self._cold_reads,
                    readers.use,
                    segment.key,
                    segment.size_bytes,
                    lambda reader: reader.first_offset_at_or_after(timestamp_ms, start),
                )
            if found is not None:
                return found
        return None


def _log_start_offset(partition: LocalPartition, manifest: Manifest | None) -> int:
    local = partition.log.log_start_offset
    if manifest is None or not manifest.finished():
        return local
    return max(partition.log.truncated_before, min(local, manifest.log_start_offset))


@contextmanager
def _storage_errors(partition: LocalPartition) -> Iterator[None]:
    """A store that failed after its retries, or an object or manifest that cannot be read,
    as Kafka's KAFKA_STORAGE_ERROR (retriable: the client asks again), logged once here."""
    try:
        yield
    except (ObjectStoreError, ManifestError, OSError) as error:
        log.warning("%s: remote tier unavailable: %s", partition, error)
        raise KafkaError(
            ErrorCode.KAFKA_STORAGE_ERROR, f"{partition}: remote tier unavailable: {error}"
        ) from error
