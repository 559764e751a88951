"""CreatePartitions (API 37) on three brokers, through the admin clients of confluent-kafka
(librdkafka), kafka-python and aiokafka, Riverbed's Admin and its CLI:

- the answer comes once the answering broker (the controller) lists every new partition with
  its leader; the new partitions' preferred leaders go on round the brokers from the topic's
  own, and records produced to a new partition are consumed back;
- a count that is not larger is refused with INVALID_PARTITIONS, an unknown topic with
  UNKNOWN_TOPIC_OR_PARTITION, a bad manual assignment with INVALID_REPLICA_ASSIGNMENT, a topic
  named twice with INVALID_REQUEST; validate_only changes nothing;
- a client that asks a broker that is not the controller gets NOT_CONTROLLER and retries at the
  controller on its own;
- producers and consumer groups (librdkafka's and Riverbed's) take up the new partitions.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Final

import confluent_kafka
import kafka.admin
import kafka.errors
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewPartitions as AioNewPartitions
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from riverbed import Admin, Consumer, Producer, TopicPartition
from riverbed.client.connection import BrokerConnection
from riverbed.coordination.embedded_zk import EmbeddedZooKeeper
from riverbed.errors import TopicError, UnknownTopicOrPartitionError
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

from tests.broker.test_cli import riverbed
from tests.interop.drivers import ConfluentKafka, Message
from tests.support.cluster import TestCluster, shared_cluster, wait_for

TIMEOUT_S: Final = 30.0
REQUEST_TIMEOUT_MS: Final = 20_000
BROKERS: Final = (1, 2, 3)
# librdkafka's topic.metadata.refresh.interval.ms and Riverbed's metadata_max_age_ms in the
# group tests: how soon a member's metadata shows the new partitions.
METADATA_REFRESH_MS: Final = 500


@pytest.fixture(scope="module")
def cluster(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestCluster]:
    """Three brokers shared by this module's tests (each test uses topics of its own)."""
    home = tmp_path_factory.mktemp("create-partitions")
    with shared_cluster(zookeeper.connect_string, home) as made:
        yield made


def new_name(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def confluent_admin(cluster: TestCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def create_topic(cluster: TestCluster, topic: str, partitions: int, replicas: int) -> None:
    admin = confluent_admin(cluster)
    futures = admin.create_topics(
        [NewTopic(topic, partitions, replicas)], operation_timeout=TIMEOUT_S
    )
    futures[topic].result(TIMEOUT_S)


def confluent_grow(admin: AdminClient, grown: NewPartitions, **options: object) -> None:
    """Raises KafkaException with the topic's error; waits on the broker as long as we do."""
    futures = admin.create_partitions([grown], operation_timeout=TIMEOUT_S, **options)
    futures[grown.topic].result(TIMEOUT_S)


def confluent_error(admin: AdminClient, grown: NewPartitions, **options: object) -> tuple[int, str]:
    with pytest.raises(confluent_kafka.KafkaException) as failed:
        confluent_grow(admin, grown, **options)
    error = failed.value.args[0]
    return error.code(), error.str()


async def controller_of(cluster: TestCluster) -> int:
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        return (await admin.describe_cluster()).controller_id


async def connect(cluster: TestCluster, broker_id: int) -> BrokerConnection:
    host, _, port = cluster.brokers[broker_id].bootstrap.rpartition(":")
    return await BrokerConnection.open(host, int(port), client_id="create-partitions-test")


async def described(
    cluster: TestCluster, broker_id: int, topic: str
) -> m.MetadataResponse.MetadataResponseTopic:
    """The topic as broker `broker_id` describes it in Metadata."""
    connection = await connect(cluster, broker_id)
    try:
        request = m.MetadataRequest(
            topics=[m.MetadataRequest.MetadataRequestTopic(name=topic)],
            allow_auto_topic_creation=False,
        )
        response = await connection.call(request, m.MetadataResponse)
    finally:
        await connection.close()
    (found,) = response.topics
    return found


async def listed(
    cluster: TestCluster, broker_id: int, topic: str
) -> list[m.MetadataResponse.MetadataResponsePartition]:
    """The topic's partitions as broker `broker_id` lists them in Metadata, by index."""
    found = await described(cluster, broker_id, topic)
    assert found.error_code == ErrorCode.NONE, found
    return sorted(found.partitions, key=lambda p: p.partition_index)


def listed_by_controller(
    cluster: TestCluster, topic: str
) -> list[m.MetadataResponse.MetadataResponsePartition]:
    async def ask() -> list[m.MetadataResponse.MetadataResponsePartition]:
        return await listed(cluster, await controller_of(cluster), topic)

    return asyncio.run(ask())


async def listed_everywhere(cluster: TestCluster, topic: str, count: int) -> None:
    """Until every broker lists the topic's `count` partitions: the answering broker has them at
    once, the others a moment later (as with Kafka), and a client may ask any of them."""

    async def everywhere() -> bool:
        topics = [await described(cluster, broker_id, topic) for broker_id in BROKERS]
        return all(t.error_code == ErrorCode.NONE and len(t.partitions) == count for t in topics)

    await wait_for(everywhere, TIMEOUT_S, what=f"{count} partitions of {topic} on every broker")


def round_robin_from(first_leader: int, count: int) -> list[int]:
    """Preferred leaders of partitions 0..count-1 going round BROKERS from partition 0's."""
    return [BROKERS[(BROKERS.index(first_leader) + p) % len(BROKERS)] for p in range(count)]


# -- growth, visible at once, and carrying records ------------------------------------------------


def test_confluent_adds_partitions_the_controller_lists_with_leaders_at_once(
    cluster: TestCluster,
) -> None:
    topic = new_name("grown")
    create_topic(cluster, topic, partitions=2, replicas=3)
    confluent_grow(confluent_admin(cluster), NewPartitions(topic, 5))

    partitions = listed_by_controller(cluster, topic)  # right after the answer, no polling
    assert [p.partition_index for p in partitions] == [0, 1, 2, 3, 4]
    for p in partitions:
        assert p.error_code == ErrorCode.NONE
        assert p.leader_id == p.replica_nodes[0]
        assert sorted(p.replica_nodes) == list(BROKERS)
        assert sorted(p.isr_nodes) == list(BROKERS)
        assert p.leader_epoch == 0
    leaders = [p.leader_id for p in partitions]
    assert leaders == round_robin_from(leaders[0], 5)

    asyncio.run(listed_everywhere(cluster, topic, 5))
    driver = ConfluentKafka(cluster.bootstrap)
    sent = {p: Message(b"k", f"to {p}".encode(), (), 1_700_000_000_000 + p) for p in (2, 3, 4)}
    for partition, message in sent.items():
        assert driver.produce(topic, partition, [message]) == [0]
    for partition, message in sent.items():
        (consumed,) = driver.consume(topic, partition, 0, 1)
        assert consumed.offset == 0
        assert consumed.message.value == message.value


@pytest.mark.parametrize("library", ["kafka-python", "aiokafka"])
def test_kafka_python_and_aiokafka_add_partitions(cluster: TestCluster, library: str) -> None:
    topic = new_name(library)
    create_topic(cluster, topic, partitions=1, replicas=2)
    if library == "kafka-python":
        admin = kafka.admin.KafkaAdminClient(
            bootstrap_servers=cluster.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS
        )
        try:
            admin.create_partitions({topic: 3})
            # A manual assignment: partition 3 on brokers 3 and 1, 3 preferred.
            admin.create_partitions({topic: {"count": 4, "assignments": [[3, 1]]}})
        finally:
            admin.close()
    else:
        asyncio.run(_aiokafka_grow(cluster.bootstrap, topic))
    partitions = listed_by_controller(cluster, topic)
    assert [p.partition_index for p in partitions] == [0, 1, 2, 3]
    assert all(len(p.replica_nodes) == 2 for p in partitions)
    assert all(p.leader_id == p.replica_nodes[0] for p in partitions)
    assert list(partitions[3].replica_nodes) == [3, 1]


async def _aiokafka_grow(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS)
    await admin.start()
    try:
        await admin.create_partitions({topic: AioNewPartitions(3)})
        await admin.create_partitions({topic: AioNewPartitions(4, [[3, 1]])})
    finally:
        await admin.close()


# -- refusals -------------------------------------------------------------------------------------


def test_confluent_is_refused_what_kafka_refuses(cluster: TestCluster) -> None:
    admin = confluent_admin(cluster)
    topic = new_name("refused")
    create_topic(cluster, topic, partitions=3, replicas=1)

    code, message = confluent_error(admin, NewPartitions(topic, 3))
    assert code == ErrorCode.INVALID_PARTITIONS
    assert f"topic '{topic}' already has 3 partitions" in message
    code, message = confluent_error(admin, NewPartitions(topic, 2))
    assert code == ErrorCode.INVALID_PARTITIONS
    assert "has 3 partitions, more than the 2 asked for" in message
    code, _ = confluent_error(admin, NewPartitions(new_name("missing"), 2))
    assert code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    code, message = confluent_error(admin, NewPartitions(topic, 4, replica_assignment=[[1, 9]]))
    assert code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert "unknown or stopped brokers [9]" in message
    # Checked, and nothing added.
    confluent_grow(admin, NewPartitions(topic, 6), validate_only=True)
    assert len(listed_by_controller(cluster, topic)) == 3


def test_kafka_python_is_refused_a_bad_manual_assignment(cluster: TestCluster) -> None:
    topic = new_name("bad-assignment")
    create_topic(cluster, topic, partitions=1, replicas=2)
    admin = kafka.admin.KafkaAdminClient(
        bootstrap_servers=cluster.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    try:
        for assignments in ([[1, 1]], [[1]], [[1, 2], [2, 3]]):
            with pytest.raises(kafka.errors.InvalidReplicationAssignmentError):
                admin.create_partitions({topic: {"count": 2, "assignments": assignments}})
    finally:
        admin.close()
    assert len(listed_by_controller(cluster, topic)) == 1


async def test_every_version_is_answered_and_only_by_the_controller(cluster: TestCluster) -> None:
    """Riverbed's connection at each version: a broker that is not the controller answers
    NOT_CONTROLLER for every topic; the controller answers a topic named twice once, with
    INVALID_REQUEST, keeps __consumer_offsets' partition count, and with timeout_ms 0 answers
    without waiting."""
    topic = new_name("versions")
    await asyncio.to_thread(create_topic, cluster, topic, 1, 1)
    controller = await controller_of(cluster)
    other = next(i for i in BROKERS if i != controller)
    connections = {i: await connect(cluster, i) for i in (controller, other)}
    Topic = m.CreatePartitionsRequest.CreatePartitionsTopic
    try:
        for version in range(4):
            for connection in connections.values():
                connection._versions[m.CreatePartitionsRequest.API_KEY] = version
            count = version + 2
            request = m.CreatePartitionsRequest(
                topics=[Topic(topic, count), Topic("__consumer_offsets", 99)],
                timeout_ms=REQUEST_TIMEOUT_MS,
            )
            refused = await connections[other].call(request, m.CreatePartitionsResponse)
            assert [(r.name, r.error_code) for r in refused.results] == [
                (topic, ErrorCode.NOT_CONTROLLER),
                ("__consumer_offsets", ErrorCode.NOT_CONTROLLER),
            ]
            answer = await connections[controller].call(request, m.CreatePartitionsResponse)
            assert [(r.name, r.error_code) for r in answer.results] == [
                (topic, ErrorCode.NONE),
                ("__consumer_offsets", ErrorCode.INVALID_REQUEST),
            ]
            assert "partition count of __consumer_offsets" in str(answer.results[1].error_message)
            assert len(await listed(cluster, controller, topic)) == count
            twice = m.CreatePartitionsRequest(
                topics=[Topic(topic, 9), Topic(topic, 10)], timeout_ms=REQUEST_TIMEOUT_MS
            )
            answer = await connections[controller].call(twice, m.CreatePartitionsResponse)
            assert [(r.name, r.error_code) for r in answer.results] == [
                (topic, ErrorCode.INVALID_REQUEST)
            ]
        # timeout_ms 0: answered without waiting for the controller's metadata, as Kafka does.
        at_once = m.CreatePartitionsRequest(topics=[Topic(topic, 6)], timeout_ms=0)
        answer = await connections[controller].call(at_once, m.CreatePartitionsResponse)
        assert [(r.name, r.error_code) for r in answer.results] == [(topic, ErrorCode.NONE)]
    finally:
        for connection in connections.values():
            await connection.close()

    async def six() -> bool:
        return len(await listed(cluster, controller, topic)) == 6

    await wait_for(six, TIMEOUT_S, what=f"6 partitions of {topic} on broker {controller}")


# -- NOT_CONTROLLER, retried by the clients -------------------------------------------------------


def test_kafka_python_retries_at_the_controller(cluster: TestCluster) -> None:
    topic = new_name("kp-not-controller")
    create_topic(cluster, topic, partitions=1, replicas=1)
    controller = asyncio.run(controller_of(cluster))
    admin = kafka.admin.KafkaAdminClient(
        bootstrap_servers=cluster.bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS
    )
    try:
        # What it believes after the controller moved away from a broker it knew.
        admin._controller_id = next(i for i in BROKERS if i != controller)
        admin.create_partitions({topic: 2})
        assert admin._controller_id == controller
    finally:
        admin.close()
    assert len(listed_by_controller(cluster, topic)) == 2


async def test_riverbeds_admin_adds_partitions_and_retries_at_the_controller(
    cluster: TestCluster,
) -> None:
    topic = new_name("riverbed-admin")
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=2)
        controller = (await admin.describe_cluster()).controller_id
        await admin.create_partitions(topic, partitions=2, validate_only=True)
        assert len(await listed(cluster, controller, topic)) == 1
        admin._pool.cluster.controller_id = next(i for i in BROKERS if i != controller)
        await admin.create_partitions(topic, partitions=3)
        assert admin._pool.cluster.controller_id == controller
        assert len(await listed(cluster, controller, topic)) == 3
        await admin.create_partitions(topic, partitions=4, replicas=[[2, 3]])
        # The controller has it at once; other brokers may lag a moment, as in Kafka.
        partitions = await listed(cluster, controller, topic)
        assert list(partitions[3].replica_nodes) == [2, 3]
        with pytest.raises(TopicError, match="already has 4 partitions") as refused:
            await admin.create_partitions(topic, partitions=4)
        assert refused.value.code == ErrorCode.INVALID_PARTITIONS
        with pytest.raises(UnknownTopicOrPartitionError):
            await admin.create_partitions(new_name("missing"), partitions=2)


# -- the CLI ---------------------------------------------------------------------------------------


def test_cli_topics_alter_adds_partitions(cluster: TestCluster) -> None:
    # The controller: it answers, so it shows each change at once (other brokers may lag).
    controller = asyncio.run(controller_of(cluster))
    server = ("--bootstrap-server", cluster.brokers[controller].bootstrap)
    topic = new_name("cli")
    assert riverbed("topics", "create", topic, "--partitions", "2", *server).returncode == 0
    grown = riverbed("topics", "alter", topic, "--partitions", "4", *server)
    assert grown.returncode == 0, grown.stderr
    assert grown.stdout.strip() == f"topic {topic} has 4 partitions"
    described = json.loads(riverbed("topics", "describe", topic, "--json", *server).stdout)
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2, 3]
    assert all(p["leader"] in BROKERS for p in described["partitions"])
    # Configs and partitions in one command; then a count that is no increase.
    both = riverbed(
        "topics", "alter", topic, "--set", "retention.ms=60000", "--partitions", "5", *server
    )
    assert both.returncode == 0, both.stderr
    assert both.stdout.splitlines() == [f"altered topic {topic}", f"topic {topic} has 5 partitions"]
    shrink = riverbed("topics", "alter", topic, "--partitions", "3", *server)
    assert shrink.returncode == 1
    assert shrink.stderr.strip().count("\n") == 0
    assert "INVALID_PARTITIONS" in shrink.stderr
    assert "more than the 3 asked for" in shrink.stderr


# -- producers and consumer groups take up the new partitions -------------------------------------


async def test_a_running_producer_spreads_keys_over_the_new_partitions(
    cluster: TestCluster,
) -> None:
    """Riverbed's producer, started on one partition: once its metadata shows the new ones,
    keyed records land on them too (murmur2 over the new count)."""
    topic = new_name("keyed")
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=1)
        async with Producer(
            bootstrap_servers=cluster.bootstrap, metadata_max_age_ms=METADATA_REFRESH_MS
        ) as producer:
            before = await producer.send_and_wait(topic, b"v", key=b"k-0")
            assert before.partition == 0
            await admin.create_partitions(topic, partitions=4)
            landed: set[int] = set()
            deadline = time.monotonic() + TIMEOUT_S
            key = 0
            while landed != {0, 1, 2, 3}:
                assert time.monotonic() < deadline, f"records landed on {landed} only"
                key += 1
                sent = await producer.send_and_wait(topic, b"v", key=f"k-{key}".encode())
                landed.add(sent.partition)
                if key % 50 == 0:
                    await asyncio.sleep(METADATA_REFRESH_MS / 1000)  # the refresh is the subject


def test_a_librdkafka_group_takes_up_the_new_partitions(cluster: TestCluster) -> None:
    topic = new_name("confluent-group")
    create_topic(cluster, topic, partitions=1, replicas=2)
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": new_name("group"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
        }
    )
    try:
        consumer.subscribe([topic])

        def assigned() -> bool:
            consumer.poll(0.2)  # joins the group; partition 0 has no record to lose
            return len(consumer.assignment()) == 1

        _until(assigned, "partition 0 assigned")
        confluent_grow(confluent_admin(cluster), NewPartitions(topic, 3))
        asyncio.run(listed_everywhere(cluster, topic, 3))
        driver = ConfluentKafka(cluster.bootstrap)
        for partition in (1, 2):
            driver.produce(topic, partition, [Message(None, b"new", (), 1_700_000_000_000)])
        seen: set[int] = set()

        def both_read() -> bool:
            for record in consumer.consume(10, 0.2):
                partition = record.partition()
                assert record.error() is None, record.error()
                assert partition is not None
                seen.add(partition)
            return seen == {1, 2}

        _until(both_read, "records of partitions 1 and 2")
        assert {tp.partition for tp in consumer.assignment()} == {0, 1, 2}
    finally:
        consumer.close()


def _until(done: Callable[[], bool], what: str) -> None:
    """Call `done` (which polls the consumer) until it is true, for at most TIMEOUT_S."""
    deadline = time.monotonic() + TIMEOUT_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"


async def test_a_riverbed_group_takes_up_the_new_partitions(cluster: TestCluster) -> None:
    topic = new_name("riverbed-group")
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic(topic, partitions=1, replication_factor=2)
        async with Consumer(
            bootstrap_servers=cluster.bootstrap,
            group_id=new_name("group"),
            auto_offset_reset="earliest",
            metadata_max_age_ms=METADATA_REFRESH_MS,
        ) as consumer:
            consumer.subscribe([topic])
            deadline = time.monotonic() + TIMEOUT_S
            while consumer.assignment() != {TopicPartition(topic, 0)}:
                assert time.monotonic() < deadline, "partition 0 never assigned"
                await consumer.getmany(timeout_ms=200)
            await admin.create_partitions(topic, partitions=3)
            await listed_everywhere(cluster, topic, 3)
            async with Producer(bootstrap_servers=cluster.bootstrap) as producer:
                for partition in (1, 2):
                    await producer.send_and_wait(topic, b"new", partition=partition)
            seen: set[int] = set()
            while seen != {1, 2}:
                assert time.monotonic() < deadline + TIMEOUT_S, f"read only from {seen}"
                batches = await consumer.getmany(timeout_ms=200)
                seen.update(tp.partition for tp, records in batches.items() if records)
            assert consumer.assignment() == {TopicPartition(topic, p) for p in range(3)}
