"""What the fault tests share: cluster settings, topic setup, waiting on a partition's state,
producers of sequence numbers, reading a partition back, and comparing replicas' files.

Every test uses one partition (index 0) per topic, replicated to every broker of its cluster,
and values that are sequence numbers (0, 1, 2, ...), so "what was acknowledged" and "what is in
the log" can be compared exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Final

import confluent_kafka
from riverbed import Admin, Consumer, Producer, TopicPartition
from riverbed.client.admin import PartitionDescription
from riverbed.client.connection import BrokerConnection
from riverbed.client.types import RecordMetadata
from riverbed.protocol import messages as m

from tests.support.broker import HOST
from tests.support.cluster import TestCluster, partition_state

# A killed broker's leaderships move once its ZooKeeper session expires, so the session timeout
# is most of every failover. The test ZooKeeper's tick is 100 ms (sessions from 200 ms).
SESSION_TIMEOUT_MS: Final = 3_000
LAG_TIME_MAX_MS: Final = 2_000
SETTINGS: Final[Mapping[str, str]] = {
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "replica.lag.time.max.ms": str(LAG_TIME_MAX_MS),
}
PARTITION: Final = 0
# Any one change the tests wait for (an election, an ISR change, a catch-up) takes a session
# timeout or two; this leaves room for a busy 2-core machine.
CHANGE_TIMEOUT_S: Final = 30.0
CHANGE_TIMEOUT_MS: Final = int(CHANGE_TIMEOUT_S * 1000)
# Requests of the tests' own clients: short, so that one sent to a frozen broker is retried
# elsewhere soon.
CLIENT_REQUEST_TIMEOUT_MS: Final = 5_000
CONSUME_POLL_MS: Final = 1_000
# Producers under test send one record per interval: thousands of records, many batches.
SEND_INTERVAL_S: Final = 0.005
LINGER_MS: Final = 5
# Generous: every record must outlive every failover and be acknowledged in the end.
DELIVERY_TIMEOUT_MS: Final = 120_000


def new_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def encode(sequence: int) -> bytes:
    return str(sequence).encode()


def decode(value: bytes | None) -> int:
    if value is None:
        raise AssertionError("a record without a value")
    return int(value)


# -- partition state ------------------------------------------------------------------------


async def create_replicated_topic(
    cluster: TestCluster, topic: str, configs: Mapping[str, str] | None = None
) -> PartitionDescription:
    """One partition on every broker; returns its state once the whole replica set is in sync."""
    async with Admin(
        bootstrap_servers=cluster.bootstrap, request_timeout_ms=CHANGE_TIMEOUT_MS
    ) as admin:
        await admin.create_topic(
            topic, partitions=1, replication_factor=len(cluster.brokers), configs=configs
        )
    return await wait_for_state(cluster, topic, fully_in_sync, "every replica in the ISR")


def fully_in_sync(state: PartitionDescription) -> bool:
    return state.leader >= 0 and sorted(state.isr) == sorted(state.replicas)


async def wait_for_state(
    cluster: TestCluster,
    topic: str,
    predicate: Callable[[PartitionDescription], bool],
    what: str,
    timeout_s: float = CHANGE_TIMEOUT_S,
    *,
    via: int | None = None,
) -> PartitionDescription:
    """Poll Metadata (from any running broker, or from broker `via` only) until the partition's
    state satisfies `predicate`; return that state. A broker answers from its own cache, which
    lags behind ZooKeeper, the more so just after it was frozen."""

    async def check() -> PartitionDescription | None:
        bootstrap = cluster.bootstrap if via is None else cluster.brokers[via].bootstrap
        state = await partition_state(bootstrap, topic, PARTITION)
        return state if predicate(state) else None

    return await cluster.wait_for(check, timeout_s, what=f"{topic}: {what}")


async def wait_for_new_leader(
    cluster: TestCluster, topic: str, before: PartitionDescription
) -> PartitionDescription:
    """A leader other than `before.leader`, at a higher leader epoch."""

    def moved(state: PartitionDescription) -> bool:
        return state.leader not in (before.leader, -1) and state.leader_epoch > before.leader_epoch

    return await wait_for_state(cluster, topic, moved, f"a leader other than {before.leader}")


async def wait_in_isr(
    cluster: TestCluster, topic: str, broker_id: int, *, via: int | None = None
) -> PartitionDescription:
    return await wait_for_state(
        cluster,
        topic,
        lambda state: broker_id in state.isr,
        f"broker {broker_id} in the ISR",
        via=via,
    )


async def metadata_from(cluster: TestCluster, broker_id: int, topic: str) -> m.MetadataResponse:
    """One broker's own Metadata answer (its cache), not the cluster's."""
    async with connect(cluster, broker_id) as connection:
        request = m.MetadataRequest(
            topics=[m.MetadataRequest.MetadataRequestTopic(name=topic)],
            allow_auto_topic_creation=False,
        )
        return await connection.call(
            request, m.MetadataResponse, timeout_ms=CLIENT_REQUEST_TIMEOUT_MS
        )


@contextlib.asynccontextmanager
async def connect(cluster: TestCluster, broker_id: int) -> AsyncIterator[BrokerConnection]:
    """A raw connection to one broker, for requests a client would not send there."""
    connection = await BrokerConnection.open(
        HOST, cluster.brokers[broker_id].port, timeout_ms=CLIENT_REQUEST_TIMEOUT_MS
    )
    try:
        yield connection
    finally:
        await connection.close()


# -- producing sequence numbers -------------------------------------------------------------


@dataclass
class Acknowledgements:
    """What a producer was told: sequence -> offset, failures, and when each answer came."""

    sent: int = 0
    offsets: dict[int, int] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    times: dict[int, float] = field(default_factory=dict)  # sequence -> monotonic time

    def acknowledged(self, sequence: int, offset: int) -> None:
        self.offsets[sequence] = offset
        self.times[sequence] = time.monotonic()

    def first_acknowledged_since(self, sequence: int) -> float | None:
        """When the first record sent as `sequence` or later was acknowledged. (Sent after a
        fault, it was acknowledged by whoever serves after it, not by a response in flight.)"""
        return min((t for s, t in self.times.items() if s >= sequence), default=None)

    def check_all_acknowledged_in_order(self) -> None:
        """Every send acknowledged, each at the offset equal to its sequence number."""
        assert self.failures == {}
        assert self.sent > 0
        assert self.offsets == {sequence: sequence for sequence in range(self.sent)}


SequenceProducer = Callable[
    [str, str, asyncio.Event, Acknowledgements], Coroutine[object, object, None]
]


async def produce_with_riverbed(
    bootstrap: str, topic: str, stop: asyncio.Event, acks: Acknowledgements
) -> None:
    """riverbed.Producer with its defaults (idempotent, acks=all) until `stop`, then flush."""

    def delivered(sequence: int, future: asyncio.Future[RecordMetadata]) -> None:
        error = future.exception()
        if error is None:
            acks.acknowledged(sequence, future.result().offset)
        else:
            acks.failures[sequence] = repr(error)

    async with Producer(
        bootstrap_servers=bootstrap,
        linger_ms=LINGER_MS,
        request_timeout_ms=CLIENT_REQUEST_TIMEOUT_MS,
        delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
    ) as producer:
        assert producer.settings.enable_idempotence
        assert producer.settings.acks == -1
        while not stop.is_set():
            future = await producer.send(topic, encode(acks.sent), partition=PARTITION)
            future.add_done_callback(functools.partial(delivered, acks.sent))
            acks.sent += 1
            await asyncio.sleep(SEND_INTERVAL_S)
        await producer.flush()


async def produce_with_librdkafka(
    bootstrap: str, topic: str, stop: asyncio.Event, acks: Acknowledgements
) -> None:
    """confluent_kafka.Producer (librdkafka), idempotent with acks=all, until `stop`, then flush."""

    def delivered(
        sequence: int, error: confluent_kafka.KafkaError | None, message: confluent_kafka.Message
    ) -> None:
        if error is None:
            offset = message.offset()
            assert offset is not None
            acks.acknowledged(sequence, offset)
        else:
            acks.failures[sequence] = str(error)

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": LINGER_MS,
            "request.timeout.ms": CLIENT_REQUEST_TIMEOUT_MS,
            "message.timeout.ms": DELIVERY_TIMEOUT_MS,
        }
    )
    while not stop.is_set():
        producer.produce(
            topic,
            value=encode(acks.sent),
            partition=PARTITION,
            on_delivery=functools.partial(delivered, acks.sent),
        )
        acks.sent += 1
        producer.poll(0)  # delivery callbacks run here, on the loop
        await asyncio.sleep(SEND_INTERVAL_S)
    while len(producer) > 0:
        producer.poll(0)
        await asyncio.sleep(SEND_INTERVAL_S)


@contextlib.asynccontextmanager
async def producing(
    cluster: TestCluster, topic: str, produce: SequenceProducer = produce_with_riverbed
) -> AsyncIterator[Acknowledgements]:
    """Send sequence numbers in the background; on exit stop sending and wait until every record
    is acknowledged or failed."""
    acks = Acknowledgements()
    stop = asyncio.Event()
    task = asyncio.create_task(produce(cluster.bootstrap, topic, stop, acks))
    try:
        yield acks
    finally:
        stop.set()
        await task


async def wait_for_acknowledgement(
    cluster: TestCluster, acks: Acknowledgements, sequence: int | None = None
) -> float:
    """When a record sent as `sequence` or later (default: from now on) was acknowledged."""
    since = acks.sent if sequence is None else sequence
    return await cluster.wait_for(
        lambda: acks.first_acknowledged_since(since),
        CHANGE_TIMEOUT_S,
        what=f"an acknowledgement of a record from sequence {since} on",
    )


# -- reading back ---------------------------------------------------------------------------


async def end_offset(cluster: TestCluster, topic: str) -> int:
    """ListOffsets "latest" from the leader: the high watermark."""
    tp = TopicPartition(topic, PARTITION)
    async with Admin(
        bootstrap_servers=cluster.bootstrap, request_timeout_ms=CHANGE_TIMEOUT_MS
    ) as admin:
        offsets = await admin.list_offsets({tp: "latest"})
    return offsets[tp].offset


async def consume_all(cluster: TestCluster, topic: str) -> list[int]:
    """Every value of the partition from its start up to the high watermark, as sequence
    numbers, in log order; each offset exactly once."""
    tp = TopicPartition(topic, PARTITION)
    stop = await end_offset(cluster, topic)
    values: list[int] = []
    async with Consumer(
        bootstrap_servers=cluster.bootstrap, request_timeout_ms=CLIENT_REQUEST_TIMEOUT_MS
    ) as consumer:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while len(values) < stop:
            batches = await consumer.getmany(tp, timeout_ms=CONSUME_POLL_MS)
            for record in batches.get(tp, []):
                if record.offset != len(values):
                    raise AssertionError(f"{topic}: offset {record.offset}, {len(values)} expected")
                values.append(decode(record.value))
    return values


def segment_digests(cluster: TestCluster, topic: str) -> dict[int, str]:
    """Per broker: one digest of the partition's segment files (names, sizes and bytes)."""
    digests = {}
    for broker_id, broker in cluster.brokers.items():
        digest = hashlib.sha256()
        sizes = []
        for path in broker.segment_files(topic, PARTITION):
            data = path.read_bytes()
            digest.update(path.name.encode())
            digest.update(data)
            sizes.append(f"{path.name}:{len(data)}")
        digests[broker_id] = f"{digest.hexdigest()[:16]} {' '.join(sizes)}"
    return digests


def broker_output(cluster: TestCluster, broker_id: int) -> str:
    """The broker's output since its last start."""
    return cluster.brokers[broker_id].log_path.read_text(errors="replace")
