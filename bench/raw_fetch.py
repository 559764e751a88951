"""How fast the broker serves a partition when the consumer does no per-record work.

The consume figure of `produce_consume` is bounded by the confluent-kafka Python consumer, which
costs far more CPU per record than the broker (see its broker_cpu_s). This consumer sends Fetch
requests with Riverbed's own connection and counts records from batch headers only — it never
decodes a record — so it shows what the broker and the loopback socket deliver. It is reported
beside, never instead of, the confluent-kafka figure.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from riverbed.client.connection import BrokerConnection
from riverbed.protocol import messages as m
from riverbed.protocol.records import iter_batch_headers

FETCH_MAX_BYTES = 50 * 1024 * 1024
FETCH_TIMEOUT_MS = 30_000


def measure_raw_fetch(host: str, port: int, topic: str, records: int) -> dict[str, Any]:
    return asyncio.run(_measure(host, port, topic, records))


async def _measure(host: str, port: int, topic: str, records: int) -> dict[str, Any]:
    connection = await BrokerConnection.open(host, port)
    try:
        metadata = await connection.request(
            m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name=topic)])
        )
        topic_id = metadata.topics[0].topic_id
        started = time.perf_counter()
        offset = count = fetches = 0
        received_bytes = 0
        while count < records:
            response = await connection.request(
                _fetch(topic, topic_id, offset), timeout_ms=FETCH_TIMEOUT_MS
            )
            data = response.responses[0].partitions[0]
            if data.error_code != 0:
                raise RuntimeError(f"fetch failed with error {data.error_code}")
            fetches += 1
            records_bytes = data.records if isinstance(data.records, (bytes, memoryview)) else b""
            received_bytes += len(records_bytes)
            for _, header in iter_batch_headers(records_bytes):
                if header.last_offset >= offset:
                    count += header.records_count
                    offset = header.last_offset + 1
        elapsed_s = time.perf_counter() - started
    finally:
        await connection.close()
    return {
        "records": count,
        "fetch_requests": fetches,
        "received_bytes": received_bytes,
        "seconds": elapsed_s,
        "records_per_s": count / elapsed_s,
        "mb_per_s": received_bytes / elapsed_s / 1e6,
    }


def _fetch(topic: str, topic_id: Any, offset: int) -> m.FetchRequest:
    return m.FetchRequest(
        replica_id=-1,
        max_wait_ms=100,
        min_bytes=1,
        max_bytes=FETCH_MAX_BYTES,
        session_epoch=-1,
        topics=[
            m.FetchRequest.FetchTopic(
                topic=topic,
                topic_id=topic_id,
                partitions=[
                    m.FetchRequest.FetchPartition(
                        partition=0, fetch_offset=offset, partition_max_bytes=FETCH_MAX_BYTES
                    )
                ],
            )
        ],
    )
