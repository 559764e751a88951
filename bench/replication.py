"""Replication: what RF=3 costs in produce rate and latency, and how long a failover takes.

Everything runs on this machine in one run, on one embedded ZooKeeper (a chroot per cluster):
one broker with RF=1 topics and three brokers with RF=3 topics (min.insync.replicas 2), both
clusters up side by side, each broker its own process with a fresh data dir, all with
zookeeper.session.timeout.ms = 6 s (Kafka's default, 18 s, would make a crash failover three
times slower; `--set` overrides it and the goal follows). On each cluster:

- Produce rate: the same Riverbed producer run as client_throughput (1M x 100-byte records,
  acks=all, linger 5 ms, no idempotence, partition 0) at both batch sizes; afterwards the high
  watermark must equal the records written and, on RF=3, all three replicas must still be in
  the ISR (else acks=all did not wait for all three). The ratio RF=3 / RF=1 is the cost of
  replication (goal >= 0.5). The two clusters take turns, PRODUCE_PAIRS times for each case
  (RF=1 first in one pair, RF=3 first in the next), each rate being the median of its runs: the
  benchmark machine's speed drifts by a third within minutes (seen 2026-11-28: RF=1 from 313k
  to 456k records/s in one hour), and two runs a minute apart compared the machine's moods as
  much as the clusters. Each case writes one topic per cluster, whose runs append to it.
- Context, not the goal's setting: the 16 KiB run once more with the producer keeping up to
  20 requests in flight instead of the default 5 (allowed without idempotence). With one
  partition and one batch per partition per request, the default caps what is in flight at
  5 x 16 KiB, so RF=3 is bound by its acks=all round trip; this shows how much of the gap that
  cap is.
- End-to-end latency at 10,000 records/s for 10 s (replication_latency.py): p50, p99, p99.9.
- RF=3 only, failover (replication_failover.py): 10 rounds of SIGKILL to the partition's leader,
  then 10 of SIGTERM; in each, a producer writing one record at a time from the signal on, and
  the longest stretch without an acknowledged acks=all write (after SIGKILL: the time from the
  signal to the first acknowledgement). The stopped broker is restarted and back in the ISR
  between rounds. Goals on the medians: SIGKILL <= session timeout + 1 s, SIGTERM (controlled
  shutdown) <= 1 s.

`--quick`: 100,000 records, one pair per produce case, 3 s of latency, 3 rounds of each failover.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import libversion

from bench import client_throughput, replication_failover, replication_latency
from bench.kafka_clients import end_offset
from bench.machine import package_version
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import ZOOKEEPER_TICK_TIME_MS, Cluster, ProcessFailed, cpu_seconds, zookeeper
from bench.produce_consume import payload
from bench.replication_topics import create_topic, partition_state

NAME = "replication"
VALUE_BYTES = 100
BATCH_SIZES = client_throughput.BATCH_SIZES
LATENCY_RATE_PER_S = 10_000
REPLICATED_BROKERS = 3
# With three replicas, acks=all then survives one broker down and refuses writes with fewer.
MIN_INSYNC_REPLICAS = 2
SESSION_TIMEOUT_KEY = "zookeeper.session.timeout.ms"
CLUSTER_SETTINGS = {SESSION_TIMEOUT_KEY: "6000"}
BROKER_START_TIMEOUT_S = 120.0
# The goals.
PRODUCE_RATIO_GOAL = 0.5
CRASH_MARGIN_S = 1.0  # after SIGKILL: at most the ZooKeeper session timeout plus this
CONTROLLED_SHUTDOWN_GOAL_S = 1.0
# Kafka's published end-to-end latency (Jay Kreps, 2014: 3 replicas, acks=all): the anchor.
KAFKA_ANCHOR_P50_MS = 2.0
KAFKA_ANCHOR_P99_MS = 3.0
# The context run: the producer's requests in flight (the default is IN_FLIGHT_DEFAULT).
TUNED_IN_FLIGHT = 20
TUNED_BATCH_BYTES = BATCH_SIZES[0]
TUNED_KEY = f"produce_batch_{TUNED_BATCH_BYTES}_in_flight_{TUNED_IN_FLIGHT}"


@dataclass(frozen=True, slots=True)
class Plan:
    records: int
    produce_pairs: int  # runs of each produce case on each cluster, taking turns
    latency_duration_s: float
    failover_rounds: int


FULL = Plan(records=1_000_000, produce_pairs=3, latency_duration_s=10.0, failover_rounds=10)
QUICK = Plan(records=100_000, produce_pairs=1, latency_duration_s=3.0, failover_rounds=3)


@dataclass(frozen=True, slots=True)
class ProduceCase:
    key: str  # its name in the measurements
    batch_bytes: int
    in_flight_max: int = client_throughput.IN_FLIGHT_DEFAULT


PRODUCE_CASES = (
    *(ProduceCase(f"produce_batch_{batch_bytes}", batch_bytes) for batch_bytes in BATCH_SIZES),
    ProduceCase(TUNED_KEY, TUNED_BATCH_BYTES, TUNED_IN_FLIGHT),
)


def run(options: BenchOptions) -> BenchResult:
    plan = QUICK if options.quick else FULL
    settings = {**CLUSTER_SETTINGS, **options.broker_settings}
    log_dir = options.work_dir / "logs"
    with (
        tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=options.work_dir) as scratch,
        zookeeper(Path(scratch) / "zookeeper") as zk_connect,
    ):
        clusters = {
            size: Cluster(
                size,
                Path(scratch) / f"rf{size}",
                f"{zk_connect}/rf{size}",
                settings,
                log_dir,
                f"{NAME}-rf{size}",
            )
            for size in (1, REPLICATED_BROKERS)
        }
        try:
            for cluster in clusters.values():
                cluster.start(BROKER_START_TIMEOUT_S)
            measured: dict[str, dict[str, Any]] = {
                f"rf{size}": {"topic_configs": topic_configs(size)} for size in clusters
            }
            for case in PRODUCE_CASES:
                runs = measure_produce_pairs(clusters, case, plan)
                for size, its_runs in runs.items():
                    measured[f"rf{size}"][case.key] = {
                        "records_per_s": statistics.median(r["records_per_s"] for r in its_runs),
                        "runs": its_runs,
                    }
                # Each pair's ratio, next to the medians', to show the spread.
                measured[f"rf{REPLICATED_BROKERS}"][case.key]["pair_ratios"] = [
                    b["records_per_s"] / a["records_per_s"]
                    for a, b in zip(runs[1], runs[REPLICATED_BROKERS], strict=True)
                ]
            for size, cluster in clusters.items():
                measured[f"rf{size}"] |= measure_latency_and_failover(size, cluster, plan)
        finally:
            for cluster in clusters.values():
                cluster.close()
    return summarize(plan, settings, measured)


def topic_configs(size: int) -> dict[str, str]:
    return {"min.insync.replicas": str(min(size, MIN_INSYNC_REPLICAS))}


def measure_produce_pairs(
    clusters: dict[int, Cluster], case: ProduceCase, plan: Plan
) -> dict[int, list[dict[str, Any]]]:
    """`case` on each cluster `plan.produce_pairs` times, the clusters taking turns (the first of
    a pair alternating), each appending to one topic of its own; every run's measurements."""
    topic = f"{NAME}-{case.key.replace('_', '-')}"
    for size, cluster in clusters.items():
        create_topic(cluster.bootstrap, topic, size, topic_configs(size))
    value = payload(VALUE_BYTES)
    runs: dict[int, list[dict[str, Any]]] = {size: [] for size in clusters}
    sizes = list(clusters)
    for pair in range(plan.produce_pairs):
        for size in sizes if pair % 2 == 0 else reversed(sizes):
            runs[size].append(
                measure_produce(
                    clusters[size],
                    topic,
                    plan.records,
                    value,
                    case.batch_bytes,
                    case.in_flight_max,
                    records_before=len(runs[size]) * plan.records,
                )
            )
    return runs


def measure_latency_and_failover(size: int, cluster: Cluster, plan: Plan) -> dict[str, Any]:
    """End-to-end latency on `cluster`; on the replicated one, failovers; then a clean stop."""
    configs = topic_configs(size)
    topic = f"{NAME}-latency"
    create_topic(cluster.bootstrap, topic, size, configs)
    measured: dict[str, Any] = {
        "latency": {
            "loadavg_1m_before": os.getloadavg()[0],
            **asyncio.run(
                replication_latency.measure(
                    cluster.bootstrap,
                    topic,
                    LATENCY_RATE_PER_S,
                    plan.latency_duration_s,
                    VALUE_BYTES,
                )
            ),
        }
    }
    if size > 1:
        topic = f"{NAME}-failover"
        create_topic(cluster.bootstrap, topic, size, configs)
        for sig in (signal.SIGKILL, signal.SIGTERM):
            measured[f"failover_{sig.name}"] = {
                "loadavg_1m_before": os.getloadavg()[0],
                "rounds": replication_failover.measure_rounds(
                    cluster, topic, sig, plan.failover_rounds
                ),
            }
    measured["exit_codes_after_sigterm"] = cluster.stop()
    return measured


def measure_produce(
    cluster: Cluster,
    topic: str,
    records: int,
    value: bytes,
    batch_bytes: int,
    in_flight_max: int = client_throughput.IN_FLIGHT_DEFAULT,
    *,
    records_before: int = 0,
) -> dict[str, Any]:
    """client_throughput's Riverbed producer run (after `records_before` written to the topic
    already); then every record must be in every replica."""
    pids = cluster.pids
    loadavg = os.getloadavg()[0]
    cpu_before = {broker_id: cpu_seconds(pid) for broker_id, pid in pids.items()}
    produced = client_throughput.produce_riverbed(
        cluster.bootstrap, topic, records, value, batch_bytes, in_flight_max=in_flight_max
    )
    broker_cpu_s = {
        str(broker_id): cpu_seconds(pid) - cpu_before[broker_id] for broker_id, pid in pids.items()
    }
    high_watermark = end_offset(cluster.bootstrap, topic, 0)
    if high_watermark != records_before + records:
        raise ProcessFailed(
            f"{topic} holds {high_watermark} records, not {records_before} + {records}"
        )
    state = partition_state(cluster.bootstrap, topic)
    if len(state.isr) != len(cluster.brokers):
        raise ProcessFailed(f"{topic}-0's ISR shrank to {state.isr} while producing")
    return {
        **produced,
        "high_watermark": high_watermark,
        "leader": state.leader,
        "isr_after": list(state.isr),
        "broker_cpu_s": broker_cpu_s,
        "loadavg_1m_before": loadavg,
    }


def summarize(plan: Plan, settings: dict[str, str], measured: dict[str, Any]) -> BenchResult:
    session_timeout_s = int(settings[SESSION_TIMEOUT_KEY]) / 1000
    single, replicated = measured["rf1"], measured[f"rf{REPLICATED_BROKERS}"]
    headlines: list[Headline] = []
    ratios: list[Ratio] = []
    for batch_bytes in BATCH_SIZES:
        key, what = f"produce_batch_{batch_bytes}", f"batch {batch_bytes} B"
        _produce_rows(single, replicated, key, what, headlines, ratios, goal=True)
    what = f"batch {TUNED_BATCH_BYTES} B, {TUNED_IN_FLIGHT} requests in flight"
    _produce_rows(single, replicated, TUNED_KEY, what, headlines, ratios, goal=False)
    crash_goal_s = session_timeout_s + CRASH_MARGIN_S
    goals = {
        "SIGKILL": (
            crash_goal_s,
            f"<= {crash_goal_s:g} s (ZooKeeper session timeout "
            f"{session_timeout_s:g} s + {CRASH_MARGIN_S:g} s)",
        ),
        "SIGTERM": (CONTROLLED_SHUTDOWN_GOAL_S, f"<= {CONTROLLED_SHUTDOWN_GOAL_S:g} s"),
    }
    for sig, (goal_s, goal) in goals.items():
        rounds = replicated[f"failover_{sig}"]["rounds"]
        median_s = statistics.median(r["unavailable_s"] for r in rounds)
        replicated[f"failover_{sig}"]["unavailable_s_median"] = median_s
        label = f"writes unavailable after leader {sig}"
        headlines += [
            _headline(f"{label}, median of {len(rounds)}", median_s, "s"),
            _headline(
                f"{label}, worst of {len(rounds)}", max(r["unavailable_s"] for r in rounds), "s"
            ),
        ]
        if sig == "SIGKILL":
            headlines += _crash_split(rounds)
        ratios.append(
            {
                "label": f"{label}, median (s)",
                "value": median_s,
                "goal": goal,
                "met": median_s <= goal_s,
            }
        )
    for rf, cluster in (("RF=3, 3 brokers", replicated), ("RF=1, 1 broker", single)):
        latency = cluster["latency"]
        where = f"{rf}, acks=all, {LATENCY_RATE_PER_S:,} records/s"
        headlines += [
            _headline(f"end-to-end latency p50, {where}", latency["p50_ms"], "ms"),
            _headline(f"end-to-end latency p99, {where}", latency["p99_ms"], "ms"),
            _headline(f"end-to-end latency p99.9, {where}", latency["p99.9_ms"], "ms"),
            _headline(f"send to acknowledgement p50, {where}", latency["ack_p50_ms"], "ms"),
            _headline(f"send to acknowledgement p99, {where}", latency["ack_p99_ms"], "ms"),
            _headline(
                f"achieved send rate, {rf} latency run", latency["sent_records_per_s"], "records/s"
            ),
        ]
    rf3_latency = replicated["latency"]
    for name, anchor_ms in (("p50", KAFKA_ANCHOR_P50_MS), ("p99", KAFKA_ANCHOR_P99_MS)):
        ratios.append(
            {
                "label": f"end-to-end latency {name}, RF=3 acks=all (ms)",
                "value": rf3_latency[f"{name}_ms"],
                "goal": f"context: Kafka 2014 {anchor_ms:g} ms",
                "met": None,
            }
        )
    return {
        "parameters": {
            "records": plan.records,
            "value_bytes": VALUE_BYTES,
            "batch_sizes": list(BATCH_SIZES),
            "topic_partitions": 1,
            "replicated_brokers": REPLICATED_BROKERS,
            "min_insync_replicas_rf3": MIN_INSYNC_REPLICAS,
            "broker_settings": settings,
            "zookeeper_tick_time_ms": ZOOKEEPER_TICK_TIME_MS,
            "produce_client": "riverbed Producer as in client_throughput: acks=all, linger 5 ms, "
            "no idempotence, max_request_size 2 MB, "
            f"{client_throughput.IN_FLIGHT_DEFAULT} requests in flight (and "
            f"{TUNED_IN_FLIGHT} in the context run)",
            "latency_rate_per_s": LATENCY_RATE_PER_S,
            "latency_duration_s": plan.latency_duration_s,
            "latency_producer": replication_latency.PRODUCER_SETTINGS,
            "latency_pace_tick_s": replication_latency.PACE_TICK_S,
            "produce_pairs": plan.produce_pairs,
            "failover_rounds": plan.failover_rounds,
            "failover_probe_producer": replication_failover.PROBE_PRODUCER_SETTINGS,
        },
        "tools": {
            "confluent-kafka (admin, offsets)": package_version("confluent-kafka"),
            "librdkafka": str(libversion()[0]),
        },
        "measurements": measured,
        "headlines": headlines,
        "ratios": ratios,
    }


def _produce_rows(
    single: dict[str, Any],
    replicated: dict[str, Any],
    key: str,
    what: str,
    headlines: list[Headline],
    ratios: list[Ratio],
    *,
    goal: bool,
) -> None:
    """The two produce rates of run `key` (medians of their runs) and their ratio: against the
    goal, or as context, labelled with the range of the pairs' ratios."""
    rf1, rf3 = single[key]["records_per_s"], replicated[key]["records_per_s"]
    pairs = replicated[key]["pair_ratios"]
    runs = f"median of {len(pairs)}"
    headlines += [
        _headline(f"produce acks=all, RF=1 on 1 broker, {what}, {runs}", rf1, "records/s"),
        _headline(f"produce acks=all, RF=3 on 3 brokers, {what}, {runs}", rf3, "records/s"),
    ]
    label = f"produce RF=3 / RF=1, {what} (pairs {min(pairs):.2f}-{max(pairs):.2f})"
    ratios.append(
        {
            "label": label if goal else f"{label} (context: not the default)",
            "value": rf3 / rf1,
            "goal": f">= {PRODUCE_RATIO_GOAL:g}" if goal else "context",
            "met": rf3 >= PRODUCE_RATIO_GOAL * rf1 if goal else None,
        }
    )


def _crash_split(rounds: list[dict[str, Any]]) -> list[Headline]:
    """ZooKeeper's part of a crash failover (the dead leader's session expiring) and the rest."""
    # The watch's event may in theory reach us after the round ended: such a round is left out.
    watched = [r for r in rounds if r["registration_deleted_s"] is not None]
    expired_s = [r["registration_deleted_s"] for r in watched]
    after_expiry_s = [r["unavailable_s"] - r["registration_deleted_s"] for r in watched]
    return [
        _headline(
            f"SIGKILL: ZooKeeper session expiry (registration deleted) after the kill, median "
            f"of {len(watched)}",
            statistics.median(expired_s),
            "s",
        ),
        _headline(
            f"SIGKILL: from that expiry to the first acks=all write, median of {len(watched)}",
            statistics.median(after_expiry_s),
            "s",
        ),
    ]


def _headline(label: str, value: float, unit: str) -> Headline:
    return {"label": label, "value": float(value), "unit": unit}
