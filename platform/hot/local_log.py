"""What the layers above the hot tier may see of a partition and its local log.

The cold tier (riverbed.tiering) uploads sealed segments, applies local retention to what it
has uploaded, and serves reads that start below the local log. For that it needs a few reads
and two deletions of the local log, and nothing else. It sees them through the Protocols here,
never through the hot tier's classes (`PartitionLog`, `Partition`, `PartitionManager`), so those
can change without the cold tier knowing; the layer contract (tools/layers.py) lets tiering
import this module of `riverbed.hot` and no other.

The values these methods return are the hot tier's own frozen records, re-exported here, and so
is the retention rule: both tiers apply it, the hot tier's retention task to every untiered
log and the offloader to the uploaded part of a tiered one.
"""

from __future__ import annotations

from typing import Protocol

from riverbed.hot.storage.log import ReadResult, SealedBatches, SegmentStats
from riverbed.hot.storage.retention import UNLIMITED, log_start_after_retention
from riverbed.hot.storage.transactions import AbortedTxn

__all__ = [
    "UNLIMITED",
    "AbortedTxn",
    "LocalLog",
    "LocalPartition",
    "ReadResult",
    "SealedBatches",
    "SegmentStats",
    "log_start_after_retention",
]


class LocalLog(Protocol):
    """A partition's local log: offsets as defined in riverbed.hot.storage.log."""

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed readers stop: the first offset of the oldest open transaction,
        or the high watermark."""
        ...

    @property
    def truncated_before(self) -> int:
        """The log start DeleteRecords set (0 without one): nothing below it is served, from
        either tier."""
        ...

    @property
    def size_bytes(self) -> int: ...

    def read(self, fetch_offset: int, max_bytes: int, max_offset: int) -> ReadResult | None:
        """Whole batches from `fetch_offset`, below `max_offset`; None if there are none."""
        ...

    def sealed_batches_from(self, offset: int, below_offset: int) -> SealedBatches | None:
        """The sealed segment holding `offset`, if all of it lies below `below_offset`."""
        ...

    def segment_stats(self) -> list[SegmentStats]: ...

    def aborted_transactions(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """The local transaction index's aborted transactions with data in [start_offset,
        upper_bound_offset)."""
        ...

    def advance_log_start_offset(self, offset: int) -> bool:
        """Move the log start up to `offset`, durably; False if it already was there."""
        ...

    def delete_segments_below(self, offset: int, *, reason: str = ...) -> int:
        """Delete the sealed segments wholly below `offset`; the bytes freed."""
        ...


class LocalPartition(Protocol):
    """A partition this broker hosts, leader or follower, with its local log."""

    @property
    def topic(self) -> str: ...

    @property
    def index(self) -> int: ...

    @property
    def is_leader(self) -> bool: ...

    @property
    def leader_epoch(self) -> int: ...

    @property
    def log(self) -> LocalLog: ...
