"""Killing a group's coordinator: the group moves to the new one with its commits intact.

Three brokers, `__consumer_offsets` replicated to all three, a topic replicated to all three,
records produced throughout, two members (each its own process) committing after every batch,
and the broker coordinating their group is killed (SIGKILL). Twice:

- frozen: the members are stopped (SIGSTOP) before the kill, so nothing changes the group's
  offsets meanwhile; what they saw acknowledged is known exactly from their reports, and
  OffsetFetch at the new coordinator must answer, per partition, the last acknowledged offset or
  one whose commit was still in flight (nothing older, nothing else). Resumed, they find their
  sessions expired on the new coordinator (its timers start when it loads the group) and rejoin;
- live: the members keep running through the failover (their commits meet a dead broker, then
  NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS, then the new coordinator); OffsetFetch at the
  new coordinator must be at least what was acknowledged before the kill.

The members are of different clients (librdkafka and aiokafka frozen, Riverbed and kafka-python
live), so that several clients' coordinator rediscovery and API versions meet the failover.

Either way FindCoordinator then names the new leader of the group's `__consumer_offsets`
partition (Kafka's placement: `abs(hash(group)) % partitions`), both members commit through it,
every produced record is processed, no partition is owned twice at once, every new owner starts
at the newest acknowledged commit, and the commits reach the end offsets.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Final

import pytest

from tests.groups.group_support import (
    BROKER_SETTINGS,
    PARTITIONS,
    SETTLE_TIMEOUT_S,
    GroupMembers,
    MemberProcess,
    SteadyProducer,
    committed_offsets,
    create_topic,
    group_committed,
    group_members,  # noqa: F401 - the fixture, by its name
    group_name,
    offsets_partition,
    overlapping_ownership,
    processed_without_ownership,
    resumed_below_acknowledged,
    unless_moving,
    wait_drained,
    wait_for_coordinator,
    wait_settled,
)
from tests.support.cluster import ClusterFactory, partition_state, wait_for

BROKERS: Final = 3
OFFSETS_PARTITIONS: Final = int(BROKER_SETTINGS["offsets.topic.num.partitions"])
SETTINGS: Final = {
    **BROKER_SETTINGS,
    "offsets.topic.replication.factor": str(BROKERS),
    # A killed broker's leaderships move once its ZooKeeper session expires.
    "zookeeper.session.timeout.ms": "3000",
    "replica.lag.time.max.ms": "2000",
}
OFFSETS_TOPIC: Final = "__consumer_offsets"


def acknowledged(members: Iterable[MemberProcess], *, before: float) -> dict[int, int]:
    """Per partition, the highest offset whose commit a member saw acknowledged before `before`."""
    out: dict[int, int] = {}
    for member in members:
        for when, offsets in member.commits("committed"):
            if when >= before:
                continue
            for partition, offset in offsets.items():
                out[partition] = max(out.get(partition, -1), offset)
    return out


def sent(members: Iterable[MemberProcess]) -> dict[int, set[int]]:
    """Per partition, every offset a member sent in a commit."""
    out: dict[int, set[int]] = {}
    for member in members:
        for _, offsets in member.commits("committing"):
            for partition, offset in offsets.items():
                out.setdefault(partition, set()).add(offset)
    return out


@pytest.mark.parametrize(
    ("clients", "frozen"),
    [
        pytest.param(("confluent-kafka", "aiokafka"), True, id="frozen"),
        pytest.param(("riverbed", "kafka-python"), False, id="live"),
    ],
)
async def test_killed_coordinator_moves_with_offsets_intact(
    cluster_factory: ClusterFactory,
    group_members: GroupMembers,  # noqa: F811
    clients: tuple[str, str],
    frozen: bool,
) -> None:
    cluster = await cluster_factory(BROKERS, SETTINGS)
    bootstrap = cluster.bootstrap
    topic, group = group_name("topic"), group_name()
    await create_topic(bootstrap, topic, replication_factor=BROKERS)
    before = await wait_for_coordinator(bootstrap, group)
    group_partition = offsets_partition(group, OFFSETS_PARTITIONS)

    async def offsets_partition_in_sync() -> bool:
        state = await partition_state(bootstrap, OFFSETS_TOPIC, group_partition)
        return state.leader == before.node_id and len(state.isr) == BROKERS

    await cluster.wait_for(offsets_partition_in_sync, SETTLE_TIMEOUT_S, what="a full ISR")

    async with SteadyProducer(bootstrap, topic) as producer:
        members = [
            await group_members.start(name, client, bootstrap=bootstrap, group=group, topic=topic)
            for name, client in zip(("A", "B"), clients, strict=True)
        ]
        await wait_settled(members, group_members)
        await wait_for(
            lambda: all(member.commits("committed") for member in members),
            SETTLE_TIMEOUT_S,
            what="both members to commit",
            context=group_members.describe,
        )
        if frozen:
            for member in members:
                await member.pause()

        killed_at = time.monotonic()
        cluster.kill(before.node_id)
        survivors = ",".join(b.bootstrap for b in cluster.brokers.values() if b.running)
        after = await wait_for_coordinator(survivors, group, other_than=before.node_id)
        state = await partition_state(survivors, OFFSETS_TOPIC, group_partition)
        assert state.leader == after.node_id, state

        committed = await cluster.wait_for(
            lambda: unless_moving(committed_offsets(after.address, group, topic, PARTITIONS)),
            SETTLE_TIMEOUT_S,
            what="OffsetFetch at the new coordinator",
        )
        # Everything the members wrote before the kill has been read by now.
        acknowledged_before = acknowledged(members, before=killed_at)
        for partition, offset in acknowledged_before.items():
            assert committed[partition] >= offset, (partition, committed, acknowledged_before)
        if frozen:
            in_flight_or_acknowledged = sent(members)
            for partition, offset in committed.items():
                assert offset in in_flight_or_acknowledged.get(partition, {-1}), (
                    partition,
                    committed,
                    in_flight_or_acknowledged,
                )
            for member in members:
                member.resume()

        resumed_at = time.monotonic()
        await wait_settled(members, group_members)
        await wait_for(
            lambda: all(
                any(t > resumed_at for t, _ in member.commits("committed")) for member in members
            ),
            SETTLE_TIMEOUT_S,
            what="both members to commit through the new coordinator",
            context=group_members.describe,
        )
        end_offsets = await producer.stop()

    await wait_drained(group_members, end_offsets)

    async def committed_to_end() -> bool:
        return await group_committed(survivors, group, topic) == end_offsets

    await cluster.wait_for(committed_to_end, SETTLE_TIMEOUT_S, what="commits up to the end")
    for member in members:
        assert await member.terminate() == 0, member.describe()
    assert overlapping_ownership(members) == []
    assert processed_without_ownership(members) == []
    assert resumed_below_acknowledged(members) == []
