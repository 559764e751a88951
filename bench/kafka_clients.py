"""The few admin steps the benchmarks take through confluent-kafka, as a user would."""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from confluent_kafka.cimpl import NewTopic

from bench.procs import ProcessFailed

# Also bounds each metadata or offsets request below.
TOPIC_READY_TIMEOUT_S = 60.0
TOPIC_READY_POLL_S = 0.1
DELIVERY_TIMEOUT_S = 120.0


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create `topic` (replication factor 1) and wait until every partition has a leader."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new_topic = NewTopic(topic, num_partitions=partitions, replication_factor=1)
    futures = admin.create_topics([new_topic])
    futures[topic].result(timeout=TOPIC_READY_TIMEOUT_S)
    wait_for_leaders(admin, topic, range(partitions))


def wait_for_leaders(admin: AdminClient, topic: str, partitions: Iterable[int]) -> None:
    """Return once each of the topic's `partitions` (their indexes) has a leader."""
    wanted = set(partitions)
    deadline = time.monotonic() + TOPIC_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        metadata = admin.list_topics(topic, timeout=TOPIC_READY_TIMEOUT_S).topics.get(topic)
        if metadata is not None and metadata.error is None:
            led = {i for i, p in metadata.partitions.items() if p.error is None and p.leader >= 0}
            if led >= wanted:
                return
        time.sleep(TOPIC_READY_POLL_S)
    raise ProcessFailed(f"{topic} has no leader after {TOPIC_READY_TIMEOUT_S} s")


def end_offset(bootstrap: str, topic: str, partition: int) -> int:
    """The partition's high watermark, from ListOffsets (latest) through an admin client.

    Not through a consumer: confluent-kafka's needs a group.id, and a consumer with a group
    looks up its coordinator, which creates __consumer_offsets (50 partitions, replicated on a
    3-broker cluster). Every replica fetch then carries those partitions too, and the runs after
    the first check would be measured on a different cluster than the first.

    A broker accepts connections before it leads its partitions again (after an unclean start
    the controller elects it anew), and librdkafka fails a ListOffsets for a partition without
    a leader at once: so the leader is waited for first.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wait_for_leaders(admin, topic, [partition])
    wanted = TopicPartition(topic, partition)
    futures = admin.list_offsets(
        # confluent-kafka leaves OffsetSpec.latest unannotated.
        {wanted: OffsetSpec.latest()},  # type: ignore[no-untyped-call]
        request_timeout=TOPIC_READY_TIMEOUT_S,
    )
    return int(futures[wanted].result(timeout=TOPIC_READY_TIMEOUT_S).offset)


def produce_acknowledged(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> None:
    """Produce `values` with acks=all and return once every one is acknowledged."""
    failures: list[str] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for value in values:
        producer.produce(topic, value, partition=partition, on_delivery=on_delivery)
    unacknowledged = producer.flush(DELIVERY_TIMEOUT_S)
    if unacknowledged or failures:
        raise ProcessFailed(f"{unacknowledged} records unacknowledged; failures: {failures[:5]}")
