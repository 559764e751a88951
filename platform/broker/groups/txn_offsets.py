"""Transactional offsets not yet decided: what TxnOffsetCommit wrote, waiting for its marker.

A transactional producer's offset commits are written to the group's `__consumer_offsets`
partition inside its transaction (KIP-98) and count only once the transaction's COMMIT marker
lands there; an ABORT marker drops them. Until then they are *pending*: kept per producer id and
group (Kafka's pendingTransactionalOffsetCommits), invisible to OffsetFetch, and they make
OffsetFetch with require_stable answer UNSTABLE_OFFSET_COMMIT for their partitions.

One producer has at most one transaction open, so a marker for a producer id decides all of its
pending offsets in the marker's partition. A tombstone for a key (DeleteGroups, expiry) removes
the pending offsets written before it for that key, as a replay of the log would.

The same structure serves the live coordinator (`OffsetStore`) and a load's replay
(`log_store.load`), so memory and a replay of the log agree.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

from riverbed.protocol.record_types import TopicPartition

if TYPE_CHECKING:  # log_store keeps a load's pending offsets here: no import cycle at runtime
    from riverbed.broker.groups.log_store import CommittedOffset

# group id -> partition -> the pending offset (with its record offset in __consumer_offsets)
GroupOffsets = dict[str, dict[TopicPartition, "CommittedOffset"]]


class PendingTransactionalOffsets:
    """Pending offsets per producer id and group, with the reverse index per group."""

    def __init__(self) -> None:
        self._by_producer: dict[int, GroupOffsets] = {}
        # Kafka's openTransactionsByGroup: the producers with pending offsets in each group.
        self._producers_by_group: dict[str, set[int]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_producer)

    # -- reads ----------------------------------------------------------------------------------

    def group_ids(self) -> set[str]:
        return set(self._producers_by_group)

    def has_group(self, group_id: str) -> bool:
        return group_id in self._producers_by_group

    def groups_of(self, producer_id: int) -> set[str]:
        """The groups where the producer has pending offsets."""
        return set(self._by_producer.get(producer_id, ()))

    def partitions(self, group_id: str) -> set[TopicPartition]:
        """The partitions of the group with a pending offset of any producer."""
        return {
            tp
            for producer_id in self._producers_by_group.get(group_id, ())
            for tp in self._by_producer[producer_id].get(group_id, {})
        }

    def get(self, producer_id: int, group_id: str) -> dict[TopicPartition, CommittedOffset]:
        """A copy of the producer's pending offsets in the group (empty if none)."""
        return dict(self._by_producer.get(producer_id, {}).get(group_id, {}))

    # -- changes --------------------------------------------------------------------------------

    def add(
        self, producer_id: int, group_id: str, tp: TopicPartition, committed: CommittedOffset
    ) -> None:
        """A transactional offset commit record was appended at `committed.record_offset`."""
        by_group = self._by_producer.setdefault(producer_id, {})
        offsets = by_group.setdefault(group_id, {})
        current = offsets.get(tp)
        if current is None or current.record_offset < committed.record_offset:
            offsets[tp] = committed
        self._producers_by_group.setdefault(group_id, set()).add(producer_id)

    def complete(self, producer_id: int, group_ids: Iterable[str] | None = None) -> GroupOffsets:
        """Remove and return the producer's pending offsets in `group_ids` (None: every group):
        its transaction ended there."""
        by_group = self._by_producer.get(producer_id)
        if by_group is None:
            return {}
        chosen = list(by_group) if group_ids is None else [g for g in group_ids if g in by_group]
        completed = {group_id: by_group.pop(group_id) for group_id in chosen}
        if not by_group:
            del self._by_producer[producer_id]
        for group_id in completed:
            self._forget(group_id, producer_id)
        return completed

    def discard(self, group_id: str, tp: TopicPartition, before_record_offset: int) -> None:
        """A tombstone for (group, tp) at `before_record_offset`: pending offsets written
        before it are gone, of every producer."""
        for producer_id in list(self._producers_by_group.get(group_id, ())):
            offsets = self._by_producer[producer_id][group_id]
            current = offsets.get(tp)
            if current is not None and current.record_offset < before_record_offset:
                del offsets[tp]
                if not offsets:
                    self._drop(producer_id, group_id)

    def drop_groups(self, group_ids: Collection[str]) -> None:
        """Forget the groups (their partition is no longer led here)."""
        for group_id in group_ids:
            for producer_id in list(self._producers_by_group.get(group_id, ())):
                self._drop(producer_id, group_id)

    def merge(self, other: PendingTransactionalOffsets) -> None:
        """Take every pending offset of `other` (a load's result)."""
        for producer_id, by_group in other._by_producer.items():
            for group_id, offsets in by_group.items():
                for tp, committed in offsets.items():
                    self.add(producer_id, group_id, tp, committed)

    def _drop(self, producer_id: int, group_id: str) -> None:
        by_group = self._by_producer[producer_id]
        del by_group[group_id]
        if not by_group:
            del self._by_producer[producer_id]
        self._forget(group_id, producer_id)

    def _forget(self, group_id: str, producer_id: int) -> None:
        producers = self._producers_by_group[group_id]
        producers.discard(producer_id)
        if not producers:
            del self._producers_by_group[group_id]
