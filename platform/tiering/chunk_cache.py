"""A bounded on-disk cache of fixed-size chunks of remote objects, and a read-only file object
over one remote object that reads through it (for pyarrow, in a worker thread).

Cold reads fetch only the chunks the Parquet reader touches (its footer, then the row groups it
needs) with ranged GETs; a sequential consumer's next chunk is prefetched. Chunks of the same
object never change (data objects are immutable), so a cached chunk is always valid.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from riverbed.tiering.store import ObjectStore

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 * 1024 * 1024
# How long a worker thread waits for one chunk from the store before giving up (the store's own
# timeouts and retries come first; this only bounds a stuck event loop).
CHUNK_WAIT_S = 120.0
# Prefetches running at once (each holds one chunk in memory until it is on disk).
PREFETCH_THREADS = 2


class ChunkCache:
    """Chunks as files under `directory`, least recently used evicted past `size_bytes_max`.
    Used from worker threads and the event loop, hence the lock."""

    def __init__(
        self,
        store: ObjectStore,
        directory: Path,
        size_bytes_max: int,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        if size_bytes_max < 2 * CHUNK_BYTES:
            raise ValueError(f"a chunk cache needs at least {2 * CHUNK_BYTES} bytes")
        self._store = store
        self._directory = directory
        self._size_bytes_max = size_bytes_max
        self._loop = loop
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, int], int] = OrderedDict()  # -> size in bytes
        self._size_bytes = 0
        self._pending: dict[tuple[str, int], Future[bytes]] = {}
        self._prefetcher = ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="prefetch")
        self.hits = 0
        self.misses = 0
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.iterdir():  # names do not survive a restart: start empty
            stale.unlink()

    def read(self, key: str, position: int, size_bytes: int, object_size: int) -> bytes:
        """Bytes [position, position + size_bytes) of `key` (clipped to its end). Blocking:
        call from a worker thread, never from the event loop."""
        end = min(position + size_bytes, object_size)
        parts = []
        while position < end:
            index = position // CHUNK_BYTES
            chunk = self._chunk(key, index)
            start = position - index * CHUNK_BYTES
            take = min(end - position, len(chunk) - start)
            if take <= 0:
                break
            parts.append(chunk[start : start + take])
            position += take
        return b"".join(parts)

    def prefetch(self, key: str, index: int, object_size: int) -> None:
        """Start fetching chunk `index` of `key` in the background, if it exists and is neither
        cached nor already coming."""
        if index * CHUNK_BYTES >= object_size:
            return
        with self._lock:
            if (key, index) in self._entries or (key, index) in self._pending:
                return
        self._prefetcher.submit(self._quietly, key, index)

    def close(self) -> None:
        """Stop prefetching (waits for the chunks in flight). Owned by whoever made the cache."""
        self._prefetcher.shutdown(wait=True, cancel_futures=True)

    def _quietly(self, key: str, index: int) -> None:
        try:
            self._chunk(key, index)
        except Exception as error:  # a failed prefetch is retried by the read that needs it
            log.info("prefetch of %s chunk %d failed: %s", key, index, error)

    def _chunk(self, key: str, index: int) -> bytes:
        with self._lock:
            if (key, index) in self._entries:
                self._entries.move_to_end((key, index))
                self.hits += 1
                path = self._path(key, index)
                return path.read_bytes()
            future = self._pending.get((key, index))
            if future is None:
                self.misses += 1
                future = self._fetch(key, index)
                self._pending[(key, index)] = future
        try:
            data = future.result(CHUNK_WAIT_S)
            self._put(key, index, data)
        finally:
            # Only now: a reader arriving meanwhile waits for this fetch instead of its own.
            with self._lock:
                self._pending.pop((key, index), None)
        return data

    def _fetch(self, key: str, index: int) -> Future[bytes]:
        return asyncio.run_coroutine_threadsafe(
            self._store.get(key, index * CHUNK_BYTES, CHUNK_BYTES), self._loop
        )

    def _put(self, key: str, index: int, data: bytes) -> None:
        path = self._path(key, index)
        temporary = path.with_suffix(f".{threading.get_ident()}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)
        with self._lock:
            if (key, index) not in self._entries:
                self._entries[(key, index)] = len(data)
                self._size_bytes += len(data)
            while self._size_bytes > self._size_bytes_max and len(self._entries) > 1:
                (old_key, old_index), size = self._entries.popitem(last=False)
                self._size_bytes -= size
                self._path(old_key, old_index).unlink(missing_ok=True)

    def _path(self, key: str, index: int) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        return self._directory / f"{digest}-{index}.chunk"


class RemoteFile(io.RawIOBase):
    """A seekable read-only file over one remote object, read through the chunk cache; reading
    prefetches the chunk after the last one touched (sequential readers rarely wait)."""

    def __init__(self, cache: ChunkCache, key: str, size_bytes: int) -> None:
        super().__init__()
        self._cache = cache
        self._key = key
        self._size_bytes = size_bytes
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size_bytes}
        self._position = max(0, base[whence] + offset)
        return self._position

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = self._size_bytes - self._position
        data = self._cache.read(self._key, self._position, size, self._size_bytes)
        self._position += len(data)
        if data:
            self._cache.prefetch(self._key, self._position // CHUNK_BYTES + 1, self._size_bytes)
        return data

    def size(self) -> int:
        return self._size_bytes
