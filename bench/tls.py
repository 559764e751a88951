"""The price of TLS on the fetch path: the same log read through a PLAINTEXT and an SSL listener
of one broker, side by side in one run.

On a plaintext connection the broker hands segment bytes to `os.sendfile`; on TLS they must be
encrypted, so it reads them into one reused buffer and encrypts from there (see
riverbed.broker.network.server). Two readers, each run over both listeners, alternating, best
of REPEATS:

- raw fetch: Fetch requests through Riverbed's `BrokerConnection`, records not decoded (the next
  offset comes from the last batch header), so the broker's fetch path is what is measured;
- confluent-kafka's consumer (librdkafka, C), from `assign()` to the last record, as a user
  sees it.

The broker's CPU seconds per phase are recorded: on TLS it pays for the encryption. Loopback and
one 2-core machine for broker and client: TLS costs the client as much CPU as the broker, so the
consumer ratio is a lower bound of what a broker with its own cores would deliver.
"""

from __future__ import annotations

import asyncio
import struct
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition, libversion

from bench.kafka_clients import create_topic
from bench.machine import package_version
from bench.options import BenchOptions, BenchResult, Headline, Ratio
from bench.procs import Broker, ProcessFailed, cpu_seconds, zookeeper
from tools.pki import make_pki

NAME: Final = "tls"
RECORDS_FULL: Final = 2_000_000
RECORDS_QUICK: Final = 200_000
VALUE_BYTES: Final = 100
TOPIC: Final = "bench-tls"
REPEATS: Final = 3
BROKER_START_TIMEOUT_S: Final = 120.0
TIMEOUT_S: Final = 600.0
PARTITION_FETCH_MAX_BYTES: Final = 10 * 1024 * 1024
# A batch header: base offset int64, then the batch length int32 (bytes after that field), and at
# byte 23 the last offset delta int32.
BATCH_LENGTH_AT: Final = 8
LAST_OFFSET_DELTA_AT: Final = 23
BATCH_OVERHEAD_BYTES: Final = 12


def run(options: BenchOptions) -> BenchResult:
    records = RECORDS_QUICK if options.quick else RECORDS_FULL
    with tempfile.TemporaryDirectory(dir=options.work_dir) as scratch:
        scratch_dir = Path(scratch)
        pki = make_pki(scratch_dir / "pki")
        settings = {
            **options.broker_settings,
            "ssl.keystore.location": str(pki.broker),
            "ssl.truststore.location": str(pki.ca),
        }
        with zookeeper(scratch_dir / "zookeeper") as zk_connect:
            broker = Broker(
                scratch_dir / "data",
                zk_connect,
                settings,
                options.work_dir / "logs" / f"{NAME}-broker.log",
                listeners=("PLAINTEXT", "SSL"),
            )
            try:
                broker.start(BROKER_START_TIMEOUT_S)
                create_topic(broker.bootstrap, TOPIC, partitions=1)
                produce(broker.bootstrap, records)
                tls_client = {"security.protocol": "ssl", "ssl.ca.location": str(pki.ca)}
                runs: dict[str, list[dict[str, Any]]] = {
                    key: []
                    for key in ("raw_plaintext", "raw_tls", "consumer_plaintext", "consumer_tls")
                }
                for _ in range(REPEATS):
                    runs["raw_plaintext"].append(raw_fetch(broker, "PLAINTEXT", records, None))
                    runs["raw_tls"].append(raw_fetch(broker, "SSL", records, str(pki.ca)))
                    runs["consumer_plaintext"].append(consume(broker, "PLAINTEXT", records, {}))
                    runs["consumer_tls"].append(consume(broker, "SSL", records, tls_client))
                broker.terminate()
            finally:
                broker.close()
    return summarize(records, runs)


def produce(bootstrap: str, records: int) -> None:
    """Produce the records the reads will move (not measured)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "batch.num.messages": 100_000,
            "queue.buffering.max.messages": 2 * RECORDS_FULL,
            "queue.buffering.max.kbytes": 1024 * 1024,
        }
    )
    value = b"v" * VALUE_BYTES
    for _ in range(records):
        producer.produce(TOPIC, value, partition=0)
    if producer.flush(TIMEOUT_S):
        raise ProcessFailed("records left unacknowledged")


def raw_fetch(broker: Broker, listener: str, records: int, ca: str | None) -> dict[str, Any]:
    return asyncio.run(_raw_fetch(broker.address(listener), broker.pid, records, ca))


async def _raw_fetch(address: str, pid: int, records: int, ca: str | None) -> dict[str, Any]:
    from riverbed.client.connection import BrokerConnection
    from riverbed.protocol import messages as m
    from riverbed.security.client import PLAINTEXT, connection_security
    from riverbed.security.session import SecurityProtocol
    from riverbed.security.tls import TlsFiles

    security = PLAINTEXT
    if ca is not None:
        security = connection_security(
            SecurityProtocol.SSL, TlsFiles(truststore_location=ca), check_hostname=True, sasl=None
        )
    host, port = address.rsplit(":", 1)
    connection = await BrokerConnection.open(host, int(port), security=security)
    try:
        metadata = await connection.call(
            m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name=TOPIC)]),
            m.MetadataResponse,
        )
        topic_id = metadata.topics[0].topic_id
        offset = moved = 0
        cpu_before = cpu_seconds(pid)
        started = time.perf_counter()
        while offset < records:
            request = m.FetchRequest(
                max_wait_ms=500,
                min_bytes=1,
                max_bytes=PARTITION_FETCH_MAX_BYTES,
                topics=[
                    m.FetchRequest.FetchTopic(
                        topic=TOPIC,
                        topic_id=topic_id,
                        partitions=[
                            m.FetchRequest.FetchPartition(
                                partition=0,
                                fetch_offset=offset,
                                partition_max_bytes=PARTITION_FETCH_MAX_BYTES,
                            )
                        ],
                    )
                ],
            )
            response = await connection.call(request, m.FetchResponse, timeout_ms=30_000)
            fetched = response.responses[0].partitions[0].records
            assert fetched is None or isinstance(fetched, bytes | memoryview)  # a client's copy
            data = bytes(fetched or b"")
            moved += len(data)
            offset = _next_offset(data, offset)
        elapsed_s = time.perf_counter() - started
        broker_cpu_s = cpu_seconds(pid) - cpu_before
    finally:
        await connection.close()
    return {
        "seconds": elapsed_s,
        "bytes": moved,
        "mb_per_s": moved / elapsed_s / 1e6,
        "records_per_s": records / elapsed_s,
        "broker_cpu_s": broker_cpu_s,
    }


def _next_offset(data: bytes, offset: int) -> int:
    """The offset after the last whole batch in `data` (per batch, never per record)."""
    position = 0
    while position + BATCH_OVERHEAD_BYTES <= len(data):
        base_offset, length = struct.unpack_from(">qi", data, position)
        end = position + BATCH_OVERHEAD_BYTES + length
        if end > len(data):
            break  # a partial batch at the end of the response
        (delta,) = struct.unpack_from(">i", data, position + LAST_OFFSET_DELTA_AT)
        offset = base_offset + delta + 1
        position = end
    if position == 0:
        raise ProcessFailed(f"a fetch at offset {offset} returned no whole batch")
    return offset


def consume(
    broker: Broker, listener: str, records: int, security: dict[str, str]
) -> dict[str, Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.address(listener),
            "group.id": f"bench-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "fetch.message.max.bytes": PARTITION_FETCH_MAX_BYTES,
            **security,
        }
    )
    try:
        consumer.list_topics(TOPIC, timeout=30)  # connected before the clock starts
        cpu_before = cpu_seconds(broker.pid)
        started = time.perf_counter()
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        count = 0
        deadline = time.monotonic() + TIMEOUT_S
        while count < records:
            if time.monotonic() > deadline:
                raise ProcessFailed(f"consumed {count} of {records} over {listener}")
            for message in consumer.consume(10_000, 1.0):
                if message.error() is not None:
                    raise ProcessFailed(str(message.error()))
                count += 1
        elapsed_s = time.perf_counter() - started
        broker_cpu_s = cpu_seconds(broker.pid) - cpu_before
    finally:
        consumer.close()
    return {
        "seconds": elapsed_s,
        "records_per_s": records / elapsed_s,
        "broker_cpu_s": broker_cpu_s,
    }


def summarize(records: int, runs: dict[str, list[dict[str, Any]]]) -> BenchResult:
    best = {
        key: max(results, key=lambda r: float(r["records_per_s"])) for key, results in runs.items()
    }
    raw_ratio = best["raw_tls"]["records_per_s"] / best["raw_plaintext"]["records_per_s"]
    consumer_ratio = (
        best["consumer_tls"]["records_per_s"] / best["consumer_plaintext"]["records_per_s"]
    )
    headlines: list[Headline] = [
        {"label": label, "value": best[key][field], "unit": unit}
        for label, key, field, unit in (
            ("raw fetch, plaintext (sendfile)", "raw_plaintext", "mb_per_s", "MB/s"),
            ("raw fetch, TLS", "raw_tls", "mb_per_s", "MB/s"),
            (
                "confluent-kafka consumer, plaintext",
                "consumer_plaintext",
                "records_per_s",
                "records/s",
            ),
            ("confluent-kafka consumer, TLS", "consumer_tls", "records_per_s", "records/s"),
        )
    ]
    ratios: list[Ratio] = [
        {"label": label, "value": value, "goal": "measured (no goal)", "met": None}
        for label, value in (
            ("raw fetch: TLS / plaintext", raw_ratio),
            ("consumer: TLS / plaintext", consumer_ratio),
        )
    ]
    return {
        "parameters": {
            "records": records,
            "value_bytes": VALUE_BYTES,
            "repeats": REPEATS,
            "partition_fetch_max_bytes": PARTITION_FETCH_MAX_BYTES,
        },
        "tools": {
            "librdkafka": libversion()[0],
            "confluent-kafka": package_version("confluent-kafka"),
        },
        "measurements": {"runs": runs, "best": best},
        "headlines": headlines,
        "ratios": ratios,
    }
