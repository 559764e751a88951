"""ZooKeeper stops for a while: brokers keep serving the leaderships they have (acks=all produce
and consumption go on, the ISR stays as it is), and once it is back the cluster works as before.

This module's tests stop and start ZooKeeper, so they run on a server of their own (the
`zk_connect` fixture is overridden here), never the shared one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

import pytest
from riverbed.client.admin import PartitionDescription

from tests.replication.fault_support import (
    SETTINGS,
    broker_output,
    consume_all,
    create_replicated_topic,
    fully_in_sync,
    new_topic,
    producing,
    wait_for_acknowledgement,
    wait_for_new_leader,
    wait_for_state,
)
from tests.support.cluster import ClusterFactory, partition_state
from tests.support.zookeeper import (
    DedicatedZooKeeper,
    restart_proof_connect,
)

# Longer than elsewhere: after the outage, each broker must reconnect within its session
# timeout (counted from ZooKeeper's restart) for its session to survive, whatever the load.
# 5 s was not enough once in CI (a broker's session expired after the long outage).
OUTAGE_SESSION_TIMEOUT_MS: Final = 9_000
OUTAGE_SETTINGS: Final = {
    **SETTINGS,
    "zookeeper.session.timeout.ms": str(OUTAGE_SESSION_TIMEOUT_MS),
}
# A short outage, then one half as long again as the brokers' session timeout.
OUTAGES_S: Final = (2.0, 1.5 * OUTAGE_SESSION_TIMEOUT_MS / 1000)


@pytest.fixture
def zk_connect(own_zookeeper: DedicatedZooKeeper) -> str:
    return restart_proof_connect(own_zookeeper.server, "/outage")


def same_roles(a: PartitionDescription, b: PartitionDescription) -> bool:
    return (a.leader, a.leader_epoch, sorted(a.isr)) == (b.leader, b.leader_epoch, sorted(b.isr))


async def test_brokers_serve_their_leaderships_while_zookeeper_is_down(
    cluster_factory: ClusterFactory, own_zookeeper: DedicatedZooKeeper
) -> None:
    cluster = await cluster_factory(3, OUTAGE_SETTINGS)
    topic = new_topic("zk-outage")
    before = await create_replicated_topic(cluster, topic)

    async with producing(cluster, topic) as acks:
        for outage_s in OUTAGES_S:
            await wait_for_acknowledgement(cluster, acks)
            await own_zookeeper.stop()
            stopped_at = time.monotonic()
            # acks=all goes on, and consumers read what was acknowledged during the outage.
            first_sent_during = acks.sent
            await wait_for_acknowledgement(cluster, acks, first_sent_during)
            consumed = await consume_all(cluster, topic)
            assert consumed == list(range(len(consumed)))
            assert len(consumed) > first_sent_during
            assert same_roles(await partition_state(cluster.bootstrap, topic, 0), before)
            await asyncio.sleep(max(stopped_at + outage_s - time.monotonic(), 0.0))
            await wait_for_acknowledgement(cluster, acks)
            assert same_roles(await partition_state(cluster.bootstrap, topic, 0), before)
            print(f"ZooKeeper down {time.monotonic() - stopped_at:.2f} s: {acks.sent} sent")
            await own_zookeeper.start()
            await wait_for_acknowledgement(cluster, acks)

    acks.check_all_acknowledged_in_order()
    assert await consume_all(cluster, topic) == list(range(acks.sent))
    # ZooKeeper is back for good: topics can be created...
    second_topic = new_topic("after-outage")
    second = await create_replicated_topic(cluster, second_topic)
    # ... and nothing moved meanwhile. Even the outage longer than the session timeout expired
    # no session: a ZooKeeper server that starts again gives every session it restores a fresh
    # timeout, and the brokers reconnect within a second, so no broker registers again.
    assert same_roles(await partition_state(cluster.bootstrap, topic, 0), before)
    for broker_id in cluster.brokers:
        output = broker_output(cluster, broker_id)
        assert "event=broker.started " in output  # the format the next check relies on
        assert "event=broker.reregistered " not in output
    # A leader's crash is handled as usual.
    cluster.kill(second.leader)
    await wait_for_new_leader(cluster, second_topic, second)
    await cluster.restart(second.leader)
    await wait_for_state(cluster, second_topic, fully_in_sync, "every replica back in the ISR")
