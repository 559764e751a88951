"""OffsetForLeaderEpoch on a real broker: end offsets of each leader epoch at versions 2-4, its
errors, and the leader epoch checkpoint surviving a restart."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from confluent_kafka import Consumer, Message, TopicPartition
from riverbed import Admin, Producer
from riverbed.client.connection import BrokerConnection
from riverbed.configs import CONFIG_RULES
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.zk import AsyncZooKeeper
from riverbed.hot.storage.leader_epoch import LEADER_EPOCH_CHECKPOINT
from riverbed.protocol import messages as m
from riverbed.protocol.connection import NEED_DATA, ClientConnection, ResponseReceived
from riverbed.protocol.errors import ErrorCode

from tests.support.broker import HOST, BrokerProcess
from tests.support.partition_states import get_partition_state, update_partition_state

TOPIC = "epochs"
TIMEOUT_S = 30
VERSIONS = (2, 3, 4)
EpochEndOffset = m.OffsetForLeaderEpochResponse.EpochEndOffset


def request(
    leader_epoch: int, *, current_leader_epoch: int = -1, topic: str = TOPIC, partition: int = 0
) -> m.OffsetForLeaderEpochRequest:
    wanted = m.OffsetForLeaderEpochRequest.OffsetForLeaderPartition(
        partition=partition, current_leader_epoch=current_leader_epoch, leader_epoch=leader_epoch
    )
    return m.OffsetForLeaderEpochRequest(
        replica_id=-1,  # a consumer (v3+; v2 has no such field)
        topics=[
            m.OffsetForLeaderEpochRequest.OffsetForLeaderTopic(topic=topic, partitions=[wanted])
        ],
    )


async def send_at(broker: BrokerProcess, body: m.RequestBody, version: int) -> Any:
    """One request at exactly `version`, with the sans-IO codec over a fresh connection
    (BrokerConnection always picks the highest common version)."""
    reader, writer = await asyncio.open_connection(HOST, broker.port)
    try:
        codec = ClientConnection(client_id="epoch-test")
        writer.write(codec.send_request(body, version)[1])
        await writer.drain()
        while (event := codec.next_response()) is NEED_DATA:
            data = await asyncio.wait_for(reader.read(65536), TIMEOUT_S)
            assert data, "the broker closed the connection"
            codec.receive_data(data)
        assert isinstance(event, ResponseReceived)
        return event.body
    finally:
        writer.close()
        await writer.wait_closed()


async def end_offset(
    broker: BrokerProcess, body: m.OffsetForLeaderEpochRequest, version: int
) -> EpochEndOffset:
    response = await send_at(broker, body, version)
    assert isinstance(response, m.OffsetForLeaderEpochResponse)
    [topic] = response.topics
    [partition] = topic.partitions
    assert (topic.topic, partition.partition) == (
        body.topics[0].topic,
        body.topics[0].partitions[0].partition,
    )
    return partition


async def produce(broker: BrokerProcess, count: int) -> None:
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all") as producer:
        for i in range(count):
            await producer.send(TOPIC, b"value-%d" % i, partition=0)
        await producer.flush()


async def bump_leader_epoch(broker: BrokerProcess) -> int:
    """Write the partition state with the next leader epoch, as a controller would, and wait
    until the broker leads at it. Returns the new epoch."""
    async with AsyncZooKeeper(broker.zk_connect) as zk:
        store = ClusterMetadataStore(zk, CONFIG_RULES)
        state, version = await get_partition_state(store, TOPIC, 0)
        epoch = state.leader_epoch + 1
        new_state = type(state)(
            leader=state.leader,
            leader_epoch=epoch,
            isr=state.isr,
            controller_epoch=state.controller_epoch,
        )
        await update_partition_state(store, TOPIC, 0, new_state, version)
    deadline = time.monotonic() + TIMEOUT_S
    while (await end_offset(broker, request(epoch, current_leader_epoch=epoch), 4)).error_code:
        assert time.monotonic() < deadline, f"the broker never led at epoch {epoch}"
        await asyncio.sleep(0.05)
    return epoch


async def test_end_offsets_of_each_leader_epoch(broker: BrokerProcess) -> None:
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=1)
        first_epoch = (await admin.describe_topic(TOPIC)).partitions[0].leader_epoch
    await produce(broker, 5)
    second_epoch = await bump_leader_epoch(broker)
    await produce(broker, 3)
    answers = {
        # A finished epoch ends where the next one starts; the current one at the log end.
        first_epoch: (first_epoch, 5),
        second_epoch: (second_epoch, 8),
        second_epoch + 1: (-1, -1),  # above every epoch: undefined
        -1: (-1, -1),
    }
    for version in VERSIONS:
        for epoch, expected in answers.items():
            found = await end_offset(broker, request(epoch), version)
            assert (found.error_code, found.leader_epoch, found.end_offset) == (0, *expected), (
                f"v{version} epoch {epoch}"
            )
        current = await end_offset(
            broker, request(first_epoch, current_leader_epoch=second_epoch), version
        )
        assert (current.error_code, current.end_offset) == (0, 5)

    # The client's negotiated version is the highest, 4.
    connection = await BrokerConnection.open(HOST, broker.port)
    try:
        assert connection.version_for(m.OffsetForLeaderEpochRequest.API_KEY) == 4
        response = await connection.call(request(first_epoch), m.OffsetForLeaderEpochResponse)
        assert response.topics[0].partitions[0].end_offset == 5
    finally:
        await connection.close()

    # A clean shutdown leaves the cache on disk in Kafka's format (a running broker writes it
    # when its recovery point passes new epochs), and the restarted broker answers the same.
    broker.restart()
    checkpoint = broker.partition_dir(TOPIC, 0) / LEADER_EPOCH_CHECKPOINT
    assert checkpoint.read_text() == f"0\n2\n{first_epoch} 0\n{second_epoch} 5\n"
    for epoch in (first_epoch, second_epoch):
        deadline = time.monotonic() + TIMEOUT_S
        while (found := await end_offset(broker, request(epoch), 4)).error_code:
            assert time.monotonic() < deadline, ErrorCode(found.error_code)
            await asyncio.sleep(0.05)
        assert (found.leader_epoch, found.end_offset) == answers[epoch]


async def test_errors_per_partition(broker: BrokerProcess) -> None:
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=1)
    await produce(broker, 2)
    epoch = await bump_leader_epoch(broker)
    cases = {
        "unknown topic": (request(epoch, topic="nope"), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        "unknown partition": (request(epoch, partition=7), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        "fenced": (request(epoch, current_leader_epoch=epoch - 1), ErrorCode.FENCED_LEADER_EPOCH),
        "newer": (request(epoch, current_leader_epoch=epoch + 1), ErrorCode.UNKNOWN_LEADER_EPOCH),
    }
    for version in VERSIONS:
        for name, (body, code) in cases.items():
            found = await end_offset(broker, body, version)
            assert (found.error_code, found.leader_epoch, found.end_offset) == (code, -1, -1), (
                f"v{version} {name}"
            )


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


async def test_librdkafka_validates_its_position_after_an_epoch_change(
    broker: BrokerProcess,
) -> None:
    """KIP-320 in a real client: fenced at its old epoch, librdkafka asks OffsetForLeaderEpoch
    where its epoch ended, finds no truncation, and consumes on."""
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=1)
    await produce(broker, 5)
    debug = _Lines()
    client_log = logging.getLogger("librdkafka-epoch-test")
    client_log.addHandler(debug)
    client_log.setLevel(logging.DEBUG)
    client_log.propagate = False
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "epoch-test",
            "enable.auto.commit": False,
            "debug": "protocol,fetch",
            "logger": client_log,
        }
    )
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        messages = _consume(consumer, 5)
        epoch = await bump_leader_epoch(broker)
        await produce(broker, 3)
        messages += _consume(consumer, 3)
    finally:
        consumer.close()
        client_log.removeHandler(debug)
    assert [(m.offset(), m.leader_epoch()) for m in messages] == [
        *((offset, epoch - 1) for offset in range(5)),
        *((offset, epoch) for offset in range(5, 8)),
    ]
    # librdkafka's own words (debug "fetch"): the broker's answer matched its position.
    assert any(
        "offset and epoch validation succeeded: broker end offset 5" in line for line in debug.lines
    ), "\n".join(line for line in debug.lines if "Epoch" in line or "epoch" in line)


def _consume(consumer: Consumer, count: int) -> list[Message]:
    messages: list[Message] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(messages) < count and time.monotonic() < deadline:
        messages += [m for m in consumer.consume(count, 0.5) if m.error() is None]
    return messages
