"""The file:// object store and manifest versions stored in it: atomic create-only writes,
ranged reads, listing, and fencing of deposed leaders."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.tiering.file_store import FileStore
from riverbed.tiering.manifest import SegmentState
from riverbed.tiering.remote_metadata import RemoteMetadata
from riverbed.tiering.store import ObjectNotFoundError
from riverbed.tiering.stores import open_store

from tests.tiering.test_manifest import segment


async def test_put_get_ranges_list_and_delete(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "root")
    await store.put("t/0/a.bin", b"0123456789")
    assert await store.get("t/0/a.bin") == b"0123456789"
    assert await store.get("t/0/a.bin", 3, 4) == b"3456"
    assert await store.get("t/0/a.bin", 8) == b"89"
    with pytest.raises(ObjectNotFoundError, match="past the object's end"):
        await store.get("t/0/a.bin", 20, 5)  # as S3 answers 416
    assert await store.size("t/0/a.bin") == 10
    source = tmp_path / "big"
    source.write_bytes(b"x" * 100_000)
    await store.put_file("t/1/b.bin", source)
    assert [(i.key, i.size_bytes) for i in await store.list("t/")] == [
        ("t/0/a.bin", 10),
        ("t/1/b.bin", 100_000),
    ]
    assert [i.key for i in await store.list("t/0")] == ["t/0/a.bin"]
    assert await store.list("nothing/") == []
    await store.delete("t/0/a.bin")
    await store.delete("t/0/a.bin")  # idempotent
    with pytest.raises(ObjectNotFoundError):
        await store.get("t/0/a.bin")
    with pytest.raises(ValueError, match="bad object key"):
        await store.get("../escape")


async def test_only_one_of_many_concurrent_creators_wins(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    results = await asyncio.gather(
        *(store.put_if_absent("k/v", f"writer {i}".encode()) for i in range(20))
    )
    assert results.count(True) == 1
    winner = results.index(True)
    assert await store.get("k/v") == f"writer {winner}".encode()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp-upload")]


def test_urls_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown object store scheme 'ftp'"):
        open_store("ftp://x/y", {})
    with pytest.raises(ValueError, match="names a local path"):
        open_store("file://relative", {})  # a host, not a path
    with pytest.raises(ValueError, match="absolute path"):
        FileStore(Path("relative"))


async def test_a_deposed_leader_can_neither_overwrite_nor_fork_the_manifest(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    old_leader = RemoteMetadata(store, "t", 0)
    new_leader = RemoteMetadata(store, "t", 0)
    first = segment(0, 9, epoch=1)
    await old_leader.commit(1, lambda m: m.with_copy_started(first))
    # The new leader (epoch 2) commits; the old one's next write is refused.
    second = segment(10, 19, epoch=2)
    await new_leader.commit(2, lambda m: m.with_copy_started(second))
    with pytest.raises(KafkaError) as fenced:
        await old_leader.commit(1, lambda m: m.with_state([first.key], SegmentState.COPY_FINISHED))
    assert fenced.value.code == ErrorCode.FENCED_LEADER_EPOCH
    latest = await new_leader.latest()
    assert (latest.version, latest.leader_epoch) == (2, 2)
    assert [s.key for s in latest.segments] == [first.key, second.key]
    assert await old_leader.versions() == [1, 2]


async def test_racing_writers_at_one_epoch_serialize_without_losing_a_change(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path)
    writers = [RemoteMetadata(store, "t", 0) for _ in range(4)]
    await asyncio.gather(
        *(
            w.commit(1, lambda m, i=i: m.with_log_start_offset(i))  # type: ignore[misc]
            for i, w in enumerate(writers)
        )
    )
    latest = await writers[0].latest()
    assert latest.version == 4
    assert latest.log_start_offset == 3
