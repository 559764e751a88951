"""The group coordinator in real brokers: placement, commits, fetches, durability, failover.

Requests are sent raw with Riverbed's own connection (so every error code is visible) at the
versions it negotiates (FindCoordinator v4, OffsetCommit v8, OffsetFetch v8: batched), and by
kafka-python, whose older versions take the other per-version paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Final

import aiokafka
import kafka.admin
import kafka.structs
from riverbed import Admin
from riverbed.broker.groups.offsets_topic import OFFSETS_TOPIC, partition_for
from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.record_types import TopicPartition

from tests.replication.fault_support import SETTINGS as FAULT_SETTINGS
from tests.support.broker import HOST, BrokerFactory
from tests.support.cluster import ClusterFactory, TestCluster, partition_state, wait_for

OFFSETS_PARTITIONS: Final = 3
SETTINGS: Final[Mapping[str, str]] = {
    # A short ZooKeeper session: a killed broker's roles move, and it restarts, fast.
    **FAULT_SETTINGS,
    "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
    "offsets.topic.replication.factor": "1",
    "group.initial.rebalance.delay.ms": "0",
    "offset.metadata.max.bytes": "16",
}
TOPIC: Final = "orders"
ORDERS_0: Final = TopicPartition(TOPIC, 0)
ORDERS_1: Final = TopicPartition(TOPIC, 1)
WAIT_S: Final = 30.0
# A commit from outside any group: no generation, no member ("simple" consumers, admin tools).
NO_GENERATION: Final = -1

Fetched = tuple[ErrorCode, dict[TopicPartition, tuple[int, str]]]


async def connect(address: str) -> BrokerConnection:
    host, _, port = address.rpartition(":")
    return await BrokerConnection.open(host, int(port), client_id="coordinator-test")


async def find_coordinator(
    connection: BrokerConnection, group_id: str
) -> m.FindCoordinatorResponse.Coordinator:
    request = m.FindCoordinatorRequest(key=group_id, coordinator_keys=[group_id])
    response = await connection.call(request, m.FindCoordinatorResponse)
    (coordinator,) = response.coordinators
    return coordinator


async def commit(
    connection: BrokerConnection,
    group_id: str,
    offsets: Mapping[TopicPartition, int],
    *,
    metadata: str = "",
) -> dict[TopicPartition, ErrorCode]:
    by_topic: dict[str, list[m.OffsetCommitRequest.OffsetCommitRequestPartition]] = {}
    for tp, offset in offsets.items():
        by_topic.setdefault(tp.topic, []).append(
            m.OffsetCommitRequest.OffsetCommitRequestPartition(
                partition_index=tp.partition, committed_offset=offset, committed_metadata=metadata
            )
        )
    request = m.OffsetCommitRequest(
        group_id=group_id,
        generation_id=NO_GENERATION,
        topics=[
            m.OffsetCommitRequest.OffsetCommitRequestTopic(name=name, partitions=partitions)
            for name, partitions in by_topic.items()
        ],
    )
    response = await connection.call(request, m.OffsetCommitResponse)
    return {
        TopicPartition(topic.name, p.partition_index): ErrorCode(p.error_code)
        for topic in response.topics
        for p in topic.partitions
    }


async def fetch(
    connection: BrokerConnection, groups: Mapping[str, Sequence[TopicPartition] | None]
) -> dict[str, Fetched]:
    """OffsetFetch v8 (several groups at once): per group its error and (offset, metadata)
    per partition."""
    request = m.OffsetFetchRequest(
        groups=[
            m.OffsetFetchRequest.OffsetFetchRequestGroup(
                group_id=group_id,
                topics=None
                if partitions is None
                else [
                    m.OffsetFetchRequest.OffsetFetchRequestTopics(
                        name=tp.topic, partition_indexes=[tp.partition]
                    )
                    for tp in partitions
                ],
            )
            for group_id, partitions in groups.items()
        ]
    )
    response = await connection.call(request, m.OffsetFetchResponse)
    return {
        group.group_id: (
            ErrorCode(group.error_code),
            {
                TopicPartition(topic.name, p.partition_index): (
                    p.committed_offset,
                    p.metadata or "",
                )
                for topic in group.topics
                for p in topic.partitions
            },
        )
        for group in response.groups
    }


async def fetch_when_ready(
    address: str, groups: Mapping[str, Sequence[TopicPartition] | None]
) -> dict[str, Fetched]:
    """Fetch once the broker at `address` coordinates every group and has loaded them."""

    async def attempt() -> dict[str, Fetched] | None:
        connection = await connect(address)
        try:
            fetched = await fetch(connection, groups)
        finally:
            await connection.close()
        return fetched if all(code == ErrorCode.NONE for code, _ in fetched.values()) else None

    return await wait_for(attempt, WAIT_S, what=f"offsets of {sorted(groups)} from {address}")


async def create_orders(bootstrap: str, replication_factor: int = 1) -> None:
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=2, replication_factor=replication_factor)


async def test_commits_and_deletions_survive_a_restart(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SETTINGS)
    await create_orders(broker.bootstrap)
    connection = await connect(broker.bootstrap)
    try:
        coordinator = await find_coordinator(connection, "g1")
        assert (coordinator.error_code, coordinator.node_id) == (ErrorCode.NONE, 1)
        assert (coordinator.host, coordinator.port) == (HOST, broker.port)
        async with Admin(bootstrap_servers=broker.bootstrap) as admin:
            offsets_topic = await admin.describe_topic(OFFSETS_TOPIC)
        assert len(offsets_topic.partitions) == OFFSETS_PARTITIONS
        assert offsets_topic.configs["cleanup.policy"] == "compact"
        assert offsets_topic.configs["compression.type"] == "producer"
        await fetch_when_ready(broker.bootstrap, {"g1": None})  # the partitions are loaded

        assert await commit(connection, "g1", {ORDERS_0: 5, ORDERS_1: 7}, metadata="m") == {
            ORDERS_0: ErrorCode.NONE,
            ORDERS_1: ErrorCode.NONE,
        }
        assert await commit(connection, "g1", {ORDERS_0: 6}) == {ORDERS_0: ErrorCode.NONE}
        # One request, four outcomes: unknown topic and partition, metadata over
        # offset.metadata.max.bytes (16), and a commit that goes through.
        bad = {
            TopicPartition("no-such-topic", 0): 1,
            TopicPartition(TOPIC, 9): 1,
        }
        codes = await commit(connection, "g2", {**bad, ORDERS_0: 1}, metadata="x" * 17)
        assert codes == {
            TopicPartition("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            TopicPartition(TOPIC, 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ORDERS_0: ErrorCode.OFFSET_METADATA_TOO_LARGE,
        }
        assert await commit(connection, "g2", {ORDERS_1: 3}) == {ORDERS_1: ErrorCode.NONE}
        assert await commit(connection, "gone", {ORDERS_0: 9}) == {ORDERS_0: ErrorCode.NONE}
        deleted = await connection.call(
            m.DeleteGroupsRequest(groups_names=["gone", "never"]), m.DeleteGroupsResponse
        )
        assert {r.group_id: r.error_code for r in deleted.results} == {
            "gone": ErrorCode.NONE,
            "never": ErrorCode.GROUP_ID_NOT_FOUND,
        }
    finally:
        await connection.close()

    wanted: dict[str, Sequence[TopicPartition] | None] = {
        "g1": [ORDERS_0, ORDERS_1],
        "g2": None,  # every partition it committed
        "gone": [ORDERS_0],
        "unknown": [ORDERS_0],
    }
    expected = {
        "g1": (ErrorCode.NONE, {ORDERS_0: (6, ""), ORDERS_1: (7, "m")}),
        "g2": (ErrorCode.NONE, {ORDERS_1: (3, "")}),
        "gone": (ErrorCode.NONE, {ORDERS_0: (-1, "")}),
        "unknown": (ErrorCode.NONE, {ORDERS_0: (-1, "")}),
    }
    assert await fetch_when_ready(broker.bootstrap, wanted) == expected
    # A crash, then a restart: the new incarnation replays __consumer_offsets (tombstones too).
    broker.kill()
    await asyncio.to_thread(broker.restart)
    assert await fetch_when_ready(broker.bootstrap, wanted) == expected


async def test_no_coordinator_until_enough_brokers(broker_factory: BrokerFactory) -> None:
    settings = {**SETTINGS, "offsets.topic.replication.factor": "2"}
    first = broker_factory(settings, broker_id=1)
    connection = await connect(first.bootstrap)
    try:
        coordinator = await find_coordinator(connection, "g")
        assert coordinator.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert "offsets.topic.replication.factor=2" in (coordinator.error_message or "")
        async with Admin(bootstrap_servers=first.bootstrap) as admin:
            assert OFFSETS_TOPIC not in await admin.list_topics()

        broker_factory(settings, broker_id=2)

        async def found() -> m.FindCoordinatorResponse.Coordinator | None:
            coordinator = await find_coordinator(connection, "g")
            return coordinator if coordinator.error_code == ErrorCode.NONE else None

        coordinator = await wait_for(found, WAIT_S, what="a coordinator for g")
        assert coordinator.node_id in (1, 2)
        async with Admin(bootstrap_servers=first.bootstrap) as admin:
            offsets_topic = await admin.describe_topic(OFFSETS_TOPIC)
        assert {len(p.replicas) for p in offsets_topic.partitions} == {2}
    finally:
        await connection.close()


async def test_commits_survive_the_coordinators_crash(cluster_factory: ClusterFactory) -> None:
    settings = {**SETTINGS, "offsets.topic.replication.factor": "3"}
    cluster = await cluster_factory(3, settings)
    await create_orders(cluster.bootstrap, replication_factor=3)
    group_id = "survivor"
    index = partition_for(group_id, OFFSETS_PARTITIONS)
    coordinator_id = await wait_for_coordinator(cluster, group_id)
    address = cluster.brokers[coordinator_id].bootstrap
    await fetch_when_ready(address, {group_id: None})
    await wait_for(
        lambda: in_sync(cluster, index), WAIT_S, what=f"all replicas of {OFFSETS_TOPIC}-{index}"
    )
    other_id = next(broker_id for broker_id in cluster.brokers if broker_id != coordinator_id)
    other = await connect(cluster.brokers[other_id].bootstrap)
    try:
        assert (await fetch(other, {group_id: None}))[group_id][0] == ErrorCode.NOT_COORDINATOR
    finally:
        await other.close()

    # Commit increasing offsets; every acknowledged one must outlive the crash.
    acknowledged = -1
    connection = await connect(address)
    try:
        for offset in range(1, 41):
            codes = await commit(connection, group_id, {ORDERS_0: offset, ORDERS_1: 2 * offset})
            assert set(codes.values()) == {ErrorCode.NONE}
            acknowledged = offset
    finally:
        await connection.close()
    cluster.kill(coordinator_id)

    new_id = await wait_for_coordinator(cluster, group_id, not_on=coordinator_id)
    fetched = await fetch_when_ready(cluster.brokers[new_id].bootstrap, {group_id: None})
    assert fetched[group_id] == (
        ErrorCode.NONE,
        {ORDERS_0: (acknowledged, ""), ORDERS_1: (2 * acknowledged, "")},
    )
    # The old coordinator comes back as a follower; the group stays where it moved.
    await cluster.restart(coordinator_id)
    assert await wait_for_coordinator(cluster, group_id) == new_id


async def wait_for_coordinator(cluster: TestCluster, group_id: str, not_on: int = -1) -> int:
    async def found() -> int | None:
        connection = await connect(cluster.bootstrap.split(",")[0])
        try:
            coordinator = await find_coordinator(connection, group_id)
        finally:
            await connection.close()
        if coordinator.error_code != ErrorCode.NONE or coordinator.node_id == not_on:
            return None
        return coordinator.node_id

    return await cluster.wait_for(found, WAIT_S, what=f"a coordinator for {group_id}")


async def in_sync(cluster: TestCluster, index: int) -> bool:
    state = await partition_state(cluster.bootstrap, OFFSETS_TOPIC, index)
    return len(state.isr) == len(cluster.brokers)


async def test_aiokafka_commits_and_kafka_python_administers(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(SETTINGS)
    await create_orders(broker.bootstrap)
    # aiokafka speaks FindCoordinator v0-1, OffsetCommit v2-3 (with a retention time) and
    # OffsetFetch v1-3; kafka-python's admin the newest versions.
    tp = aiokafka.TopicPartition(TOPIC, 0)
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap, group_id="ak", enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([tp])  # no subscription: commits come from outside any generation
        await consumer.commit({tp: (42, "meta")})
        assert await consumer.committed(tp) == 42
    finally:
        await consumer.stop()

    admin = kafka.admin.KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        kp_tp = kafka.structs.TopicPartition(TOPIC, 0)
        offsets = await asyncio.to_thread(admin.list_group_offsets, "ak")
        assert (offsets["ak"][kp_tp].offset, offsets["ak"][kp_tp].metadata) == (42, "meta")
        # A group known only by its offsets: listed and described as Empty, without a protocol.
        listed = await asyncio.to_thread(admin.list_groups)
        assert listed == [{"group_id": "ak", "protocol_type": "", "group_state": "Empty"}]
        described = (await asyncio.to_thread(admin.describe_groups, ["ak"]))["ak"]
        assert (described["group_state"], described["members"]) == ("Empty", [])
        assert await asyncio.to_thread(admin.delete_groups, ["ak"]) == {"ak": "OK"}
        assert await asyncio.to_thread(admin.list_group_offsets, "ak") == {"ak": {}}
        assert await asyncio.to_thread(admin.list_groups) == []
    finally:
        await asyncio.to_thread(admin.close)
