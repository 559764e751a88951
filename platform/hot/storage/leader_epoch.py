"""The leader epoch cache of one partition: the offset at which each leader epoch's records start.

An entry (epoch, start_offset) says that the leader of `epoch` wrote the records from
`start_offset` up to the next entry's start offset (or the log end offset, for the latest
entry). With it a follower finds where its log diverged from a new leader's (OffsetForLeaderEpoch,
KIP-101 / KIP-279) instead of truncating to its high watermark, which can keep a divergent tail
or lose committed records.

Invariants: epochs strictly increase along the entries and start offsets never decrease; every
epoch and start offset is >= 0. The owner (PartitionLog) records an epoch just before writing its
first batch and calls `truncate_from_end` after any truncation and on open, so start offsets
stay at or below its log end offset (but for an entry whose batch's write then failed: see
`assign`).

Persisted in the partition directory as `leader-epoch-checkpoint`, in Kafka's format:

    0          <- format version
    2          <- number of entries
    0 0        <- epoch, start offset
    3 1500

Every change rewrites the file atomically (tmp file + rename) before it shows in memory, so a
failed write leaves the cache as it was. A file that does not parse raises CheckpointError: the
owner then rebuilds the cache from the batch headers, which carry each batch's leader epoch.

When the file is written: a truncation rewrites it durably at once (tmp file, fsync, rename,
fsync of the directory). A new epoch (`assign`: every partition a broker starts leading, and a
follower's first batch of each new epoch) only changes memory: writing and renaming a file per
partition, let alone two fsyncs, on the event loop made a leadership move of thousands of
partitions wait on the disk (Kafka moved the same fsync off the append path, KAFKA-15046). The
owner calls `persist()` before its recovery point passes the batches an entry describes, and
recovery, which re-scans the batches above the recovery point, assigns their epochs again. So
the entries of the batches below the recovery point are always on disk, and those above it are
rebuilt from the batches that survived a crash. (An epoch that wrote no batch before a crash is
forgotten; an OffsetsForLeaderEpoch for it then gets the floor epoch's answer, which names the
same end offset.)
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Final, NamedTuple

from riverbed.common.fileio import write_atomically
from riverbed.hot.storage.checkpoint import CHECKPOINT_VERSION, CheckpointError
from riverbed.protocol.records import BatchHeader

log = logging.getLogger(__name__)

# Kafka's OffsetsForLeaderEpochResponse.UNDEFINED_EPOCH / UNDEFINED_EPOCH_OFFSET: "no answer".
UNDEFINED_EPOCH: Final = -1
UNDEFINED_EPOCH_OFFSET: Final = -1
LEADER_EPOCH_CHECKPOINT: Final = "leader-epoch-checkpoint"


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


def leader_epoch_checkpoint_path(directory: Path) -> Path:
    return directory / LEADER_EPOCH_CHECKPOINT


class LeaderEpochCache:
    """The epoch entries of one partition, kept in memory and in its checkpoint file.

    Not thread-safe: its PartitionLog's owner calls it.
    """

    def __init__(self, directory: Path, entries: Iterable[EpochEntry] = ()) -> None:
        self._path = leader_epoch_checkpoint_path(directory)
        self._entries = list(entries)
        _check_entries(self._entries, self._path)
        # Whether `assign` changed the entries since the file was last written.
        self._unwritten = False

    @classmethod
    def load(cls, directory: Path) -> LeaderEpochCache:
        """The cache persisted in `directory`; empty if there is no checkpoint file. Raises
        CheckpointError for a file this module did not write, OSError if it cannot be read."""
        path = leader_epoch_checkpoint_path(directory)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return cls(directory)
        return cls(directory, _parse(path, data))

    @classmethod
    def rebuild(cls, directory: Path, batches: Iterable[BatchHeader]) -> LeaderEpochCache:
        """The cache implied by a log's batch headers (oldest first), persisted: each epoch
        starts at the first batch that carries it. Batches without an epoch (-1) add nothing."""
        entries: list[EpochEntry] = []
        for header in batches:
            epoch = header.partition_leader_epoch
            if epoch > (entries[-1].epoch if entries else UNDEFINED_EPOCH):
                entries.append(EpochEntry(epoch, header.base_offset))
        cache = cls(directory)
        cache._replace(entries)
        return cache

    @property
    def latest_epoch(self) -> int:
        return self._entries[-1].epoch if self._entries else UNDEFINED_EPOCH

    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch` starts at `start_offset`, in memory: the file follows at the
        owner's next `persist()`.

        A newer epoch is added. Entries starting at or after `start_offset` are dropped first,
        as in Kafka: normally only the latest, when it wrote nothing; with a warning if more (a
        stale entry, left by an append whose write failed). The latest epoch again is a no-op;
        an older one is ignored with a warning.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"{self._path}: invalid entry: epoch {epoch} at {start_offset}")
        latest_epoch = self.latest_epoch
        if epoch == latest_epoch:
            return
        if epoch < latest_epoch:
            log.warning(
                "%s: ignoring epoch %d at offset %d: older than the latest, %s",
                self._path,
                epoch,
                start_offset,
                self._entries[-1],
            )
            return
        kept = [entry for entry in self._entries if entry.start_offset < start_offset]
        dropped = self._entries[len(kept) :]
        if dropped and dropped != [EpochEntry(latest_epoch, start_offset)]:
            log.warning(
                "%s: epoch %d at offset %d replaces %s", self._path, epoch, start_offset, dropped
            )
        entries = [*kept, EpochEntry(epoch, start_offset)]
        _check_entries(entries, self._path)
        self._entries = entries
        self._unwritten = True

    def persist(self, *, durable: bool = True) -> None:
        """Write what `assign` added since the last write (fsynced if `durable`; raises
        OSError, the entries then still to be written). The owner calls it before its recovery
        point covers batches of those epochs."""
        if self._unwritten:
            self._write(self._entries, durable=durable)

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for a requested epoch, Kafka's LeaderEpochFileCache.endOffsetFor:

        - UNDEFINED_EPOCH, or an epoch above every known one: (UNDEFINED_EPOCH,
          UNDEFINED_EPOCH_OFFSET);
        - the latest epoch: (it, `log_end_offset`), the epoch still being written;
        - an epoch below every known one: (it, the first entry's start offset): older data is
          gone, the follower must restart from there;
        - otherwise (the largest known epoch <= it, the start offset of the next known epoch).
        """
        entries = self._entries
        if epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if entries and epoch == entries[-1].epoch:
            return epoch, log_end_offset
        higher = bisect.bisect_right(entries, epoch, key=lambda entry: entry.epoch)
        if higher == len(entries):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return epoch, entries[0].start_offset
        return entries[higher - 1].epoch, entries[higher].start_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop the entries starting at or above `end_offset` (the log was cut there)."""
        kept = [entry for entry in self._entries if entry.start_offset < end_offset]
        if len(kept) != len(self._entries):
            log.info("%s: dropped epochs from offset %d on", self._path, end_offset)
            self._replace(kept)

    def drop_from_end(self, end_offset: int) -> None:
        """`truncate_from_end` in memory only, for a log being opened. The file may keep the
        dropped entries: they describe no batch (the file ran ahead of the log, which is
        allowed), and every later write or opening drops them again. Rewriting, and fsyncing,
        the file of every log at each startup cost a broker with 5,000 partitions ~2 s."""
        self._entries = [entry for entry in self._entries if entry.start_offset < end_offset]

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset`: drop the entries wholly below it, and the last
        entry starting at or below it starts at `start_offset` instead."""
        slot = bisect.bisect_right(
            self._entries, start_offset, key=lambda entry: entry.start_offset
        )
        if slot == 0:
            return
        first = EpochEntry(self._entries[slot - 1].epoch, start_offset)
        entries = [first, *self._entries[slot:]]
        if entries != self._entries:
            self._replace(entries)

    def _replace(self, entries: list[EpochEntry]) -> None:
        """Write `entries` durably, then adopt them: a failed write leaves the cache as it was."""
        _check_entries(entries, self._path)
        self._write(entries, durable=True)
        self._entries = entries

    def _write(self, entries: list[EpochEntry], *, durable: bool) -> None:
        lines = [str(CHECKPOINT_VERSION), str(len(entries))]
        lines += [f"{entry.epoch} {entry.start_offset}" for entry in entries]
        write_atomically(self._path, ("\n".join(lines) + "\n").encode(), durable=durable)
        self._unwritten = False

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self._path}, {self._entries})"


def _check_entries(entries: list[EpochEntry], path: Path) -> None:
    previous = EpochEntry(UNDEFINED_EPOCH, 0)
    for entry in entries:
        if entry.epoch <= previous.epoch or entry.start_offset < previous.start_offset:
            raise CheckpointError(f"{path}: entry {tuple(entry)} does not follow {tuple(previous)}")
        previous = entry


def _parse(path: Path, data: bytes) -> list[EpochEntry]:
    try:
        lines = data.decode("ascii").splitlines()
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not a text file") from None
    if len(lines) < 2 or lines[0] != str(CHECKPOINT_VERSION):
        raise CheckpointError(f"{path}: expected version line {CHECKPOINT_VERSION}")
    if not lines[1].isdigit() or int(lines[1]) != len(lines) - 2:
        raise CheckpointError(f"{path}: entry count {lines[1]!r} does not match the file")
    entries = []
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split(" ")
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            raise CheckpointError(f"{path}:{number}: expected 'epoch start_offset', got {line!r}")
        entries.append(EpochEntry(int(fields[0]), int(fields[1])))
    return entries
