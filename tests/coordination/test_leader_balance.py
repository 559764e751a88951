"""The automatic preferred-leader rebalance rule (riverbed.coordination.leader_balance), and the
broker configs that drive it."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st
from riverbed.configs import BrokerConfig, ConfigError
from riverbed.coordination.layout import NO_LEADER
from riverbed.coordination.leader_balance import (
    BrokerImbalance,
    RebalancePolicy,
    TopicPartition,
    plan_rebalance,
)
from riverbed.coordination.metadata_cache import PartitionMetadata
from riverbed.coordination.partition_election import BrokerView

LIVE = BrokerView(live=frozenset({1, 2, 3}))


def partition(
    replicas: tuple[int, ...],
    leader: int,
    isr: tuple[int, ...] | None = None,
    adding: tuple[int, ...] = (),
    removing: tuple[int, ...] = (),
) -> PartitionMetadata:
    return PartitionMetadata(
        replicas=replicas,
        leader=leader,
        leader_epoch=1,
        isr=replicas if isr is None else isr,
        adding_replicas=adding,
        removing_replicas=removing,
    )


def topic(*states: PartitionMetadata) -> list[tuple[TopicPartition, PartitionMetadata]]:
    return [(("t", index), state) for index, state in enumerate(states)]


def test_a_broker_above_the_threshold_gets_its_partitions_back() -> None:
    # Broker 1 is preferred for 0 and 1 and leads neither (ratio 1.0); 2 leads its own.
    plan = plan_rebalance(
        topic(partition((1, 2, 3), 2), partition((1, 3, 2), 3), partition((2, 3, 1), 2)),
        LIVE,
        10,
    )
    assert plan.imbalanced == (BrokerImbalance(1, preferred=2, not_leading=2),)
    assert plan.elect == {("t", 0), ("t", 1)}


def test_the_threshold_is_exclusive_and_exact() -> None:
    # Broker 1 is preferred for 10 partitions and leads 9: a ratio of exactly 10%.
    states = [partition((1, 2), 1) for _ in range(9)] + [partition((1, 2), 2)]
    at_threshold = plan_rebalance(topic(*states), LIVE, 10)
    assert at_threshold.imbalanced == ()
    assert at_threshold.elect == frozenset()
    below_ratio = plan_rebalance(topic(*states), LIVE, 9)
    assert below_ratio.elect == {("t", 9)}
    # 100% never rebalances (a ratio cannot exceed 1); 0% rebalances any imbalance.
    assert plan_rebalance(topic(partition((1, 2), 2)), LIVE, 100).elect == frozenset()
    assert plan_rebalance(topic(*states), LIVE, 0).elect == {("t", 9)}


def test_only_brokers_that_can_lead_are_elected() -> None:
    states = topic(
        partition((1, 2, 3), 2, isr=(2, 3)),  # preferred out of the ISR
        partition((1, 2, 3), 2, adding=(1,)),  # being reassigned
        partition((3, 1, 2), 1),  # preferred 3 is not registered
        partition((1, 2, 3), NO_LEADER, isr=(1,)),  # offline, preferred in sync: counts
    )
    plan = plan_rebalance(states, BrokerView(live=frozenset({1, 2})), 10)
    assert [i.broker for i in plan.imbalanced] == [1, 3]
    assert plan.elect == {("t", 3)}


def test_a_broker_shutting_down_is_not_given_leaderships() -> None:
    brokers = BrokerView(live=frozenset({1, 2, 3}), shutting_down=frozenset({1}))
    plan = plan_rebalance(topic(partition((1, 2, 3), 2)), brokers, 10)
    assert plan.imbalanced == (BrokerImbalance(1, 1, 1),)  # counted, not elected
    assert plan.elect == frozenset()


def test_partitions_without_replicas_are_ignored() -> None:
    assert plan_rebalance(topic(partition((), NO_LEADER)), LIVE, 0).imbalanced == ()


replica_sets = st.permutations([1, 2, 3]).map(tuple)


@given(
    st.lists(
        st.tuples(
            replica_sets, st.sampled_from([NO_LEADER, 1, 2, 3]), st.sets(st.sampled_from([1, 2, 3]))
        ),
        max_size=30,
    ),
    st.integers(0, 100),
)
def test_the_plan_follows_kafkas_rule(
    rows: list[tuple[tuple[int, ...], int, set[int]]], percentage: int
) -> None:
    states = topic(*(partition(r, leader, tuple(sorted(isr))) for r, leader, isr in rows))
    plan = plan_rebalance(states, LIVE, percentage)
    # Kafka: group by preferred replica; ratio = not leading / preferred; above percentage/100.
    ratios: dict[int, tuple[int, int]] = {}
    for _key, state in states:
        preferred, misled = ratios.get(state.replicas[0], (0, 0))
        ratios[state.replicas[0]] = (preferred + 1, misled + (state.leader != state.replicas[0]))
    over = {b for b, (n, m) in ratios.items() if m / n > percentage / 100 + 1e-12}
    assert {i.broker for i in plan.imbalanced} == over
    expected = {
        key
        for key, state in states
        if state.replicas[0] in over
        and state.leader != state.replicas[0]
        and state.replicas[0] in state.isr
    }
    assert plan.elect == expected


@pytest.mark.parametrize(("interval_s", "percentage"), [(0, 10), (-1, 10), (1, -1), (1, 101)])
def test_a_policy_out_of_range_is_refused(interval_s: float, percentage: int) -> None:
    with pytest.raises(ValueError, match="leader imbalance"):
        RebalancePolicy(enabled=True, check_interval_s=interval_s, imbalance_percentage=percentage)


def broker_config(settings: Mapping[str, str]) -> BrokerConfig:
    return BrokerConfig.from_mapping({"zookeeper.connect": "127.0.0.1:2181", **settings})


def test_kafkas_configs_and_defaults() -> None:
    assert broker_config({}).leader_rebalance == RebalancePolicy(
        enabled=True, check_interval_s=300, imbalance_percentage=10
    )
    configured = broker_config(
        {
            "auto.leader.rebalance.enable": "false",
            "leader.imbalance.check.interval.seconds": "1",
            "leader.imbalance.per.broker.percentage": "0",
        }
    )
    assert configured.leader_rebalance == RebalancePolicy(False, 1, 0)


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("leader.imbalance.check.interval.seconds", "0", "integers >= 1"),
        ("leader.imbalance.check.interval.seconds", "soon", "integers >= 1"),
        ("leader.imbalance.per.broker.percentage", "101", "[0, 100]"),
        ("leader.imbalance.per.broker.percentage", "-1", "[0, 100]"),
        ("auto.leader.rebalance.enable", "yes", "boolean"),
    ],
)
def test_invalid_rebalance_configs_name_the_key(name: str, value: str, allowed: str) -> None:
    with pytest.raises(ConfigError, match=allowed) as raised:
        broker_config({name: value})
    assert raised.value.key == name
    assert name in str(raised.value)
