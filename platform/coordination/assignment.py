"""Replica placement: Kafka's rack-unaware round-robin assignment, for new topics and for the
partitions added to a topic.

Brokers are sorted; partition p's first replica (its preferred leader) is broker
`(p + start) % n`, and the followers are the next brokers after a shift that grows by one each
time the partitions wrap around the broker list, so that leaders and followers of consecutive
partitions land on different brokers. For a new topic `start` and the initial shift are random
(as in Kafka's AdminUtils), so many small topics do not all lead on the same broker. Partitions
added to a topic continue its round robin as Kafka's AdminZkClient does: numbered from the
current count, with `start` (and the initial shift) the position of partition 0's preferred
leader among the brokers, so that the preferred leaders keep going round from where they were.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Mapping, Sequence


def assign_replicas(
    broker_ids: Iterable[int],
    num_partitions: int,
    replication_factor: int,
    rng: random.Random | None = None,
) -> dict[int, tuple[int, ...]]:
    """partition -> replica broker ids (first = preferred leader). Raises ValueError if the
    request cannot be met; callers map that to a Kafka error with context."""
    if num_partitions < 1:
        raise ValueError(f"number of partitions must be >= 1, got {num_partitions}")
    brokers = _brokers_for(broker_ids, replication_factor)
    chooser = rng or random.Random()
    start = chooser.randrange(len(brokers))
    shift = chooser.randrange(len(brokers))
    return _round_robin(brokers, range(num_partitions), replication_factor, start, shift)


def assign_added_replicas(
    broker_ids: Iterable[int], existing: Mapping[int, tuple[int, ...]], new_count: int
) -> dict[int, tuple[int, ...]]:
    """The replicas of partitions `len(existing)`..`new_count - 1` of a topic whose partitions
    are `existing`, as many as partition 0 has. Raises ValueError if the brokers cannot hold
    them (fewer live brokers than that replication factor)."""
    first_replicas = existing[0]
    brokers = _brokers_for(broker_ids, len(first_replicas))
    # Where partition 0's preferred leader is, or would be: the first broker at or above it.
    start = next((i for i, b in enumerate(brokers) if b >= first_replicas[0]), 0)
    added = range(len(existing), new_count)
    return _round_robin(brokers, added, len(first_replicas), start, start)


def check_manual_replicas(
    replicas: Sequence[Sequence[int]], replication_factor: int, broker_ids: Collection[int]
) -> None:
    """Check replica lists given by a client, one per partition: each as long as
    `replication_factor`, without a broker twice, naming only `broker_ids`. Raises ValueError
    naming the first list that is not."""
    for position, brokers in enumerate(replicas):
        if not brokers:
            raise ValueError(f"replica list {position} is empty")
        if len(set(brokers)) != len(brokers):
            raise ValueError(f"replica list {position} names a broker twice: {list(brokers)}")
        unknown = sorted(set(brokers) - set(broker_ids))
        if unknown:
            raise ValueError(
                f"replica list {position} names unknown or stopped brokers {unknown} "
                f"(live: {sorted(broker_ids)})"
            )
        if len(brokers) != replication_factor:
            raise ValueError(
                f"replica list {position} has {len(brokers)} replicas; the topic's partitions "
                f"have {replication_factor}"
            )


def _brokers_for(broker_ids: Iterable[int], replication_factor: int) -> list[int]:
    brokers = sorted(set(broker_ids))
    if not 1 <= replication_factor <= len(brokers):
        raise ValueError(
            f"replication factor {replication_factor} must be in 1..{len(brokers)} (live brokers)"
        )
    return brokers


def _round_robin(
    brokers: list[int], partitions: range, replication_factor: int, start: int, shift: int
) -> dict[int, tuple[int, ...]]:
    count = len(brokers)
    assignment: dict[int, tuple[int, ...]] = {}
    for partition in partitions:
        if partition > 0 and partition % count == 0:
            shift += 1
        first = (partition + start) % count
        followers = (_follower_index(first, shift, j, count) for j in range(replication_factor - 1))
        assignment[partition] = (brokers[first], *(brokers[i] for i in followers))
    return assignment


def _follower_index(first: int, shift: int, replica: int, count: int) -> int:
    return (first + 1 + (shift + replica) % (count - 1)) % count
