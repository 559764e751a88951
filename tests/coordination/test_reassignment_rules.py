"""The pure rules of reassignment and preferred-leader election
(riverbed.coordination.reassignment)."""

from __future__ import annotations

import pytest
from riverbed.coordination.layout import NO_LEADER
from riverbed.coordination.partition_election import BrokerView, LeaderAndIsr
from riverbed.coordination.reassignment import (
    ReplicaSet,
    cancel,
    check_target,
    finished,
    leader_and_isr,
    preferred_leader,
    start,
)
from riverbed.protocol.errors import ErrorCode, KafkaError

LIVE = BrokerView(live=frozenset({1, 2, 3, 4}))


def test_start_puts_the_target_first_and_names_what_moves() -> None:
    moved = start(ReplicaSet((1, 2)), (3, 2))
    assert moved == ReplicaSet((3, 2, 1), adding=(3,), removing=(1,))
    assert moved.original == (2, 1)
    assert moved.target == (3, 2)


def test_a_new_target_starts_again_from_the_original_replicas() -> None:
    moving = start(ReplicaSet((1, 2)), (3, 4))
    assert start(moving, (4, 1)) == ReplicaSet((4, 1, 2), adding=(4,), removing=(2,))
    assert start(moving, (1, 2)) == ReplicaSet((1, 2))  # back where it was: nothing moves


def test_cancel_returns_to_the_original_replicas() -> None:
    assert cancel(start(ReplicaSet((1, 2)), (3, 2))) == ReplicaSet((2, 1))
    with pytest.raises(KafkaError) as raised:
        cancel(ReplicaSet((1, 2)))
    assert raised.value.code == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


def test_finished_once_every_target_replica_is_in_sync() -> None:
    moving = start(ReplicaSet((1, 2)), (3, 2))
    assert finished(moving, (1, 2)) is None
    assert finished(moving, (1, 2, 3)) == ReplicaSet((3, 2))
    assert finished(ReplicaSet((1, 2)), (1, 2)) is None  # nothing in progress


@pytest.mark.parametrize(
    ("target", "reason"),
    [((), "empty"), ((1, 1), "repeat"), ((1, 9), "not registered")],
)
def test_bad_targets(target: tuple[int, ...], reason: str) -> None:
    with pytest.raises(KafkaError, match=reason) as raised:
        check_target(target, LIVE.live)
    assert raised.value.code == ErrorCode.INVALID_REPLICA_ASSIGNMENT


def test_leader_and_isr_for_a_new_replica_set() -> None:
    current = LeaderAndIsr(1, (1, 2, 3))
    assert leader_and_isr((3, 2), current, LIVE) == LeaderAndIsr(3, (2, 3))
    assert leader_and_isr((2, 1), current, LIVE) == LeaderAndIsr(1, (1, 2))
    shutting = BrokerView(live=LIVE.live, shutting_down=frozenset({3}))
    assert leader_and_isr((3, 2), current, shutting) == LeaderAndIsr(2, (2, 3))
    # Nobody of the new set can lead: the set must not change yet.
    assert leader_and_isr((4,), current, LIVE) is None


def test_preferred_leader() -> None:
    assert preferred_leader((1, 2), LeaderAndIsr(2, (1, 2)), LIVE) == LeaderAndIsr(1, (1, 2))
    for current, view, code in [
        (LeaderAndIsr(1, (1, 2)), LIVE, ErrorCode.ELECTION_NOT_NEEDED),
        (LeaderAndIsr(2, (2,)), LIVE, ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE),
        (
            LeaderAndIsr(2, (1, 2)),
            BrokerView(live=frozenset({2})),
            ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
        ),
        (
            LeaderAndIsr(NO_LEADER, (1,)),
            BrokerView(live=frozenset()),
            ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
        ),
    ]:
        with pytest.raises(KafkaError) as raised:
            preferred_leader((1, 2), current, view)
        assert raised.value.code == code
