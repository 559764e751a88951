"""Partition scale (issue 31): what a cluster costs, idle and in its chores, as partitions grow.

For each size (500, 1,000, 2,000 and 4,000 partitions; `--quick`: 100 and 300) a fresh cluster of
three brokers (each its own process, `riverbed broker` as a user starts it,
zookeeper.session.timeout.ms 6 s; one embedded ZooKeeper for the run, a chroot per cluster) gets
one topic of that many partitions at RF=3, created with confluent-kafka's AdminClient. Then, in
this order:

1. **RSS of the empty broker**: each broker's VmRSS (/proc/PID/status) before the topic exists.
2. **create**: from CreateTopics to Metadata listing every partition with a leader and all three
   replicas in its ISR (the CreateTopics answer alone is recorded too).
3. **idle CPU**: SETTLE_S after that, each broker's user + system CPU time (/proc/PID/stat) over
   the idle window, as % of one core. No client is connected meanwhile (the admin client is
   closed first). The machine's whole CPU time over the window (/proc/stat) is recorded next to
   it: what the brokers did not use was ZooKeeper, this process, or someone else on the host.
4. **RSS per partition**: each broker's VmRSS now minus its empty VmRSS, divided by the replicas
   it hosts (every partition: RF=3 on three brokers); the mean over the brokers. Across sizes a
   least-squares line through (partitions, mean VmRSS at that size) gives a slope too, free of
   each process's own baseline.
5. **produce**, with two clients in turn, each with the same settings for both of its runs:
   confluent-kafka's Producer with produce_consume's settings (acks=all, linger.ms 5, batch.size
   1,000,000, no compression, failures-only delivery reports), then Riverbed's own asyncio
   Producer with the same ones (acks=all, linger_ms 5, batch_size 1,000,000, no compression, no
   idempotence). Each writes the same number of 100-byte records to partition 0 alone, then
   round robin over every partition; records per second from the first produce()/send() until
   flush() has every one acknowledged. Each run is preceded, off the clock, by one
   acknowledged record to each partition it writes (connections open, leaders known). Ratio
   spread / one partition per client, goal >= 0.5; PRODUCE_PAIRS pairs in turn, the figures
   being the pair with the median ratio (every pair's ratio is kept; one pair proved noisy).
   The two clients differ in one way that decides this ratio: librdkafka puts one partition in
   each ProduceRequest (librdkafka issue #1700), so a spread run sends about one request per
   partition per linger window, while Riverbed's producer, like Kafka's Java client, sends one
   request per broker holding every partition's batch. The first measures the broker's cost
   per request, the second its cost per partition.
   The high watermarks must add up to every record written.
6. **controlled shutdown**: SIGTERM to a broker that is not the controller (the highest id such)
   until its process exits; goal <= 5 s. One still running after SHUTDOWN_BOUND_S is SIGKILLed
   and the bound is recorded, as a failure.
7. **restart**: the same broker started again (same id, port and data dir): spawn to its port
   accepting, then from then until Metadata shows every partition with three ISR members again
   (goal <= 15 s after it listens; bounded the same way).
8. **kill -9**: SIGKILL to the non-controller broker leading the most partitions (the
   controller only if no other leads any), until Metadata shows every partition led by a broker
   other than it (goal <= session timeout + 3 s). When ZooKeeper deleted its registration (its
   session expired) is recorded too, through a watch.

Once per run, not per size, a single broker with 5,000 partitions (RF=1; `--quick`: 1,000), one
acknowledged record in each, is stopped with SIGTERM and started again, SINGLE_RESTARTS times: the
seconds from spawning to its port accepting, and to serving, i.e. one ListOffsets request sent
straight to the broker answering every partition with its one record (a broker accepts
connections before it leads its partitions again). Goal: serving <= 5 s (median).

Metadata and ListOffsets are polled every POLL_S; a poll of 4,000 partitions takes a while itself,
so each waited figure comes with its resolution: the condition became true after the previous
poll started, at most `resolution_s` before the figure.

Goals are judged at the largest size. The growth of each figure from 1,000 to 4,000 partitions
(with other sizes: from the smallest to the largest) is recorded beside them: the issue asks that
each stay roughly flat, or grow only as the work itself grows.

Other sizes: `python -m bench.partition_scale --sizes 500 [--single-partitions 1000]` (saved
under its own name, never as the latest result).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition, libversion
from confluent_kafka.admin import AdminClient, OffsetSpec
from confluent_kafka.cimpl import NewTopic
from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.errors import KafkaError as RiverbedKafkaError

from bench.machine import package_version
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import HOST, Broker, Cluster, ProcessFailed, cpu_seconds, zookeeper
from bench.produce_consume import PRODUCER_CONFIG

NAME = "partition_scale"
TOPIC = "scale"
BROKERS = 3
REPLICATION_FACTOR = 3
SESSION_TIMEOUT_MS = 6_000
CLUSTER_SETTINGS = {"zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS)}
VALUE = b"v" * 100
SINGLE_RESTARTS = 3
# (one partition, spread) runs per client and size; the ratio reported is the median pair's.
# One pair swung from 0.25 to 0.46 between runs on one cluster (2026-11-29), the one-partition
# rate alone by ±30%.
PRODUCE_PAIRS = 3

# Bounds: a measured wait that reaches its bound records the bound and fails its goal; waits
# nothing can be measured without (a broker starting, a topic created) fail the run instead.
CLUSTER_START_TIMEOUT_S = 120.0
BROKER_START_TIMEOUT_S = 300.0
CREATE_TIMEOUT_S = 600.0
SHUTDOWN_BOUND_S = 120.0
BACK_IN_ISR_BOUND_S = 300.0
FAILOVER_BOUND_S = 120.0
SERVING_BOUND_S = 120.0
DELIVERY_TIMEOUT_S = 300.0
# One Metadata or ListOffsets request.
REQUEST_TIMEOUT_S = 30.0
ZOOKEEPER_TIMEOUT_S = 30.0
# Between polls of Metadata / ListOffsets, and of a stopping process.
POLL_S = 0.1
EXIT_POLL_S = 0.005

# The goals, judged at the largest size.
IDLE_CPU_GOAL_PCT = 5.0
SHUTDOWN_GOAL_S = 5.0
BACK_IN_ISR_GOAL_S = 15.0
FAILOVER_MARGIN_S = 3.0
PRODUCE_RATIO_GOAL = 0.5
SINGLE_SERVING_GOAL_S = 5.0
GROWTH_SIZES = (1_000, 4_000)

ADMIN_CONFIG: dict[str, Any] = {"log_level": 0}
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Plan:
    sizes: tuple[int, ...]
    single_partitions: int
    produce_records: int
    settle_s: float
    idle_window_s: float


FULL = Plan(
    sizes=(500, 1_000, 2_000, 4_000),
    single_partitions=5_000,
    produce_records=200_000,
    settle_s=5.0,
    idle_window_s=15.0,
)
QUICK = Plan(
    sizes=(100, 300),
    single_partitions=1_000,
    produce_records=20_000,
    settle_s=3.0,
    idle_window_s=10.0,
)


def run(options: BenchOptions) -> BenchResult:
    return run_plan(options, QUICK if options.quick else FULL)


def run_plan(options: BenchOptions, plan: Plan) -> BenchResult:
    settings = {**CLUSTER_SETTINGS, **options.broker_settings}
    log_dir = options.work_dir / "logs"
    per_size: dict[int, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=options.work_dir) as scratch,
        zookeeper(Path(scratch) / "zookeeper") as zk_connect,
    ):
        for size in plan.sizes:
            print(f"   {size:,} partitions", flush=True)
            cluster = Cluster(
                BROKERS,
                Path(scratch) / f"data-{size}",
                f"{zk_connect}/scale-{size}",
                settings,
                log_dir,
                f"{NAME}-{size}",
            )
            try:
                per_size[size] = measure_size(cluster, size, plan)
            finally:
                cluster.close()
            line = ", ".join(
                f"{key} {get(per_size[size]):.3g}" for key, (_, _, get) in METRICS.items()
            )
            print(f"     {line}", flush=True)
        print(f"   single broker, {plan.single_partitions:,} partitions", flush=True)
        single_cluster = Cluster(
            1,
            Path(scratch) / "data-single",
            f"{zk_connect}/scale-single",
            settings,
            log_dir,
            f"{NAME}-single",
        )
        try:
            single = measure_single(single_cluster, plan.single_partitions)
        finally:
            single_cluster.close()
    return summarize(plan, settings, per_size, single)


# -- one size ------------------------------------------------------------------------------------


def measure_size(cluster: Cluster, size: int, plan: Plan) -> dict[str, Any]:
    cluster.start(CLUSTER_START_TIMEOUT_S)
    figures: dict[str, Any] = {"loadavg_at_start": os.getloadavg()}
    rss_empty = {i: _rss_kib(pid) for i, pid in cluster.pids.items()}

    figures["create"] = _create_topic(cluster.bootstrap, size, REPLICATION_FACTOR)
    # Its admin client is gone: no client is connected while the brokers idle.
    time.sleep(plan.settle_s)
    figures["idle"] = _idle_cpu(cluster.pids, plan.idle_window_s)
    rss_now = {i: _rss_kib(pid) for i, pid in cluster.pids.items()}
    figures["rss"] = {
        "empty_kib": rss_empty,
        "with_topic_kib": rss_now,
        # RF=3 on three brokers: each hosts a replica of every partition.
        "per_partition_kib": statistics.mean(rss_now[i] - rss_empty[i] for i in rss_now) / size,
    }

    figures["produce"] = _produce_both(cluster.bootstrap, size, plan.produce_records, _produce)
    figures["produce_riverbed"] = _produce_both(
        cluster.bootstrap, size, plan.produce_records, _produce_riverbed
    )

    admin = _admin(cluster.bootstrap)
    in_sync = _wait_until(
        lambda: _isr_full(admin, size, REPLICATION_FACTOR), time.perf_counter(), BACK_IN_ISR_BOUND_S
    )
    if in_sync.timed_out:
        raise ProcessFailed(f"ISRs of {size} partitions not full after producing")
    controller = _controller(admin)
    stopped_id = max(i for i in cluster.brokers if i != controller)
    leaders_before = _leaders(admin)
    figures["controlled_shutdown"] = {
        "broker": stopped_id,
        "controller": controller,
        "leaderships_before": sum(1 for leader in leaders_before if leader == stopped_id),
        **_controlled_shutdown(cluster.brokers[stopped_id]),
    }

    stopped = cluster.brokers[stopped_id]
    startup_s = stopped.start(BROKER_START_TIMEOUT_S)
    listening = time.perf_counter()
    back = _wait_until(
        lambda: _isr_full(admin, size, REPLICATION_FACTOR), listening, BACK_IN_ISR_BOUND_S
    )
    figures["restart"] = {"broker": stopped_id, "listening_s": startup_s, **back.as_dict()}

    figures["kill_9"] = _kill_leader(cluster, admin)
    return figures


def _create_topic(bootstrap: str, partitions: int, replication_factor: int) -> dict[str, Any]:
    """CreateTopics, then Metadata until every partition has a leader and a full ISR. The admin
    client is this function's: gone (connections closed) when it returns."""
    admin = _admin(bootstrap)
    started = time.perf_counter()
    new_topic = NewTopic(TOPIC, num_partitions=partitions, replication_factor=replication_factor)
    future = admin.create_topics([new_topic], operation_timeout=CREATE_TIMEOUT_S)[TOPIC]
    future.result(CREATE_TIMEOUT_S)
    answered_s = time.perf_counter() - started
    created = _wait_until(
        lambda: _isr_full(admin, partitions, replication_factor), started, CREATE_TIMEOUT_S
    )
    if created.timed_out:
        raise ProcessFailed(
            f"{partitions} partitions not all in sync {CREATE_TIMEOUT_S} s after create"
        )
    return {"create_topics_answered_s": answered_s, **created.as_dict()}


def _controlled_shutdown(broker: Broker) -> dict[str, Any]:
    """SIGTERM until the process exits; SHUTDOWN_BOUND_S at most, then SIGKILL (recorded)."""
    started = time.perf_counter()
    broker.send_signal(signal.SIGTERM)
    while broker.running and time.perf_counter() - started < SHUTDOWN_BOUND_S:
        time.sleep(EXIT_POLL_S)
    seconds = time.perf_counter() - started
    timed_out = broker.running
    if timed_out:
        broker.kill()
        seconds = SHUTDOWN_BOUND_S
    return {"seconds": seconds, "timed_out": timed_out, "exit_code": broker.wait_exit()}


def _kill_leader(cluster: Cluster, admin: AdminClient) -> dict[str, Any]:
    """SIGKILL a broker that leads partitions; wait until every partition is led by another."""
    controller = _controller(admin)
    leaders = _leaders(admin)
    led = {i: sum(1 for leader in leaders if leader == i) for i in cluster.brokers}
    others = {i: n for i, n in led.items() if i != controller and n > 0}
    victim_id = max(others, key=lambda i: others[i]) if others else controller
    if led.get(victim_id, 0) == 0:
        raise ProcessFailed(f"no broker leads a partition: {led}")
    victim = cluster.brokers[victim_id]

    def moved() -> bool:
        leaders = _leaders(admin)
        return bool(leaders) and all(leader not in (victim_id, -1) for leader in leaders)

    with victim.registration_watch(ZOOKEEPER_TIMEOUT_S) as registration:
        started = time.perf_counter()
        victim.kill()
        waited = _wait_until(moved, started, SESSION_TIMEOUT_MS / 1000 + FAILOVER_BOUND_S)
    deleted_at = registration.deleted_at
    return {
        "broker": victim_id,
        "was_controller": victim_id == controller,
        "leaderships_before": led[victim_id],
        "registration_deleted_s": None if deleted_at is None else deleted_at - started,
        **waited.as_dict(),
    }


# -- the single broker ---------------------------------------------------------------------------


def measure_single(cluster: Cluster, partitions: int) -> dict[str, Any]:
    cluster.start(CLUSTER_START_TIMEOUT_S)
    broker = cluster.brokers[1]
    create = _create_topic(cluster.bootstrap, partitions, 1)
    # One record in each partition: every log has a segment to open, and a restart must keep it.
    _produce(cluster.bootstrap, 0, list(range(partitions)))
    restarts = []
    for _ in range(SINGLE_RESTARTS):
        shutdown = _controlled_shutdown(broker)
        broker.spawn()
        spawned = time.perf_counter()
        listening_s = broker.wait_ready(BROKER_START_TIMEOUT_S)
        serving = _wait_until(
            lambda: _all_serving(broker, partitions, 1),
            spawned,
            SERVING_BOUND_S,
            not_before=spawned + listening_s,
        )
        restarts.append(
            {
                "shutdown_s": shutdown["seconds"],
                "shutdown_timed_out": shutdown["timed_out"],
                "listening_s": listening_s,
                "serving_s": serving.seconds,
                "serving_timed_out": serving.timed_out,
                "serving_resolution_s": serving.resolution_s,
                "serving_polls": serving.polls,
            }
        )
        print(f"     restart: {_summary(restarts[-1])}", flush=True)
    return {
        "partitions": partitions,
        "create_s": create["seconds"],
        "restarts": restarts,
        "listening_s_median": statistics.median(r["listening_s"] for r in restarts),
        "serving_s_median": statistics.median(r["serving_s"] for r in restarts),
        "serving_timed_out": any(r["serving_timed_out"] for r in restarts),
    }


def _all_serving(broker: Broker, partitions: int, records: int) -> bool:
    """Whether one ListOffsets (latest) request to the broker answers every partition with no
    error and `records` as its end offset.

    Sent straight to the broker, not through confluent-kafka's AdminClient: right after a
    restart librdkafka's list_offsets waits seconds on its own retries of partitions it has no
    leader for (seen: 3-12 s for 2,000 partitions while the broker answered Metadata in < 0.2 s
    and used a third of a core), so it measured the client more than the broker."""
    request = m.ListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            m.ListOffsetsRequest.ListOffsetsTopic(
                name=TOPIC,
                partitions=[
                    m.ListOffsetsRequest.ListOffsetsPartition(partition_index=p, timestamp=-1)
                    for p in range(partitions)
                ],
            )
        ],
    )

    async def call() -> m.ListOffsetsResponse:
        connection = await BrokerConnection.open(
            HOST, broker.port, client_id=NAME, timeout_ms=int(REQUEST_TIMEOUT_S * 1000)
        )
        try:
            return await connection.call(
                request, m.ListOffsetsResponse, timeout_ms=int(REQUEST_TIMEOUT_S * 1000)
            )
        finally:
            await connection.close()

    try:
        response = asyncio.run(call())
    except (OSError, TimeoutError, RiverbedKafkaError):
        return False
    answered = [p for t in response.topics if t.name == TOPIC for p in t.partitions]
    return len(answered) == partitions and all(
        p.error_code == 0 and p.offset == records for p in answered
    )


# -- produce -------------------------------------------------------------------------------------


def _produce_both(
    bootstrap: str, size: int, records: int, produce: Callable[[str, int, list[int]], Any]
) -> dict[str, Any]:
    """PRODUCE_PAIRS pairs of runs, one partition then spread; the figures of the pair with
    the median ratio, and every pair's ratio beside them."""
    written_before = _end_offsets_sum(_admin(bootstrap), size)
    pairs = []
    for _ in range(PRODUCE_PAIRS):
        one = produce(bootstrap, records, [0])
        spread = produce(bootstrap, records, list(range(size)))
        pairs.append((spread["records_per_s"] / one["records_per_s"], one, spread))
    timed_out = any(one["timed_out"] or spread["timed_out"] for _, one, spread in pairs)
    if not timed_out:  # after a timeout, purged records may or may not have been written
        written = _end_offsets_sum(_admin(bootstrap), size) - written_before
        # Each run also wrote one warm-up record to each partition it used.
        expected = PRODUCE_PAIRS * (2 * records + 1 + size)
        if written != expected:
            raise ProcessFailed(f"high watermarks grew by {written}, not {expected}")
    ratio, one, spread = sorted(pairs, key=lambda pair: pair[0])[len(pairs) // 2]
    return {
        "timed_out": timed_out,
        "records_per_run": records,
        "one_partition": one,
        "spread": spread,
        "ratio": ratio,
        "pair_ratios": [pair[0] for pair in pairs],
    }


def _produce(bootstrap: str, records: int, partitions: list[int]) -> dict[str, Any]:
    """Write `records` round robin over `partitions`, all acknowledged (acks=all); records per
    second from the first produce() to flush() returning. One record to each partition first,
    off the clock: connections open and leaders known."""
    failures: list[str] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None and len(failures) < 10:
            failures.append(str(error))

    producer = Producer({**PRODUCER_CONFIG, "bootstrap.servers": bootstrap, "log_level": 0})
    producer.list_topics(TOPIC, timeout=REQUEST_TIMEOUT_S)
    for partition in partitions:
        producer.produce(TOPIC, VALUE, partition=partition, on_delivery=on_delivery)
    if producer.flush(DELIVERY_TIMEOUT_S) or failures:
        raise ProcessFailed(f"warm-up records unacknowledged; failures: {failures}")
    count = len(partitions)
    client_cpu_before = time.process_time()
    started = time.perf_counter()
    for i in range(records):
        producer.produce(TOPIC, VALUE, partition=partitions[i % count], on_delivery=on_delivery)
    unacknowledged = producer.flush(DELIVERY_TIMEOUT_S)
    seconds = time.perf_counter() - started
    if failures:
        raise ProcessFailed(f"delivery failures: {failures}")
    if unacknowledged:  # too slow, not failed: the rate of what was acknowledged, flagged
        producer.purge()
        producer.flush(REQUEST_TIMEOUT_S)
    return {
        "partitions": count,
        "records": records,
        "seconds": seconds,
        # Within DELIVERY_TIMEOUT_S: records still queued or in flight then are not counted.
        "timed_out": unacknowledged > 0,
        "records_per_s": (records - unacknowledged) / seconds,
        "client_cpu_s": time.process_time() - client_cpu_before,
    }


def _produce_riverbed(bootstrap: str, records: int, partitions: list[int]) -> dict[str, Any]:
    """As `_produce`, with Riverbed's producer and the same settings."""
    from riverbed.client.producer import Producer as RiverbedProducer

    async def run() -> dict[str, Any]:
        async with RiverbedProducer(
            bootstrap_servers=bootstrap,
            acks=PRODUCER_CONFIG["acks"],
            linger_ms=PRODUCER_CONFIG["linger.ms"],
            batch_size=PRODUCER_CONFIG["batch.size"],
            compression_type=PRODUCER_CONFIG["compression.type"],
            enable_idempotence=False,
            delivery_timeout_ms=int(DELIVERY_TIMEOUT_S * 1000),
        ) as producer:
            await producer.partitions_for(TOPIC)
            for partition in partitions:
                await producer.send(TOPIC, VALUE, partition=partition)
            await producer.flush()
            count = len(partitions)
            send = producer.send
            client_cpu_before = time.process_time()
            started = time.perf_counter()
            last = None
            for i in range(records):
                last = await send(TOPIC, VALUE, partition=partitions[i % count])
            await producer.flush()
            seconds = time.perf_counter() - started
            client_cpu_s = time.process_time() - client_cpu_before
            if last is not None:
                await last  # raises if the last batch failed; the high watermarks count the rest
        return {
            "partitions": count,
            "records": records,
            "seconds": seconds,
            "timed_out": False,  # a delivery timeout raises instead
            "records_per_s": records / seconds,
            "client_cpu_s": client_cpu_s,
        }

    return asyncio.run(run())


def _end_offsets_sum(admin: AdminClient, size: int) -> int:
    wanted = [TopicPartition(TOPIC, p) for p in range(size)]
    futures = admin.list_offsets(
        {tp: OffsetSpec.latest() for tp in wanted},  # type: ignore[no-untyped-call]
        request_timeout=REQUEST_TIMEOUT_S,
    )
    return sum(int(futures[tp].result(timeout=REQUEST_TIMEOUT_S).offset) for tp in wanted)


# -- waiting and measuring -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Waited:
    # Seconds from the start to the first poll that saw the condition; the bound if none did.
    seconds: float
    timed_out: bool
    # The condition became true after the previous poll started: at most this long before.
    resolution_s: float
    polls: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "timed_out": self.timed_out,
            "resolution_s": self.resolution_s,
            "polls": self.polls,
        }


def _wait_until(
    condition: Callable[[], bool], started: float, bound_s: float, not_before: float | None = None
) -> Waited:
    """Poll `condition` until it holds, at most `bound_s` from `started` (perf_counter). It
    cannot have held before `not_before` (default: `started`), so a first poll that sees it
    narrows the resolution to the time since then."""
    previous = started if not_before is None else not_before
    polls = 0
    while True:
        poll_started = time.perf_counter()
        met = condition()
        polls += 1
        now = time.perf_counter()
        if met:
            return Waited(now - started, False, now - previous, polls)
        if now - started >= bound_s:
            return Waited(bound_s, True, now - previous, polls)
        previous = poll_started
        time.sleep(POLL_S)


def _idle_cpu(pids: Mapping[int, int], window_s: float) -> dict[str, Any]:
    machine_before = _machine_cpu_seconds()
    before = {i: cpu_seconds(pid) for i, pid in pids.items()}
    started = time.perf_counter()
    time.sleep(window_s)
    elapsed = time.perf_counter() - started
    per_broker = {i: 100 * (cpu_seconds(pid) - before[i]) / elapsed for i, pid in pids.items()}
    machine_pct = 100 * (_machine_cpu_seconds() - machine_before) / elapsed
    return {
        "window_s": elapsed,
        "per_broker_pct": per_broker,
        "max_pct": max(per_broker.values()),
        # All cores together (100 = one core busy): the brokers, ZooKeeper, this process, others.
        "machine_pct": machine_pct,
        "machine_other_than_brokers_pct": machine_pct - sum(per_broker.values()),
    }


def _machine_cpu_seconds() -> float:
    """CPU time the whole machine spent busy (not idle or waiting on I/O), from /proc/stat."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS_PER_S


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ProcessFailed(f"no VmRSS for process {pid}")


def _admin(bootstrap: str) -> AdminClient:
    """An AdminClient; its connections close when the last reference to it goes."""
    return AdminClient({**ADMIN_CONFIG, "bootstrap.servers": bootstrap})


def _topic_partitions(admin: AdminClient) -> dict[int, Any]:
    """The topic's partitions by Metadata; empty while it is unknown or the request fails."""
    try:
        topic = admin.list_topics(TOPIC, timeout=REQUEST_TIMEOUT_S).topics.get(TOPIC)
    except KafkaException:
        return {}
    if topic is None or topic.error is not None:
        return {}
    return dict(topic.partitions)


def _isr_full(admin: AdminClient, size: int, replication_factor: int) -> bool:
    partitions = _topic_partitions(admin)
    return len(partitions) == size and all(
        p.leader >= 0 and len(p.isrs) == replication_factor for p in partitions.values()
    )


def _leaders(admin: AdminClient) -> list[int]:
    return [p.leader for p in _topic_partitions(admin).values()]


def _controller(admin: AdminClient) -> int:
    return int(admin.list_topics(timeout=REQUEST_TIMEOUT_S).controller_id)


def _summary(figures: Mapping[str, Any]) -> str:
    """One line for the console: the top-level numbers, rounded."""
    parts = []
    for key, value in figures.items():
        if isinstance(value, Mapping):
            value = value.get("seconds", value.get("max_pct", value.get("ratio")))
        if isinstance(value, float):
            parts.append(f"{key} {value:.2f}")
        elif isinstance(value, bool | int):
            parts.append(f"{key} {value}")
    return ", ".join(parts)


# -- results -------------------------------------------------------------------------------------


def _produce_metrics(
    suffix: str, figures_key: str, client: str
) -> dict[str, tuple[str, str, Callable[[dict[str, Any]], float]]]:
    """The produce phase's three metrics for one client's figures."""
    return {
        f"produce_one_partition_per_s{suffix}": (
            f"produce to one partition, {client}",
            "records/s",
            lambda f: f[figures_key]["one_partition"]["records_per_s"],
        ),
        f"produce_spread_per_s{suffix}": (
            f"produce spread over every partition, {client}",
            "records/s",
            lambda f: f[figures_key]["spread"]["records_per_s"],
        ),
        f"produce_ratio{suffix}": (
            f"produce spread / one partition, {client}",
            "x",
            lambda f: f[figures_key]["ratio"],
        ),
    }


# Metric: (label, unit, its value in one size's figures).
METRICS: dict[str, tuple[str, str, Callable[[dict[str, Any]], float]]] = {
    "create_s": ("topic created, every ISR full", "s", lambda f: f["create"]["seconds"]),
    "idle_cpu_pct_max": (
        "idle CPU per broker (max)",
        "% of a core",
        lambda f: f["idle"]["max_pct"],
    ),
    "rss_per_partition_kib": (
        "RSS per partition replica (growth from empty)",
        "KiB",
        lambda f: f["rss"]["per_partition_kib"],
    ),
    **_produce_metrics("", "produce", "confluent-kafka"),
    **_produce_metrics("_riverbed", "produce_riverbed", "Riverbed's producer"),
    "controlled_shutdown_s": (
        "controlled shutdown (SIGTERM to exit)",
        "s",
        lambda f: f["controlled_shutdown"]["seconds"],
    ),
    "restart_listening_s": ("restart to listening", "s", lambda f: f["restart"]["listening_s"]),
    "back_in_isr_s": (
        "restarted broker back in every ISR, after listening",
        "s",
        lambda f: f["restart"]["seconds"],
    ),
    "kill_9_moved_s": (
        "kill -9 to every leadership moved",
        "s",
        lambda f: f["kill_9"]["seconds"],
    ),
}


def _goals(figures: dict[str, Any], session_s: float) -> dict[str, dict[str, Any]]:
    """The issue's goals for one size: value, goal and whether it is met (a timeout never is)."""

    def at_most(value: float, most: float, timed_out: bool = False) -> dict[str, Any]:
        return {"value": value, "goal": f"<= {most:g}", "met": value <= most and not timed_out}

    def ratio_at_least(produce: dict[str, Any]) -> dict[str, Any]:
        ratio = produce["ratio"]
        return {
            "value": ratio,
            "goal": f">= {PRODUCE_RATIO_GOAL}",
            "met": ratio >= PRODUCE_RATIO_GOAL and not produce["timed_out"],
        }

    return {
        "idle_cpu_pct_max": at_most(figures["idle"]["max_pct"], IDLE_CPU_GOAL_PCT),
        "controlled_shutdown_s": at_most(
            figures["controlled_shutdown"]["seconds"],
            SHUTDOWN_GOAL_S,
            figures["controlled_shutdown"]["timed_out"],
        ),
        "back_in_isr_s": at_most(
            figures["restart"]["seconds"], BACK_IN_ISR_GOAL_S, figures["restart"]["timed_out"]
        ),
        "kill_9_moved_s": at_most(
            figures["kill_9"]["seconds"],
            session_s + FAILOVER_MARGIN_S,
            figures["kill_9"]["timed_out"],
        ),
        "produce_ratio": ratio_at_least(figures["produce"]),
        "produce_ratio_riverbed": ratio_at_least(figures["produce_riverbed"]),
    }


def summarize(
    plan: Plan,
    settings: dict[str, str],
    per_size: dict[int, dict[str, Any]],
    single: dict[str, Any],
) -> BenchResult:
    session_s = int(settings["zookeeper.session.timeout.ms"]) / 1000
    metrics = {
        size: {key: get(figures) for key, (_, _, get) in METRICS.items()}
        for size, figures in per_size.items()
    }
    for size, figures in per_size.items():
        figures["metrics"] = metrics[size]
        figures["goals"] = _goals(figures, session_s)
    sizes = sorted(per_size)
    low, high = GROWTH_SIZES if set(GROWTH_SIZES) <= set(sizes) else (sizes[0], sizes[-1])
    growth = {
        key: metrics[high][key] / metrics[low][key]
        for key in METRICS
        if len(sizes) > 1 and metrics[low][key] > 0
    }
    rss_fit = None
    if len(sizes) > 1:
        mean_rss = [statistics.mean(per_size[s]["rss"]["with_topic_kib"].values()) for s in sizes]
        fit = statistics.linear_regression(sizes, mean_rss)
        rss_fit = {"kib_per_partition": fit.slope, "intercept_kib": fit.intercept}
    single_goal = {
        "value": single["serving_s_median"],
        "goal": f"<= {SINGLE_SERVING_GOAL_S:g}",
        "met": single["serving_s_median"] <= SINGLE_SERVING_GOAL_S
        and not single["serving_timed_out"],
    }

    single_label = f"single broker, {single['partitions']:,} partitions"
    headlines: list[Headline] = []
    for size in sizes:
        for key, (label, unit, _) in METRICS.items():
            if "_per_s" not in key:
                headlines.append(
                    Headline(
                        label=f"{size:,} partitions: {label}", value=metrics[size][key], unit=unit
                    )
                )
    if rss_fit is not None:
        headlines.append(
            Headline(
                label=f"RSS per partition replica, fit over {', '.join(f'{s:,}' for s in sizes)}",
                value=rss_fit["kib_per_partition"],
                unit="KiB",
            )
        )
    headlines += [
        Headline(
            label=f"{single_label}: restart to listening (median)",
            value=single["listening_s_median"],
            unit="s",
        ),
        Headline(
            label=f"{single_label}: restart to serving every partition (median)",
            value=single["serving_s_median"],
            unit="s",
        ),
    ]

    largest = sizes[-1]
    ratios = [
        Ratio(
            label=f"{largest:,} partitions: {METRICS[key][0]}",
            value=goal["value"],
            goal=goal["goal"],
            met=goal["met"],
        )
        for key, goal in per_size[largest]["goals"].items()
    ]
    ratios.append(
        Ratio(
            label=f"{single_label}: restart to serving every partition (s)",
            value=single_goal["value"],
            goal=single_goal["goal"],
            met=single_goal["met"],
        )
    )
    for key, factor in growth.items():
        ratios.append(
            Ratio(
                label=f"growth {low:,} -> {high:,} partitions: {METRICS[key][0]}",
                value=factor,
                goal=f"context (partitions x{high / low:g})",
                met=None,
            )
        )
    return BenchResult(
        parameters={
            "sizes": sizes,
            "brokers": BROKERS,
            "replication_factor": REPLICATION_FACTOR,
            "broker_settings": settings,
            "settle_s": plan.settle_s,
            "idle_window_s": plan.idle_window_s,
            "produce_records": plan.produce_records,
            "value_bytes": len(VALUE),
            "producer_config": PRODUCER_CONFIG,
            "single_broker_partitions": plan.single_partitions,
            "single_broker_restarts": SINGLE_RESTARTS,
            "poll_s": POLL_S,
            "bounds_s": {
                "controlled_shutdown": SHUTDOWN_BOUND_S,
                "back_in_isr": BACK_IN_ISR_BOUND_S,
                "kill_9_moved": session_s + FAILOVER_BOUND_S,
                "single_serving": SERVING_BOUND_S,
            },
        },
        tools={
            "confluent-kafka": package_version("confluent-kafka"),
            "librdkafka": libversion()[0],
        },
        measurements={
            "per_size": {str(size): per_size[size] for size in sizes},
            "single_broker": {**single, "goal": single_goal},
            "growth": {"from": low, "to": high, "factors": growth},
            "rss_fit": rss_fit,
        },
        headlines=headlines,
        ratios=ratios,
    )


# -- other sizes ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    from bench.run import DEFAULT_WORK_DIR, RESULTS_DIR, run_one

    parser = argparse.ArgumentParser(
        prog="python -m bench.partition_scale",
        description="partition_scale at other sizes; saved under its own name, not as latest",
    )
    parser.add_argument("--sizes", required=True, help="comma-separated, e.g. 500,1000")
    parser.add_argument("--single-partitions", type=int, default=QUICK.single_partitions)
    parser.add_argument("--quick", action="store_true", help="quick settle, window and records")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    sizes = tuple(sorted(int(size) for size in args.sizes.split(",")))
    plan = replace(
        QUICK if args.quick else FULL, sizes=sizes, single_partitions=args.single_partitions
    )
    options = BenchOptions(quick=args.quick, work_dir=args.work_dir.resolve())
    options.work_dir.mkdir(parents=True, exist_ok=True)
    variant = "sizes-" + "-".join(str(size) for size in sizes)
    path = run_one(NAME, options, args.results_dir, lambda o: run_plan(o, plan), variant)
    print(f"   saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
