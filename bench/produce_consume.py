"""Produce then consume a million 100-byte records on one Riverbed broker, next to Redis XADD.

Everything runs on this machine in one run: an embedded ZooKeeper and one broker (started as a
user would, as its own process, with a fresh data dir on the work dir's disk), the confluent-kafka
producer and consumer in this process, and a private redis-server driven by redis-benchmark.

- Produce: acks=all, linger.ms=5, ~1 MB batches, no compression, one partition; the clock runs
  from the first `produce()` until `flush()` reports every record acknowledged.
- Consume: assign the partition from offset 0 (no consumer group rebalance to wait for) and count
  records until all are in; the clock runs from `assign()` to the last record. Twice: with
  confluent-kafka's consumer, and with Riverbed's own (which decodes every record into a
  `Record` too); both are reported, each with its ratio.
- Both clients connect and fetch the topic's metadata before their clock starts.
- Baseline: XADD of the same 100-byte value through redis-benchmark (pipelined, 50 clients),
  median of several runs, redis-server with persistence off.
- MB/s counts record values only (10^6 bytes), the same payload on both sides.
"""

from __future__ import annotations

import asyncio
import os
import string
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
    libversion,
)

from bench.consumers import consume_riverbed
from bench.kafka_clients import create_topic
from bench.machine import package_version
from bench.options import BenchOptions, BenchResult, Headline
from bench.procs import Broker, ProcessFailed, cpu_seconds, free_port, zookeeper
from bench.redis_stream import XaddParameters, measure_xadd, tool_versions

NAME = "produce_consume"
RECORDS_FULL = 1_000_000
RECORDS_QUICK = 100_000
VALUE_BYTES = 100
TOPIC = "bench-produce-consume"
BROKER_START_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 30.0
DELIVERY_TIMEOUT_S = 600.0
CONSUME_TIMEOUT_S = 600.0
# Records handed back per consume() call: large enough that the Python loop is not the bottleneck.
CONSUME_BATCH_MAX = 10_000
# librdkafka errors kept for the results; more would only repeat themselves.
CLIENT_ERRORS_MAX = 20
REDIS_PIPELINE = 1000
REDIS_CLIENTS = 50
REDIS_REPEATS = 3

PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "linger.ms": 5,
    # ~1 MB per batch; kept under the default max.message.bytes (1 MiB + 12) of a Kafka broker.
    "batch.size": 1_000_000,
    # Let batch.size, not the default 10,000-message cap, close a batch.
    "batch.num.messages": 100_000,
    "compression.type": "none",
    # Room for every record of the run, so produce() never blocks on a full queue.
    "queue.buffering.max.messages": 2 * RECORDS_FULL,
    "queue.buffering.max.kbytes": 1024 * 1024,
    # Successes are not reported one by one (a Python callback per record would measure the
    # client); failures are, and the consumer then checks that every offset is there.
    "delivery.report.only.error": True,
}
CONSUMER_CONFIG: dict[str, Any] = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "enable.partition.eof": False,
    "fetch.max.bytes": 50 * 1024 * 1024,
    "max.partition.fetch.bytes": 10 * 1024 * 1024,
    "fetch.wait.max.ms": 100,
    "queued.min.messages": RECORDS_FULL,
    "queued.max.messages.kbytes": 1024 * 1024,
}


def run(options: BenchOptions) -> BenchResult:
    records = RECORDS_QUICK if options.quick else RECORDS_FULL
    value = payload(VALUE_BYTES)
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=options.work_dir) as scratch:
        scratch_dir = Path(scratch)
        xadd_params = XaddParameters(records, value, REDIS_PIPELINE, REDIS_CLIENTS, REDIS_REPEATS)
        redis = measure_xadd(xadd_params, scratch_dir / "redis", aof=False)
        redis_aof = measure_xadd(
            XaddParameters(records, value, REDIS_PIPELINE, REDIS_CLIENTS, repeats=1),
            scratch_dir / "redis-aof",
            aof=True,
        )
        ceiling = measure_client_ceiling(records, value)
        riverbed = measure_riverbed(
            records, value, scratch_dir, options.work_dir / "logs", options.broker_settings
        )
    return summarize(records, redis, redis_aof, ceiling, riverbed, options)


def payload(size: int) -> bytes:
    """The record value on both sides: printable, no spaces (it goes on redis-benchmark's argv)."""
    alphabet = (string.ascii_letters + string.digits).encode()
    return (alphabet * (size // len(alphabet) + 1))[:size]


def measure_client_ceiling(records: int, value: bytes) -> dict[str, Any]:
    """How fast this process can call produce() at all: no broker, the records just queue up.

    The producer below cannot go faster than this whatever the broker does; on a small machine
    it is the client, not the broker, that this number describes.
    """
    producer = Producer(
        {**PRODUCER_CONFIG, "bootstrap.servers": f"127.0.0.1:{free_port()}", "log_level": 0}
    )
    started = time.perf_counter()
    for _ in range(records):
        producer.produce(TOPIC, value, partition=0)
    elapsed_s = time.perf_counter() - started
    producer.purge()
    producer.flush(0)
    return {"records": records, "seconds": elapsed_s, "records_per_s": records / elapsed_s}


def measure_riverbed(
    records: int, value: bytes, scratch_dir: Path, log_dir: Path, settings: dict[str, str]
) -> dict[str, Any]:
    data_dir = scratch_dir / "broker-data"
    data_dir.mkdir()
    with zookeeper(scratch_dir / "zookeeper") as zk_connect:
        broker = Broker(data_dir, zk_connect, settings, log_dir / f"{NAME}-broker.log")
        try:
            startup_s = broker.start(BROKER_START_TIMEOUT_S)
            create_topic(broker.bootstrap, TOPIC, partitions=1)
            produced = produce(broker, records, value)
            log_bytes = directory_bytes(data_dir)
            consumed = consume(broker, records, value)
            riverbed_consumer = asyncio.run(
                consume_riverbed(broker.bootstrap, TOPIC, records, value)
            )
            exit_code = broker.terminate()
        finally:
            broker.close()
    return {
        "broker_command": broker.command(),
        "broker_startup_s": startup_s,
        "produce": produced,
        "consume": consumed,
        "consume_riverbed_client": riverbed_consumer,
        "data_dir_bytes_after_produce": log_bytes,
        "broker_exit_code_after_sigterm": exit_code,
    }


def produce(broker: Broker, records: int, value: bytes) -> dict[str, Any]:
    failures: list[str] = []
    client_errors: list[str] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None and len(failures) < CLIENT_ERRORS_MAX:
            failures.append(str(error))

    producer = Producer(
        {
            **PRODUCER_CONFIG,
            "bootstrap.servers": broker.bootstrap,
            "on_delivery": on_delivery,
            "error_cb": _collect_into(client_errors),
        }
    )
    connect_s = _connect(producer)
    load_before = os.getloadavg()
    broker_cpu_before = cpu_seconds(broker.pid)
    client_cpu_before = time.process_time()
    started = time.perf_counter()
    for _ in range(records):
        producer.produce(TOPIC, value, partition=0)
    enqueued_s = time.perf_counter() - started
    unacknowledged = producer.flush(DELIVERY_TIMEOUT_S)
    elapsed_s = time.perf_counter() - started
    client_cpu_s = time.process_time() - client_cpu_before
    broker_cpu_s = cpu_seconds(broker.pid) - broker_cpu_before
    if unacknowledged or failures:
        raise ProcessFailed(
            f"{unacknowledged} records unacknowledged after {DELIVERY_TIMEOUT_S} s; "
            f"delivery failures: {failures}; client errors: {client_errors}"
        )
    return {
        "records": records,
        "seconds": elapsed_s,
        "enqueue_seconds": enqueued_s,
        "records_per_s": records / elapsed_s,
        "payload_mb_per_s": records * len(value) / elapsed_s / 1e6,
        "connect_s_before_clock": connect_s,
        "client_cpu_s": client_cpu_s,
        "broker_cpu_s": broker_cpu_s,
        "loadavg_1m_before": load_before[0],
        "client_errors": client_errors,
    }


def consume(broker: Broker, records: int, value: bytes) -> dict[str, Any]:
    client_errors: list[str] = []
    consumer = Consumer(
        {
            **CONSUMER_CONFIG,
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"bench-{uuid.uuid4()}",
            "error_cb": _collect_into(client_errors),
        }
    )
    try:
        connect_s = _connect(consumer)
        load_before = os.getloadavg()
        broker_cpu_before = cpu_seconds(broker.pid)
        client_cpu_before = time.process_time()
        started = time.perf_counter()
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        count, first_record_s, first, last = _count_records(consumer, records, started)
        elapsed_s = time.perf_counter() - started
        client_cpu_s = time.process_time() - client_cpu_before
        broker_cpu_s = cpu_seconds(broker.pid) - broker_cpu_before
    finally:
        consumer.close()
    if first != (0, value) or last != (records - 1, value):
        raise ProcessFailed(f"consumed records are not the produced ones: {first=} {last=}")
    return {
        "records": count,
        "seconds": elapsed_s,
        "seconds_to_first_record": first_record_s,
        "records_per_s": count / elapsed_s,
        "payload_mb_per_s": count * len(value) / elapsed_s / 1e6,
        "connect_s_before_clock": connect_s,
        "client_cpu_s": client_cpu_s,
        "broker_cpu_s": broker_cpu_s,
        "loadavg_1m_before": load_before[0],
        "client_errors": client_errors,
    }


def _connect(client: Producer | Consumer) -> float:
    """Connect and learn the partition's leader before the clock starts.

    Without this, librdkafka's first offset lookup waits on an internal retry timer (~0.5 s,
    seen with debug logs) that has nothing to do with how fast the broker serves.
    """
    started = time.perf_counter()
    client.list_topics(TOPIC, timeout=CONNECT_TIMEOUT_S)
    return time.perf_counter() - started


Sample = tuple[int | None, bytes | None] | None


def _count_records(
    consumer: Consumer, records: int, started: float
) -> tuple[int, float, Sample, Sample]:
    """Consume until `records` arrived; returns count, time to the first, first and last record."""
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    count = 0
    first_record_s = 0.0
    first: Sample = None
    last: Sample = None
    while count < records:
        if time.monotonic() > deadline:
            raise ProcessFailed(f"consumed {count} of {records} in {CONSUME_TIMEOUT_S} s")
        batch = consumer.consume(num_messages=CONSUME_BATCH_MAX, timeout=1.0)
        for message in batch:
            if message.error() is not None:
                raise KafkaException(message.error())
        if not batch:
            continue
        if first is None:
            first_record_s = time.perf_counter() - started
            first = (batch[0].offset(), batch[0].value())
        last = (batch[-1].offset(), batch[-1].value())
        count += len(batch)
    return count, first_record_s, first, last


def _collect_into(errors: list[str]) -> Any:
    def on_error(error: KafkaError) -> None:
        if len(errors) < CLIENT_ERRORS_MAX:
            errors.append(str(error))

    return on_error


def directory_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


def summarize(
    records: int,
    redis: dict[str, Any],
    redis_aof: dict[str, Any],
    ceiling: dict[str, Any],
    riverbed: dict[str, Any],
    options: BenchOptions,
) -> BenchResult:
    xadd_per_s = float(redis["requests_per_s_median"])
    produced, consumed = riverbed["produce"], riverbed["consume"]
    produce_per_s = float(produced["records_per_s"])
    consume_per_s = float(consumed["records_per_s"])
    own_consumer_per_s = float(riverbed["consume_riverbed_client"]["records_per_s"])
    return {
        "parameters": {
            "records": records,
            "value_bytes": VALUE_BYTES,
            "topic_partitions": 1,
            "producer_config": PRODUCER_CONFIG,
            "consumer_config": {**CONSUMER_CONFIG, "assignment": "partition 0 from offset 0"},
            "consume_batch_max": CONSUME_BATCH_MAX,
            "broker_settings": options.broker_settings,
            "redis_pipeline": REDIS_PIPELINE,
            "redis_clients": REDIS_CLIENTS,
            "redis_repeats": REDIS_REPEATS,
        },
        "tools": {
            "confluent-kafka": package_version("confluent-kafka"),
            "librdkafka": str(libversion()[0]),
            **tool_versions(),
        },
        "measurements": {
            "redis_xadd": redis,
            "redis_xadd_aof_everysec": redis_aof,
            "client_produce_call_ceiling": ceiling,
            "riverbed": riverbed,
        },
        "headlines": [
            _headline("Redis XADD (no persistence)", xadd_per_s, "records/s"),
            _headline(
                "Redis XADD (AOF everysec, context only)",
                redis_aof["requests_per_s_median"],
                "records/s",
            ),
            _headline("Riverbed produce (acks=all)", produce_per_s, "records/s"),
            _headline("Riverbed produce (acks=all)", produced["payload_mb_per_s"], "MB/s"),
            _headline("Riverbed consume, confluent-kafka consumer", consume_per_s, "records/s"),
            _headline(
                "Riverbed consume, confluent-kafka consumer", consumed["payload_mb_per_s"], "MB/s"
            ),
            _headline("Riverbed consume, Riverbed's own consumer", own_consumer_per_s, "records/s"),
            _headline("Broker CPU time while producing", produced["broker_cpu_s"], "s"),
            _headline("Broker CPU time while consuming", consumed["broker_cpu_s"], "s"),
            _headline(
                "confluent-kafka produce() calls, no broker (client ceiling)",
                ceiling["records_per_s"],
                "records/s",
            ),
        ],
        "ratios": [
            {
                "label": "Riverbed produce / Redis XADD",
                "value": produce_per_s / xadd_per_s,
                "goal": ">= 1",
                "met": produce_per_s >= xadd_per_s,
            },
            {
                "label": "Riverbed consume with confluent-kafka's consumer / Redis XADD",
                "value": consume_per_s / xadd_per_s,
                "goal": ">= 2",
                "met": consume_per_s >= 2 * xadd_per_s,
            },
            {
                "label": "Riverbed consume with Riverbed's consumer / Redis XADD",
                "value": own_consumer_per_s / xadd_per_s,
                "goal": ">= 2",
                "met": own_consumer_per_s >= 2 * xadd_per_s,
            },
        ],
    }


def _headline(label: str, value: float, unit: str) -> Headline:
    return {"label": label, "value": float(value), "unit": unit}
