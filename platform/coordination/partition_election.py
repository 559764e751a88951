"""The controller's decisions about one partition's leader and ISR, as pure functions (no I/O).

Kafka's rules in ZooKeeper mode (kafka.controller.Election and PartitionLeaderElectionAlgorithms),
over the partition's replica assignment (preferred leader first), its current leader and ISR,
and what the controller knows of the brokers:

- A broker is **lost** to a partition when it is not registered, or when it is *fenced*: its
  registration ended (a restart, a new ZooKeeper session) while it led or was in the ISR at the
  partition's current leader epoch, so what it held then may be gone.
- Lost brokers leave the ISR, but never below one member: when every member is lost the ISR
  keeps those registered again, or else stays as it was, so the last in-sync replica can lead
  again when it returns.
- A partition whose leader is lost (or that has none) elects the first replica in assignment
  order that is in the ISR and *eligible*: registered and not shutting down. A fenced broker is
  registered again, so it can win, but only if nobody else in the ISR can.
- With nobody eligible in the ISR, `unclean.leader.election.enable` lets the first eligible
  replica lead with the ISR reduced to itself (it loses what it lacks); otherwise the leader is
  NO_LEADER and the partition is offline.
- Controlled shutdown moves leadership to another eligible ISR member and takes the broker out
  of every ISR (never the last member); partitions with one replica are left alone (there is
  nowhere to move them), as in Kafka.

The caller writes each result with the leader epoch bumped by one (see `next_state`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from riverbed.coordination.layout import NO_LEADER, PartitionState


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    leader: int  # NO_LEADER (-1) when the partition is offline
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BrokerView:
    """The brokers as the controller sees them."""

    live: frozenset[int]  # registered in ZooKeeper
    shutting_down: frozenset[int] = frozenset()  # asked for a controlled shutdown: never elected

    def eligible(self, broker_id: int) -> bool:
        return broker_id in self.live and broker_id not in self.shutting_down


def reconcile(
    replicas: Sequence[int],
    current: LeaderAndIsr,
    brokers: BrokerView,
    *,
    unclean: bool,
    fenced: Collection[int] = (),
) -> LeaderAndIsr | None:
    """The leader and ISR the partition should have now, or None if it has them already.

    A fenced leader always yields a result (even the same leader and ISR, when it is the only
    in-sync replica), because its old term must end with a new leader epoch.
    """
    holders = current.isr if current.leader == NO_LEADER else (current.leader, *current.isr)
    lost = frozenset(b for b in holders if b not in brokers.live or b in fenced)
    isr = _without(current.isr, lost, brokers.live)
    leader = NO_LEADER if current.leader in lost else current.leader
    if leader == NO_LEADER:
        leader, isr = _elect(replicas, isr, lost, brokers, unclean=unclean)
    result = LeaderAndIsr(leader, isr)
    if result == current and current.leader not in fenced:
        return None
    return result


def controlled_shutdown(
    replicas: Sequence[int], current: LeaderAndIsr, broker_id: int, brokers: BrokerView
) -> LeaderAndIsr | None:
    """Move `broker_id` out of the partition's leadership and ISR, or None if nothing can or
    needs to change. `brokers.shutting_down` includes `broker_id`."""
    if len(replicas) < 2 or broker_id not in replicas:
        return None
    if current.leader == broker_id:
        for replica in replicas:
            if replica in current.isr and brokers.eligible(replica):
                isr = tuple(r for r in current.isr if r not in brokers.shutting_down)
                return LeaderAndIsr(replica, isr)
        return None  # nobody else in sync: it keeps leading until it stops
    if broker_id in current.isr and len(current.isr) > 1:
        return LeaderAndIsr(current.leader, tuple(r for r in current.isr if r != broker_id))
    return None


def still_led_by(replicas: Sequence[int], current: LeaderAndIsr, broker_id: int) -> bool:
    """Whether a controlled shutdown of `broker_id` must report this partition as remaining:
    it still leads it and there are other replicas it could have moved to."""
    return current.leader == broker_id and len(replicas) > 1


def next_state(leader_epoch: int, change: LeaderAndIsr, controller_epoch: int) -> PartitionState:
    """The state znode to write for a controller decision taken at `leader_epoch`: every
    controller change starts a new leader epoch (as Kafka's ZooKeeper-mode controller does), so
    the brokers' roles and the followers' truncation always follow it."""
    return PartitionState(
        leader=change.leader,
        leader_epoch=leader_epoch + 1,
        isr=change.isr,
        controller_epoch=controller_epoch,
    )


def _without(isr: tuple[int, ...], lost: frozenset[int], live: frozenset[int]) -> tuple[int, ...]:
    """The ISR without its lost members, but never empty: when all are lost, those registered
    again (restarted), or failing that all of them."""
    return tuple(r for r in isr if r not in lost) or tuple(r for r in isr if r in live) or isr


def _elect(
    replicas: Sequence[int],
    isr: tuple[int, ...],
    lost: frozenset[int],
    brokers: BrokerView,
    *,
    unclean: bool,
) -> tuple[int, tuple[int, ...]]:
    for replica in replicas:
        if replica in isr and brokers.eligible(replica):
            # The ISR may still hold lost members (kept when all were lost): only the winner
            # stays of those.
            return replica, tuple(r for r in isr if r == replica or r not in lost)
    if unclean:
        for replica in replicas:
            if brokers.eligible(replica):
                return replica, (replica,)
    return NO_LEADER, isr
