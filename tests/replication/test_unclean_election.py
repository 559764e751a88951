"""`unclean.leader.election.enable`, a topic config, decides what the controller does when the
leader dies and no other in-sync replica is left: with it the out-of-sync follower leads (and
loses what it lacks); without it the partition stays offline (leader -1) until an in-sync
replica returns."""

from __future__ import annotations

from typing import Final

import pytest
from riverbed import Producer
from riverbed.client.admin import PartitionDescription

from tests.replication.fault_support import (
    create_replicated_topic,
    encode,
    new_topic,
    wait_for_state,
)
from tests.support.cluster import ClusterFactory

NO_LEADER: Final = -1
SETTINGS: Final = {
    # Outlives the follower's freeze below, and ends the killed leader's term in a few seconds.
    "zookeeper.session.timeout.ms": "6000",
    "replica.lag.time.max.ms": "1000",
}
# Written to the leader alone while the follower is frozen, so the follower falls behind.
BEHIND_RECORDS: Final = 10


@pytest.mark.parametrize("unclean", [True, False])
async def test_the_topic_config_decides_whether_an_out_of_sync_follower_may_lead(
    cluster_factory: ClusterFactory, unclean: bool
) -> None:
    cluster = await cluster_factory(2, SETTINGS)
    topic = new_topic(f"unclean-{str(unclean).lower()}")
    before = await create_replicated_topic(
        cluster,
        topic,
        {"unclean.leader.election.enable": str(unclean).lower(), "min.insync.replicas": "1"},
    )
    leader = before.leader
    follower = next(b for b in before.replicas if b != leader)

    cluster.pause(follower)
    try:
        async with Producer(bootstrap_servers=cluster.brokers[leader].bootstrap, acks=1) as p:
            for sequence in range(BEHIND_RECORDS):
                await (await p.send(topic, encode(sequence), partition=0))
        await wait_for_state(
            cluster,
            topic,
            lambda s: list(s.isr) == [leader],
            "the ISR down to the leader",
            via=leader,
        )
        cluster.kill(leader)
    finally:
        cluster.resume(follower)

    # A broker reports leader -1 as soon as the dead leader's registration is gone, before the
    # controller has decided anything: only a higher leader epoch is the controller's decision.
    def decided(state: PartitionDescription) -> bool:
        return state.leader_epoch > before.leader_epoch

    if unclean:
        after = await wait_for_state(
            cluster,
            topic,
            lambda s: decided(s) and s.leader == follower,
            "the follower leading at a new epoch",
            via=follower,
        )
        assert list(after.isr) == [follower]
    else:
        after = await wait_for_state(
            cluster,
            topic,
            lambda s: decided(s) and s.leader == NO_LEADER,
            "the partition offline at a new epoch",
            via=follower,
        )
        assert follower not in after.isr
