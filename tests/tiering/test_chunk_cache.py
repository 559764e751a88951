"""The chunk cache of cold reads, over a real file:// store: ranged reads come back exact across
chunk boundaries, cached chunks are served without the store, the cache stays within its
bound (least recently used out first), a sequential reader's next chunk is prefetched, and a
restarted cache starts empty."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from riverbed.tiering.chunk_cache import CHUNK_BYTES, ChunkCache, RemoteFile
from riverbed.tiering.file_store import FileStore
from riverbed.tiering.store import ObjectNotFoundError

OBJECT_BYTES = 3 * CHUNK_BYTES + 12_345  # four chunks, the last one short
PREFETCH_TIMEOUT_S = 10.0


@pytest.fixture
async def stored(tmp_path: Path) -> AsyncIterator[tuple[FileStore, bytes]]:
    store = FileStore(tmp_path / "store")
    data = os.urandom(OBJECT_BYTES)
    await store.put("t/0/segments/a.parquet", data)
    yield store, data
    await store.close()


def cache_of(store: FileStore, directory: Path, chunks: int) -> ChunkCache:
    return ChunkCache(store, directory, chunks * CHUNK_BYTES, asyncio.get_running_loop())


async def read(cache: ChunkCache, position: int, size: int) -> bytes:
    return await asyncio.to_thread(
        cache.read, "t/0/segments/a.parquet", position, size, OBJECT_BYTES
    )


async def test_reads_are_exact_across_chunks_and_cached_chunks_need_no_store(
    stored: tuple[FileStore, bytes], tmp_path: Path
) -> None:
    store, data = stored
    cache = cache_of(store, tmp_path / "cache", chunks=8)
    try:
        ranges = [(0, 10), (CHUNK_BYTES - 5, 10), (0, OBJECT_BYTES + 99), (OBJECT_BYTES - 3, 50)]
        for position, size in ranges:
            assert await read(cache, position, size) == data[position : position + size]
        misses = cache.misses
        assert misses == 4  # each chunk fetched once
        await store.delete("t/0/segments/a.parquet")
        assert await read(cache, 100, 2 * CHUNK_BYTES) == data[100 : 100 + 2 * CHUNK_BYTES]
        assert cache.misses == misses
        assert cache.hits > 0
    finally:
        await asyncio.to_thread(cache.close)


async def test_the_cache_stays_within_its_bound_least_recently_used_out_first(
    stored: tuple[FileStore, bytes], tmp_path: Path
) -> None:
    store, data = stored
    directory = tmp_path / "cache"
    cache = cache_of(store, directory, chunks=2)
    try:
        for index in (0, 1, 0, 2):  # chunk 1 is then the least recently used
            assert await read(cache, index * CHUNK_BYTES, 1) == data[index * CHUNK_BYTES :][:1]
        on_disk = sum(p.stat().st_size for p in directory.iterdir())
        assert on_disk <= 2 * CHUNK_BYTES
        await store.delete("t/0/segments/a.parquet")
        assert await read(cache, 0, 1) == data[:1]  # kept
        assert await read(cache, 2 * CHUNK_BYTES, 1) == data[2 * CHUNK_BYTES :][:1]  # kept
        with pytest.raises(ObjectNotFoundError):
            await read(cache, CHUNK_BYTES, 1)  # evicted: back to the (now empty) store
    finally:
        await asyncio.to_thread(cache.close)


async def test_a_sequential_reader_finds_its_next_chunk_prefetched(
    stored: tuple[FileStore, bytes], tmp_path: Path
) -> None:
    store, data = stored
    cache = cache_of(store, tmp_path / "cache", chunks=8)
    remote = RemoteFile(cache, "t/0/segments/a.parquet", OBJECT_BYTES)
    try:
        assert await asyncio.to_thread(remote.read, 1000) == data[:1000]
        # Fetched in the background, before anyone reads it: a second chunk file appears.
        deadline = time.monotonic() + PREFETCH_TIMEOUT_S
        while len(list((tmp_path / "cache").glob("*.chunk"))) < 2:
            assert time.monotonic() < deadline, "the next chunk was not prefetched"
            await asyncio.sleep(0.01)
        await store.delete("t/0/segments/a.parquet")
        await asyncio.to_thread(remote.seek, CHUNK_BYTES + 10)
        assert await asyncio.to_thread(remote.read, 20) == data[CHUNK_BYTES + 10 :][:20]
    finally:
        await asyncio.to_thread(cache.close)


async def test_a_restarted_cache_starts_empty(
    stored: tuple[FileStore, bytes], tmp_path: Path
) -> None:
    store, data = stored
    directory = tmp_path / "cache"
    cache = cache_of(store, directory, chunks=8)
    assert await read(cache, 0, 10) == data[:10]
    await asyncio.to_thread(cache.close)
    assert list(directory.iterdir())
    # Names are not remembered across restarts: what is on disk is removed, not trusted.
    cache = cache_of(store, directory, chunks=8)
    try:
        assert not list(directory.iterdir())
        assert await read(cache, 0, 10) == data[:10]
        assert cache.misses == 1
    finally:
        await asyncio.to_thread(cache.close)
