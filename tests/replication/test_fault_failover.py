"""Leaders crash under load; controllers crash; whole clusters restart. Whatever happens, the log
holds exactly the acknowledged records, in order, once each.

Producers send sequence numbers (0, 1, 2, ...) to one partition replicated to three brokers, with
acks=all and idempotence, so the consumed log can be compared with the acknowledgements exactly.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Final

import pytest
from riverbed import Admin, Producer
from riverbed.client.admin import PartitionDescription
from riverbed.protocol import messages as m

from tests.replication.fault_support import (
    CHANGE_TIMEOUT_S,
    SETTINGS,
    Acknowledgements,
    SequenceProducer,
    broker_output,
    connect,
    consume_all,
    create_replicated_topic,
    encode,
    end_offset,
    fully_in_sync,
    new_topic,
    produce_with_librdkafka,
    produce_with_riverbed,
    producing,
    wait_for_acknowledgement,
    wait_for_new_leader,
    wait_for_state,
)
from tests.support.cluster import ClusterFactory, TestCluster

KILL_ROUNDS: Final = 10
# Each round kills the leader this long after the previous round ended (uniformly at random):
# before, during or after a batch is in flight.
KILL_DELAY_S: Final = (0.1, 1.5)


@pytest.mark.parametrize(
    "produce", [produce_with_riverbed, produce_with_librdkafka], ids=["riverbed", "librdkafka"]
)
async def test_leader_killed_repeatedly_under_acks_all_loses_and_duplicates_nothing(
    cluster_factory: ClusterFactory, produce: SequenceProducer
) -> None:
    cluster = await cluster_factory(3, SETTINGS)
    topic = new_topic("kill-leader")
    await create_replicated_topic(cluster, topic)
    seed = random.randrange(2**32)
    print(f"kill moments seeded with {seed}")
    rng = random.Random(seed)
    async with producing(cluster, topic, produce) as acks:
        for round_index in range(KILL_ROUNDS):
            await kill_leader_and_recover(cluster, topic, acks, rng, round_index)

    # Every send was acknowledged, at the offset equal to its sequence number, and the log
    # holds exactly those records: nothing lost, doubled or reordered.
    acks.check_all_acknowledged_in_order()
    assert await consume_all(cluster, topic) == list(range(acks.sent))


async def kill_leader_and_recover(
    cluster: TestCluster,
    topic: str,
    acks: Acknowledgements,
    rng: random.Random,
    round_index: int,
) -> None:
    """SIGKILL the leader at a random moment; once another broker leads, restart it and return
    when it is back in the ISR. Prints the failover times. (A broker restarted at once is
    covered by test_a_broker_restarted_at_once_never_leads_at_its_old_epoch.)"""
    before = await wait_for_state(cluster, topic, fully_in_sync, "every replica in the ISR")
    await asyncio.sleep(rng.uniform(*KILL_DELAY_S))
    sent_before = acks.sent
    killed_at = time.monotonic()
    cluster.kill(before.leader)
    after = await wait_for_new_leader(cluster, topic, before)
    elected_s = time.monotonic() - killed_at
    await cluster.restart(before.leader)
    rejoined = await wait_for_state(cluster, topic, fully_in_sync, "the killed broker back in sync")
    rejoined_s = time.monotonic() - killed_at
    resumed_at = await wait_for_acknowledgement(cluster, acks, sent_before)
    print(
        f"round {round_index}: killed leader {before.leader} (epoch {before.leader_epoch}, "
        f"{sent_before} sent); leader {after.leader} at epoch {after.leader_epoch} after "
        f"{elected_s:.2f} s; acks resumed after {resumed_at - killed_at:.2f} s; "
        f"ISR {list(rejoined.isr)} after {rejoined_s:.2f} s"
    )


# -- the controller dies ---------------------------------------------------------------------

CONTROLLER_TEST_PARTITIONS: Final = 3


async def controller_seen_by(cluster: TestCluster, broker_id: int) -> int:
    """The controller id in one broker's own Metadata answer."""
    async with connect(cluster, broker_id) as connection:
        request = m.MetadataRequest(topics=[], allow_auto_topic_creation=False)
        response = await connection.call(request, m.MetadataResponse)
    return response.controller_id


async def wait_for_controller(cluster: TestCluster, *, not_on: int = -1) -> int:
    """The controller every running broker names, once they agree on one other than `not_on`."""

    async def agreed() -> int | None:
        seen = {await controller_seen_by(cluster, b) for b in sorted(cluster.running_ids)}
        (controller,) = seen if len(seen) == 1 else (None,)
        return controller if controller not in (None, -1, not_on) else None

    return await cluster.wait_for(agreed, CHANGE_TIMEOUT_S, what="one agreed controller")


async def wait_for_partitions(
    cluster: TestCluster,
    topic: str,
    predicate: Callable[[PartitionDescription], bool],
    what: str,
) -> tuple[PartitionDescription, ...]:
    """Every partition of `topic` once each satisfies `predicate`."""

    async def check() -> tuple[PartitionDescription, ...] | None:
        async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
            partitions = (await admin.describe_topic(topic)).partitions
        return partitions if all(predicate(p) for p in partitions) else None

    return await cluster.wait_for(check, CHANGE_TIMEOUT_S, what=f"{topic}: {what}")


async def test_controller_killed_another_takes_over_and_still_elects_leaders(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, SETTINGS)
    topic = new_topic("controller")
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(topic, partitions=CONTROLLER_TEST_PARTITIONS, replication_factor=3)
    before = await wait_for_partitions(cluster, topic, fully_in_sync, "all replicas in sync")
    first = await wait_for_controller(cluster)

    cluster.kill(first)
    second = await wait_for_controller(cluster, not_on=first)
    # The new controller moved whatever the old one led (leaders are spread over the brokers,
    # so it led at least its preferred partition).
    led_by_first = {p.partition: p.leader_epoch for p in before if p.leader == first}
    assert led_by_first
    await wait_for_partitions(
        cluster,
        topic,
        lambda p: (
            p.partition not in led_by_first
            or (p.leader not in (first, -1) and p.leader_epoch > led_by_first[p.partition])
        ),
        f"leaders other than the dead controller {first}",
    )
    await cluster.restart(first)
    settled = await wait_for_partitions(cluster, topic, fully_in_sync, "all replicas in sync")

    # A leader crash now is handled by the second controller.
    victim = next(p for p in settled if p.leader != second)
    cluster.kill(victim.leader)
    await wait_for_partitions(
        cluster,
        topic,
        lambda p: (
            p.partition != victim.partition
            or (p.leader not in (victim.leader, -1) and p.leader_epoch > victim.leader_epoch)
        ),
        f"partition {victim.partition} led by another broker than {victim.leader}",
    )
    assert await wait_for_controller(cluster) == second
    decision = f"event=partition.leader_changed topic={topic} partition={victim.partition} leader="
    decided = [line for line in broker_output(cluster, second).splitlines() if decision in line]
    assert any(f" previous_leader={victim.leader} " in line for line in decided), decided
    async with Producer(bootstrap_servers=cluster.bootstrap) as producer:
        for partition in range(CONTROLLER_TEST_PARTITIONS):
            await (await producer.send(topic, encode(partition), partition=partition))


# -- every broker restarts -------------------------------------------------------------------

RESTART_TEST_RECORDS: Final = 500


@pytest.mark.parametrize("how", ["terminate", "kill"])
async def test_whole_cluster_restart_keeps_acknowledged_records_and_high_watermark(
    cluster_factory: ClusterFactory, how: str
) -> None:
    cluster = await cluster_factory(3, SETTINGS)
    topic = new_topic(f"restart-{how}")
    await create_replicated_topic(cluster, topic)
    async with Producer(bootstrap_servers=cluster.bootstrap) as producer:
        futures = [
            await producer.send(topic, encode(sequence), partition=0)
            for sequence in range(RESTART_TEST_RECORDS)
        ]
        offsets = [(await future).offset for future in futures]
    assert offsets == list(range(RESTART_TEST_RECORDS))

    if how == "terminate":
        await cluster.stop()  # SIGTERM to all at once: concurrent controlled shutdowns
    else:
        cluster.kill_all()
    started_at = time.monotonic()
    await cluster.start()
    state = await wait_for_state(cluster, topic, fully_in_sync, "all replicas in sync")
    print(
        f"{how}: leader {state.leader} at epoch {state.leader_epoch} and ISR {list(state.isr)} "
        f"{time.monotonic() - started_at:.2f} s after the restart"
    )

    assert await end_offset(cluster, topic) == RESTART_TEST_RECORDS
    assert await consume_all(cluster, topic) == list(range(RESTART_TEST_RECORDS))
    async with Producer(bootstrap_servers=cluster.bootstrap) as producer:
        metadata = await (await producer.send(topic, encode(RESTART_TEST_RECORDS), partition=0))
    assert metadata.offset == RESTART_TEST_RECORDS


async def test_a_broker_restarted_at_once_never_leads_at_its_old_epoch(
    cluster_factory: ClusterFactory,
) -> None:
    """The controller (which also leads a partition) crashes and comes straight back, possibly
    registering before the next controller is elected. Its old leaderships are still in
    ZooKeeper, written before its new registration: it must not take them up (its log tail may
    be lost), and whichever controller runs must start a new term for them (broker epochs)."""
    cluster = await cluster_factory(3, SETTINGS)
    topic = new_topic("restart-at-once")
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(topic, partitions=CONTROLLER_TEST_PARTITIONS, replication_factor=3)
    before = await wait_for_partitions(cluster, topic, fully_in_sync, "all replicas in sync")
    victim = await wait_for_controller(cluster)
    led = {p.partition: p.leader_epoch for p in before if p.leader == victim}
    assert led  # leaders are spread over the brokers

    cluster.kill(victim)
    await cluster.restart(victim)
    after = await wait_for_partitions(
        cluster,
        topic,
        lambda p: p.partition not in led or p.leader_epoch > led[p.partition],
        f"a new term for the partitions broker {victim} led",
    )
    output = broker_output(cluster, victim)
    for partition, epoch in led.items():
        leading = f"event=partition.leading topic={topic} partition={partition} "
        assert f"{leading}leader_epoch={epoch} " not in output
        assert "event=broker.started " in output  # the format the check above relies on
    async with Producer(bootstrap_servers=cluster.bootstrap) as producer:
        for state in after:
            await (await producer.send(topic, encode(state.partition), partition=state.partition))
