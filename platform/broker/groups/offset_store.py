"""Committed offsets: the in-memory copy of `__consumer_offsets`, commits, fetches and expiry.

`OffsetStore` holds the latest committed offset of every (group, partition) whose
`__consumer_offsets` partition this broker has loaded. It changes only after the log does: a
commit is applied once its record is committed (on every in-sync replica), a removal once its
tombstone is; of two values for one key the one later in the log wins, so memory and a replay
of the log always agree, whatever order writes complete in.

Expiry (KIP-211): an offset expires `offsets.retention.minutes` after a base time that depends on
its group — when an Empty group became empty (or its commit time when that is unknown), its
commit time for a group without members that never used group management ("simple" consumers),
and for a Stable consumer group only offsets of topics it no longer subscribes to, by commit
time. An offset committed with an explicit retention (OffsetCommit v2-4) expires at its own
expire timestamp. Offsets with a commit in flight never expire, nor do offsets with a pending
transactional offset (Kafka's rule).

Transactional offsets (TxnOffsetCommit, KIP-98) are pending from the moment their batch is in the
local log until the transaction's marker decides them (`complete_transaction`); see
riverbed.broker.groups.txn_offsets. A group with pending offsets exists as far as listing,
describing and deleting go, as in Kafka; deleting it tombstones its pending partitions too.
"""

from __future__ import annotations

import collections
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Protocol

from riverbed.broker.groups.log_store import (
    NO_TIMESTAMP,
    CommittedOffset,
    Entry,
    OnAppended,
    TransactionalProducer,
    coordinator_error,
    offset_commit_entry,
    offset_tombstone,
)
from riverbed.broker.groups.txn_offsets import GroupOffsets, PendingTransactionalOffsets
from riverbed.coordination.metadata_cache import MetadataCache
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition


class WriteEntries(Protocol):
    """Writes entries to the group's __consumer_offsets partition (in `producer`'s transaction
    if one is given); returns the offset of the first once committed; raises KafkaError with
    the storage's code (mapped here for the client). `on_appended` is told the first offset as
    soon as the batch is in the local log."""

    async def __call__(
        self,
        group_id: str,
        entries: Sequence[Entry],
        /,
        *,
        producer: TransactionalProducer | None = None,
        on_appended: OnAppended | None = None,
    ) -> int: ...


MS_PER_MINUTE: Final = 60_000


@dataclass(frozen=True, slots=True)
class ExpiryBase:
    """How one group's offsets age: from `since_ms` (None: each offset's commit time), except
    offsets of `kept_topics`, which do not expire while the group keeps them."""

    since_ms: int | None = None
    kept_topics: frozenset[str] = frozenset()


class OffsetStore:
    """The committed offsets of the groups of every loaded `__consumer_offsets` partition."""

    def __init__(self, cache: MetadataCache, write: WriteEntries, metadata_max_bytes: int) -> None:
        self._cache = cache
        self._write = write
        self._metadata_max_bytes = metadata_max_bytes
        self._offsets: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        # Commits written but not yet committed, per key: such an offset is about to change,
        # so expiry leaves it alone.
        self._pending: collections.Counter[tuple[str, TopicPartition]] = collections.Counter()
        self._transactional = PendingTransactionalOffsets()

    # -- reads ----------------------------------------------------------------------------------

    def group_ids(self) -> set[str]:
        """Groups with committed or pending transactional offsets."""
        return set(self._offsets) | self._transactional.group_ids()

    def has_offsets(self, group_id: str) -> bool:
        """Whether the group has committed or pending transactional offsets (Kafka's
        GroupMetadata.hasOffsets: such a group is not removed)."""
        return group_id in self._offsets or self._transactional.has_group(group_id)

    def unstable(self, group_id: str, partitions: Iterable[TopicPartition]) -> set[TopicPartition]:
        """Those of `partitions` with a pending transactional offset in the group
        (OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them)."""
        return self._transactional.partitions(group_id).intersection(partitions)

    def pending_transactional(
        self, producer_id: int, group_id: str
    ) -> dict[TopicPartition, CommittedOffset]:
        """The producer's pending transactional offsets in the group."""
        return self._transactional.get(producer_id, group_id)

    def transactional_groups(self, producer_id: int) -> set[str]:
        """The groups where the producer has pending transactional offsets."""
        return self._transactional.groups_of(producer_id)

    def fetch(
        self, group_id: str, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset | None]:
        """The committed offset of each of `partitions` (None if there is none), or of every
        partition the group committed when `partitions` is None."""
        offsets = self._offsets.get(group_id, {})
        if partitions is None:
            return dict(sorted(offsets.items()))
        return {tp: offsets.get(tp) for tp in partitions}

    # -- loading --------------------------------------------------------------------------------

    def load(self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset]) -> None:
        """Take a group's offsets as a load of its partition found them."""
        if offsets:
            self._offsets[group_id] = dict(offsets)

    def load_transactional(self, pending: PendingTransactionalOffsets) -> None:
        """Take the pending transactional offsets a load of a partition found."""
        self._transactional.merge(pending)

    def unload(self, group_ids: Collection[str]) -> None:
        for group_id in group_ids:
            self._offsets.pop(group_id, None)
        self._transactional.drop_groups(group_ids)

    # -- commits --------------------------------------------------------------------------------

    def unknown_partitions(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Those of `partitions` the cluster does not have (UNKNOWN_TOPIC_OR_PARTITION)."""
        unknown = []
        for tp in partitions:
            topic = self._cache.topic(tp.topic)
            if topic is None or tp.partition not in topic.partitions:
                unknown.append(tp)
        return unknown

    async def commit(
        self, group_id: str, offsets: Mapping[TopicPartition, CommittedOffset]
    ) -> dict[TopicPartition, ErrorCode]:
        """Write a validated OffsetCommit and apply it once committed: the code per partition.

        Metadata longer than offset.metadata.max.bytes gets OFFSET_METADATA_TOO_LARGE; the rest
        is written as one batch and shares its outcome.
        """
        codes, accepted = self._sized(offsets)
        if not accepted:
            return codes
        entries = [offset_commit_entry(group_id, tp, c) for tp, c in accepted.items()]
        keys = [(group_id, tp) for tp in accepted]
        self._pending.update(keys)
        try:
            first_offset = await self._write(group_id, entries)
        except KafkaError as error:
            return codes | dict.fromkeys(accepted, coordinator_error(error, commit=True).code)
        finally:
            for key in keys:
                self._pending[key] -= 1
                if not self._pending[key]:
                    del self._pending[key]
        for position, (tp, committed) in enumerate(accepted.items()):
            self._put(group_id, tp, replace(committed, record_offset=first_offset + position))
        return codes | dict.fromkeys(accepted, ErrorCode.NONE)

    async def commit_transactional(
        self,
        group_id: str,
        producer: TransactionalProducer,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> dict[TopicPartition, ErrorCode]:
        """Write a validated TxnOffsetCommit in the producer's transaction: the code per
        partition. The offsets are pending from the moment the batch is in the local log (a
        marker may follow before it is committed), as a replay of this log would find them."""
        codes, accepted = self._sized(offsets)
        if not accepted:
            return codes
        entries = [offset_commit_entry(group_id, tp, c) for tp, c in accepted.items()]

        def appended(first_offset: int) -> None:
            for position, (tp, committed) in enumerate(accepted.items()):
                at = replace(committed, record_offset=first_offset + position)
                self._transactional.add(producer.producer_id, group_id, tp, at)

        try:
            await self._write(group_id, entries, producer=producer, on_appended=appended)
        except KafkaError as error:
            return codes | dict.fromkeys(accepted, coordinator_error(error, commit=True).code)
        return codes | dict.fromkeys(accepted, ErrorCode.NONE)

    def complete_transaction(
        self, producer_id: int, group_ids: Iterable[str], committed: bool
    ) -> GroupOffsets:
        """The producer's transaction ended in the partition of `group_ids`: its pending
        offsets there become the committed ones (unless a later record of the key already is)
        or are dropped. Returns the offsets it decided."""
        completed = self._transactional.complete(producer_id, group_ids)
        if committed:
            for group_id, offsets in completed.items():
                for tp, offset in offsets.items():
                    self._put(group_id, tp, offset)
        return completed

    def _sized(
        self, offsets: Mapping[TopicPartition, CommittedOffset]
    ) -> tuple[dict[TopicPartition, ErrorCode], dict[TopicPartition, CommittedOffset]]:
        """(OFFSET_METADATA_TOO_LARGE per partition whose metadata is longer than
        offset.metadata.max.bytes, the others)."""
        codes: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, CommittedOffset] = {}
        for tp, committed in offsets.items():
            if _java_length(committed.metadata) > self._metadata_max_bytes:
                codes[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
            else:
                accepted[tp] = committed
        return codes, accepted

    def _put(self, group_id: str, tp: TopicPartition, committed: CommittedOffset) -> None:
        offsets = self._offsets.setdefault(group_id, {})
        current = offsets.get(tp)
        if current is None or current.record_offset < committed.record_offset:
            offsets[tp] = committed

    # -- removal --------------------------------------------------------------------------------

    async def remove(self, group_id: str, partitions: Collection[TopicPartition]) -> None:
        """Write tombstones for the group's offsets of `partitions` and drop them once
        committed (unless a later commit replaced one meanwhile). Raises KafkaError."""
        if not partitions:
            return
        entries = [offset_tombstone(group_id, tp) for tp in partitions]
        try:
            first_offset = await self._write(group_id, entries)
        except KafkaError as error:
            raise coordinator_error(error, commit=False) from error
        offsets = self._offsets.get(group_id, {})
        for position, tp in enumerate(partitions):
            current = offsets.get(tp)
            if current is not None and current.record_offset < first_offset + position:
                del offsets[tp]
            self._transactional.discard(group_id, tp, first_offset + position)
        if not offsets:
            self._offsets.pop(group_id, None)

    async def remove_group(self, group_id: str) -> None:
        """Tombstone every offset of the group, pending transactional ones too (DeleteGroups,
        as Kafka's deleteAllOffsets). Raises KafkaError."""
        partitions = set(self._offsets.get(group_id, {})) | self._transactional.partitions(group_id)
        await self.remove(group_id, sorted(partitions))

    def expired(
        self, group_id: str, base: ExpiryBase, now_ms: int, retention_ms: int
    ) -> list[TopicPartition]:
        """The group's offsets that have expired at `now_ms` (see the module docstring)."""
        expired = []
        transactional = self._transactional.partitions(group_id)
        for tp, committed in self._offsets.get(group_id, {}).items():
            if tp.topic in base.kept_topics or self._pending[(group_id, tp)] or tp in transactional:
                continue
            if committed.expire_timestamp_ms != NO_TIMESTAMP:
                due = now_ms >= committed.expire_timestamp_ms
            else:
                since_ms = committed.commit_timestamp_ms if base.since_ms is None else base.since_ms
                due = now_ms - since_ms >= retention_ms
            if due:
                expired.append(tp)
        return expired


def _java_length(text: str) -> int:
    """Java's String.length(): UTF-16 code units (Kafka compares the metadata's length)."""
    return len(text.encode("utf-16-le")) // 2
