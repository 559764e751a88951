"""Riverbed's asyncio client against aiokafka and confluent-kafka: 1M x 100-byte records.

Everything runs on this machine in one run, against one Riverbed broker (its own process, fresh
data dir): each client produces the same records to a topic of its own (acks=all, linger 5 ms,
no compression, no idempotence, one partition), at two batch sizes — Kafka's default 16 KiB and
~1 MB — then each consumer reads the same topic, one confluent-kafka wrote, from offset 0.

- Produce: the clock runs from the first send until every record is acknowledged; afterwards the
  topic's log end offset must equal the record count. The async producers' per-record futures
  are not kept (as an application streaming records would not keep a million of them): the
  delivery check is that log end offset, the same for all three clients.
- Consume: partition 0 assigned, position at offset 0, clock from the first fetch to the last
  record; records are counted per batch (`getmany` / `consume`), as an application would.
- Each client connects and learns the partition's leader before its clock starts.
- Each producer runs 3 times per batch size, the three clients taking turns (a slow spell of this
  shared machine then falls on all of them); the median run is the result, and every run's rate
  is kept in the JSON. Consumers run once.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiokafka
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Producer,
    TopicPartition,
    libversion,
)

from bench.consumers import (
    CONSUME_BATCH_MAX,
    CONSUME_TIMEOUT_S,
    FETCH_MAX_BYTES,
    FETCH_MAX_WAIT_MS,
    PARTITION_FETCH_MAX_BYTES,
    check_records,
    consume_riverbed,
    count_getmany,
    rate,
)
from bench.kafka_clients import create_topic
from bench.machine import package_version
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import Broker, ProcessFailed, zookeeper
from bench.produce_consume import CONSUMER_CONFIG, PRODUCER_CONFIG, payload

NAME = "client_throughput"
RECORDS_FULL = 1_000_000
RECORDS_QUICK = 100_000
VALUE_BYTES = 100
BROKER_START_TIMEOUT_S = 120.0
# Kafka's default batch.size, and batches of ~1 MB: every client runs with both.
BATCH_SIZES = (16_384, 1_000_000)
REQUEST_BYTES_MAX = 2_000_000
LINGER_MS = 5
# Kafka's and our producers' default max.in.flight.requests.per.connection.
IN_FLIGHT_DEFAULT = 5
# Each producer runs this many times per batch size, the clients in turn; the median counts.
PRODUCE_ROUNDS = 3
CONSUME_GOAL = 2.0  # the goals: Riverbed consume >= 2x aiokafka,
PRODUCE_GOAL = 3.0  # produce >= 3x aiokafka


def run(options: BenchOptions) -> BenchResult:
    records = RECORDS_QUICK if options.quick else RECORDS_FULL
    rounds = 1 if options.quick else PRODUCE_ROUNDS
    value = payload(VALUE_BYTES)
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=options.work_dir) as scratch:
        scratch_dir = Path(scratch)
        data_dir = scratch_dir / "broker-data"
        data_dir.mkdir()
        with zookeeper(scratch_dir / "zookeeper") as zk_connect:
            log_path = options.work_dir / "logs" / f"{NAME}-broker.log"
            broker = Broker(data_dir, zk_connect, options.broker_settings, log_path)
            try:
                broker.start(BROKER_START_TIMEOUT_S)
                measurements = measure(broker, records, value, rounds)
                broker.terminate()
            finally:
                broker.close()
    return summarize(records, measurements, options)


def measure(broker: Broker, records: int, value: bytes, rounds: int) -> dict[str, Any]:
    bootstrap = broker.bootstrap
    produced: dict[str, Any] = {}
    for batch_bytes in BATCH_SIZES:
        runs: dict[str, list[dict[str, Any]]] = {client: [] for client in PRODUCERS}
        # Rounds alternate the clients, so that a slow spell of the machine falls on all of them.
        for round_index in range(rounds):
            for client, produce in PRODUCERS.items():
                topic = _topic(client, batch_bytes, round_index)
                create_topic(bootstrap, topic, partitions=1)
                runs[client].append(produce(bootstrap, topic, records, value, batch_bytes))
                _check_log_end(bootstrap, topic, records)
        for client, client_runs in runs.items():
            produced[_label(client, batch_bytes)] = _median_run(client_runs)
    source = _topic("confluent-kafka", BATCH_SIZES[-1], 0)
    consumed = {
        "riverbed": asyncio.run(consume_riverbed(bootstrap, source, records, value)),
        "aiokafka": asyncio.run(_consume_aiokafka(bootstrap, source, records, value)),
        "confluent-kafka": _consume_confluent(bootstrap, source, records, value),
    }
    return {"produce": produced, "consume": consumed}


def _topic(client: str, batch_bytes: int, round_index: int) -> str:
    return f"{NAME}-{client}-{batch_bytes}-{round_index}"


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median rate, with every run's rate beside it."""
    ordered = sorted(runs, key=lambda run: float(run["records_per_s"]))
    return {
        **ordered[len(ordered) // 2],
        "runs_records_per_s": [run["records_per_s"] for run in runs],
    }


def _label(client: str, batch_bytes: int) -> str:
    return f"{client} produce, batch {batch_bytes} B"


def produce_riverbed(
    bootstrap: str,
    topic: str,
    records: int,
    value: bytes,
    batch_bytes: int,
    *,
    in_flight_max: int = IN_FLIGHT_DEFAULT,
) -> dict[str, Any]:
    from riverbed.client.producer import Producer as RiverbedProducer

    async def run() -> dict[str, Any]:
        async with RiverbedProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=LINGER_MS,
            batch_size=batch_bytes,
            max_request_size=REQUEST_BYTES_MAX,
            enable_idempotence=False,
            max_in_flight_requests_per_connection=in_flight_max,
        ) as producer:
            await producer.partitions_for(topic)
            cpu_before = time.process_time()
            started = time.perf_counter()
            send = producer.send
            for _ in range(records - 1):
                await send(topic, value, partition=0)
            last = await send(topic, value, partition=0)
            await producer.flush()
            elapsed_s = time.perf_counter() - started
            cpu_s = time.process_time() - cpu_before
            await last  # raises if the last batch failed; _check_log_end counts every record
        return rate(records, elapsed_s, cpu_s)

    return asyncio.run(run())


def _produce_aiokafka(
    bootstrap: str, topic: str, records: int, value: bytes, batch_bytes: int
) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=LINGER_MS,
            max_batch_size=batch_bytes,
            max_request_size=REQUEST_BYTES_MAX,
            enable_idempotence=False,
        )
        await producer.start()
        try:
            await producer.partitions_for(topic)
            cpu_before = time.process_time()
            started = time.perf_counter()
            for _ in range(records - 1):
                await producer.send(topic, value, partition=0)
            last = await producer.send(topic, value, partition=0)
            await producer.flush()
            elapsed_s = time.perf_counter() - started
            cpu_s = time.process_time() - cpu_before
            await last  # raises if the last batch failed; _check_log_end counts every record
        finally:
            await producer.stop()
        return rate(records, elapsed_s, cpu_s)

    return asyncio.run(run())


def _produce_confluent(
    bootstrap: str, topic: str, records: int, value: bytes, batch_bytes: int
) -> dict[str, Any]:
    failures: list[str] = []

    def on_delivery(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(
        {
            **PRODUCER_CONFIG,
            "bootstrap.servers": bootstrap,
            "batch.size": batch_bytes,
            "message.max.bytes": REQUEST_BYTES_MAX,
            "on_delivery": on_delivery,
        }
    )
    producer.list_topics(topic, timeout=30)
    cpu_before = time.process_time()
    started = time.perf_counter()
    for _ in range(records):
        producer.produce(topic, value, partition=0)
    unacknowledged = producer.flush(CONSUME_TIMEOUT_S)
    elapsed_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_before
    if unacknowledged or failures:
        raise ProcessFailed(f"confluent-kafka: {unacknowledged} unacknowledged, {failures[:3]}")
    return rate(records, elapsed_s, cpu_s)


PRODUCERS: dict[str, Callable[[str, str, int, bytes, int], dict[str, Any]]] = {
    "riverbed": produce_riverbed,
    "aiokafka": _produce_aiokafka,
    "confluent-kafka": _produce_confluent,
}


def _check_log_end(bootstrap: str, topic: str, records: int) -> None:
    """Every produced record is in the log (the producers' own reports are not trusted)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{NAME}-check"})
    try:
        _, log_end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    finally:
        consumer.close()
    if log_end != records:
        raise ProcessFailed(f"{topic} holds {log_end} records, not {records}")


async def _consume_aiokafka(
    bootstrap: str, topic: str, records: int, value: bytes
) -> dict[str, Any]:
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        fetch_max_bytes=FETCH_MAX_BYTES,
        max_partition_fetch_bytes=PARTITION_FETCH_MAX_BYTES,
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
    )
    await consumer.start()
    try:
        tp = aiokafka.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        return await count_getmany("aiokafka", consumer.getmany, records, value)
    finally:
        await consumer.stop()


def _consume_confluent(bootstrap: str, topic: str, records: int, value: bytes) -> dict[str, Any]:
    consumer = Consumer(
        {**CONSUMER_CONFIG, "bootstrap.servers": bootstrap, "group.id": f"{NAME}-confluent"}
    )
    try:
        consumer.list_topics(topic, timeout=30)
        cpu_before = time.process_time()
        started = time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        count = 0
        first = last = None
        while count < records:
            if time.monotonic() > deadline:
                raise ProcessFailed(f"confluent-kafka consumed {count} of {records}")
            batch = consumer.consume(num_messages=CONSUME_BATCH_MAX, timeout=1.0)
            if not batch:
                continue
            if batch[0].error() is not None:
                raise ProcessFailed(str(batch[0].error()))
            if first is None:
                first = (batch[0].offset(), batch[0].value())
            last = (batch[-1].offset(), batch[-1].value())
            count += len(batch)
        elapsed_s = time.perf_counter() - started
        cpu_s = time.process_time() - cpu_before
    finally:
        consumer.close()
    check_records("confluent-kafka", records, value, first, last)
    return rate(count, elapsed_s, cpu_s)


def summarize(records: int, measured: dict[str, Any], options: BenchOptions) -> BenchResult:
    consume = {name: float(m["records_per_s"]) for name, m in measured["consume"].items()}
    produce_rates = {name: float(m["records_per_s"]) for name, m in measured["produce"].items()}
    headlines = [
        Headline(label=f"{name} consume", value=rate, unit="records/s")
        for name, rate in consume.items()
    ] + [
        Headline(label=f"{name} (acks=all)", value=rate, unit="records/s")
        for name, rate in produce_rates.items()
    ]
    riverbed_vs_aiokafka = consume["riverbed"] / consume["aiokafka"]
    ratios: list[Ratio] = [
        {
            "label": "Riverbed consume / aiokafka consume",
            "value": riverbed_vs_aiokafka,
            "goal": f">= {CONSUME_GOAL:g}",
            "met": riverbed_vs_aiokafka >= CONSUME_GOAL,
        },
        *_produce_ratios(produce_rates),
        {
            "label": "Riverbed consume / confluent-kafka consume",
            "value": consume["riverbed"] / consume["confluent-kafka"],
            "goal": "context (librdkafka is C)",
            "met": None,
        },
    ]
    return {
        "parameters": {
            "records": records,
            "produce_rounds": len(next(iter(measured["produce"].values()))["runs_records_per_s"]),
            "value_bytes": VALUE_BYTES,
            "topic_partitions": 1,
            "consume_batch_max": CONSUME_BATCH_MAX,
            "fetch_max_bytes": FETCH_MAX_BYTES,
            "max_partition_fetch_bytes": PARTITION_FETCH_MAX_BYTES,
            "fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
            "broker_settings": options.broker_settings,
        },
        "tools": {
            "aiokafka": package_version("aiokafka"),
            "confluent-kafka": package_version("confluent-kafka"),
            "librdkafka": str(libversion()[0]),
        },
        "measurements": measured,
        "headlines": headlines,
        "ratios": ratios,
    }


def _produce_ratios(rates: dict[str, float]) -> list[Ratio]:
    ratios: list[Ratio] = []
    for batch_bytes in BATCH_SIZES:
        riverbed = rates[_label("riverbed", batch_bytes)]
        aiokafka_rate = rates[_label("aiokafka", batch_bytes)]
        confluent = rates[_label("confluent-kafka", batch_bytes)]
        ratios.append(
            {
                "label": f"Riverbed produce / aiokafka produce, batch {batch_bytes} B",
                "value": riverbed / aiokafka_rate,
                "goal": f">= {PRODUCE_GOAL:g}",
                "met": riverbed >= PRODUCE_GOAL * aiokafka_rate,
            }
        )
        ratios.append(
            {
                "label": f"Riverbed produce / confluent-kafka produce, batch {batch_bytes} B",
                "value": riverbed / confluent,
                "goal": "context (librdkafka is C)",
                "met": None,
            }
        )
    return ratios
