"""Partition reassignment and preferred-leader election as pure functions (no I/O), after
Kafka's KIP-455 (ZooKeeper mode) and KIP-183/KIP-460.

A reassignment moves a partition from its original replicas (ORS) to target replicas (TRS):

1. **Start**: the replica set becomes TRS followed by the original replicas that are not in
   TRS, with `adding` = TRS - ORS and `removing` = ORS - TRS. The new replicas see themselves in
   the assignment and start following the leader, which keeps leading.
2. **Catch up**: the leader adds each new replica to the ISR once it has caught up (the
   ordinary ISR expansion), which is also what throttling slows down.
3. **Finish**: once every target replica is in the ISR, the replica set becomes TRS, the ISR
   loses the removed replicas, and if the leader is being removed the first target replica in
   the ISR leads. The removed replicas see they are gone and delete their logs.

A new target while a reassignment is in progress starts again from the original replicas (the
replicas still being added but no longer wanted simply go), and cancelling returns to them.
Every step is written with a new leader epoch, so leaders and followers notice it whatever
order the assignment and the state reach them in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from riverbed.coordination.layout import NO_LEADER
from riverbed.coordination.partition_election import BrokerView, LeaderAndIsr
from riverbed.protocol.errors import ErrorCode, KafkaError


@dataclass(frozen=True, slots=True)
class ReplicaSet:
    replicas: tuple[int, ...]  # the full set: target replicas first
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def original(self) -> tuple[int, ...]:
        """The replicas before the reassignment began (all of them when none is in progress)."""
        return tuple(r for r in self.replicas if r not in self.adding)

    @property
    def target(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing)


def check_target(target: Sequence[int], live: frozenset[int]) -> None:
    """Raise INVALID_REPLICA_ASSIGNMENT unless `target` names distinct live brokers."""
    if not target:
        raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT, "the target replica list is empty")
    if len(set(target)) != len(target):
        raise KafkaError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"replicas {list(target)} repeat a broker"
        )
    missing = sorted(set(target) - live)
    if missing:
        raise KafkaError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"brokers {missing} are not registered"
        )


def start(current: ReplicaSet, target: Sequence[int]) -> ReplicaSet:
    """The replica set that moves the partition to `target` (checked by `check_target`)."""
    original = current.original
    if tuple(target) == original:
        return ReplicaSet(original)
    replicas = (*target, *(r for r in original if r not in target))
    return ReplicaSet(
        replicas,
        adding=tuple(r for r in target if r not in original),
        removing=tuple(r for r in original if r not in target),
    )


def cancel(current: ReplicaSet) -> ReplicaSet:
    if not current.reassigning:
        raise KafkaError(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "no reassignment in progress")
    return ReplicaSet(current.original)


def finished(current: ReplicaSet, isr: Sequence[int]) -> ReplicaSet | None:
    """The final replica set once every target replica is in sync, else None."""
    if not current.reassigning or not set(current.target) <= set(isr):
        return None
    return ReplicaSet(current.target)


def leader_and_isr(
    replicas: Sequence[int], current: LeaderAndIsr, brokers: BrokerView
) -> LeaderAndIsr | None:
    """The leader and ISR for a new replica set: the ISR keeps its members that remain; the
    leader stays if it remains, else the first remaining eligible in-sync replica leads. None
    when nobody could lead (a replica set shrinks only once its target is in sync, so that
    happens only when brokers died meanwhile): the set must not change yet."""
    isr = tuple(r for r in current.isr if r in replicas)
    if current.leader in replicas and current.leader != NO_LEADER:
        return LeaderAndIsr(current.leader, isr or (current.leader,))
    for replica in replicas:
        if replica in isr and brokers.eligible(replica):
            return LeaderAndIsr(replica, isr)
    return None


def preferred_leader(
    replicas: Sequence[int], current: LeaderAndIsr, brokers: BrokerView
) -> LeaderAndIsr:
    """Leadership moved to the preferred (first) replica, or a KafkaError saying why not."""
    preferred = replicas[0]
    if current.leader == preferred:
        raise KafkaError(ErrorCode.ELECTION_NOT_NEEDED, f"broker {preferred} leads already")
    if preferred not in current.isr or not brokers.eligible(preferred):
        raise KafkaError(
            ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
            f"preferred replica {preferred} is not a live in-sync replica",
        )
    return LeaderAndIsr(preferred, current.isr)
