"""Exactly-once under crashes: a consume-transform-produce loop (confluent-kafka's transactional
producer and a read_committed consumer group, tests/transactions/eos_worker.py) runs while the
transaction coordinator, the leaders of `output` and the group coordinator are SIGKILLed and
restarted in turn, on three brokers.

Nine rounds kill, in turn, the broker coordinating the transactional id, the leader of one
`output` partition and the group coordinator (the leader of the group's `__consumer_offsets`
partition), each at a moment chosen at random among: a transaction held open with its records
written, the worker sending its offsets (AddOffsetsToTxn, TxnOffsetCommit), the worker committing
(EndTxn and the markers). Each kill must move its role to another broker (FindCoordinator or
Metadata), the broker is restarted, and the worker must commit again. Once, a second producer with
the worker's transactional id fences it; a tenth of the transactions are aborted on purpose.

Afterwards a read_committed consumer of `output` sees every input record exactly once, and the
records of each key in their sequence order; a read_uncommitted one sees the aborted attempts'
records too (there must be some). The seed of the fault moments is printed.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import confluent_kafka
from kafka.protocol.metadata import FindCoordinatorRequest
from riverbed import Admin
from riverbed.coordination.internal_topics import partition_for
from riverbed.protocol.errors import ErrorCode

from tests.groups.group_support import KafkaWire
from tests.support.cluster import ClusterFactory, TestCluster
from tests.transactions.eos_worker import (
    BATCH_RECORDS_MAX,
    CALL_TIMEOUT_S,
    IN_TRANSACTION_PHASES,
    EosWorker,
    input_value,
    parse_output,
)

BROKERS: Final = 3
PARTITIONS: Final = 3
STATE_PARTITIONS: Final = 3  # of __transaction_state and __consumer_offsets
SETTINGS: Final = {
    "transaction.state.log.replication.factor": str(BROKERS),
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": str(STATE_PARTITIONS),
    "offsets.topic.replication.factor": str(BROKERS),
    "offsets.topic.num.partitions": str(STATE_PARTITIONS),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "group.initial.rebalance.delay.ms": "0",
    # A killed broker's leaderships move once its ZooKeeper session expires.
    "zookeeper.session.timeout.ms": "3000",
    "replica.lag.time.max.ms": "2000",
}
TOPIC_CONFIGS: Final = {"min.insync.replicas": "2"}
INPUT: Final = "input"
OUTPUT: Final = "output"
TRANSACTIONAL_ID: Final = "eos-worker"
GROUP: Final = "eos-group"
RECORDS: Final = 2_000
KEYS: Final = 20
# Each kind of fault three times, in turn.
COORDINATOR, OUTPUT_LEADER, GROUP_COORDINATOR = "coordinator", "output leader", "group coordinator"
ROUNDS: Final = [COORDINATOR, OUTPUT_LEADER, GROUP_COORDINATOR] * 3
KILLS_PER_KIND_MIN: Final = 3
KILL_DELAY_S: Final = (0.1, 1.0)  # after the worker is let on: mid-loop, at a random moment
# Where in the worker's transaction a kill lands, chosen per round: a transaction held open
# (records written, nothing committed), sending its offsets (AddOffsetsToTxn, TxnOffsetCommit) or
# committing (EndTxn, then the markers).
KILL_PHASES: Final = ("held", "sending-offsets", "committing")
PHASE_WAIT_S: Final = 10.0
PHASE_POLL_S: Final = 0.001
# After this round a second producer with the worker's transactional id fences the worker.
FENCE_AFTER_ROUND: Final = 4
# Transactions the worker aborts on purpose after writing (a transform that failed).
ABORT_RATIO: Final = 0.1
DOWN_S: Final = 0.5  # how long a killed broker stays down once its partitions moved
CHANGE_TIMEOUT_S: Final = 30.0
FINISH_TIMEOUT_S: Final = 90.0
# A commit after a fault: the client's own retries, within two of its call timeouts.
RECOVERY_TIMEOUT_S: Final = 2 * CALL_TIMEOUT_S + 10
READ_TIMEOUT_S: Final = 30.0
QUIET_S: Final = 2.0  # how long a reader waits for records that must not come


@dataclass(frozen=True)
class Kill:
    kind: str
    broker: int
    moved_to: int
    worker_phase: str
    elapsed_s: float


async def test_exactly_once_through_coordinator_and_leader_crashes(
    cluster_factory: ClusterFactory,
) -> None:
    seed = random.randrange(2**32)
    print(f"fault moments seeded with {seed}")
    rng = random.Random(seed)
    cluster = await cluster_factory(BROKERS, SETTINGS)
    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        for topic in (INPUT, OUTPUT):
            await admin.create_topic(
                topic, partitions=PARTITIONS, replication_factor=BROKERS, configs=TOPIC_CONFIGS
            )
    await wait_in_sync(cluster, (INPUT, OUTPUT))
    end_offsets = await asyncio.to_thread(produce_input, cluster.bootstrap)
    assert sum(end_offsets.values()) == RECORDS

    worker = EosWorker(
        bootstrap=cluster.bootstrap,
        transactional_id=TRANSACTIONAL_ID,
        group_id=GROUP,
        input_topic=INPUT,
        output_topic=OUTPUT,
        end_offsets=end_offsets,
        abort_ratio=ABORT_RATIO,
        seed=seed,
    )
    failures: list[BaseException] = []
    thread = threading.Thread(
        target=_capturing(worker.run, failures), name="eos-worker", daemon=True
    )
    worker.allow(RECORDS // (len(ROUNDS) + 1))
    thread.start()
    try:
        kills = await inject_faults(cluster, worker, rng)
        worker.allow(RECORDS)
        await asyncio.to_thread(thread.join, FINISH_TIMEOUT_S)
        progress = worker.progress
        print(f"kills: {kills}")
        print(f"worker: {progress}")
        assert not failures, f"the worker crashed: {failures!r}"
        assert worker.done, f"the worker did not finish: {progress}, committed {worker.committed}"
    finally:
        worker.stop()
        await asyncio.to_thread(thread.join, FINISH_TIMEOUT_S)

    for kind in (COORDINATOR, OUTPUT_LEADER, GROUP_COORDINATOR):
        during = [k for k in kills if k.kind == kind and k.worker_phase in IN_TRANSACTION_PHASES]
        assert len(during) >= KILLS_PER_KIND_MIN, f"{kind}: {kills}"

    committed = await asyncio.to_thread(read_output, cluster.bootstrap, "read_committed")
    check_exactly_once_in_order(committed, end_offsets)
    everything = await asyncio.to_thread(read_output, cluster.bootstrap, "read_uncommitted")
    print(
        f"{len(committed)} records committed; {len(everything) - len(committed)} more written by "
        f"aborted attempts; {progress.committed_transactions} transactions committed, "
        f"{progress.aborted_transactions} aborted ({progress.deliberate_aborts} on purpose), "
        f"producer replaced {progress.producers_replaced} times, consumer "
        f"{progress.consumers_replaced} times"
    )
    # The aborted transactions' records are in the log (flushed before the abort): what
    # read_committed left out was there to leave out.
    assert progress.deliberate_aborts > 0
    assert progress.producers_replaced >= 1  # the fencing
    assert len(everything) > len(committed)


def _capturing(run: Callable[[], None], failures: list[BaseException]) -> Callable[[], None]:
    def target() -> None:
        try:
            run()
        except BaseException as error:
            failures.append(error)

    return target


# -- the input --------------------------------------------------------------------------------


def produce_input(bootstrap: str) -> dict[int, int]:
    """RECORDS records over KEYS keys, each key's values numbered 0, 1, ...; returns the end
    offset of each partition."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    ends = dict.fromkeys(range(PARTITIONS), 0)

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        ends[message.partition()] = max(ends[message.partition()], message.offset() + 1)

    sequences: collections.Counter[str] = collections.Counter()
    for i in range(RECORDS):
        key = f"k{i % KEYS}"
        producer.produce(
            INPUT, input_value(key, sequences[key]), key.encode(), on_delivery=delivered
        )
        sequences[key] += 1
        producer.poll(0)
    assert producer.flush(READ_TIMEOUT_S) == 0
    return ends


# -- the faults -------------------------------------------------------------------------------


async def inject_faults(cluster: TestCluster, worker: EosWorker, rng: random.Random) -> list[Kill]:
    """Each round lets the worker on by one slice of the input, kills the round's target at a
    random moment while a transaction is open, waits until its role moved, and restarts it."""
    started = time.monotonic()
    # The internal topics exist once the worker committed a transaction.
    await cluster.wait_for(
        lambda: worker.progress.committed_transactions > 0 or worker.progress.phase == "crashed",
        CHANGE_TIMEOUT_S,
        what="the worker's first transaction",
    )
    kills: list[Kill] = []
    for index, kind in enumerate(ROUNDS):
        await wait_in_sync(cluster, (INPUT, OUTPUT, "__transaction_state", "__consumer_offsets"))
        victim = await target(cluster, kind, index)
        slice_end = RECORDS * (index + 2) // (len(ROUNDS) + 1)
        wanted = rng.choice(KILL_PHASES)
        if wanted != "held":  # else the worker soon holds a transaction at its slice's end
            worker.allow(slice_end)
            await asyncio.sleep(rng.uniform(*KILL_DELAY_S))
        phase = await phase_reached(cluster, worker, wanted)
        committed_at_kill = worker.progress.committed_transactions
        cluster.kill(victim)
        moved_to = await cluster.wait_for(
            functools.partial(moved, cluster, kind, index, victim),
            CHANGE_TIMEOUT_S,
            what=f"the {kind} to move from broker {victim}",
        )
        kills.append(Kill(kind, victim, moved_to, phase, time.monotonic() - started))
        print(f"round {index}: {kills[-1]}; worker {worker.progress.phase}")
        worker.allow(slice_end)
        await asyncio.sleep(DOWN_S)
        await cluster.restart(victim)
        await recovered(cluster, worker, committed_at_kill)
        if index == FENCE_AFTER_ROUND:
            await fence(cluster, worker)
    return kills


async def fence(cluster: TestCluster, worker: EosWorker) -> None:
    """A second instance of the worker starts (a producer with the same transactional id): the
    running one is fenced (a fatal error) and must replace its producer and consumer."""
    replaced = worker.progress.producers_replaced
    committed = worker.progress.committed_transactions

    def init_twin() -> None:
        twin = confluent_kafka.Producer(
            {"bootstrap.servers": cluster.bootstrap, "transactional.id": TRANSACTIONAL_ID}
        )
        twin.init_transactions(CHANGE_TIMEOUT_S)

    await asyncio.to_thread(init_twin)
    worker.allow(worker.committed_records + 2 * BATCH_RECORDS_MAX)
    await cluster.wait_for(
        lambda: (
            worker.progress.producers_replaced > replaced
            and worker.progress.committed_transactions > committed
        ),
        RECOVERY_TIMEOUT_S,
        what="the fenced worker to replace its producer and commit again",
    )


async def phase_reached(cluster: TestCluster, worker: EosWorker, wanted: str) -> str:
    """The worker's phase once it is `wanted` (watched closely: a commit is short), or, if that
    does not come soon, once it is any phase inside a transaction."""
    deadline = time.monotonic() + PHASE_WAIT_S
    while time.monotonic() < deadline:
        if worker.progress.phase == wanted:
            return wanted
        await asyncio.sleep(PHASE_POLL_S)
    return await cluster.wait_for(
        lambda: worker.progress.phase if worker.progress.in_transaction else None,
        CHANGE_TIMEOUT_S,
        what="the worker inside a transaction",
    )


async def recovered(cluster: TestCluster, worker: EosWorker, committed_before: int) -> None:
    """The worker commits again after a fault (let on by a batch or two if it was held)."""
    worker.allow(worker.committed_records + 2 * BATCH_RECORDS_MAX)
    try:
        await cluster.wait_for(
            lambda: worker.progress.committed_transactions > committed_before,
            RECOVERY_TIMEOUT_S,
            what="the worker to commit again",
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\nthe worker: {worker.progress}") from None


async def target(cluster: TestCluster, kind: str, index: int) -> int:
    """The broker holding the round's role now."""
    if kind == OUTPUT_LEADER:
        return (await leaders(cluster, OUTPUT))[index % PARTITIONS]
    coordinator = await find_coordinator(cluster, kind)
    # The coordinator is the leader of the key's partition of the internal topic.
    topic, key = _internal(kind)
    partition = partition_for(key, STATE_PARTITIONS)
    assert (await leaders(cluster, topic))[partition] == coordinator
    return coordinator


async def moved(cluster: TestCluster, kind: str, index: int, victim: int) -> int | None:
    """The role's new holder, once it is another broker than `victim`."""
    if kind == OUTPUT_LEADER:
        leader = (await leaders(cluster, OUTPUT))[index % PARTITIONS]
    else:
        leader = await find_coordinator(cluster, kind)
    return leader if leader not in (-1, victim) else None


def _internal(kind: str) -> tuple[str, str]:
    if kind == COORDINATOR:
        return "__transaction_state", TRANSACTIONAL_ID
    return "__consumer_offsets", GROUP


async def find_coordinator(cluster: TestCluster, kind: str) -> int:
    """FindCoordinator, asked of a running broker: the transactional id's coordinator (key type
    1) or the group's (0); -1 while there is none."""
    wire = await KafkaWire.open(cluster.bootstrap.split(",")[0])
    try:
        _, key = _internal(kind)
        response = await wire.call(
            FindCoordinatorRequest, version=3, key=key, key_type=int(kind == COORDINATOR)
        )
    finally:
        await wire.close()
    return int(response.node_id) if response.error_code == ErrorCode.NONE else -1


async def leaders(cluster: TestCluster, topic: str) -> dict[int, int]:
    async with Admin(bootstrap_servers=cluster.bootstrap, request_timeout_ms=3_000) as admin:
        description = await admin.describe_topic(topic)
    return {p.partition: p.leader for p in description.partitions}


async def wait_in_sync(cluster: TestCluster, topics: tuple[str, ...]) -> None:
    """Every partition of `topics` led and with its whole replica set in the ISR: the next kill
    then leaves min.insync.replicas (2 of 3) standing."""

    async def in_sync() -> bool:
        async with Admin(bootstrap_servers=cluster.bootstrap, request_timeout_ms=3_000) as admin:
            for topic in topics:
                for p in (await admin.describe_topic(topic)).partitions:
                    if p.leader == -1 or set(p.isr) != set(p.replicas):
                        return False
        return True

    await cluster.wait_for(in_sync, CHANGE_TIMEOUT_S, what=f"{topics} fully in sync")


# -- reading back -----------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputRecord:
    partition: int
    key: str
    sequence: int
    input_partition: int
    input_offset: int


def read_output(bootstrap: str, isolation: str) -> list[OutputRecord]:
    """Every record of `output` at `isolation`, in each partition's order."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"eos-reader-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    records: list[OutputRecord] = []
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(OUTPUT, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(PARTITIONS)
            ]
        )
        deadline = time.monotonic() + READ_TIMEOUT_S
        quiet_until = None
        while quiet_until is None or time.monotonic() < quiet_until:
            assert time.monotonic() < deadline + QUIET_S, f"{len(records)} of {RECORDS} read"
            for message in consumer.consume(100, 0.2):
                value, output_partition = message.value(), message.partition()
                assert message.error() is None, message.error()
                assert value is not None
                assert output_partition is not None
                key, sequence, partition, offset = parse_output(value)
                assert message.key() == key.encode()
                records.append(OutputRecord(output_partition, key, sequence, partition, offset))
            if quiet_until is None and (len(records) >= RECORDS or time.monotonic() > deadline):
                quiet_until = time.monotonic() + QUIET_S
        return records
    finally:
        consumer.close()


def check_exactly_once_in_order(records: list[OutputRecord], end_offsets: dict[int, int]) -> None:
    """Each input (partition, offset) exactly once; each key's sequence numbers 0, 1, ... in
    the order of its output partition."""
    seen = collections.Counter((r.input_partition, r.input_offset) for r in records)
    expected = {(p, o) for p, end in end_offsets.items() for o in range(end)}
    lost = sorted(expected - set(seen))
    duplicated = sorted((tp, n) for tp, n in seen.items() if n > 1)
    unexpected = sorted(set(seen) - expected)
    assert (lost, duplicated, unexpected) == ([], [], []), (
        f"lost {len(lost)}: {lost[:20]}; duplicated {len(duplicated)}: {duplicated[:20]}; "
        f"unexpected {unexpected[:20]}"
    )
    by_key: dict[str, list[int]] = collections.defaultdict(list)
    partition_of: dict[str, set[int]] = collections.defaultdict(set)
    for record in records:
        by_key[record.key].append(record.sequence)
        partition_of[record.key].add(record.partition)
    assert len(by_key) == KEYS
    for key, sequences in by_key.items():
        assert len(partition_of[key]) == 1, f"{key} in output partitions {partition_of[key]}"
        assert sequences == list(range(len(sequences))), f"{key} out of order: {sequences}"
