"""Partition scale: what a cluster costs as its partition count grows, idle and in its chores.

For each size (500, 1,000, 2,000 and 4,000 partitions; `--quick`: 100 and 300) a fresh cluster
of three brokers (each its own process, zookeeper.session.timeout.ms = 6 s, one embedded
ZooKeeper with a chroot per cluster) gets one topic of that many partitions at RF=3, created
with confluent-kafka's AdminClient as a user would. Then, in this order:

- **create**: from CreateTopics to every partition having a leader and three in-sync replicas
  in Metadata.
- **idle CPU**: after SETTLE_S, each broker's CPU time (/proc) over IDLE_WINDOW_S, as a
  percentage of one core; no client is connected meanwhile.
- **RSS per partition**: each broker's VmRSS minus its own VmRSS before the topic existed,
  divided by the replicas it hosts (the partition count: RF=3 on three brokers).
- **produce**: confluent-kafka's Producer (acks=all, linger.ms 5, batch.size 1 MiB, the same
  settings both times) writes PRODUCE_RECORDS records of 100 bytes to partition 0 only, then
  the same count spread round robin over every partition; records per second from the first
  produce() to flush() returning with all acknowledged. The ratio spread / one partition is
  what the partition count costs a producer (goal >= 0.5).
- **controlled shutdown**: SIGTERM to broker 3 until its process exits (goal <= 5 s).
- **restart**: broker 3 started again: seconds to its port accepting, then seconds from then
  until every partition lists all three replicas in its ISR again (goal <= 15 s).
- **kill -9**: SIGKILL to broker 1 (it leads a third of the partitions), until Metadata shows
  no partition led by it (goal <= session timeout + 3 s).

Once per run, a single broker with SINGLE_BROKER_PARTITIONS partitions (RF=1; `--quick`: 1,000)
is stopped with SIGTERM and started again: seconds from spawning to its port accepting (goal
<= 5 s, the median of SINGLE_BROKER_RESTARTS).

The growth of each figure from 1,000 to 4,000 partitions is recorded beside it: the issue asks
that each stay roughly flat, or grow only as the work itself does. Every wait is bounded
(WAIT_S); a size that does not finish fails the run with the process logs kept.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer, libversion
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bench.machine import package_version
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import Cluster, ProcessFailed, cpu_seconds, zookeeper

NAME = "partition_scale"
TOPIC = "scale"
SIZES_FULL = (500, 1_000, 2_000, 4_000)
SIZES_QUICK = (100, 300)
SINGLE_BROKER_PARTITIONS_FULL = 5_000
SINGLE_BROKER_PARTITIONS_QUICK = 1_000
SINGLE_BROKER_RESTARTS = 3
BROKERS = 3
REPLICATION_FACTOR = 3
SESSION_TIMEOUT_MS = 6_000
CLUSTER_SETTINGS = {"zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS)}
SETTLE_S = 5.0
IDLE_WINDOW_S = 15.0
PRODUCE_RECORDS_FULL = 200_000
PRODUCE_RECORDS_QUICK = 20_000
VALUE_BYTES = 100
PRODUCER_SETTINGS = {"acks": "all", "linger.ms": 5, "batch.size": 1024 * 1024, "log_level": 0}
# Every wait (a cluster up, a topic in sync, a broker stopped) ends here at the latest.
WAIT_S = 300.0
POLL_S = 0.2
# The goals, at the largest size.
IDLE_CPU_GOAL_PCT = 5.0
SHUTDOWN_GOAL_S = 5.0
BACK_IN_ISR_GOAL_S = 15.0
FAILOVER_MARGIN_S = 3.0
PRODUCE_RATIO_GOAL = 0.5
SINGLE_RESTART_GOAL_S = 5.0
GROWTH_FROM, GROWTH_TO = 1_000, 4_000
ADMIN_CONFIG = {"log_level": 0}


def run(options: BenchOptions) -> BenchResult:
    sizes = SIZES_QUICK if options.quick else SIZES_FULL
    records = PRODUCE_RECORDS_QUICK if options.quick else PRODUCE_RECORDS_FULL
    single_size = SINGLE_BROKER_PARTITIONS_QUICK if options.quick else SINGLE_BROKER_PARTITIONS_FULL
    settings = {**CLUSTER_SETTINGS, **options.broker_settings}
    per_size: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(dir=options.work_dir) as scratch:
        work = Path(scratch)
        with zookeeper(work / "zookeeper") as connect:
            for size in sizes:
                print(f"   {size} partitions", flush=True)
                per_size[size] = _measure_size(size, records, connect, settings, work, options)
                print(f"     {per_size[size]}", flush=True)
            single = _measure_single(single_size, connect, settings, work, options)
    largest = per_size[sizes[-1]]
    session_s = int(settings["zookeeper.session.timeout.ms"]) / 1000
    growth = _growth(per_size)
    measurements: dict[str, Any] = {
        "per_size": {str(size): figures for size, figures in per_size.items()},
        "single_broker": single,
        "growth_1000_to_4000": growth,
    }
    headlines: list[Headline] = []
    for size, figures in per_size.items():
        headlines += [
            Headline(label=f"{size} partitions: idle CPU per broker (max)",
                     value=figures["idle_cpu_pct_max"], unit="% of a core"),
            Headline(label=f"{size} partitions: controlled shutdown",
                     value=figures["controlled_shutdown_s"], unit="s"),
            Headline(label=f"{size} partitions: restarted broker back in every ISR",
                     value=figures["back_in_isr_s"], unit="s"),
            Headline(label=f"{size} partitions: kill -9 to every leadership moved",
                     value=figures["failover_s"], unit="s"),
            Headline(label=f"{size} partitions: RSS per partition replica",
                     value=figures["rss_per_partition_kib"], unit="KiB"),
        ]  # fmt: skip
    headlines.append(
        Headline(
            label=f"single broker, {single_size} partitions: restart to serving (median)",
            value=single["restart_s_median"],
            unit="s",
        )
    )
    size = sizes[-1]
    ratios = [
        _goal(f"{size} partitions: idle CPU per broker (% of a core, max)",
              largest["idle_cpu_pct_max"], IDLE_CPU_GOAL_PCT),
        _goal(f"{size} partitions: controlled shutdown (s)",
              largest["controlled_shutdown_s"], SHUTDOWN_GOAL_S),
        _goal(f"{size} partitions: back in every ISR after listening (s)",
              largest["back_in_isr_s"], BACK_IN_ISR_GOAL_S),
        _goal(f"{size} partitions: kill -9 to every leadership moved (s)",
              largest["failover_s"], session_s + FAILOVER_MARGIN_S),
        Ratio(label=f"{size} partitions: produce spread over all / one partition",
              value=largest["produce_ratio"], goal=f">= {PRODUCE_RATIO_GOAL}",
              met=largest["produce_ratio"] >= PRODUCE_RATIO_GOAL),
        _goal(f"single broker, {single_size} partitions: restart to serving (s)",
              single["restart_s_median"], SINGLE_RESTART_GOAL_S),
    ]  # fmt: skip
    for metric, factor in growth.items():
        ratios.append(
            Ratio(label=f"growth {GROWTH_FROM} -> {GROWTH_TO} partitions: {metric}",
                  value=factor, goal="context (work grows 4x)", met=None)
        )  # fmt: skip
    return BenchResult(
        parameters={
            "sizes": list(sizes),
            "brokers": BROKERS,
            "replication_factor": REPLICATION_FACTOR,
            "broker_settings": settings,
            "idle_window_s": IDLE_WINDOW_S,
            "settle_s": SETTLE_S,
            "produce_records": records,
            "value_bytes": VALUE_BYTES,
            "producer_settings": PRODUCER_SETTINGS,
            "single_broker_partitions": single_size,
            "single_broker_restarts": SINGLE_BROKER_RESTARTS,
        },
        tools={
            "confluent-kafka": package_version("confluent-kafka"),
            "librdkafka": libversion()[0],
        },
        measurements=measurements,
        headlines=headlines,
        ratios=ratios,
    )


def _goal(label: str, value: float, most: float) -> Ratio:
    return Ratio(label=label, value=value, goal=f"<= {most:g}", met=value <= most)


def _growth(per_size: dict[int, dict[str, Any]]) -> dict[str, float]:
    if GROWTH_FROM not in per_size or GROWTH_TO not in per_size:
        return {}
    low, high = per_size[GROWTH_FROM], per_size[GROWTH_TO]
    metrics = (
        "create_s",
        "idle_cpu_pct_max",
        "controlled_shutdown_s",
        "back_in_isr_s",
        "failover_s",
        "rss_per_partition_kib",
        "produce_spread_records_per_s",
    )
    return {m: round(high[m] / low[m], 2) for m in metrics if low[m] > 0}


def _measure_size(
    size: int,
    records: int,
    connect: str,
    settings: dict[str, str],
    work: Path,
    options: BenchOptions,
) -> dict[str, Any]:
    cluster = Cluster(
        BROKERS,
        work / f"data-{size}",
        f"{connect}/scale-{size}",
        settings,
        options.work_dir / "logs",
        f"partition-scale-{size}",
    )
    try:
        cluster.start(WAIT_S)
        admin = AdminClient({**ADMIN_CONFIG, "bootstrap.servers": cluster.bootstrap})
        rss_before = {i: _rss_kib(pid) for i, pid in cluster.pids.items()}
        started = time.perf_counter()
        new_topic = NewTopic(TOPIC, num_partitions=size, replication_factor=REPLICATION_FACTOR)
        admin.create_topics([new_topic], operation_timeout=WAIT_S)[TOPIC].result(WAIT_S)
        _wait(lambda: _fully_replicated(admin, size), "every ISR full after creation")
        create_s = time.perf_counter() - started

        time.sleep(SETTLE_S)
        pids = cluster.pids
        cpu_before = {i: cpu_seconds(pid) for i, pid in pids.items()}
        time.sleep(IDLE_WINDOW_S)
        idle_pct = {
            i: 100 * (cpu_seconds(pid) - cpu_before[i]) / IDLE_WINDOW_S for i, pid in pids.items()
        }
        rss_growth = {i: _rss_kib(pid) - rss_before[i] for i, pid in pids.items()}
        # RF=3 on three brokers: every broker hosts a replica of every partition.
        rss_per_partition_kib = statistics.mean(rss_growth.values()) / size

        one_rate = _produce_rate(cluster.bootstrap, records, [0])
        spread_rate = _produce_rate(cluster.bootstrap, records, list(range(size)))

        stopping = cluster.brokers[3]
        started = time.perf_counter()
        stopping.terminate()
        shutdown_s = time.perf_counter() - started
        startup_s = stopping.start(WAIT_S)
        listening = time.perf_counter()
        _wait(lambda: _fully_replicated(admin, size), "the restarted broker back in every ISR")
        back_in_isr_s = time.perf_counter() - listening

        victim = cluster.brokers[1]
        if _led_by(admin, 1) == 0:
            raise ProcessFailed("broker 1 leads nothing: kill -9 would measure nothing")
        started = time.perf_counter()
        victim.kill()
        _wait(lambda: _led_by(admin, 1) == 0, "broker 1's leaderships moved")
        failover_s = time.perf_counter() - started
        return {
            "create_s": round(create_s, 2),
            "idle_cpu_pct": {str(i): round(v, 1) for i, v in idle_pct.items()},
            "idle_cpu_pct_max": round(max(idle_pct.values()), 1),
            "rss_growth_kib": {str(i): v for i, v in rss_growth.items()},
            "rss_per_partition_kib": round(rss_per_partition_kib, 1),
            "produce_one_partition_records_per_s": round(one_rate),
            "produce_spread_records_per_s": round(spread_rate),
            "produce_ratio": round(spread_rate / one_rate, 3),
            "controlled_shutdown_s": round(shutdown_s, 2),
            "restart_to_listening_s": round(startup_s, 2),
            "back_in_isr_s": round(back_in_isr_s, 2),
            "failover_s": round(failover_s, 2),
        }
    finally:
        cluster.close()


def _measure_single(
    size: int, connect: str, settings: dict[str, str], work: Path, options: BenchOptions
) -> dict[str, Any]:
    cluster = Cluster(
        1,
        work / "data-single",
        f"{connect}/scale-single",
        settings,
        options.work_dir / "logs",
        "partition-scale-single",
    )
    try:
        cluster.start(WAIT_S)
        admin = AdminClient({**ADMIN_CONFIG, "bootstrap.servers": cluster.bootstrap})
        new_topic = NewTopic(TOPIC, num_partitions=size, replication_factor=1)
        admin.create_topics([new_topic], operation_timeout=WAIT_S)[TOPIC].result(WAIT_S)
        broker = cluster.brokers[1]
        restarts, stops = [], []
        for _ in range(SINGLE_BROKER_RESTARTS):
            started = time.perf_counter()
            broker.terminate()
            stops.append(round(time.perf_counter() - started, 2))
            restarts.append(round(broker.start(WAIT_S), 2))
            restarted = AdminClient({**ADMIN_CONFIG, "bootstrap.servers": cluster.bootstrap})
            _wait(
                lambda client=restarted: _led_by(client, 1) == size,  # type: ignore[misc]
                "every partition led after the restart",
            )
        return {
            "partitions": size,
            "restart_s": restarts,
            "restart_s_median": statistics.median(restarts),
            "shutdown_s": stops,
        }
    finally:
        cluster.close()


def _produce_rate(bootstrap: str, records: int, partitions: list[int]) -> float:
    """Records per second, all acknowledged, written round robin over `partitions`."""
    failures: list[str] = []

    def on_delivery(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer({**PRODUCER_SETTINGS, "bootstrap.servers": bootstrap})
    producer.list_topics(TOPIC, timeout=WAIT_S)  # connected, metadata known: not timed
    value = b"x" * VALUE_BYTES
    count = len(partitions)
    started = time.perf_counter()
    for i in range(records):
        while True:
            try:
                partition = partitions[i % count]
                producer.produce(TOPIC, value, partition=partition, on_delivery=on_delivery)
                break
            except BufferError:  # the client's queue is full: let it send
                producer.poll(0.01)
    unacknowledged = producer.flush(WAIT_S)
    elapsed_s = time.perf_counter() - started
    if unacknowledged or failures:
        raise ProcessFailed(f"{unacknowledged} records unacknowledged; failures: {failures[:5]}")
    return records / elapsed_s


def _fully_replicated(admin: AdminClient, size: int) -> bool:
    topic = admin.list_topics(TOPIC, timeout=WAIT_S).topics.get(TOPIC)
    if topic is None or topic.error is not None or len(topic.partitions) != size:
        return False
    return all(
        p.leader >= 0 and len(p.isrs) == REPLICATION_FACTOR for p in topic.partitions.values()
    )


def _led_by(admin: AdminClient, broker_id: int) -> int:
    topic = admin.list_topics(TOPIC, timeout=WAIT_S).topics.get(TOPIC)
    if topic is None or topic.error is not None:
        return -1
    return sum(1 for p in topic.partitions.values() if p.leader == broker_id)


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise ProcessFailed(f"not reached within {WAIT_S} s: {what}")
        time.sleep(POLL_S)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ProcessFailed(f"no VmRSS for process {pid}")
