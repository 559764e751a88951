"""The controller's pure election rules (riverbed.coordination.partition_election)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from riverbed.coordination.layout import NO_LEADER, PartitionState
from riverbed.coordination.partition_election import (
    BrokerView,
    LeaderAndIsr,
    controlled_shutdown,
    next_state,
    reconcile,
    still_led_by,
)

REPLICAS = (1, 2, 3)


def view(*live: int, shutting_down: tuple[int, ...] = ()) -> BrokerView:
    return BrokerView(frozenset(live), frozenset(shutting_down))


@pytest.mark.parametrize(
    ("current", "brokers", "expected"),
    [
        # All well: nothing to write.
        (LeaderAndIsr(1, (1, 2, 3)), view(1, 2, 3), None),
        # Leader lost: the next replica in assignment order that is in the ISR.
        (LeaderAndIsr(1, (1, 2, 3)), view(2, 3), LeaderAndIsr(2, (2, 3))),
        # Assignment order decides, not ISR order.
        (LeaderAndIsr(1, (1, 3, 2)), view(2, 3), LeaderAndIsr(2, (3, 2))),
        # A live replica outside the ISR is not elected.
        (LeaderAndIsr(1, (1, 3)), view(2, 3), LeaderAndIsr(3, (3,))),
        # A follower lost: it leaves the ISR, the leader stays.
        (LeaderAndIsr(1, (1, 2, 3)), view(1, 3), LeaderAndIsr(1, (1, 3))),
        # Nobody in the ISR alive: offline, ISR kept for the last in-sync replica's return.
        (LeaderAndIsr(1, (1, 2)), view(3), LeaderAndIsr(NO_LEADER, (1, 2))),
        # Offline and still nobody: nothing to write again.
        (LeaderAndIsr(NO_LEADER, (1, 2)), view(3), None),
        # The last in-sync replica is back: it leads.
        (LeaderAndIsr(NO_LEADER, (1, 2)), view(2, 3), LeaderAndIsr(2, (2,))),
        # Lost members leave even an offline partition's ISR while someone remains.
        (LeaderAndIsr(1, (1, 2)), view(2, 3, shutting_down=(2,)), LeaderAndIsr(NO_LEADER, (2,))),
        # A shutting-down leader keeps leading (the shutdown itself moves it, if it can).
        (LeaderAndIsr(2, (2,)), view(1, 2, shutting_down=(2,)), None),
        # A shutting-down broker is never elected.
        (LeaderAndIsr(NO_LEADER, (2, 3)), view(2, 3, shutting_down=(2,)), LeaderAndIsr(3, (2, 3))),
    ],
)
def test_reconcile(
    current: LeaderAndIsr, brokers: BrokerView, expected: LeaderAndIsr | None
) -> None:
    assert reconcile(REPLICAS, current, brokers, unclean=False) == expected


def test_unclean_election_takes_the_first_live_replica_alone() -> None:
    current = LeaderAndIsr(1, (1,))
    brokers = view(2, 3)
    assert reconcile(REPLICAS, current, brokers, unclean=False) == LeaderAndIsr(NO_LEADER, (1,))
    assert reconcile(REPLICAS, current, brokers, unclean=True) == LeaderAndIsr(2, (2,))
    # A clean choice is always preferred.
    assert reconcile(REPLICAS, LeaderAndIsr(1, (1, 3)), brokers, unclean=True) == LeaderAndIsr(
        3, (3,)
    )
    # Shutting-down brokers are not eligible for an unclean election either.
    assert reconcile(
        REPLICAS, current, view(2, 3, shutting_down=(2,)), unclean=True
    ) == LeaderAndIsr(3, (3,))


def test_fenced_broker_is_lost_yet_may_lead_again_at_a_new_epoch() -> None:
    # A restarted leader with another in-sync replica: leadership moves, it leaves the ISR.
    assert reconcile(
        REPLICAS, LeaderAndIsr(1, (1, 2)), view(1, 2, 3), unclean=False, fenced={1}
    ) == LeaderAndIsr(2, (2,))
    # The only in-sync replica restarted: it leads again, and the unchanged leader and ISR are
    # still a result, so the caller writes a new leader epoch.
    assert reconcile(
        REPLICAS, LeaderAndIsr(1, (1,)), view(1, 2, 3), unclean=False, fenced={1}
    ) == LeaderAndIsr(1, (1,))
    # A restarted follower leaves the ISR.
    assert reconcile(
        REPLICAS, LeaderAndIsr(2, (2, 1)), view(1, 2, 3), unclean=False, fenced={1}
    ) == LeaderAndIsr(2, (2,))
    # Fenced, but neither leader nor in the ISR: nothing to do.
    assert (
        reconcile(REPLICAS, LeaderAndIsr(2, (2,)), view(1, 2, 3), unclean=False, fenced={1}) is None
    )
    # All in-sync replicas lost, one of them restarted: only the winner stays in the ISR.
    assert reconcile(
        REPLICAS, LeaderAndIsr(2, (2, 3)), view(1, 3), unclean=False, fenced={3}
    ) == LeaderAndIsr(3, (3,))


def test_controlled_shutdown() -> None:
    brokers = view(1, 2, 3, shutting_down=(1,))
    # Led: the next eligible ISR member in assignment order leads, without the broker.
    assert controlled_shutdown(REPLICAS, LeaderAndIsr(1, (1, 3, 2)), 1, brokers) == LeaderAndIsr(
        2, (3, 2)
    )
    # Followed: it leaves the ISR.
    assert controlled_shutdown(REPLICAS, LeaderAndIsr(2, (2, 1)), 1, brokers) == LeaderAndIsr(
        2, (2,)
    )
    # Led with nobody else in sync: stays, and is reported as remaining.
    alone = LeaderAndIsr(1, (1,))
    assert controlled_shutdown(REPLICAS, alone, 1, brokers) is None
    assert still_led_by(REPLICAS, alone, 1)
    # The only ISR member as a follower (leader gone): the ISR keeps it.
    assert controlled_shutdown(REPLICAS, LeaderAndIsr(NO_LEADER, (1,)), 1, brokers) is None
    # Not a replica, or a single replica: nothing to move, nothing remaining.
    assert controlled_shutdown((2, 3), LeaderAndIsr(2, (2, 3)), 1, brokers) is None
    assert controlled_shutdown((1,), LeaderAndIsr(1, (1,)), 1, brokers) is None
    assert not still_led_by((1,), LeaderAndIsr(1, (1,)), 1)
    # Another broker shutting down at the same time is not elected and leaves the ISR too.
    both = view(1, 2, 3, shutting_down=(1, 2))
    assert controlled_shutdown(REPLICAS, LeaderAndIsr(1, (1, 2, 3)), 1, both) == LeaderAndIsr(
        3, (3,)
    )


def test_next_state_bumps_the_leader_epoch() -> None:
    assert next_state(4, LeaderAndIsr(2, (2, 3)), 7) == PartitionState(2, 5, (2, 3), 7)


brokers_ids = st.integers(min_value=0, max_value=4)


@given(
    replicas=st.lists(brokers_ids, min_size=1, max_size=4, unique=True),
    data=st.data(),
    live=st.frozensets(brokers_ids),
    shutting_down=st.frozensets(brokers_ids),
    fenced=st.frozensets(brokers_ids),
    unclean=st.booleans(),
)
def test_reconcile_invariants(
    replicas: list[int],
    data: st.DataObject,
    live: frozenset[int],
    shutting_down: frozenset[int],
    fenced: frozenset[int],
    unclean: bool,
) -> None:
    isr = tuple(data.draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True)))
    leader = data.draw(st.sampled_from((NO_LEADER, *isr)))
    current = LeaderAndIsr(leader, isr)
    brokers = BrokerView(live, shutting_down & live)
    result = reconcile(replicas, current, brokers, unclean=unclean, fenced=fenced)
    after = current if result is None else result
    assert after.isr, "an ISR never becomes empty"
    if after.leader != current.leader:
        # A new leader is always eligible, and in the old ISR unless the election was unclean.
        assert after.leader == NO_LEADER or brokers.eligible(after.leader)
        if after.leader != NO_LEADER and after.leader not in current.isr:
            assert unclean
            assert after.isr == (after.leader,)
    if after.leader != NO_LEADER:
        assert after.leader in after.isr
        assert after.leader in live
    if after.leader == NO_LEADER or after.leader in current.isr:
        assert set(after.isr) <= set(current.isr)
    # Once applied, a second pass (fences consumed by the new epoch) has nothing more to do.
    assert reconcile(replicas, after, brokers, unclean=unclean) is None
