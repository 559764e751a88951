"""The transaction coordinator on three brokers: `__transaction_state` and the data replicated to
all three, and the coordinator killed.

- Each client's transactional producer commits, aborts and commits on an RF 3 topic; read_committed
  consumers of all three clients see exactly the committed records.
- Coordinator failover: a transaction is committed, a second one is opened and written to, and
  the broker coordinating the transactional id is killed (SIGKILL) mid-transaction. The new
  coordinator (the new leader of the id's `__transaction_state` partition) loads the open
  transaction from the log; the producer's commit goes through it, and read_committed consumers
  see both transactions' records exactly once.
- A commit whose markers cannot be written (the only replica of its partition is down) stays
  PrepareCommit; the coordinator is killed, the replica comes back, and the new coordinator sends
  the markers and writes CompleteCommit: the committed records become readable.
- A transaction left open by a producer that disappears, whose coordinator is then killed: the new
  coordinator aborts it once its timeout passed, and read_committed consumers move past it.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Iterator
from typing import Final

import pytest
from kafka.protocol.metadata import FindCoordinatorRequest
from riverbed.protocol.errors import ErrorCode

from tests.groups.group_support import KafkaWire
from tests.support.cluster import ClusterFactory, TestCluster, partition_state, wait_for
from tests.transactions.txn_clients import (
    ONE_BROKER_SETTINGS,
    PARTITIONS,
    confluent_producer,
    create_topic,
    describe,
    produce_commit_abort_commit,
    read_all_clients,
    read_confluent,
    values,
    wait_state,
)

BROKERS: Final = 3
# kafka-python 3.0's admin client (DescribeTransactions here) drops, without closing them, the
# sockets its network thread opened to a broker these tests killed: their ResourceWarning is
# kafka-python's, not Riverbed's, and is not an error here.
pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


@pytest.fixture(autouse=True)
def _collect_kafka_python_sockets() -> Iterator[None]:
    """Collect those sockets before the next test, whose warnings count as errors again."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


SETTINGS: Final = {
    **ONE_BROKER_SETTINGS,
    "transaction.state.log.replication.factor": str(BROKERS),
    "transaction.state.log.min.isr": "2",
    "offsets.topic.replication.factor": str(BROKERS),
    # A killed broker's leaderships move once its ZooKeeper session expires.
    "zookeeper.session.timeout.ms": "3000",
    "replica.lag.time.max.ms": "2000",
}
FAILOVER_TIMEOUT_S: Final = 60


async def start(cluster_factory: ClusterFactory) -> TestCluster:
    return await cluster_factory(BROKERS, SETTINGS)


@pytest.mark.parametrize("client", ["confluent-kafka", "aiokafka", "kafka-python"])
async def test_commit_abort_commit_replicated(cluster_factory: ClusterFactory, client: str) -> None:
    cluster = await start(cluster_factory)
    bootstrap = cluster.bootstrap
    topic = f"replicated-{client}"
    await create_topic(bootstrap, topic, PARTITIONS, replication_factor=BROKERS)
    await produce_commit_abort_commit(client, bootstrap, f"rf3-{client}", topic)
    committed = sorted(values("c1", 6) + values("c2", 6))
    read = await read_all_clients(bootstrap, topic, "read_committed", PARTITIONS, 12)
    assert read == dict.fromkeys(read, committed)
    description = await asyncio.to_thread(wait_state, bootstrap, f"rf3-{client}", "CompleteCommit")
    assert description.coordinator_id in cluster.brokers


async def test_killed_coordinator_mid_transaction(cluster_factory: ClusterFactory) -> None:
    cluster = await start(cluster_factory)
    bootstrap = cluster.bootstrap
    topic = "failover"
    await create_topic(bootstrap, topic, PARTITIONS, replication_factor=BROKERS)
    producer = confluent_producer(
        bootstrap, "survivor", **{"transaction.timeout.ms": 120_000, "acks": "all"}
    )

    def first_and_open() -> int:
        producer.init_transactions(30)
        producer.begin_transaction()
        for i, value in enumerate(values("before", 6)):
            producer.produce(topic, value, partition=i % PARTITIONS)
        producer.commit_transaction(30)
        producer.begin_transaction()
        for i, value in enumerate(values("during", 6)):
            producer.produce(topic, value, partition=i % PARTITIONS)
        producer.flush(30)
        ongoing = describe(bootstrap, "survivor")
        assert str(ongoing.state.value) == "Ongoing"
        assert len(ongoing.topic_partitions) == PARTITIONS
        return int(ongoing.coordinator_id)

    coordinator = await asyncio.to_thread(first_and_open)
    cluster.kill(coordinator)
    survivors = ",".join(b.bootstrap for b in cluster.brokers.values() if b.running)

    def commit_through_the_new_coordinator() -> int:
        producer.commit_transaction(FAILOVER_TIMEOUT_S)
        return int(wait_state(survivors, "survivor", "CompleteCommit").coordinator_id)

    new_coordinator = await asyncio.to_thread(commit_through_the_new_coordinator)
    assert new_coordinator != coordinator
    expected = sorted(values("before", 6) + values("during", 6))
    seen = await asyncio.to_thread(
        read_confluent, survivors, topic, "read_committed", PARTITIONS, 12
    )
    assert sorted(seen) == expected
    # The killed broker comes back as a follower; nothing it coordinated is lost.
    await cluster.restart(coordinator)
    again = await asyncio.to_thread(
        read_confluent, cluster.bootstrap, topic, "read_committed", PARTITIONS, 12
    )
    assert sorted(again) == expected


async def coordinator_of(bootstrap: str, transactional_id: str) -> int:
    """The broker FindCoordinator names for the id (once it has one)."""
    wire = await KafkaWire.open(bootstrap.split(",")[0])
    try:

        async def found() -> int | None:
            response = await wire.call(
                FindCoordinatorRequest, version=3, key=transactional_id, key_type=1
            )
            return int(response.node_id) if response.error_code == ErrorCode.NONE else None

        return await wait_for(found, 30, what=f"a coordinator for {transactional_id}")
    finally:
        await wire.close()


async def test_new_coordinator_completes_a_prepared_commit(cluster_factory: ClusterFactory) -> None:
    cluster = await start(cluster_factory)
    bootstrap = cluster.bootstrap
    topic = "single-replica"
    await create_topic(bootstrap, topic, 1, replication_factor=1)
    replica = (await partition_state(bootstrap, topic, 0)).leader
    # A transactional id coordinated elsewhere than the partition's only replica.
    for transactional_id in (f"prepared-{i}" for i in range(40)):
        coordinator = await coordinator_of(bootstrap, transactional_id)
        if coordinator != replica:
            break
    else:
        raise AssertionError(f"every candidate id is coordinated by broker {replica}")
    producer = confluent_producer(bootstrap, transactional_id, acks="all")

    def produce() -> None:
        producer.init_transactions(30)
        producer.begin_transaction()
        for value in values("prepared", 5):
            producer.produce(topic, value, partition=0)
        producer.flush(30)

    await asyncio.to_thread(produce)
    cluster.kill(replica)
    # EndTxn is answered once PrepareCommit is written; the marker cannot be.
    await asyncio.to_thread(producer.commit_transaction, FAILOVER_TIMEOUT_S)
    third = next(b for b in cluster.brokers if b not in (replica, coordinator))
    survivor = cluster.brokers[third].bootstrap
    # (Asked until the admin client stops trying the killed broker.)
    stuck = await asyncio.to_thread(wait_state, survivor, transactional_id, "PrepareCommit")
    assert stuck.coordinator_id == coordinator
    cluster.kill(coordinator)
    await cluster.restart(replica)
    live = ",".join(b.bootstrap for b in cluster.brokers.values() if b.running)
    done = await asyncio.to_thread(
        wait_state, live, transactional_id, "CompleteCommit", FAILOVER_TIMEOUT_S
    )
    assert done.coordinator_id != coordinator
    seen = await asyncio.to_thread(read_confluent, live, topic, "read_committed", 1, 5)
    assert seen == values("prepared", 5)


async def test_new_coordinator_aborts_an_expired_transaction(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await start(cluster_factory)
    bootstrap = cluster.bootstrap
    topic = "orphaned"
    await create_topic(bootstrap, topic, 1, replication_factor=BROKERS)

    def open_and_forget() -> int:
        orphan = confluent_producer(bootstrap, "orphan", **{"transaction.timeout.ms": 5_000})
        orphan.init_transactions(30)
        orphan.begin_transaction()
        for value in values("orphaned", 3):
            orphan.produce(topic, value, partition=0)
        orphan.flush(30)
        coordinator = int(describe(bootstrap, "orphan").coordinator_id)
        # The producer goes away without ending its transaction (no close: librdkafka would
        # abort it).
        return coordinator

    coordinator = await asyncio.to_thread(open_and_forget)
    cluster.kill(coordinator)
    survivors = ",".join(b.bootstrap for b in cluster.brokers.values() if b.running)

    def after_failover() -> int:
        aborted = wait_state(survivors, "orphan", "CompleteAbort", timeout_s=FAILOVER_TIMEOUT_S)
        later = confluent_producer(survivors, "later")
        later.init_transactions(FAILOVER_TIMEOUT_S)
        later.begin_transaction()
        for value in values("later", 2):
            later.produce(topic, value, partition=0)
        later.commit_transaction(FAILOVER_TIMEOUT_S)
        return int(aborted.coordinator_id)

    new_coordinator = await asyncio.to_thread(after_failover)
    assert new_coordinator != coordinator
    seen = await asyncio.to_thread(read_confluent, survivors, topic, "read_committed", 1, 2)
    assert seen == values("later", 2)
