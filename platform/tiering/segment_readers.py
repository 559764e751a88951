"""Open tiered segments kept for cold reads: a sequential consumer's fetches fall in the same
object, and mostly in the same row group, so its footer is parsed once and its last row group
decoded once rather than on every fetch."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from riverbed.tiering.chunk_cache import ChunkCache, RemoteFile
from riverbed.tiering.parquet_codec import SegmentReader

T = TypeVar("T")

# Objects kept open at once (each holds its footer and one decoded row group, ~8 MiB).
READERS_MAX = 8


class _Open:
    def __init__(self, cache: ChunkCache, key: str, size_bytes: int) -> None:
        self.file = RemoteFile(cache, key, size_bytes)
        self.reader = SegmentReader(self.file)
        self.lock = threading.Lock()  # a SegmentReader serves one thread at a time

    def close(self) -> None:
        with self.lock:
            self.reader.close()
            self.file.close()


class SegmentReaders:
    """Used from the tiering worker threads; `close()` by the owner at shutdown."""

    def __init__(self, cache: ChunkCache) -> None:
        self._cache = cache
        self._lock = threading.Lock()
        self._open: OrderedDict[str, _Open] = OrderedDict()

    def use(self, key: str, size_bytes: int, work: Callable[[SegmentReader], T]) -> T:
        """`work(reader)` on the open reader of object `key`, opening it if needed. Blocking:
        call it from a worker thread."""
        evicted = []
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                entry = _Open(self._cache, key, size_bytes)
                self._open[key] = entry
                while len(self._open) > READERS_MAX:
                    evicted.append(self._open.popitem(last=False)[1])
            self._open.move_to_end(key)
        for old in evicted:
            old.close()
        with entry.lock:
            return work(entry.reader)

    def close(self) -> None:
        with self._lock:
            entries, self._open = list(self._open.values()), OrderedDict()
        for entry in entries:
            entry.close()
