"""Replication metrics on a real three-broker cluster: an acks=all produce waits in the produce
purgatory while a follower is frozen, the leader counts the ISR shrink and the expansion when the
follower is back (under-replicated meanwhile), exactly one broker is the active controller, and it
reports the partitions a crash left without a leader."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Final

from riverbed import Admin, Producer

from tests.support.cluster import ClusterFactory, TestCluster, partition_state
from tests.support.metrics import WITH_METRICS, Scrape, scrape

SETTINGS: Final = {
    # A frozen follower leaves the ISR after 2 s: long enough to see the produce wait.
    "replica.lag.time.max.ms": "2000",
    "zookeeper.session.timeout.ms": "4000",
    **WITH_METRICS,
}
WAIT_S: Final = 30.0
POLL_S: Final = 0.05


async def wait_metric(
    cluster: TestCluster, broker_id: int, check: Callable[[Scrape], bool], what: str
) -> Scrape:
    deadline = time.monotonic() + WAIT_S
    while True:
        metrics = await asyncio.to_thread(scrape, cluster.brokers[broker_id])
        if check(metrics):
            return metrics
        assert time.monotonic() < deadline, f"broker {broker_id}: not within {WAIT_S} s: {what}"
        await asyncio.sleep(POLL_S)


async def test_purgatory_isr_changes_under_replicated_and_offline_partitions(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, SETTINGS)
    topic, solo = f"m-{uuid.uuid4().hex[:8]}", f"solo-{uuid.uuid4().hex[:8]}"
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=3)
        await admin.create_topic(solo, partitions=3, replication_factor=1)
    state = await partition_state(cluster.bootstrap, topic, 0)
    leader = state.leader
    follower = next(r for r in state.replicas if r != leader)
    before = await asyncio.to_thread(scrape, cluster.brokers[leader])
    assert before.value("riverbed_under_replicated_partitions") == 0

    # A frozen follower: the acks=all append waits for it until the ISR shrinks.
    cluster.pause(follower)
    async with Producer(bootstrap_servers=cluster.bootstrap, acks="all") as producer:
        sent = asyncio.create_task(producer.send_and_wait(topic, b"waits", partition=0))
        await wait_metric(
            cluster,
            leader,
            lambda m: m.value("riverbed_produce_purgatory_size") >= 1,
            "the acks=all produce in the purgatory",
        )
        assert (await asyncio.wait_for(sent, WAIT_S)).offset == 0  # answered once it shrank
    shrunk = await wait_metric(
        cluster,
        leader,
        lambda m: m.value("riverbed_under_replicated_partitions") == 1,
        "the partition under-replicated",
    )
    assert shrunk.value("riverbed_isr_shrinks_total") > before.value("riverbed_isr_shrinks_total")
    assert shrunk.value("riverbed_produce_purgatory_size") == 0

    cluster.resume(follower)
    back = await wait_metric(
        cluster,
        leader,
        lambda m: m.value("riverbed_under_replicated_partitions") == 0,
        "the follower back in the ISR",
    )
    assert back.value("riverbed_isr_expands_total") >= 1

    # Exactly one active controller; it counts the partitions a crash left without a leader.
    scrapes = {i: await asyncio.to_thread(scrape, b) for i, b in cluster.brokers.items()}
    controllers = [i for i, s in scrapes.items() if s.value("riverbed_active_controller") == 1]
    assert len(controllers) == 1
    controller = controllers[0]
    assert all(s.value("riverbed_offline_partitions") == 0 for s in scrapes.values())
    solo_leaders = [(await partition_state(cluster.bootstrap, solo, p)).leader for p in range(3)]
    victim = next(b for b in solo_leaders if b != controller)
    cluster.kill(victim)
    await wait_metric(
        cluster,
        controller,
        lambda m: m.value("riverbed_offline_partitions") == solo_leaders.count(victim),
        f"broker {victim}'s RF 1 partitions offline",
    )
