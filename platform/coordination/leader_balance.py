"""Automatic preferred-leader rebalance: which partitions go back to their preferred replicas,
as pure functions (no I/O). Kafka's rule in ZooKeeper mode
(KafkaController.checkAndTriggerAutoLeaderRebalance), run by the controller every
`leader.imbalance.check.interval.seconds`:

- A partition's **preferred replica** is the first of its assignment.
- A broker's **leader imbalance** is, over the partitions whose preferred replica it is, the
  share that it does not lead (another replica leads, or nobody does).
- For each broker whose imbalance is *above* `leader.imbalance.per.broker.percentage` / 100,
  the partitions it should lead and does not get a preferred-leader election, where it can
  win one: it is registered, not shutting down, and in the ISR, and the partition is not
  being reassigned (a move in progress decides its own leader when it finishes).
- A broker at or under the threshold keeps its imbalance: each move costs the partition's
  clients a NOT_LEADER answer and a metadata refresh, and a few partitions off their preferred
  replica are not worth that.

The election itself (fencing of restarted brokers, the conditional writes) is the controller's
ElectLeaders path; this module only chooses what to ask it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from riverbed.coordination.partition_election import BrokerView

TopicPartition = tuple[str, int]

# Kafka's `leader.imbalance.per.broker.percentage` is a percentage: 0 rebalances any imbalance,
# 100 never (a ratio cannot exceed 1).
IMBALANCE_PERCENTAGE_MIN: Final = 0
IMBALANCE_PERCENTAGE_MAX: Final = 100


@dataclass(frozen=True, slots=True)
class RebalancePolicy:
    """Kafka's `auto.leader.rebalance.enable`, `leader.imbalance.check.interval.seconds` and
    `leader.imbalance.per.broker.percentage`, checked when built."""

    enabled: bool
    check_interval_s: float
    imbalance_percentage: int

    def __post_init__(self) -> None:
        # Explicit checks, not asserts: a zero interval would make the controller spin.
        if not self.check_interval_s > 0:
            raise ValueError(
                f"the leader imbalance check interval must be above 0 s, "
                f"not {self.check_interval_s}"
            )
        if not IMBALANCE_PERCENTAGE_MIN <= self.imbalance_percentage <= IMBALANCE_PERCENTAGE_MAX:
            raise ValueError(
                f"the leader imbalance percentage must be in [{IMBALANCE_PERCENTAGE_MIN}, "
                f"{IMBALANCE_PERCENTAGE_MAX}], not {self.imbalance_percentage}"
            )


# What a controller built without a policy does (tests that construct one directly): nothing.
REBALANCE_OFF: Final = RebalancePolicy(enabled=False, check_interval_s=1.0, imbalance_percentage=0)


class PartitionView(Protocol):
    """What the rule reads of a partition (the metadata cache's PartitionMetadata has it)."""

    @property
    def replicas(self) -> tuple[int, ...]: ...

    @property
    def leader(self) -> int: ...

    @property
    def isr(self) -> tuple[int, ...]: ...

    @property
    def adding_replicas(self) -> tuple[int, ...]: ...

    @property
    def removing_replicas(self) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class BrokerImbalance:
    broker: int
    preferred: int  # partitions whose preferred replica it is
    not_leading: int  # of those, the ones it does not lead

    @property
    def ratio(self) -> float:
        return self.not_leading / self.preferred

    def above(self, percentage: int) -> bool:
        """Whether the ratio exceeds `percentage` / 100; in integers, so that 1 partition in 10
        at 10% is exactly at the threshold (not above it by a float's rounding)."""
        return self.not_leading * IMBALANCE_PERCENTAGE_MAX > percentage * self.preferred


@dataclass(frozen=True, slots=True)
class RebalancePlan:
    imbalanced: tuple[BrokerImbalance, ...]  # the brokers above the threshold, by id
    elect: frozenset[TopicPartition]  # where their preferred replica can lead again


def plan_rebalance(
    partitions: Iterable[tuple[TopicPartition, PartitionView]],
    brokers: BrokerView,
    imbalance_percentage: int,
) -> RebalancePlan:
    """The preferred-leader elections Kafka's auto-rebalance would run now; one pass over
    `partitions`."""
    preferred: dict[int, int] = {}
    # Per preferred broker, the partitions it does not lead, with whether it could lead them.
    misled: dict[int, list[tuple[TopicPartition, bool]]] = {}
    for key, state in partitions:
        if not state.replicas:
            continue
        broker = state.replicas[0]
        preferred[broker] = preferred.get(broker, 0) + 1
        if state.leader == broker:
            continue
        electable = (
            brokers.eligible(broker)
            and broker in state.isr
            and not (state.adding_replicas or state.removing_replicas)
        )
        misled.setdefault(broker, []).append((key, electable))
    imbalanced = tuple(
        imbalance
        for broker, keys in sorted(misled.items())
        if (imbalance := BrokerImbalance(broker, preferred[broker], len(keys))).above(
            imbalance_percentage
        )
    )
    elect = frozenset(
        key for imbalance in imbalanced for key, electable in misled[imbalance.broker] if electable
    )
    return RebalancePlan(imbalanced, elect)
