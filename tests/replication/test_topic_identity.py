"""A broker deletes a local log only for a real DeleteTopics of that log's own topic id.

- A topic deleted and created again under its name while a replica was away: the replica drops
  the old log (the deletion's marker names its id) and copies the new topic's from the leader;
  no old record is served or kept as the new topic's.
- A topic whose znodes vanish without a DeleteTopics (what a wiped or wrongly restored
  ZooKeeper looks like): the log stays on disk byte for byte, unserved, with one clear line,
  across a restart; when the znodes come back the broker serves it again.
- A DeleteTopics whose controller stopped after writing its intent: the next controller
  finishes it.
"""

from __future__ import annotations

import hashlib
from typing import Final

from riverbed import Admin, Producer
from riverbed.coordination import layout
from riverbed.coordination.zk import AsyncZooKeeper, CreateOp

from tests.replication.fault_support import (
    CHANGE_TIMEOUT_MS,
    CHANGE_TIMEOUT_S,
    PARTITION,
    broker_output,
    consume_all,
    encode,
    fully_in_sync,
    new_topic,
    segment_digests,
    wait_for_state,
)
from tests.support.broker import BrokerProcess
from tests.support.cluster import ClusterFactory, TestCluster
from tests.support.waiting import eventually

# The paused replica's session must outlive the deletion and creation made behind its back.
PAUSED_SESSION_TIMEOUT_MS: Final = 10_000
SETTINGS: Final = {
    "zookeeper.session.timeout.ms": str(PAUSED_SESSION_TIMEOUT_MS),
    "replica.lag.time.max.ms": "1500",
}
# Creation places the first leader; the test needs it elsewhere than on the paused broker.
CREATE_ATTEMPTS_MAX: Final = 10
KEPT_LINE: Final = "keeping the log of {topic}-0 and not serving it"


async def produce(bootstrap: str, topic: str, values: range) -> None:
    async with Producer(bootstrap_servers=bootstrap, request_timeout_ms=CHANGE_TIMEOUT_MS) as p:
        for value in values:
            await p.send(topic, encode(value), partition=PARTITION)
        await p.flush()


def records_digest(broker: BrokerProcess, topic: str) -> str:
    """Of the segment files: a restart rewrites the indexes and snapshots beside them."""
    digest = hashlib.sha256()
    for path in broker.segment_files(topic, PARTITION):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


async def markers(cluster: TestCluster) -> list[str]:
    async with AsyncZooKeeper(cluster.zk_connect) as zk:
        return await zk.get_children(layout.DELETE_TOPICS_PATH)


async def test_a_replica_away_while_its_topic_was_created_again_takes_the_new_log(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, SETTINGS)
    topic = new_topic("again")
    async with Admin(
        bootstrap_servers=cluster.bootstrap, request_timeout_ms=CHANGE_TIMEOUT_MS
    ) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=3)
        await wait_for_state(cluster, topic, fully_in_sync, "every replica in the ISR")
        await produce(cluster.bootstrap, topic, range(1000, 1030))  # the old topic's records
        controller = (await admin.describe_cluster()).controller_id
        away = next(b for b in (3, 2, 1) if b != controller)
        cluster.pause(away)  # registered still, so the new topic is placed on it too

        for _ in range(CREATE_ATTEMPTS_MAX):
            await admin.delete_topic(topic)
            await admin.create_topic(topic, partitions=1, replication_factor=3)
            state = await wait_for_state(cluster, topic, lambda s: s.leader >= 0, "a leader")
            if state.leader != away:
                break
        else:
            raise AssertionError(f"broker {away} led every creation of {topic}")
        await produce(cluster.bootstrap, topic, range(10))  # acknowledged once it leaves the ISR

    # It never saw any of that; a fresh start finds the old topic's log under the new name.
    cluster.kill(away)
    await cluster.restart(away)
    await wait_for_state(cluster, topic, fully_in_sync, f"broker {away} back in the ISR")
    await produce(cluster.bootstrap, topic, range(10, 15))
    await wait_for_state(cluster, topic, fully_in_sync, "every replica in the ISR")

    assert await consume_all(cluster, topic) == list(range(15))

    await eventually(lambda: len(set(segment_digests(cluster, topic).values())) == 1)
    output = broker_output(cluster, away)
    deleted = [line for line in output.splitlines() if "event=partition.deleted" in line]
    assert deleted, output
    assert all(f"topic={topic}" in line and "reason=DeleteTopics" in line for line in deleted)

    # Every broker named in the markers has deleted its logs of those ids: none is left.
    async def no_markers() -> bool | None:
        return await markers(cluster) == [] or None

    await cluster.wait_for(no_markers, CHANGE_TIMEOUT_S, what="the deletion markers gone")


async def test_a_topic_gone_from_zookeeper_without_delete_topics_is_kept_and_served_again(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(1, SETTINGS)
    broker = cluster.brokers[1]
    topic = new_topic("kept")
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=1)
    await produce(cluster.bootstrap, topic, range(20))
    before = records_digest(broker, topic)

    topic_path, config_path = layout.topic_path(topic), layout.topic_config_path(topic)
    state_path = layout.partition_state_path(topic, PARTITION)
    async with AsyncZooKeeper(cluster.zk_connect) as zk:
        saved = {path: (await zk.get(path))[0] for path in (topic_path, state_path, config_path)}
        await zk.delete(topic_path, recursive=True)  # no DeleteTopics: no marker
        await zk.delete(config_path)

    line = KEPT_LINE.format(topic=topic)

    def kept() -> bool:
        return line in broker_output(cluster, 1)

    await eventually(kept)
    assert records_digest(broker, topic) == before
    await cluster.restart(1)  # loading the logs anew decides the same
    await eventually(kept)
    assert broker_output(cluster, 1).count(line) == 1  # one line, not one per pass
    assert records_digest(broker, topic) == before
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        assert topic not in await admin.list_topics()

    async with AsyncZooKeeper(cluster.zk_connect) as zk:
        await zk.transaction(
            [
                CreateOp(topic_path, saved[topic_path]),
                CreateOp(layout.partitions_path(topic)),
                CreateOp(layout.partition_path(topic, PARTITION)),
                CreateOp(state_path, saved[state_path]),
                CreateOp(config_path, saved[config_path]),
            ]
        )
    await wait_for_state(cluster, topic, lambda s: s.leader == 1, "led again")
    assert await consume_all(cluster, topic) == list(range(20))


async def test_a_deletion_whose_controller_stopped_after_its_intent_is_finished(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(1, SETTINGS)
    broker = cluster.brokers[1]
    topic = new_topic("half-deleted")
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        topic_id = await admin.create_topic(topic, partitions=1, replication_factor=1)
    await produce(cluster.bootstrap, topic, range(3))
    async with AsyncZooKeeper(cluster.zk_connect) as zk:
        marker = layout.TopicDeletion(topic_id, topic, frozenset({1}))
        await zk.create(layout.topic_deletion_path(topic_id), marker.encode())
    await cluster.restart(1)  # elected again: its first pass finishes the deletion

    async def deleted() -> bool | None:
        async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
            listed = topic in await admin.list_topics()
        try:
            broker.partition_dir(topic, PARTITION)
        except FileNotFoundError:
            return (not listed and await markers(cluster) == []) or None
        return None

    await cluster.wait_for(deleted, CHANGE_TIMEOUT_S, what=f"{topic} deleted everywhere")
