"""Partition reassignment (KIP-455) and preferred-leader election (KIP-183/460) across real
broker processes: replicas move to other brokers with every acknowledged record, moves can be
cancelled, leaders go back to their preferred replicas; through our Admin, the CLI, and
confluent-kafka's AdminClient."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka.admin import AdminClient, ConfigEntry, ConfigResource
from riverbed import Admin, Consumer, Producer, TopicPartition
from riverbed.client.admin import PartitionDescription
from riverbed.protocol.errors import ErrorCode, KafkaError

from tests.support.cluster import ClusterFactory, TestCluster, partition_state

TOPIC = "moving"
RECORDS = 2_000
VALUE_BYTES = 1_000
WAIT_S = 60.0
FAST_FAILOVER = {
    "zookeeper.session.timeout.ms": "4000",
    "replica.lag.time.max.ms": "4000",
    # Small segments: a moved replica fetches several, and the leader rolls while it does.
    "log.segment.bytes": str(256 * 1024),
}


def value(i: int) -> bytes:
    return str(i).encode().ljust(VALUE_BYTES, b".")


async def produce(bootstrap: str, first: int, count: int) -> None:
    async with Producer(bootstrap_servers=bootstrap, acks="all") as producer:
        for i in range(first, first + count):
            await producer.send(TOPIC, value(i), key=str(i).encode(), partition=0)
        await producer.flush()


async def consume_all(bootstrap: str, expected: int) -> list[bytes]:
    async with Consumer(bootstrap_servers=bootstrap) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        await consumer.seek_to_beginning()
        values: list[bytes] = []
        async with asyncio.timeout(WAIT_S):
            while len(values) < expected:
                batch = await consumer.getmany(timeout_ms=1_000)
                values.extend(r.value or b"" for records in batch.values() for r in records)
    return values


async def led_by(cluster: TestCluster, leader: int) -> None:
    """Wait until Metadata shows `leader` leading partition 0. ElectLeaders answers once the
    controller has written the election to ZooKeeper; each broker's metadata follows through its
    watches a moment later (as in Kafka), so the broker asked next may still show the old one."""

    async def leading() -> PartitionDescription | None:
        state = await partition_state(cluster.bootstrap, TOPIC, 0)
        return state if state.leader == leader else None

    await cluster.wait_for(leading, WAIT_S, what=f"broker {leader} leading")


async def settled(cluster: TestCluster, replicas: tuple[int, ...]) -> PartitionDescription:
    """Wait until the partition has exactly `replicas`, all in sync, led by one of them, and
    no reassignment is listed."""

    async def check() -> PartitionDescription | None:
        state = await partition_state(cluster.bootstrap, TOPIC, 0)
        if state.replicas != replicas or set(state.isr) != set(replicas):
            return None
        async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
            if await admin.list_partition_reassignments():
                return None
        return state if state.leader in replicas else None

    return await cluster.wait_for(check, WAIT_S, what=f"{TOPIC}-0 settled on {replicas}")


def hosts_partition(cluster: TestCluster, broker_id: int) -> bool:
    return any(cluster.brokers[broker_id].data_dir.glob(f"**/{TOPIC}-0"))


async def test_reassignment_moves_the_leader_and_keeps_every_record(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, FAST_FAILOVER)
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=1, replication_factor=2)
    before = await partition_state(cluster.bootstrap, TOPIC, 0)
    await produce(cluster.bootstrap, 0, RECORDS)
    leaving = before.leader
    staying = next(r for r in before.replicas if r != leaving)
    joining = next(b for b in cluster.brokers if b not in before.replicas)
    target = (joining, staying)

    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        errors = await admin.alter_partition_reassignments({TopicPartition(TOPIC, 0): target})
        assert errors == {TopicPartition(TOPIC, 0): None}
        # Records produced while the move is under way are kept too.
        await produce(cluster.bootstrap, RECORDS, RECORDS)
    after = await settled(cluster, target)

    assert after.leader in target
    assert after.leader_epoch > before.leader_epoch
    values = await consume_all(cluster.bootstrap, 2 * RECORDS)
    assert values == [value(i) for i in range(2 * RECORDS)]
    # The removed replica deleted its log; the new one has it.
    await cluster.wait_for(
        lambda: asyncio.sleep(0, result=not hosts_partition(cluster, leaving) or None),
        WAIT_S,
        what=f"broker {leaving} deleting its replica",
    )
    assert hosts_partition(cluster, joining)

    # The new replicas serve alone: the removed broker can go.
    cluster.kill(leaving)
    await produce(cluster.bootstrap, 2 * RECORDS, 10)
    assert len(await consume_all(cluster.bootstrap, 2 * RECORDS + 10)) == 2 * RECORDS + 10


async def test_a_move_can_be_cancelled_while_the_new_replica_is_stuck(
    cluster_factory: ClusterFactory,
) -> None:
    # A long session timeout: the frozen broker stays registered while the move is listed.
    cluster = await cluster_factory(3, {"zookeeper.session.timeout.ms": "30000"})
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=1, replication_factor=2)
        before = await partition_state(cluster.bootstrap, TOPIC, 0)
        await produce(cluster.bootstrap, 0, 100)
        joining = next(b for b in cluster.brokers if b not in before.replicas)
        tp = TopicPartition(TOPIC, 0)
        if (await admin.describe_cluster()).controller_id == joining:
            # A frozen controller would answer nothing: move the controllership first.
            await cluster.restart(joining)
            await cluster.wait_for(
                lambda: _controller_is_not(admin, joining), WAIT_S, what="a new controller"
            )

        cluster.pause(joining)  # it can never catch up
        try:
            target = (joining, *before.replicas[1:])
            assert await admin.alter_partition_reassignments({tp: target}) == {tp: None}
            ongoing = await admin.list_partition_reassignments()
            assert ongoing[tp].adding_replicas == (joining,)
            assert ongoing[tp].removing_replicas == (before.replicas[0],)
            assert ongoing[tp].target_replicas == target
            assert set(ongoing[tp].replicas) == {joining, *before.replicas}

            # Cancelling returns to the original replicas, listed as the full set has them
            # (target first), as Kafka's controller does.
            original = tuple(r for r in ongoing[tp].replicas if r != joining)
            assert set(original) == set(before.replicas)
            assert await admin.alter_partition_reassignments({tp: None}) == {tp: None}
            assert await admin.list_partition_reassignments() == {}
        finally:
            cluster.resume(joining)
        state = await settled(cluster, original)
        assert state.leader == before.leader
        await cluster.wait_for(
            lambda: asyncio.sleep(0, result=not hosts_partition(cluster, joining) or None),
            WAIT_S,
            what=f"broker {joining} dropping the cancelled replica",
        )
        # Nothing to cancel any more.
        errors = await admin.alter_partition_reassignments({tp: None})
        error = errors[tp]
        assert error is not None
        assert error.code == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


async def test_bad_targets_are_refused_per_partition(cluster_factory: ClusterFactory) -> None:
    cluster = await cluster_factory(2)
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=2, replication_factor=1)
        errors = await admin.alter_partition_reassignments(
            {
                TopicPartition(TOPIC, 0): (99,),
                TopicPartition(TOPIC, 1): (1, 1),
                TopicPartition(TOPIC, 7): (1,),
                TopicPartition("nope", 0): (1,),
            }
        )
        codes = {
            tp.partition if tp.topic == TOPIC else -1: e and e.code for tp, e in errors.items()
        }
        assert codes == {
            0: ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            1: ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            7: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            -1: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        }
        assert await admin.list_partition_reassignments() == {}


async def test_preferred_leader_election_after_a_failover(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(2, FAST_FAILOVER)
    tp = TopicPartition(TOPIC, 0)
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=1, replication_factor=2)
    before = await partition_state(cluster.bootstrap, TOPIC, 0)
    preferred = before.replicas[0]
    assert before.leader == preferred
    await produce(cluster.bootstrap, 0, 100)

    await cluster.terminate(preferred)  # controlled shutdown: the other replica leads
    await cluster.restart(preferred)

    async def back_in_sync() -> PartitionDescription | None:
        state = await partition_state(cluster.bootstrap, TOPIC, 0)
        return state if set(state.isr) == set(state.replicas) else None

    moved = await cluster.wait_for(back_in_sync, WAIT_S, what="the restarted broker in sync")
    assert moved.leader != preferred  # leaderships stay where the failover put them

    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        assert await admin.elect_leaders([tp]) == {tp: None}
        await led_by(cluster, preferred)
        again = (await admin.elect_leaders())[tp]
        assert again is not None
        assert again.code == ErrorCode.ELECTION_NOT_NEEDED
        unclean = (await admin.elect_leaders([tp], election="unclean"))[tp]
        assert unclean is not None
        assert unclean.code == ErrorCode.ELECTION_NOT_NEEDED
    assert len(await consume_all(cluster.bootstrap, 100)) == 100


def riverbed_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli", *args],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 2,
        check=False,
    )


async def test_cli_reassigns_with_progress_and_elects(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    cluster = await cluster_factory(3, FAST_FAILOVER)
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=1, replication_factor=2)
    before = await partition_state(cluster.bootstrap, TOPIC, 0)
    await produce(cluster.bootstrap, 0, 500)
    joining = next(b for b in cluster.brokers if b not in before.replicas)
    target = [joining, before.replicas[0]]
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": TOPIC, "partition": 0, "replicas": target}]}
        )
    )

    done = await asyncio.to_thread(
        riverbed_cli,
        "partitions", "reassign", "--plan", str(plan), "--wait", "--json",
        "--bootstrap-server", cluster.bootstrap,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        {"topic": TOPIC, "partition": 0, "replicas": target, "error": None, "message": None}
    ]
    # --wait returned only once the move had finished: the controller lists it no more (the
    # broker asked for Metadata next may learn the new replicas a moment later, by its watch).
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        assert await admin.list_partition_reassignments() == {}
    state = await settled(cluster, tuple(target))

    text = await asyncio.to_thread(
        riverbed_cli,
        "partitions", "reassign", "--topic", TOPIC, "--partition", "0", "--replicas", "99",
        "--bootstrap-server", cluster.bootstrap,
    )  # fmt: skip
    assert text.returncode == 1
    assert text.stdout.strip() == (
        f"{TOPIC}-0: INVALID_REPLICA_ASSIGNMENT: brokers [99] are not registered"
    )

    listed = await asyncio.to_thread(
        riverbed_cli, "partitions", "reassignments", "--bootstrap-server", cluster.bootstrap
    )
    assert listed.stdout.strip() == "no reassignment in progress"

    elected = await asyncio.to_thread(
        riverbed_cli,
        "leaders", "elect", "--preferred", "--topic", TOPIC, "--json",
        "--bootstrap-server", cluster.bootstrap,
    )  # fmt: skip
    assert elected.returncode == 0, elected.stderr
    # The move kept the leader (it stayed a replica); the election hands it to the first.
    assert state.leader == before.leader == target[1]
    assert json.loads(elected.stdout) == [
        {"topic": TOPIC, "partition": 0, "error": None, "message": None}
    ]
    await led_by(cluster, target[0])


async def test_confluent_kafka_elects_preferred_leaders(cluster_factory: ClusterFactory) -> None:
    cluster = await cluster_factory(2, FAST_FAILOVER)
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=1, replication_factor=2)
    before = await partition_state(cluster.bootstrap, TOPIC, 0)
    preferred = before.replicas[0]
    await cluster.terminate(preferred)
    await cluster.restart(preferred)

    async def back_in_sync() -> PartitionDescription | None:
        state = await partition_state(cluster.bootstrap, TOPIC, 0)
        return state if set(state.isr) == set(state.replicas) else None

    await cluster.wait_for(back_in_sync, WAIT_S, what="the restarted broker in sync")

    def elect() -> dict[confluent_kafka.TopicPartition, confluent_kafka.KafkaError | None]:
        client = AdminClient({"bootstrap.servers": cluster.bootstrap})
        future = client.elect_leaders(
            confluent_kafka.ElectionType.PREFERRED, [confluent_kafka.TopicPartition(TOPIC, 0)]
        )
        return dict(future.result(timeout=WAIT_S))

    results = await asyncio.to_thread(elect)
    assert [(tp.topic, tp.partition) for tp in results] == [(TOPIC, 0)]
    assert list(results.values()) == [None]
    await led_by(cluster, preferred)


async def test_throttled_move_copies_at_the_capped_rate(cluster_factory: ClusterFactory) -> None:
    cluster = await cluster_factory(2, FAST_FAILOVER)
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=1, replication_factor=1)
    before = await partition_state(cluster.bootstrap, TOPIC, 0)
    await produce(cluster.bootstrap, 0, RECORDS)  # ~2 MB on disk
    joining = next(b for b in cluster.brokers if b not in before.replicas)
    target = f"{before.replicas[0]},{joining}"
    rate = 300_000
    leader = cluster.brokers[before.leader]
    log_bytes = sum(f.stat().st_size for f in leader.segment_files(TOPIC, 0))
    assert log_bytes > 5 * rate  # long enough to measure the throttle

    started = asyncio.get_running_loop().time()
    done = await asyncio.to_thread(
        riverbed_cli,
        "partitions", "reassign", "--topic", TOPIC, "--partition", "0", "--replicas", target,
        "--throttle", str(rate), "--wait", "--bootstrap-server", cluster.bootstrap,
    )  # fmt: skip
    elapsed_s = asyncio.get_running_loop().time() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{TOPIC}-0: moved to [{target.replace(',', ', ')}]"
    # The copy of the log could not go faster than the rate allows (less the first window's
    # allowance): a lower bound, so a slow machine cannot fail it.
    floor_s = log_bytes / rate - 1
    assert elapsed_s >= floor_s, f"moved in {elapsed_s:.1f} s, under the throttle's {floor_s} s"
    state = await partition_state(cluster.bootstrap, TOPIC, 0)
    assert set(state.isr) == {before.replicas[0], joining}

    # The throttle is lifted once the move is done: confluent-kafka sees the defaults again.
    def broker_and_topic_configs() -> tuple[ConfigEntry, ConfigEntry]:
        client = AdminClient({"bootstrap.servers": cluster.bootstrap})
        broker = confluent_kafka.admin.ConfigResource(
            confluent_kafka.admin.ResourceType.BROKER, str(joining)
        )
        topic = confluent_kafka.admin.ConfigResource(
            confluent_kafka.admin.ResourceType.TOPIC, TOPIC
        )
        found: dict[ConfigResource, dict[str, ConfigEntry]] = {
            r: f.result(timeout=WAIT_S) for r, f in client.describe_configs([broker, topic]).items()
        }
        return (
            found[broker]["follower.replication.throttled.rate"],
            found[topic]["follower.replication.throttled.replicas"],
        )

    rate_entry, replicas_entry = await asyncio.to_thread(broker_and_topic_configs)
    assert rate_entry.value == str(2**63 - 1)
    assert replicas_entry.value == ""
    # librdkafka sets `source` to the enum's value, not the ConfigSource its type says.
    default = confluent_kafka.admin.ConfigSource.DEFAULT_CONFIG.value
    assert replicas_entry.source == default  # type: ignore[comparison-overlap]


async def test_dynamic_broker_configs_are_cluster_wide(cluster_factory: ClusterFactory) -> None:
    cluster = await cluster_factory(2)
    Resource, Entry = confluent_kafka.admin.ConfigResource, confluent_kafka.admin.ConfigEntry
    BROKER = confluent_kafka.admin.ResourceType.BROKER
    SET = confluent_kafka.admin.AlterConfigOpType.SET

    def alter(name: str) -> None:  # confluent-kafka's incremental alter of a broker
        client = AdminClient({"bootstrap.servers": cluster.bootstrap})
        resource = Resource(
            BROKER,
            name,
            incremental_configs=[
                Entry("follower.replication.throttled.rate", "12345", incremental_operation=SET)
            ],
        )
        for future in client.incremental_alter_configs([resource]).values():
            future.result(timeout=WAIT_S)

    def describe(broker_id: int) -> ConfigEntry:
        client = AdminClient({"bootstrap.servers": cluster.bootstrap})
        resource = Resource(BROKER, str(broker_id))
        [future] = client.describe_configs([resource]).values()
        entries: dict[str, ConfigEntry] = future.result(timeout=WAIT_S)
        return entries["follower.replication.throttled.rate"]

    # Per-broker dynamic configs are refused; the default entity (an empty name, which
    # librdkafka will not send) takes them for the whole cluster.
    with pytest.raises(confluent_kafka.KafkaException, match="cluster-wide"):
        await asyncio.to_thread(alter, "1")
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.alter_broker_configs(set={"follower.replication.throttled.rate": "12345"})
    for broker_id in cluster.brokers:
        entry = await asyncio.to_thread(describe, broker_id)
        assert entry.value == "12345"
        dynamic_default = confluent_kafka.admin.ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
        assert entry.source == dynamic_default  # type: ignore[comparison-overlap]  # as above
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.alter_broker_configs(delete=["follower.replication.throttled.rate"])
        with pytest.raises(KafkaError, match=r"log\.retention\.ms"):
            await admin.alter_broker_configs(set={"log.retention.ms": "1"})
    entry = await asyncio.to_thread(describe, 1)
    assert entry.value == str(2**63 - 1)


async def _controller_is_not(admin: Admin, broker_id: int) -> bool:
    return (await admin.describe_cluster()).controller_id != broker_id
