"""LeaderEpochCache: Kafka's endOffsetFor answers, assignment rules, truncation, its file."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from riverbed.hot.storage.checkpoint import CheckpointError
from riverbed.hot.storage.leader_epoch import (
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    EpochEntry,
    LeaderEpochCache,
    leader_epoch_checkpoint_path,
)
from riverbed.protocol.records import encode_batch, iter_batch_headers

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
LOG_END_OFFSET = 40


@pytest.fixture
def cache(tmp_path: Path) -> LeaderEpochCache:
    """Epoch 1 from offset 0, epoch 3 from 10, epoch 6 from 25 (epochs 2, 4, 5 wrote nothing)."""
    epochs = LeaderEpochCache.load(tmp_path)
    for epoch, start_offset in [(1, 0), (3, 10), (6, 25)]:
        epochs.assign(epoch, start_offset)
    epochs.persist()
    return epochs


def checkpoint_text(directory: Path) -> str:
    return leader_epoch_checkpoint_path(directory).read_text()


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        pytest.param(UNDEFINED_EPOCH, UNDEFINED, id="undefined"),
        pytest.param(6, (6, LOG_END_OFFSET), id="latest: ends at the log end"),
        pytest.param(7, UNDEFINED, id="above every epoch"),
        pytest.param(0, (0, 0), id="below every epoch: the first start offset"),
        pytest.param(1, (1, 10), id="known: the next epoch's start"),
        pytest.param(2, (1, 10), id="unknown in between: the floor epoch"),
        pytest.param(3, (3, 25), id="known, the one before the latest"),
        pytest.param(5, (3, 25), id="unknown, just below the latest"),
    ],
)
def test_end_offset_for_follows_kafka(
    cache: LeaderEpochCache, requested: int, expected: tuple[int, int]
) -> None:
    assert cache.end_offset_for(requested, LOG_END_OFFSET) == expected


def test_an_empty_cache_knows_no_epoch(tmp_path: Path) -> None:
    empty = LeaderEpochCache.load(tmp_path)
    assert empty.latest_epoch == UNDEFINED_EPOCH
    assert empty.entries() == ()
    assert empty.end_offset_for(0, 10) == UNDEFINED
    assert empty.end_offset_for(UNDEFINED_EPOCH, 10) == UNDEFINED
    assert not leader_epoch_checkpoint_path(tmp_path).exists()


def test_the_checkpoint_is_kafkas_format_and_round_trips(
    cache: LeaderEpochCache, tmp_path: Path
) -> None:
    assert checkpoint_text(tmp_path) == "0\n3\n1 0\n3 10\n6 25\n"
    assert LeaderEpochCache.load(tmp_path).entries() == cache.entries()
    assert cache.latest_epoch == 6
    assert not list(tmp_path.glob("*.tmp")), "written through a temp file, renamed"


def test_assign_adds_newer_epochs_only(
    cache: LeaderEpochCache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache.assign(6, 30)  # the latest epoch again: no-op, it keeps its start
    with caplog.at_level(logging.WARNING, logger="riverbed.hot.storage.leader_epoch"):
        cache.assign(4, 35)  # older than the latest: ignored, with a warning
    assert "ignoring epoch 4 at offset 35" in caplog.text
    cache.assign(8, 30)
    expected = (EpochEntry(1, 0), EpochEntry(3, 10), EpochEntry(6, 25), EpochEntry(8, 30))
    assert cache.entries() == expected
    cache.persist()
    assert LeaderEpochCache.load(tmp_path).entries() == expected


def test_an_epoch_that_wrote_nothing_is_replaced_by_the_next(
    cache: LeaderEpochCache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache.assign(7, LOG_END_OFFSET)
    with caplog.at_level(logging.WARNING, logger="riverbed.hot.storage.leader_epoch"):
        cache.assign(9, LOG_END_OFFSET)
    assert caplog.text == "", "the expected case: no warning"
    assert cache.entries()[-2:] == (EpochEntry(6, 25), EpochEntry(9, LOG_END_OFFSET))
    cache.persist()
    assert LeaderEpochCache.load(tmp_path).entries() == cache.entries()


def test_a_newer_epoch_starting_earlier_replaces_the_entries_it_overlaps(
    cache: LeaderEpochCache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka's rule: epoch 6's entry at 25 is stale (say its append failed at the disk) once
    epoch 7 starts at 20, below it."""
    with caplog.at_level(logging.WARNING, logger="riverbed.hot.storage.leader_epoch"):
        cache.assign(7, 20)
    assert "epoch 7 at offset 20 replaces [EpochEntry(epoch=6, start_offset=25)]" in caplog.text
    assert cache.entries() == (EpochEntry(1, 0), EpochEntry(3, 10), EpochEntry(7, 20))
    cache.persist()
    assert LeaderEpochCache.load(tmp_path).entries() == cache.entries()
    with pytest.raises(ValueError, match="invalid entry"):
        cache.assign(-1, 50)
    with pytest.raises(ValueError, match="invalid entry"):
        cache.assign(8, -1)
    assert cache.latest_epoch == 7


def test_a_failed_write_leaves_the_cache_unchanged(tmp_path: Path) -> None:
    """A truncation that cannot be written is not applied; an assigned epoch stays in memory,
    to be written by the next `persist`, which raises until it can."""
    directory = tmp_path / "orders-0"
    directory.mkdir()
    epochs = LeaderEpochCache.load(directory)
    epochs.assign(1, 0)
    epochs.persist()
    shutil.rmtree(directory)  # every later write fails
    epochs.assign(2, 10)
    with pytest.raises(FileNotFoundError):
        epochs.persist()
    with pytest.raises(FileNotFoundError):
        epochs.truncate_from_end(0)
    assert epochs.entries() == (EpochEntry(1, 0), EpochEntry(2, 10))
    directory.mkdir()
    epochs.persist()  # still owed
    assert LeaderEpochCache.load(directory).entries() == (EpochEntry(1, 0), EpochEntry(2, 10))


def test_truncate_from_end_drops_epochs_starting_at_or_after_the_offset(
    cache: LeaderEpochCache, tmp_path: Path
) -> None:
    cache.truncate_from_end(LOG_END_OFFSET)
    assert len(cache.entries()) == 3
    cache.truncate_from_end(25)
    assert cache.entries() == (EpochEntry(1, 0), EpochEntry(3, 10))
    assert LeaderEpochCache.load(tmp_path).entries() == cache.entries()
    cache.truncate_from_end(0)
    assert cache.entries() == ()
    assert checkpoint_text(tmp_path) == "0\n0\n"


@pytest.mark.parametrize(
    ("start_offset", "expected"),
    [
        (0, [(1, 0), (3, 10), (6, 25)]),
        (5, [(1, 5), (3, 10), (6, 25)]),
        (10, [(3, 10), (6, 25)]),
        (12, [(3, 12), (6, 25)]),
        (30, [(6, 30)]),
    ],
)
def test_truncate_from_start_moves_the_first_epoch_up(
    cache: LeaderEpochCache, tmp_path: Path, start_offset: int, expected: list[tuple[int, int]]
) -> None:
    cache.truncate_from_start(start_offset)
    assert cache.entries() == tuple(EpochEntry(*entry) for entry in expected)
    assert LeaderEpochCache.load(tmp_path).entries() == cache.entries()


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"1\n0\n", id="unknown version"),
        pytest.param(b"0\n2\n1 0\n", id="count too high"),
        pytest.param(b"0\n1\n1\n", id="one field"),
        pytest.param(b"0\n1\n1 x\n", id="not a number"),
        pytest.param(b"0\n1\n-1 0\n", id="negative epoch"),
        pytest.param(b"0\n2\n3 0\n2 5\n", id="epochs go back"),
        pytest.param(b"0\n2\n1 5\n2 3\n", id="start offsets go back"),
        pytest.param(b"\x00\xff\x17garbage", id="binary"),
    ],
)
def test_a_damaged_checkpoint_is_reported(tmp_path: Path, content: bytes) -> None:
    leader_epoch_checkpoint_path(tmp_path).write_bytes(content)
    with pytest.raises(CheckpointError, match="leader-epoch-checkpoint"):
        LeaderEpochCache.load(tmp_path)


def test_rebuild_takes_each_epochs_first_batch(tmp_path: Path) -> None:
    batches = b"".join(
        encode_batch([(None, b"v", (), 1_000)] * count, base_offset=base, partition_leader_epoch=e)
        for base, count, e in [(0, 2, -1), (2, 3, 1), (5, 1, 1), (8, 2, 4), (10, 1, 5)]
    )
    headers = [header for _, header in iter_batch_headers(batches)]
    rebuilt = LeaderEpochCache.rebuild(tmp_path, headers)
    expected = (EpochEntry(1, 2), EpochEntry(4, 8), EpochEntry(5, 10))
    assert rebuilt.entries() == expected
    assert LeaderEpochCache.load(tmp_path).entries() == expected


def test_assign_changes_memory_and_persist_or_a_truncation_writes_the_file(
    tmp_path: Path,
) -> None:
    """`assign` is in memory only (the append path must not wait on a file per partition);
    `persist` writes what it added; a truncation writes the file itself. Kafka's format."""
    epochs = LeaderEpochCache.load(tmp_path)
    epochs.assign(1, 0)
    epochs.assign(4, 30)
    assert not leader_epoch_checkpoint_path(tmp_path).exists()
    epochs.persist()
    assert checkpoint_text(tmp_path) == "0\n2\n1 0\n4 30\n"
    leader_epoch_checkpoint_path(tmp_path).unlink()
    epochs.persist()  # nothing new since the last write: no file written
    assert not leader_epoch_checkpoint_path(tmp_path).exists()
    epochs.truncate_from_end(30)
    assert checkpoint_text(tmp_path) == "0\n1\n1 0\n"
    assert LeaderEpochCache.load(tmp_path).entries() == (EpochEntry(1, 0),)
    assert not list(tmp_path.glob("*.tmp")), "no temporary file left behind"
