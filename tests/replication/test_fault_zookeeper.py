"""A leader whose ZooKeeper session expires while it is frozen (SIGSTOP) is replaced; when it
thaws it must learn that from ZooKeeper, refuse writes, be fenced at its old leader epoch, and
come back as a follower under a new session, without losing an acknowledged record."""

from __future__ import annotations

import time
from typing import Final

from riverbed import Admin
from riverbed.client.admin import PartitionDescription
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records import encode_batch

from tests.replication.fault_support import (
    CHANGE_TIMEOUT_S,
    CLIENT_REQUEST_TIMEOUT_MS,
    PARTITION,
    SETTINGS,
    broker_output,
    connect,
    consume_all,
    create_replicated_topic,
    metadata_from,
    new_topic,
    producing,
    wait_for_acknowledgement,
    wait_for_new_leader,
    wait_in_isr,
)
from tests.support.cluster import ClusterFactory, TestCluster

ACKS_LEADER: Final = 1
ACKS_ALL: Final = -1
FETCH_MAX_BYTES: Final = 1024


async def leader_seen_by(cluster: TestCluster, broker_id: int, topic: str) -> tuple[int, int]:
    """(leader, leader epoch) of the partition in one broker's own metadata."""
    response = await metadata_from(cluster, broker_id, topic)
    (partition,) = response.topics[0].partitions
    return partition.leader_id, partition.leader_epoch


async def produce_directly(cluster: TestCluster, broker_id: int, topic: str, acks: int) -> int:
    """A one-record Produce sent to `broker_id` whatever it leads; the partition's error code."""
    batch = encode_batch([(None, b"stale", (), int(time.time() * 1000))])
    request = m.ProduceRequest(
        acks=acks,
        timeout_ms=CLIENT_REQUEST_TIMEOUT_MS,
        topic_data=[
            m.ProduceRequest.TopicProduceData(
                topic, [m.ProduceRequest.PartitionProduceData(index=PARTITION, records=batch)]
            )
        ],
    )
    async with connect(cluster, broker_id) as connection:
        response = await connection.call(request, m.ProduceResponse)
    (answer,) = response.responses[0].partition_responses
    return answer.error_code


async def fetch_at_epoch(
    cluster: TestCluster, broker_id: int, topic: str, description: PartitionDescription, epoch: int
) -> int:
    """A consumer Fetch naming `epoch` as the current leader epoch; the partition's error code."""
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        topic_id = (await admin.describe_topic(topic)).topic_id
    request = m.FetchRequest(
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=FETCH_MAX_BYTES,
        topics=[
            m.FetchRequest.FetchTopic(
                topic=topic,
                topic_id=topic_id,
                partitions=[
                    m.FetchRequest.FetchPartition(
                        partition=description.partition,
                        current_leader_epoch=epoch,
                        fetch_offset=0,
                        partition_max_bytes=FETCH_MAX_BYTES,
                    )
                ],
            )
        ],
    )
    async with connect(cluster, broker_id) as connection:
        response = await connection.call(request, m.FetchResponse)
    (answer,) = response.responses[0].partitions
    return answer.error_code


async def list_offsets_at_epoch(
    cluster: TestCluster, broker_id: int, topic: str, epoch: int
) -> int:
    """ListOffsets "latest" naming `epoch` as the current leader epoch; the error code."""
    request = m.ListOffsetsRequest(
        replica_id=-1,
        topics=[
            m.ListOffsetsRequest.ListOffsetsTopic(
                name=topic,
                partitions=[
                    m.ListOffsetsRequest.ListOffsetsPartition(
                        partition_index=PARTITION, current_leader_epoch=epoch, timestamp=-1
                    )
                ],
            )
        ],
    )
    async with connect(cluster, broker_id) as connection:
        response = await connection.call(request, m.ListOffsetsResponse)
    (answer,) = response.topics[0].partitions
    return answer.error_code


async def test_leader_with_an_expired_session_is_fenced_and_rejoins_as_follower(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, SETTINGS)
    topic = new_topic("expired")
    before = await create_replicated_topic(cluster, topic)
    old_leader = before.leader

    async with producing(cluster, topic) as acks:
        await wait_for_acknowledgement(cluster, acks)
        paused_at = time.monotonic()
        cluster.pause(old_leader)  # frozen longer than its session: ZooKeeper expires it
        after = await wait_for_new_leader(cluster, topic, before)
        moved_s = time.monotonic() - paused_at
        assert old_leader not in after.isr
        cluster.resume(old_leader)
        resumed_at = time.monotonic()

        # The thawed broker learns the new state from ZooKeeper...
        async def learned() -> bool:
            leader, epoch = await leader_seen_by(cluster, old_leader, topic)
            return leader != old_leader and epoch >= after.leader_epoch

        await cluster.wait_for(learned, CHANGE_TIMEOUT_S, what=f"broker {old_leader} to learn")
        learned_s = time.monotonic() - resumed_at
        # ... refuses writes ...
        for acks_setting in (ACKS_LEADER, ACKS_ALL):
            error = await produce_directly(cluster, old_leader, topic, acks_setting)
            assert error == ErrorCode.NOT_LEADER_OR_FOLLOWER, (acks_setting, error)
        # ... and requests at the old epoch are fenced wherever they land.
        for broker_id in cluster.brokers:
            error = await fetch_at_epoch(cluster, broker_id, topic, before, before.leader_epoch)
            assert error == ErrorCode.FENCED_LEADER_EPOCH, (broker_id, error)
            error = await list_offsets_at_epoch(cluster, broker_id, topic, before.leader_epoch)
            assert error == ErrorCode.FENCED_LEADER_EPOCH, (broker_id, error)

        # It registered again under a new session and follows the new leader into the ISR.
        await cluster.wait_registered()
        output = broker_output(cluster, old_leader)
        assert f"event=broker.reregistered broker={old_leader}" in output
        rejoined = await wait_in_isr(cluster, topic, old_leader)
        rejoined_s = time.monotonic() - resumed_at
        assert rejoined.leader == after.leader
        await wait_for_acknowledgement(cluster, acks)
    print(
        f"leader {old_leader} frozen: leader {after.leader} at epoch {after.leader_epoch} after "
        f"{moved_s:.2f} s; thawed, it knew {learned_s:.2f} s later and was back in the ISR "
        f"after {rejoined_s:.2f} s"
    )

    acks.check_all_acknowledged_in_order()
    assert await consume_all(cluster, topic) == list(range(acks.sent))
