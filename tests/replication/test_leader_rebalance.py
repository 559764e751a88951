"""Automatic preferred-leader rebalance (Kafka's `auto.leader.rebalance.enable`) across real
broker processes: after a broker's restart the controller hands its leaderships back without
anyone running `riverbed leaders elect`; with the setting off they stay where the failover put
them; and a preferred replica that is not in sync is not elected."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from riverbed import Admin, Producer, TopicPartition
from riverbed.client.admin import PartitionDescription, TopicDescription

from tests.support.cluster import ClusterFactory, TestCluster

TOPIC = "balanced"
PARTITIONS = 6  # two per broker on 3 brokers: each broker is the preferred leader of two
WAIT_S = 60.0
RESTARTED = 1  # the broker each test stops and starts again
# Kafka allows any interval >= 1 s; the tests check every second instead of every 300 s.
CHECK_INTERVAL_S = 1
# How many check intervals a test waits to see that a check did not move a leadership.
CHECKS_WAITED = 5
SETTINGS: Mapping[str, str] = {
    "zookeeper.session.timeout.ms": "4000",
    "replica.lag.time.max.ms": "4000",
    "leader.imbalance.check.interval.seconds": str(CHECK_INTERVAL_S),
}


async def describe(cluster: TestCluster) -> TopicDescription:
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        return await admin.describe_topic(TOPIC)


async def led_by_preferred_replicas(
    cluster: TestCluster, what: str
) -> tuple[PartitionDescription, ...]:
    """Wait until every partition is led by its preferred replica; return them then."""

    async def preferred() -> tuple[PartitionDescription, ...] | None:
        partitions = (await describe(cluster)).partitions
        return partitions if all(p.leader == p.replicas[0] for p in partitions) else None

    return await cluster.wait_for(preferred, WAIT_S, what=what)


async def restart_away_from(
    cluster: TestCluster, broker_id: int
) -> tuple[PartitionDescription, ...]:
    """Stop `broker_id` cleanly (its leaderships move to the other replicas), start it again,
    and wait until it is back in every ISR; returns the partitions as they are then."""
    await cluster.terminate(broker_id)
    await cluster.restart(broker_id)

    async def back_in_sync() -> tuple[PartitionDescription, ...] | None:
        partitions = (await describe(cluster)).partitions
        return partitions if all(broker_id in p.isr for p in partitions) else None

    return await cluster.wait_for(back_in_sync, WAIT_S, what=f"broker {broker_id} in sync")


async def create_balanced_topic(cluster: TestCluster) -> tuple[PartitionDescription, ...]:
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3)
    return await led_by_preferred_replicas(cluster, "the new topic's leaders")


async def test_leaderships_return_to_the_preferred_replicas_after_a_restart(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, SETTINGS)
    before = await create_balanced_topic(cluster)
    own = {p.partition for p in before if p.replicas[0] == RESTARTED}
    assert own  # round-robin placement: broker 1 is the preferred replica of some

    await cluster.terminate(RESTARTED)
    await cluster.restart(RESTARTED)
    # Nobody elects: the controller's check finds broker 1 leading none of its partitions (an
    # imbalance of 100% > 10%) and hands them back once it is in their ISRs again.
    after = await led_by_preferred_replicas(cluster, "leaders back on preferred replicas")
    by_partition = {p.partition: p for p in before}
    for state in after:
        if state.partition in own:
            # Moved away by the shutdown and back by the rebalance: two new epochs at least.
            assert state.leader_epoch >= by_partition[state.partition].leader_epoch + 2
        else:
            assert state.leader == by_partition[state.partition].leader


async def test_leaderships_stay_put_with_auto_rebalance_disabled(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, {**SETTINGS, "auto.leader.rebalance.enable": "false"})
    await create_balanced_topic(cluster)
    skewed = await restart_away_from(cluster, RESTARTED)
    own = [p for p in skewed if p.replicas[0] == RESTARTED]
    assert own
    assert all(p.leader != RESTARTED for p in own)

    # Broker 1 is live and in sync, so any check would elect it: after several intervals the
    # leaders are exactly where the shutdown left them.
    await asyncio.sleep(CHECKS_WAITED * CHECK_INTERVAL_S)
    now = (await describe(cluster)).partitions
    assert [(p.leader, p.leader_epoch) for p in now] == [(p.leader, p.leader_epoch) for p in skewed]
    # ...and it was electable all along: an explicit election hands them back.
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        elected = await admin.elect_leaders([TopicPartition(TOPIC, p.partition) for p in own])
    assert set(elected.values()) == {None}
    await led_by_preferred_replicas(cluster, "leaders back after the election")


async def test_a_preferred_replica_out_of_the_isr_is_not_elected(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, SETTINGS)
    before = await create_balanced_topic(cluster)
    behind, caught_up = (p.partition for p in before if p.replicas[0] == RESTARTED)
    await cluster.terminate(RESTARTED)
    # While broker 1 is down one of its partitions gets records, and its copy of them is
    # throttled to ~1 kB/s: after the restart it stays out of that ISR for many minutes.
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.alter_broker_configs(set={"follower.replication.throttled.rate": "1000"})
        await admin.alter_configs(
            TOPIC, set={"follower.replication.throttled.replicas": f"{behind}:{RESTARTED}"}
        )
    async with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        for i in range(1_000):
            await producer.send(TOPIC, b"x" * 1_000, key=str(i).encode(), partition=behind)
        await producer.flush()
    await cluster.restart(RESTARTED)

    async def other_one_back() -> tuple[PartitionDescription, ...] | None:
        partitions = (await describe(cluster)).partitions
        return partitions if partitions[caught_up].leader == RESTARTED else None

    # The check that handed `caught_up` back planned `behind` too, and left it.
    await cluster.wait_for(other_one_back, WAIT_S, what=f"{TOPIC}-{caught_up} back on 1")
    await asyncio.sleep(CHECKS_WAITED * CHECK_INTERVAL_S)
    state = (await describe(cluster)).partitions[behind]
    assert RESTARTED not in state.isr, "the throttled replica caught up: the test proves nothing"
    assert state.leader != RESTARTED
