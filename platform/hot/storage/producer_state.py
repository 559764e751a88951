"""Idempotent producers' state in one partition: who wrote which sequence numbers where.

Per producer id the state holds its current epoch and the metadata (first and last sequence,
first and last offset) of its last `BATCHES_RETAINED_MAX` batches: a producer keeps at most five
requests in flight, so a retried batch is always one of these. The rules, as Kafka's
ProducerAppendInfo / UnifiedLog apply them to a client's batch with a producer id:

- same epoch and the same (first, last) sequence as a retained batch: a DUPLICATE, not appended;
  the produce response carries the ORIGINAL offsets and no error;
- an epoch below the current one: INVALID_PRODUCER_EPOCH (a fenced zombie);
- a newer epoch: the sequence must start again at 0, else OUT_OF_ORDER_SEQUENCE_NUMBER;
- the same epoch: the base sequence must follow the last one (with int32 wrap-around), else
  OUT_OF_ORDER_SEQUENCE_NUMBER;
- an unknown producer id (never seen here, or expired) is accepted at any sequence. This is
  Kafka's rule since KIP-360 (2.5): its state may be gone through retention or expiry while the
  producer lives on, and the broker cannot tell that apart from a lost first batch.

Batches without a producer id (-1) pass straight through.

Transactions (KIP-98), as Kafka's ProducerAppendInfo / ProducerStateManager keep them: a
producer's first transactional batch opens its transaction in this partition
(`current_txn_first_offset`); a non-transactional batch while one is open is refused with
INVALID_TXN_STATE; a marker (control batch) closes it, yielding a `CompletedTxn`. A marker with an
epoch below the producer's is refused with INVALID_PRODUCER_EPOCH (Kafka's answer since 2.7), one
from a coordinator epoch below the last the producer's markers carried with
TRANSACTION_COORDINATOR_FENCED. Completed transactions stay "unreplicated" until the high
watermark passes their marker: until then they still hold the last stable offset back
(`first_unstable_offset`). Appends from a coordinator (AppendOrigin.COORDINATOR: TxnOffsetCommit
records) skip the duplicate and sequence checks; epochs are checked. A producer with an open
transaction never expires.

The state is derived from batch headers only (never records) and can always be rebuilt from the
log: `rebuild` replays headers. So that reopening a log does not scan all of it, the state is
snapshotted to `<offset 20 digits>.snapshot` in the partition directory (the state after every
batch below that offset); `load_producer_state` starts from the latest valid snapshot at or below
the log end offset and replays only the batches after it. Replay needs the type of each marker,
so it takes (header, marker) pairs (`PartitionLog.batches_with_markers`) and returns the aborted
transactions it completed, for the log's transaction index.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import crc32c
from riverbed.common.fileio import write_atomically
from riverbed.hot.storage.transactions import (
    NO_TXN_OFFSET,
    AbortedTxn,
    AppendOrigin,
    CompletedTxn,
)
from riverbed.protocol.control_records import ControlType
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records import BatchHeader

__all__ = [
    "AbortedTxn",
    "AppendOrigin",
    "CompletedTxn",
    "DuplicateBatch",
    "ProducerEntry",
    "ProducerStateManager",
    "load_producer_state",
]

log = logging.getLogger(__name__)

NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
NO_COORDINATOR_EPOCH: Final = -1
SEQUENCE_MAX: Final = 2**31 - 1
# Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN: the producer's max.in.flight limit of 5.
BATCHES_RETAINED_MAX: Final = 5
# Kafka's producer.id.expiration.ms default (1 day): how long an idle producer's state is kept.
PRODUCER_ID_EXPIRATION_MS: Final = 24 * 60 * 60 * 1000

SNAPSHOT_SUFFIX: Final = ".snapshot"
# The newest snapshots kept; an older one is the fallback should the newest be unreadable.
SNAPSHOTS_KEPT_MAX: Final = 2
SNAPSHOT_VERSION: Final = 2
SNAPSHOT_VERSION_V1: Final = 1
# Snapshot layout (big-endian): version int16, crc uint32 (CRC-32C of everything after it),
# producer count int32; per producer: id int64, epoch int16, last timestamp int64, (v2:) current
# transaction's first offset int64 (-1: none), coordinator epoch int32, then batch count int8;
# per batch: first seq int32, last seq int32, first offset int64, last offset int64. Version 1
# (before transactions) lacks the two v2 fields; it is still read.
_SNAPSHOT_HEADER: Final = struct.Struct(">hIi")
_SNAPSHOT_CRC_END: Final = 6  # the CRC covers the bytes after version and crc
_PRODUCER: Final = struct.Struct(">qhqqib")
_PRODUCER_V1: Final = struct.Struct(">qhqb")
_BATCH: Final = struct.Struct(">iiqq")


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class DuplicateBatch:
    """A retried batch already in the log: answer with these offsets, append nothing."""

    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=BATCHES_RETAINED_MAX)
    )
    # The max timestamp of its last batch (Kafka's lastTimestamp): the clock of expiry.
    last_timestamp_ms: int = -1
    # The first offset of its open transaction here (Kafka's currentTxnFirstOffset).
    current_txn_first_offset: int = NO_TXN_OFFSET
    # The coordinator epoch of its last marker: older coordinators are fenced.
    coordinator_epoch: int = NO_COORDINATOR_EPOCH

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        if header.producer_epoch != self.epoch:
            return None
        first_seq, last_seq = header.base_sequence, last_sequence(header)
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def add(self, header: BatchHeader, base_offset: int) -> None:
        """Record a batch written at `base_offset`; a new epoch forgets the old one's batches."""
        if header.producer_epoch != self.epoch:
            self.epoch = header.producer_epoch
            self.batches.clear()
        self.batches.append(
            BatchMetadata(
                header.base_sequence,
                last_sequence(header),
                base_offset,
                base_offset + header.last_offset_delta,
            )
        )
        self.last_timestamp_ms = header.max_timestamp

    def update_epoch(self, epoch: int) -> None:
        """A marker's epoch: a new one forgets the old epoch's batches (Kafka's
        maybeUpdateProducerEpoch)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches.clear()


def last_sequence(header: BatchHeader) -> int:
    """The sequence of the batch's last record: sequences wrap from int32 max to 0."""
    return (header.base_sequence + header.last_offset_delta) % (SEQUENCE_MAX + 1)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == SEQUENCE_MAX)


class ProducerStateManager:
    """The idempotent producers of one partition. Pure logic, no I/O except snapshots.

    Produce path, in one synchronous stretch (no await between the three steps):
    `check(headers)` before the append (raises KafkaError, or returns a DuplicateBatch to answer
    instead of appending), then the append, then `on_append(headers, first_offset)`.
    Invariant: the state reflects exactly the batches of the log below the offset the caller
    snapshots it at (the log end offset when every append went through `on_append`).
    """

    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}
        # The offset of the snapshot this state was last written to or read from, if it is
        # the whole state (nothing appended since): Kafka's lastSnapOffset.
        self.snapshot_offset: int | None = None
        # Open transactions: first offset -> producer id (Kafka's ongoingTxns).
        self._ongoing: dict[int, int] = {}
        # Completed transactions whose marker the HW has not passed yet, by first offset
        # (Kafka's unreplicatedTxns).
        self._unreplicated: dict[int, CompletedTxn] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def producers(self) -> Iterator[ProducerEntry]:
        """The active producers (DescribeProducers)."""
        return iter(list(self._producers.values()))

    @property
    def ongoing_txns(self) -> dict[int, int]:
        """Open transactions, first offset -> producer id (a copy)."""
        return dict(self._ongoing)

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of an open transaction or of a completed one whose marker is not
        below `high_watermark` (Kafka's firstUnstableOffset); None if there is none. Completed
        transactions the HW has passed are forgotten here (Kafka's onHighWatermarkUpdated)."""
        unreplicated = self._unreplicated
        if unreplicated:
            for first_offset in [
                first for first, txn in unreplicated.items() if txn.last_offset < high_watermark
            ]:
                del unreplicated[first_offset]
        ongoing = self._ongoing
        if not ongoing and not unreplicated:
            return None
        if not unreplicated:
            return min(ongoing)
        if not ongoing:
            return min(unreplicated)
        return min(min(ongoing), min(unreplicated))

    def check(
        self, headers: Sequence[BatchHeader], origin: AppendOrigin = AppendOrigin.CLIENT
    ) -> DuplicateBatch | None:
        """Validate a produce request's batches against the state (Kafka's rules, see the module
        docstring). Later batches of one producer in the same request are checked against the
        earlier ones. As in Kafka, the first duplicate answers for the whole request."""
        client = origin is AppendOrigin.CLIENT
        # (epoch, last sequence, in a transaction) of producers as the earlier batches of this
        # request leave them.
        pending: dict[int, tuple[int, int, bool]] = {}
        for header in headers:
            producer_id = header.producer_id
            if producer_id == NO_PRODUCER_ID:
                continue
            committed = self._producers.get(producer_id)
            if committed is not None and client:
                duplicate = committed.find_duplicate(header)
                if duplicate is not None:
                    return DuplicateBatch(duplicate.first_offset, duplicate.last_offset)
            if committed is None:
                committed_state = (NO_PRODUCER_EPOCH, NO_SEQUENCE, False)
            else:
                in_txn = committed.current_txn_first_offset != NO_TXN_OFFSET
                committed_state = (committed.epoch, committed.last_seq, in_txn)
            epoch, last_seq, in_txn = pending.get(producer_id, committed_state)
            if client:
                _check_batch(header, epoch, last_seq, committed_state[0])
            elif header.producer_epoch < epoch:
                raise KafkaError(
                    ErrorCode.INVALID_PRODUCER_EPOCH,
                    f"producer {producer_id} epoch {header.producer_epoch} is older than {epoch}",
                )
            if in_txn and not header.is_transactional:
                raise KafkaError(
                    ErrorCode.INVALID_TXN_STATE,
                    f"producer {producer_id} sent a non-transactional batch while its "
                    "transaction is open",
                )
            pending[producer_id] = (
                header.producer_epoch,
                last_sequence(header),
                in_txn or header.is_transactional,
            )
        return None

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """Validate a marker the leader is about to append (Kafka's appendEndTxnMarker checks)."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise KafkaError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"marker of producer {producer_id} at epoch {producer_epoch}, older than "
                f"{entry.epoch}",
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise KafkaError(
                ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                f"marker of producer {producer_id} from coordinator epoch {coordinator_epoch}, "
                f"older than {entry.coordinator_epoch}",
            )

    def on_append(self, headers: Sequence[BatchHeader], first_offset: int) -> None:
        """Record data batches just appended, the first at `first_offset` (the log assigns
        consecutive offsets, so each batch's base offset follows from the previous one)."""
        self.snapshot_offset = None
        base_offset = first_offset
        for header in headers:
            self._apply_data(header, base_offset)
            base_offset += header.last_offset_delta + 1

    def on_marker(
        self, header: BatchHeader, control_type: ControlType, coordinator_epoch: int
    ) -> AbortedTxn | None:
        """Record a marker just appended (`header` with its final offset); the aborted
        transaction it ends, for the transaction index, if it aborted one."""
        self.snapshot_offset = None
        return self._apply_marker(header, control_type, coordinator_epoch)

    def rebuild(
        self, batches: Iterable[tuple[BatchHeader, tuple[ControlType, int] | None]]
    ) -> list[AbortedTxn]:
        """Replay batches whose offsets are final, without validation: read back from the log
        (what is in it was accepted when it was written), or a follower's batches just appended
        with the leader's offsets (the leader validated them). Each comes with its marker
        (type, coordinator epoch) if it is one. Returns the aborted transactions the markers
        ended, oldest first, for the transaction index."""
        self.snapshot_offset = None
        aborted: list[AbortedTxn] = []
        for header, marker in batches:
            if not header.is_control:
                self._apply_data(header, header.base_offset)
            elif marker is not None:
                txn = self._apply_marker(header, marker[0], marker[1])
                if txn is not None:
                    aborted.append(txn)
        return aborted

    def remove_expired(self, now_ms: int, expiration_ms: int = PRODUCER_ID_EXPIRATION_MS) -> int:
        """Forget producers idle longer than `expiration_ms` (bounds the state); return how many.

        Like Kafka, idleness is measured by the batches' own max timestamps, and a producer with
        an open transaction never expires (its transaction holds the LSO; the coordinator
        aborts it on its timeout)."""
        expired = [
            producer_id
            for producer_id, entry in self._producers.items()
            if now_ms - entry.last_timestamp_ms > expiration_ms
            and entry.current_txn_first_offset == NO_TXN_OFFSET
        ]
        for producer_id in expired:
            del self._producers[producer_id]
        if expired:
            self.snapshot_offset = None
        return len(expired)

    def _entry(self, producer_id: int) -> ProducerEntry:
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = ProducerEntry(producer_id)
        return entry

    def _apply_data(self, header: BatchHeader, base_offset: int) -> None:
        if header.producer_id == NO_PRODUCER_ID or header.is_control:
            return
        entry = self._entry(header.producer_id)
        entry.add(header, base_offset)
        if header.is_transactional and entry.current_txn_first_offset == NO_TXN_OFFSET:
            entry.current_txn_first_offset = base_offset
            self._ongoing[base_offset] = header.producer_id

    def _apply_marker(
        self, header: BatchHeader, control_type: ControlType, coordinator_epoch: int
    ) -> AbortedTxn | None:
        entry = self._entry(header.producer_id)
        entry.update_epoch(header.producer_epoch)
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp_ms = header.max_timestamp
        first_offset = entry.current_txn_first_offset
        if first_offset == NO_TXN_OFFSET:
            return None  # a marker of a transaction without data here changes nothing
        entry.current_txn_first_offset = NO_TXN_OFFSET
        marker_offset = header.base_offset
        is_aborted = control_type == ControlType.ABORT
        completed = CompletedTxn(header.producer_id, first_offset, marker_offset, is_aborted)
        self._ongoing.pop(first_offset, None)
        self._unreplicated[first_offset] = completed
        if not is_aborted:
            return None
        # Kafka's lastStableOffset(completedTxn): where the LSO may go once this one is done.
        next_open = min(self._ongoing, default=marker_offset + 1)
        return AbortedTxn(header.producer_id, first_offset, marker_offset, next_open)

    # -- snapshots -----------------------------------------------------------------------------

    def take_snapshot(self, directory: Path, offset: int, *, durable: bool = True) -> bool:
        """Write the state (that of every batch below `offset`) to `<offset>.snapshot` and drop
        older snapshots beyond SNAPSHOTS_KEPT_MAX. A failure is logged, not raised: a missing
        snapshot only makes the next open scan more of the log. Returns whether the snapshot is
        on disk (written now, or the one this state was last written to or read from).
        `durable=False` leaves the fsync to the caller (a clean shutdown syncs the whole file
        system once); a snapshot a crash then tears fails its CRC and is not used.
        """
        if offset == self.snapshot_offset:
            # Nothing appended since that snapshot (Kafka skips it too): an idle partition's
            # shutdown writes no file, which at thousands of partitions was most of it.
            return True
        path = snapshot_path(directory, offset)
        try:
            write_atomically(path, self.encode_snapshot(), durable=durable)
            self.snapshot_offset = offset
            for stale in snapshot_files(directory)[:-SNAPSHOTS_KEPT_MAX]:
                stale.unlink(missing_ok=True)
        except OSError as error:
            log.warning("%s: could not write the producer state snapshot: %s", path, error)
            return False
        return True

    def encode_snapshot(self) -> bytes:
        body = bytearray(struct.pack(">i", len(self._producers)))
        for entry in self._producers.values():
            body += _PRODUCER.pack(
                entry.producer_id,
                entry.epoch,
                entry.last_timestamp_ms,
                entry.current_txn_first_offset,
                entry.coordinator_epoch,
                len(entry.batches),
            )
            for batch in entry.batches:
                body += _BATCH.pack(
                    batch.first_seq, batch.last_seq, batch.first_offset, batch.last_offset
                )
        return struct.pack(">hI", SNAPSHOT_VERSION, crc32c.crc32c(body)) + body

    @classmethod
    def decode_snapshot(cls, data: bytes) -> ProducerStateManager:
        """Raises ValueError for anything but an intact snapshot of a known version."""
        if len(data) < _SNAPSHOT_HEADER.size:
            raise ValueError(f"snapshot of {len(data)} bytes is truncated")
        version, crc, count = _SNAPSHOT_HEADER.unpack_from(data)
        if version not in (SNAPSHOT_VERSION, SNAPSHOT_VERSION_V1):
            raise ValueError(f"unknown snapshot version {version}")
        if crc32c.crc32c(data[_SNAPSHOT_CRC_END:]) != crc:
            raise ValueError("snapshot fails its CRC")
        manager = cls()
        position = _SNAPSHOT_HEADER.size
        try:
            for _ in range(count):
                if version == SNAPSHOT_VERSION_V1:
                    producer_id, epoch, last_timestamp_ms, batches = _PRODUCER_V1.unpack_from(
                        data, position
                    )
                    position += _PRODUCER_V1.size
                    txn_first_offset, coordinator_epoch = NO_TXN_OFFSET, NO_COORDINATOR_EPOCH
                else:
                    (
                        producer_id,
                        epoch,
                        last_timestamp_ms,
                        txn_first_offset,
                        coordinator_epoch,
                        batches,
                    ) = _PRODUCER.unpack_from(data, position)
                    position += _PRODUCER.size
                entry = ProducerEntry(
                    producer_id,
                    epoch,
                    last_timestamp_ms=last_timestamp_ms,
                    current_txn_first_offset=txn_first_offset,
                    coordinator_epoch=coordinator_epoch,
                )
                if txn_first_offset != NO_TXN_OFFSET:
                    manager._ongoing[txn_first_offset] = producer_id
                for _ in range(batches):
                    entry.batches.append(BatchMetadata(*_BATCH.unpack_from(data, position)))
                    position += _BATCH.size
                manager._producers[producer_id] = entry
        except struct.error as error:
            raise ValueError(f"snapshot is truncated: {error}") from None
        if position != len(data):
            raise ValueError(f"{len(data) - position} bytes after the last producer")
        return manager


def _check_batch(header: BatchHeader, epoch: int, last_seq: int, committed_epoch: int) -> None:
    """Kafka's checkProducerEpoch + checkSequence for a client batch (duplicates excluded)."""
    producer_id, first_seq = header.producer_id, header.base_sequence
    if header.producer_epoch < epoch:
        raise KafkaError(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"producer {producer_id} epoch {header.producer_epoch} is older than {epoch}",
        )
    if header.producer_epoch != epoch:
        if first_seq != 0 and epoch != NO_PRODUCER_EPOCH:
            raise KafkaError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {producer_id} new epoch {header.producer_epoch} must start at "
                f"sequence 0, not {first_seq}",
            )
    elif committed_epoch != NO_PRODUCER_EPOCH and not _in_sequence(last_seq, first_seq):
        raise KafkaError(
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            f"producer {producer_id} sent sequence {first_seq} after {last_seq}",
        )


# -- snapshot files ----------------------------------------------------------------------------


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def snapshot_files(directory: Path) -> list[Path]:
    """The snapshots in `directory`, oldest (lowest offset) first. Names are compared as
    strings (os.listdir, not Path objects for every segment file: a broker opening or closing
    thousands of partitions lists each directory)."""
    suffix_len = len(SNAPSHOT_SUFFIX)
    names = sorted(
        name
        for name in os.listdir(directory)
        if name.endswith(SNAPSHOT_SUFFIX) and name[:-suffix_len].isdigit()
    )
    return [directory / name for name in names]


def delete_snapshots_above(directory: Path, offset: int) -> int:
    """Delete the snapshots taken above `offset`: once the log ends at `offset` (a truncation,
    or recovery cutting a torn tail) they describe batches it no longer holds. Returns how many
    were deleted."""
    files = snapshot_files(directory)
    return len(files) - len(_without_snapshots_above(files, offset))


def _without_snapshots_above(files: list[Path], offset: int) -> list[Path]:
    """Delete the snapshots of `files` taken above `offset`; return the others."""
    kept = []
    for path in files:
        if int(path.stem) > offset:
            log.info("%s: removing a snapshot above the log end %d", path, offset)
            path.unlink(missing_ok=True)
        else:
            kept.append(path)
    return kept


def load_producer_state(
    directory: Path,
    log_end_offset: int,
    batches_from: Callable[[int], Iterable[tuple[BatchHeader, tuple[ControlType, int] | None]]],
    *,
    replay_from_max: int | None = None,
    on_aborted: Callable[[AbortedTxn], None] | None = None,
) -> ProducerStateManager:
    """The state of a log reopened at `log_end_offset`: the latest readable snapshot at or below
    it, plus the batches after that snapshot (`batches_from(offset)` yields the headers of the
    batches holding offsets >= offset, oldest first, each with its marker if it is one).
    Snapshots above the log end offset are deleted first (as `delete_snapshots_above` does; the
    directory is listed once), unreadable ones too. After a truncation, calling it again with
    the new log end offset gives the state of the truncated log.

    `replay_from_max`: replay at least from there (a snapshot above it is not used, nor
    deleted): recovery re-scanned the log from that offset after an unclean shutdown, and the
    transaction indexes of those segments may lack entries their markers need. `on_aborted`
    gets each aborted transaction the replay completes (the log's index skips those it has)."""
    manager: ProducerStateManager | None = None
    start_offset = 0
    for path in reversed(_without_snapshots_above(snapshot_files(directory), log_end_offset)):
        offset = int(path.stem)
        if replay_from_max is not None and offset > replay_from_max:
            continue
        try:
            manager = ProducerStateManager.decode_snapshot(path.read_bytes())
        except (OSError, ValueError) as error:
            log.warning("%s: removing an unreadable producer state snapshot: %s", path, error)
            path.unlink(missing_ok=True)
            continue
        start_offset = offset
        break
    if manager is None:
        manager = ProducerStateManager()
    elif start_offset == log_end_offset:
        manager.snapshot_offset = start_offset  # the snapshot is the whole state
    if start_offset < log_end_offset:
        aborted = manager.rebuild(
            (header, marker)
            for header, marker in batches_from(start_offset)
            if header.base_offset >= start_offset
        )
        if on_aborted is not None:
            for txn in aborted:
                on_aborted(txn)
    return manager
