"""The values a partition's transactions pass between its producer state, its log and its
aborted-transaction index (KIP-98), as Kafka's storage layer names them."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

# A producer without an open transaction in this partition (Kafka's empty currentTxnFirstOffset).
NO_TXN_OFFSET: Final = -1


class AppendOrigin(enum.Enum):
    """Who appends, which decides how much of a batch the producer state checks (Kafka's
    AppendOrigin). Replicated batches are never checked: they are replayed (`rebuild`)."""

    # A producer's Produce request: duplicates, epochs, sequences and transaction state.
    CLIENT = "client"
    # A coordinator writing on a producer's behalf (TxnOffsetCommit's transactional offset
    # records): no sequence numbers to check, so no duplicate or sequence checks; epochs are
    # still checked, so a fenced producer's offsets are refused.
    COORDINATOR = "coordinator"


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker just ended: its data offsets [first_offset, last_offset), the
    marker at `last_offset`."""

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An aborted transaction as the `.txnindex` file holds it (Kafka's AbortedTxn):
    `last_offset` is its marker's offset; `last_stable_offset` the partition's LSO once it
    completed (the first offset of the next open transaction, or last_offset + 1)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int
