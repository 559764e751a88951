"""Replicated topics for the replication benchmark: create one, read its partition's state.

Through confluent-kafka's AdminClient, as a user would; the state is what brokers report in
Metadata (leader, in-sync replicas, controller), which they take from ZooKeeper.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bench.procs import ProcessFailed

# Also bounds each CreateTopics or Metadata request.
TOPIC_TIMEOUT_S = 60.0
STATE_POLL_S = 0.1
# librdkafka logs every refused connection to a stopped broker on stderr; the benchmark reports
# what it measures instead.
ADMIN_CONFIG = {"log_level": 0}


@dataclass(frozen=True, slots=True)
class PartitionState:
    leader: int  # -1: none
    isr: tuple[int, ...]
    controller: int  # -1: none known


def create_topic(
    bootstrap: str, topic: str, replication_factor: int, configs: dict[str, str]
) -> PartitionState:
    """Create `topic` with one partition and wait until every replica is in sync."""
    admin = AdminClient({**ADMIN_CONFIG, "bootstrap.servers": bootstrap})
    new_topic = NewTopic(
        topic, num_partitions=1, replication_factor=replication_factor, config=configs
    )
    admin.create_topics([new_topic])[topic].result(timeout=TOPIC_TIMEOUT_S)
    return wait_for_isr(bootstrap, topic, replication_factor, TOPIC_TIMEOUT_S)


def partition_state(bootstrap: str, topic: str) -> PartitionState:
    """Partition 0's leader and ISR, and the controller, from one Metadata request."""
    admin = AdminClient({**ADMIN_CONFIG, "bootstrap.servers": bootstrap})
    metadata = admin.list_topics(topic, timeout=TOPIC_TIMEOUT_S)
    topic_metadata = metadata.topics.get(topic)
    if (
        topic_metadata is None
        or topic_metadata.error is not None
        or 0 not in (topic_metadata.partitions)
    ):
        return PartitionState(leader=-1, isr=(), controller=metadata.controller_id)
    partition = topic_metadata.partitions[0]
    return PartitionState(
        leader=partition.leader,
        isr=tuple(sorted(partition.isrs)),
        controller=metadata.controller_id,
    )


def wait_for_isr(bootstrap: str, topic: str, replicas: int, timeout_s: float) -> PartitionState:
    """Wait until partition 0 has a leader and `replicas` in-sync replicas; returns its state."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = partition_state(bootstrap, topic)
        if state.leader >= 0 and len(state.isr) == replicas:
            return state
        if time.monotonic() > deadline:
            raise ProcessFailed(
                f"{topic}-0 has not got {replicas} in-sync replicas after {timeout_s} s: {state}"
            )
        time.sleep(STATE_POLL_S)
