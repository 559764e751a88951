"""Requests that write to ZooKeeper while it is down: each is answered with a retriable Kafka
error code once its bound has passed (the request's timeout, at most the ZooKeeper session
timeout), on a connection that stays open and usable; produce and fetch go on meanwhile; and
once ZooKeeper is back the same requests succeed.

The broker runs against a ZooKeeper server of this test alone (the `zk_connect` fixture is
overridden here), which the test stops and starts.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final, TypeVar

import pytest
from riverbed import Consumer, Producer, TopicPartition
from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.cluster import wait_for
from tests.support.zookeeper import DedicatedZooKeeper, restart_proof_connect

HOST: Final = "127.0.0.1"
SESSION_TIMEOUT_MS: Final = 4_000
CREATE_TIMEOUT_MS: Final = 1_500
# What an answer may take beyond its bound on a loaded CI machine.
ANSWER_MARGIN_S: Final = 3.0
TOPIC: Final = "kept"
R = TypeVar("R")


@pytest.fixture
def zk_connect(own_zookeeper: DedicatedZooKeeper) -> str:
    return restart_proof_connect(own_zookeeper.server, "/admin-outage")


def create_request(timeout_ms: int, *names: str) -> m.CreateTopicsRequest:
    topics = [
        m.CreateTopicsRequest.CreatableTopic(
            name=name, num_partitions=1, replication_factor=1, configs=[]
        )
        for name in names
    ]
    return m.CreateTopicsRequest(topics=topics, timeout_ms=timeout_ms)


def grow_request(timeout_ms: int, topic: str, count: int) -> m.CreatePartitionsRequest:
    grown = m.CreatePartitionsRequest.CreatePartitionsTopic(name=topic, count=count)
    return m.CreatePartitionsRequest(topics=[grown], timeout_ms=timeout_ms)


def alter_request(topic: str) -> m.IncrementalAlterConfigsRequest:
    entry = m.IncrementalAlterConfigsRequest.AlterableConfig(
        name="retention.ms", config_operation=0, value="3600000"
    )
    resource = m.IncrementalAlterConfigsRequest.AlterConfigsResource(
        resource_type=2, resource_name=topic, configs=[entry]
    )
    return m.IncrementalAlterConfigsRequest(resources=[resource], validate_only=False)


INIT_PRODUCER_ID: Final = m.InitProducerIdRequest(
    transactional_id=None, transaction_timeout_ms=60_000
)


async def produce_and_read(broker: BrokerProcess, values: list[bytes]) -> list[bytes]:
    """acks=1 produce of `values` to TOPIC, then every value of TOPIC read back."""
    bootstrap = f"{HOST}:{broker.port}"
    async with Producer(bootstrap_servers=bootstrap, acks=1, enable_idempotence=False) as p:
        for value in values:
            await p.send(TOPIC, value, partition=0)
        await p.flush()
    read: list[bytes] = []
    async with Consumer(bootstrap_servers=bootstrap) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0)])
        await consumer.seek_to_beginning()
        async with asyncio.timeout(30):
            while True:
                batches = await consumer.getmany(timeout_ms=500)
                if not batches:
                    return read
                read.extend(r.value or b"" for records in batches.values() for r in records)


async def timed(
    connection: BrokerConnection, request: m.RequestBody, answer: type[R]
) -> tuple[R, float]:
    """The broker's answer, and the seconds it took."""
    started = time.monotonic()
    response = await connection.call(request, answer, timeout_ms=60_000)
    return response, time.monotonic() - started


async def test_zookeeper_writes_are_answered_with_retriable_errors_while_it_is_down(
    broker_factory: BrokerFactory, own_zookeeper: DedicatedZooKeeper
) -> None:
    broker = broker_factory({"zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS)})
    connection = await BrokerConnection.open(HOST, broker.port)
    try:
        created = await connection.call(create_request(30_000, TOPIC), m.CreateTopicsResponse)
        assert created.topics[0].error_code == ErrorCode.NONE
        assert await produce_and_read(broker, [b"before"]) == [b"before"]

        await own_zookeeper.stop()
        # CreateTopics: bounded by its own timeout_ms, for all its topics together.
        create_answer, took_s = await timed(
            connection,
            create_request(CREATE_TIMEOUT_MS, "during", "during-2", "during-3", "during-4"),
            m.CreateTopicsResponse,
        )
        assert [r.error_code for r in create_answer.topics] == [ErrorCode.REQUEST_TIMED_OUT] * 4
        for result in create_answer.topics:
            assert "ZooKeeper did not answer within 1500 ms" in (result.error_message or "")
        assert CREATE_TIMEOUT_MS / 1000 <= took_s < CREATE_TIMEOUT_MS / 1000 + ANSWER_MARGIN_S
        # CreatePartitions: bounded by its own timeout_ms as well.
        grow_answer, took_s = await timed(
            connection, grow_request(CREATE_TIMEOUT_MS, TOPIC, 2), m.CreatePartitionsResponse
        )
        (grown,) = grow_answer.results
        assert grown.error_code == ErrorCode.REQUEST_TIMED_OUT, grown
        assert "ZooKeeper did not answer within 1500 ms" in (grown.error_message or "")
        assert CREATE_TIMEOUT_MS / 1000 <= took_s < CREATE_TIMEOUT_MS / 1000 + ANSWER_MARGIN_S
        # IncrementalAlterConfigs has no timeout of its own: the session timeout bounds it.
        alter_answer, took_s = await timed(
            connection, alter_request(TOPIC), m.IncrementalAlterConfigsResponse
        )
        (altered,) = alter_answer.responses
        assert altered.error_code == ErrorCode.REQUEST_TIMED_OUT, altered
        assert SESSION_TIMEOUT_MS / 1000 <= took_s < SESSION_TIMEOUT_MS / 1000 + ANSWER_MARGIN_S
        # InitProducerId needs a producer id block from ZooKeeper: the code clients retry.
        init_answer, took_s = await timed(connection, INIT_PRODUCER_ID, m.InitProducerIdResponse)
        assert init_answer.error_code == ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert took_s < SESSION_TIMEOUT_MS / 1000 + ANSWER_MARGIN_S
        # The connection still serves, and so does the broker: produce and fetch go on.
        metadata = await connection.call(
            m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name=TOPIC)]),
            m.MetadataResponse,
        )
        assert metadata.topics[0].error_code == ErrorCode.NONE
        assert await produce_and_read(broker, [b"during"]) == [b"before", b"during"]

        await own_zookeeper.start()
        # The same requests now succeed (the timed-out create may have been applied once
        # ZooKeeper came back, as Kafka's REQUEST_TIMED_OUT allows: then it already exists).
        async with asyncio.timeout(30):
            while True:
                create_answer = await connection.call(
                    create_request(10_000, "during"), m.CreateTopicsResponse
                )
                code = create_answer.topics[0].error_code
                if code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                    break
                await asyncio.sleep(0.2)  # still reconnecting: REQUEST_TIMED_OUT again
        alter_answer = await connection.call(
            alter_request(TOPIC), m.IncrementalAlterConfigsResponse
        )
        assert alter_answer.responses[0].error_code == ErrorCode.NONE
        grow_answer = await connection.call(
            grow_request(10_000, TOPIC, 2), m.CreatePartitionsResponse
        )
        # INVALID_PARTITIONS if the timed-out request was applied once ZooKeeper came back.
        assert grow_answer.results[0].error_code in (ErrorCode.NONE, ErrorCode.INVALID_PARTITIONS)
        init_answer = await connection.call(INIT_PRODUCER_ID, m.InitProducerIdResponse)
        assert init_answer.error_code == ErrorCode.NONE
        assert init_answer.producer_id >= 0
    finally:
        await connection.close()


def reassign_request(topic: str, replicas: list[int], timeout_ms: int) -> m.RequestBody:
    partition = m.AlterPartitionReassignmentsRequest.ReassignablePartition(
        partition_index=0, replicas=replicas
    )
    return m.AlterPartitionReassignmentsRequest(
        timeout_ms=timeout_ms,
        topics=[
            m.AlterPartitionReassignmentsRequest.ReassignableTopic(
                name=topic, partitions=[partition]
            )
        ],
    )


async def test_controller_requests_are_answered_while_zookeeper_is_down(
    broker_factory: BrokerFactory, own_zookeeper: DedicatedZooKeeper
) -> None:
    """Work handed to the controller that needs ZooKeeper (a replica move): the requester stops
    waiting at the request's timeout with REQUEST_TIMED_OUT; the controller goes on with it."""
    settings = {"zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS)}
    brokers = {i: broker_factory(settings, broker_id=i) for i in (1, 2)}
    connections = {i: await BrokerConnection.open(HOST, b.port) for i, b in brokers.items()}
    try:
        any_connection = connections[1]

        async def controller_id() -> int:
            metadata = await any_connection.call(m.MetadataRequest(topics=[]), m.MetadataResponse)
            return int(metadata.controller_id)

        async def elected() -> bool:
            return await controller_id() in brokers

        await wait_for(elected, 30, what="a controller among the brokers")
        controller = connections[await controller_id()]
        created = await controller.call(create_request(30_000, "moving"), m.CreateTopicsResponse)
        assert created.topics[0].error_code == ErrorCode.NONE
        metadata = await controller.call(
            m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name="moving")]),
            m.MetadataResponse,
        )
        (replica,) = metadata.topics[0].partitions[0].replica_nodes
        elsewhere = next(i for i in brokers if i != replica)

        await own_zookeeper.stop()
        answer, took_s = await timed(
            controller,
            reassign_request("moving", [elsewhere], CREATE_TIMEOUT_MS),
            m.AlterPartitionReassignmentsResponse,
        )
        assert answer.error_code == ErrorCode.REQUEST_TIMED_OUT, answer
        message = answer.error_message or ""
        assert took_s < CREATE_TIMEOUT_MS / 1000 + ANSWER_MARGIN_S
        if "ZooKeeper connection lost mid-request" not in message:
            # The usual case: the broker already knew ZooKeeper was gone, the move waits for
            # it and the requester stops waiting at its timeout. (When the stop races the
            # request, the controller's write fails at once with ConnectionLoss and it answers
            # the same retriable code straight away, which is the branch above.)
            assert "the controller did not answer within 1500 ms" in message, answer
            assert took_s >= CREATE_TIMEOUT_MS / 1000
        # The connection still serves.
        assert await controller_id() in brokers
        await own_zookeeper.start()
    finally:
        for connection in connections.values():
            await connection.close()
