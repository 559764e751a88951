"""Replica placement for new topics: Kafka's rack-unaware round-robin assignment.

Brokers are sorted; partition p's first replica (its preferred leader) is broker
`(p + start) % n`, and the followers are the next brokers after a shift that grows by one each
time the partitions wrap around the broker list, so that leaders and followers of consecutive
partitions land on different brokers. `start` and the initial shift are random (as in Kafka's
AdminUtils), so many small topics do not all lead on the same broker.
"""

from __future__ import annotations

import random
from collections.abc import Iterable


def assign_replicas(
    broker_ids: Iterable[int],
    num_partitions: int,
    replication_factor: int,
    rng: random.Random | None = None,
) -> dict[int, tuple[int, ...]]:
    """partition -> replica broker ids (first = preferred leader). Raises ValueError if the
    request cannot be met; callers map that to a Kafka error with context."""
    brokers = sorted(set(broker_ids))
    count = len(brokers)
    if num_partitions < 1:
        raise ValueError(f"number of partitions must be >= 1, got {num_partitions}")
    if not 1 <= replication_factor <= count:
        raise ValueError(
            f"replication factor {replication_factor} must be in 1..{count} (live brokers)"
        )
    chooser = rng or random.Random()
    start = chooser.randrange(count)
    shift = chooser.randrange(count)
    assignment: dict[int, tuple[int, ...]] = {}
    for partition in range(num_partitions):
        if partition > 0 and partition % count == 0:
            shift += 1
        first = (partition + start) % count
        followers = (_follower_index(first, shift, j, count) for j in range(replication_factor - 1))
        assignment[partition] = (brokers[first], *(brokers[i] for i in followers))
    return assignment


def _follower_index(first: int, shift: int, replica: int, count: int) -> int:
    return (first + 1 + (shift + replica) % (count - 1)) % count
