"""Transactions: what committing every 100 ms costs a producer, and what read_committed costs a
consumer's latency.

One Riverbed broker (its own process, fresh data dir), confluent-kafka (librdkafka) for every
client, 1 KiB records (the size of Kafka's own "about 3% overhead" figure for 100 ms
transactions), a topic of PARTITIONS partitions, the same producer settings for both runs:

- Produce throughput: RECORDS records with `enable.idempotence=true` against the same records
  with a `transactional.id`, a transaction committed every COMMIT_INTERVAL_MS (the producer
  thread checks the clock after each record; `commit_transaction()` flushes, as librdkafka's
  does, so the time a commit blocks is counted). Rounds alternate the two modes and the median
  run counts; every run's rate is kept. The ratio is transactional / idempotent: goal >= 0.9.
- End-to-end latency: a transactional producer paced at LATENCY_RATE records/s for
  LATENCY_SECONDS, committing every COMMIT_INTERVAL_MS; two consumers read the same partitions
  at once, one read_committed and one read_uncommitted. A record's latency is the time it was
  consumed minus its CreateTime. A committed transaction's records become visible to
  read_committed consumers only once its marker is written, so their latency includes up to one
  commit interval by design: the comparison shows how much.

The broker runs with transaction.state.log.replication.factor=1 (one broker). What a marker's
replication adds on a 3-broker cluster is not measured here.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition, libversion

from bench.kafka_clients import create_topic
from bench.machine import package_version
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import Broker, ProcessFailed, zookeeper

NAME = "transactions"
RECORDS_FULL = 1_000_000
RECORDS_QUICK = 30_000
VALUE_BYTES = 1024
PARTITIONS = 4
COMMIT_INTERVAL_MS = 100
ROUNDS_FULL = 3
LATENCY_RATE = 10_000  # records/s, the rate
LATENCY_SECONDS_FULL = 20.0
LATENCY_SECONDS_QUICK = 5.0
# The producer sends a slice of records every PACE_MS to hold LATENCY_RATE.
PACE_MS = 10
BROKER_START_TIMEOUT_S = 120.0
DELIVERY_TIMEOUT_S = 120.0
CONSUME_TIMEOUT_S = 60.0
THROUGHPUT_GOAL = 0.9
BROKER_SETTINGS = {
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
}
# The same batching for both producers: librdkafka's defaults but for linger, as the other
# benchmarks set it.
PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "linger.ms": 5,
    "compression.type": "none",
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 2_000_000,
}


def run(options: BenchOptions) -> BenchResult:
    records = RECORDS_QUICK if options.quick else RECORDS_FULL
    rounds = 1 if options.quick else ROUNDS_FULL
    seconds = LATENCY_SECONDS_QUICK if options.quick else LATENCY_SECONDS_FULL
    settings = {**BROKER_SETTINGS, **options.broker_settings}
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=options.work_dir) as scratch:
        scratch_dir = Path(scratch)
        data_dir = scratch_dir / "broker-data"
        data_dir.mkdir()
        with zookeeper(scratch_dir / "zookeeper") as zk_connect:
            log_path = options.work_dir / "logs" / f"{NAME}-broker.log"
            broker = Broker(data_dir, zk_connect, settings, log_path)
            try:
                broker.start(BROKER_START_TIMEOUT_S)
                throughput = _throughput(broker.bootstrap, records, rounds)
                latency = _latency(broker.bootstrap, seconds)
                broker.terminate()
            finally:
                broker.close()
    return _summarize(records, rounds, seconds, throughput, latency, settings)


# -- throughput --------------------------------------------------------------------------------


def _throughput(bootstrap: str, records: int, rounds: int) -> dict[str, Any]:
    value = bytes(VALUE_BYTES)
    runs: dict[str, list[dict[str, Any]]] = {"idempotent": [], "transactional": []}
    for round_index in range(rounds):
        for mode in runs:
            topic = f"{NAME}-{mode}-{round_index}"
            create_topic(bootstrap, topic, PARTITIONS)
            runs[mode].append(_produce(bootstrap, topic, records, value, mode, round_index))
    return {mode: _median(mode_runs) for mode, mode_runs in runs.items()}


def _produce(
    bootstrap: str, topic: str, records: int, value: bytes, mode: str, round_index: int
) -> dict[str, Any]:
    config = {**PRODUCER_CONFIG, "bootstrap.servers": bootstrap}
    transactional = mode == "transactional"
    if transactional:
        config["transactional.id"] = f"{NAME}-{round_index}"
    else:
        config["enable.idempotence"] = True
    failures: list[str] = []

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(config)
    producer.list_topics(topic, timeout=DELIVERY_TIMEOUT_S)
    commits = 0
    if transactional:
        producer.init_transactions(DELIVERY_TIMEOUT_S)
        producer.begin_transaction()
    interval_s = COMMIT_INTERVAL_MS / 1000
    started = time.perf_counter()
    cpu_before = time.process_time()
    next_commit = started + interval_s
    for index in range(records):
        producer.produce(topic, value, partition=index % PARTITIONS, on_delivery=delivered)
        producer.poll(0)
        if transactional and time.perf_counter() >= next_commit:
            producer.commit_transaction(DELIVERY_TIMEOUT_S)
            commits += 1
            producer.begin_transaction()
            next_commit = time.perf_counter() + interval_s
    if transactional:
        producer.commit_transaction(DELIVERY_TIMEOUT_S)
        commits += 1
    elif producer.flush(DELIVERY_TIMEOUT_S) != 0:
        raise ProcessFailed(f"{topic}: records still unacknowledged after {DELIVERY_TIMEOUT_S} s")
    elapsed_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_before
    if failures:
        raise ProcessFailed(f"{topic}: {len(failures)} records failed, first: {failures[0]}")
    return {
        "records": records,
        "seconds": elapsed_s,
        "records_per_s": records / elapsed_s,
        "client_cpu_s": cpu_s,
        "transactions": commits,
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda run: float(run["records_per_s"]))
    return {**ordered[len(ordered) // 2], "runs_records_per_s": [r["records_per_s"] for r in runs]}


# -- latency -----------------------------------------------------------------------------------


class _LatencyConsumer(threading.Thread):
    """Reads every partition of `topic` from the start at one isolation level, noting each
    record's latency (now - CreateTime) in ms, until `expected` records or the stop event."""

    def __init__(self, bootstrap: str, topic: str, isolation: str, stop: threading.Event) -> None:
        super().__init__(name=f"consume-{isolation}", daemon=True)
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"{NAME}-{isolation}",  # assign() below: the group is never joined
                "enable.auto.commit": False,
                "isolation.level": isolation,
                "fetch.wait.max.ms": 10,
            }
        )
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        self._done = stop
        self.latencies_ms: list[float] = []
        self.error: str | None = None

    def run(self) -> None:
        try:
            while not self._done.is_set():
                for message in self._consumer.consume(1000, 0.05):
                    if message.error() is not None:
                        self.error = str(message.error())
                        continue
                    created_ms = message.timestamp()[1]
                    self.latencies_ms.append(time.time() * 1000 - created_ms)
        finally:
            self._consumer.close()


def _latency(bootstrap: str, seconds: float) -> dict[str, Any]:
    topic = f"{NAME}-latency"
    create_topic(bootstrap, topic, PARTITIONS)
    stop = threading.Event()
    consumers = {
        isolation: _LatencyConsumer(bootstrap, topic, isolation, stop)
        for isolation in ("read_committed", "read_uncommitted")
    }
    for consumer in consumers.values():
        consumer.start()
    sent = _paced_transactional_producer(bootstrap, topic, seconds)
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    while time.monotonic() < deadline and any(
        len(c.latencies_ms) < sent for c in consumers.values()
    ):
        time.sleep(0.1)
    stop.set()
    for consumer in consumers.values():
        consumer.join(CONSUME_TIMEOUT_S)
    results: dict[str, Any] = {"records_sent": sent, "rate_target": LATENCY_RATE}
    for isolation, consumer in consumers.items():
        if consumer.error is not None or len(consumer.latencies_ms) != sent:
            raise ProcessFailed(
                f"{isolation} consumer read {len(consumer.latencies_ms)} of {sent} records"
                f" (last error: {consumer.error})"
            )
        results[isolation] = _percentiles(consumer.latencies_ms)
    return results


def _paced_transactional_producer(bootstrap: str, topic: str, seconds: float) -> int:
    producer = Producer(
        {**PRODUCER_CONFIG, "bootstrap.servers": bootstrap, "transactional.id": f"{NAME}-pace"}
    )
    producer.init_transactions(DELIVERY_TIMEOUT_S)
    producer.begin_transaction()
    value = bytes(VALUE_BYTES)
    per_slice = LATENCY_RATE * PACE_MS // 1000
    started = time.perf_counter()
    next_commit = started + COMMIT_INTERVAL_MS / 1000
    sent = 0
    slice_index = 0
    while time.perf_counter() - started < seconds:
        for _ in range(per_slice):
            producer.produce(topic, value, partition=sent % PARTITIONS)
            sent += 1
        producer.poll(0)
        now = time.perf_counter()
        if now >= next_commit:
            producer.commit_transaction(DELIVERY_TIMEOUT_S)
            producer.begin_transaction()
            next_commit = now + COMMIT_INTERVAL_MS / 1000
        slice_index += 1
        pause = started + slice_index * PACE_MS / 1000 - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    producer.commit_transaction(DELIVERY_TIMEOUT_S)
    return sent


def _percentiles(latencies_ms: list[float]) -> dict[str, float]:
    ordered = sorted(latencies_ms)
    return {
        "records": len(ordered),
        "p50_ms": ordered[len(ordered) // 2],
        "p99_ms": ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)],
        "mean_ms": statistics.fmean(ordered),
        "max_ms": ordered[-1],
    }


# -- result ------------------------------------------------------------------------------------


def _summarize(
    records: int,
    rounds: int,
    seconds: float,
    throughput: dict[str, Any],
    latency: dict[str, Any],
    settings: dict[str, str],
) -> BenchResult:
    idempotent = float(throughput["idempotent"]["records_per_s"])
    transactional = float(throughput["transactional"]["records_per_s"])
    committed, uncommitted = latency["read_committed"], latency["read_uncommitted"]
    headlines: list[Headline] = [
        {"label": "idempotent produce", "value": idempotent, "unit": "records/s"},
        {"label": "transactional produce (100 ms)", "value": transactional, "unit": "records/s"},
        {"label": "read_committed p50 latency", "value": committed["p50_ms"], "unit": "ms"},
        {"label": "read_committed p99 latency", "value": committed["p99_ms"], "unit": "ms"},
        {"label": "read_uncommitted p50 latency", "value": uncommitted["p50_ms"], "unit": "ms"},
        {"label": "read_uncommitted p99 latency", "value": uncommitted["p99_ms"], "unit": "ms"},
    ]
    ratios: list[Ratio] = [
        {
            "label": "transactional / idempotent produce",
            "value": transactional / idempotent,
            "goal": f">= {THROUGHPUT_GOAL}",
            "met": transactional / idempotent >= THROUGHPUT_GOAL,
        },
        {
            "label": "read_committed / read_uncommitted p50 latency",
            "value": committed["p50_ms"] / uncommitted["p50_ms"],
            "goal": "",
            "met": None,
        },
    ]
    return {
        "parameters": {
            "records": records,
            "value_bytes": VALUE_BYTES,
            "partitions": PARTITIONS,
            "commit_interval_ms": COMMIT_INTERVAL_MS,
            "rounds": rounds,
            "latency_rate": LATENCY_RATE,
            "latency_seconds": seconds,
            "producer_config": PRODUCER_CONFIG,
            "broker_settings": settings,
        },
        "tools": {
            "confluent-kafka": package_version("confluent-kafka"),
            "librdkafka": libversion()[0],
        },
        "measurements": {"throughput": throughput, "latency": latency},
        "headlines": headlines,
        "ratios": ratios,
    }
