"""Fetch responses into records: the consumer's hot path, with no I/O.

A `PartitionFetch` holds one partition's records section from one Fetch response (a memoryview
into the response frame, never copied whole) and hands out records batch by batch as the
application asks for them, so a `getmany(max_records=100)` decodes one batch, not a whole
fetch. Batches are filtered as Kafka's consumer does:

- control batches (transaction markers) never surface;
- with read_committed (KIP-98), a transactional batch is dropped when its producer id is in the
  response's aborted transactions from that transaction's first offset until the producer's
  ABORT marker;
- records below the fetch offset are dropped: the broker answers with whole batches, and the
  first one can start before the offset asked for.

Batches are decoded by riverbed.protocol.records_codec.decode_batch, whose per-record loop is
compiled (records_fast): at ~100 bytes per record it is the whole cost of consuming. An
uncompressed records section is decoded in place from the response frame, without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from riverbed.client.types import Record, TopicPartition
from riverbed.protocol.records import BatchHeader, decode_batch, iter_batch_headers

ISOLATION_READ_UNCOMMITTED: Final = 0
ISOLATION_READ_COMMITTED: Final = 1
# A control record's key: version int16, type int16 (0 ABORT, 1 COMMIT).
CONTROL_TYPE_ABORT: Final = 0
CONTROL_KEY_BYTES: Final = 4
NO_PRODUCER_ID: Final = -1

AbortedTransaction = tuple[int, int]  # (producer_id, first_offset)


class PartitionFetch:
    """One partition's part of one Fetch response, drained by `take`.

    `next_offset` is where the application stands after what `take` returned (batches skipped
    as control or aborted count as read); `end_offset` is where the next fetch starts: after the
    last whole batch (a response may end in part of a batch, which the next fetch reads again).
    """

    __slots__ = (
        "_aborted",
        "_aborted_producer_ids",
        "_batch_end_offset",
        "_batches",
        "_buf",
        "_check_crcs",
        "_pending",
        "_pending_index",
        "_read_committed",
        "end_offset",
        "generation",
        "next_offset",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        records: bytes | memoryview,
        fetch_offset: int,
        generation: int,
        *,
        read_committed: bool = False,
        aborted_transactions: Sequence[AbortedTransaction] = (),
        check_crcs: bool = True,
    ) -> None:
        self.tp = tp
        self._check_crcs = check_crcs
        self.generation = generation
        self.next_offset = fetch_offset
        self._buf = records
        # Batches wholly below the fetch offset carry nothing for us (nor their end offset).
        self._batches = [
            (position, header)
            for position, header in iter_batch_headers(records)
            if header.last_offset >= fetch_offset
        ]
        self._batches.reverse()  # popped from the end, oldest first
        self.end_offset = self._batches[0][1].last_offset + 1 if self._batches else fetch_offset
        self._read_committed = read_committed
        # Ascending first offset, as `take` consumes them (Kafka sorts them the same way).
        self._aborted = sorted(aborted_transactions, key=lambda item: item[1], reverse=True)
        self._aborted_producer_ids: set[int] = set()
        self._pending: list[Record] = []
        self._pending_index = 0
        self._batch_end_offset = fetch_offset  # one past the batch `_pending` came from

    @property
    def exhausted(self) -> bool:
        return not self._batches and self._pending_index >= len(self._pending)

    def take(self, max_records: int) -> list[Record]:
        """Up to `max_records` records in offset order; [] once exhausted.

        Raises CorruptRecordError for a batch that fails its CRC or cannot be decoded.
        """
        out: list[Record] = []
        while len(out) < max_records:
            if self._pending_index >= len(self._pending):
                if not self._batches:
                    break
                self._decode_next_batch()
                continue
            start = self._pending_index
            stop = min(len(self._pending), start + max_records - len(out))
            out += self._pending[start:stop]
            self._pending_index = stop
            # Within the batch: after the last record taken; at its end: past the batch (its
            # last offsets may hold no record, as after compaction).
            if stop < len(self._pending):
                self.next_offset = self._pending[stop - 1].offset + 1
            else:
                self.next_offset = self._batch_end_offset
        return out

    def _decode_next_batch(self) -> None:
        position, header = self._batches.pop()
        skip_below = self.next_offset
        # Whatever happens to the batch, the application has now read past it.
        self.next_offset = max(self.next_offset, header.last_offset + 1)
        self._batch_end_offset = self.next_offset
        self._pending = []
        self._pending_index = 0
        if self._read_committed and header.producer_id != NO_PRODUCER_ID:
            self._add_aborted_up_to(header.last_offset)
            if header.is_control:
                if self._is_abort_marker(position, header):
                    self._aborted_producer_ids.discard(header.producer_id)
                return
            if header.is_transactional and header.producer_id in self._aborted_producer_ids:
                return
        if header.is_control:
            return
        self._pending = decode_batch(
            self.tp, self._buf, position, header, check_crc=self._check_crcs, skip_below=skip_below
        )

    def _add_aborted_up_to(self, last_offset: int) -> None:
        aborted = self._aborted
        while aborted and aborted[-1][1] <= last_offset:
            self._aborted_producer_ids.add(aborted.pop()[0])

    def _is_abort_marker(self, position: int, header: BatchHeader) -> bool:
        records = decode_batch(self.tp, self._buf, position, header, check_crc=self._check_crcs)
        key = records[0].key if records else None
        if key is None or len(key) < CONTROL_KEY_BYTES:
            return False
        return int.from_bytes(key[2:4], "big", signed=True) == CONTROL_TYPE_ABORT
