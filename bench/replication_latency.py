"""End-to-end latency at a steady rate: from `send()` to the record reaching a consumer.

A Riverbed `Producer` (acks=all, linger 0 ms: records go out as soon as they are due, like
Kafka's 2014 producer whose latency is the usual anchor) sends `rate_per_s` records per second to
partition 0 for `duration_s`: every PACE_TICK_S it sends the records due by then, each value
starting with its sequence number and the `time.perf_counter_ns()` of its `send()` call. A Riverbed
`Consumer` in the same process, assigned the partition from the start, notes the time each
`getmany()` returns; a record's latency is that time minus its stamp. Consumers only see records
below the high watermark, so with acks=all the latency includes replication to every in-sync
replica. Every record must arrive once, in order. Each record's time from `send()` to the
producer's acknowledgement is noted too (`ack_*`): the producer's side of the same path.

Producer and consumer connect and exchange one unmeasured record first.
"""

from __future__ import annotations

import asyncio
import functools
import math
import struct
import time
from typing import Any

from riverbed import Consumer, Producer, Record, TopicPartition
from riverbed.client.producer import DeliveryFuture

from bench.procs import ProcessFailed

PRODUCER_SETTINGS: dict[str, Any] = {"acks": "all", "linger_ms": 0}
# Sends are paced in small bursts: asyncio's timers have ~1 ms resolution anyway.
PACE_TICK_S = 0.001
STAMP = struct.Struct(">QQ")  # sequence number, send time in ns
CONSUME_BATCH_MAX = 10_000
# The consumer's patience after the last send, and for the unmeasured first record.
DRAIN_TIMEOUT_S = 60.0
NS_PER_MS = 1_000_000
PERCENTILES = (50.0, 99.0, 99.9)


async def measure(
    bootstrap: str, topic: str, rate_per_s: int, duration_s: float, value_bytes: int
) -> dict[str, Any]:
    records = int(rate_per_s * duration_s)
    padding = b"x" * (value_bytes - STAMP.size)
    tp = TopicPartition(topic, 0)
    async with (
        Producer(bootstrap_servers=bootstrap, **PRODUCER_SETTINGS) as producer,
        Consumer(bootstrap_servers=bootstrap) as consumer,
    ):
        consumer.assign([tp])
        consumer.seek(tp, 0)
        warm_up = await producer.send_and_wait(topic, padding, partition=0)
        await _receive(consumer, 1, DRAIN_TIMEOUT_S)
        receiving = asyncio.create_task(_receive(consumer, records, duration_s + DRAIN_TIMEOUT_S))
        acks_ns: list[int] = []
        try:
            sent = await _send_paced(producer, topic, records, rate_per_s, padding, acks_ns)
            await producer.flush()
            received = await receiving
        finally:
            receiving.cancel()
    if len(acks_ns) != records:
        raise ProcessFailed(f"{records - len(acks_ns)} of {records} records not acknowledged")
    return {
        "records": records,
        "target_records_per_s": rate_per_s,
        **sent,
        "consumed_records_per_s": records / ((received[-1][0] - sent["started_ns"]) / 1e9),
        **_summary("", _latencies(received, first_offset=warm_up.offset + 1)),
        # send() to the producer's acknowledgement: the acks=all part of the end-to-end time.
        **_summary("ack_", sorted(acks_ns)),
    }


def _summary(prefix: str, sorted_ns: list[int]) -> dict[str, float]:
    return {
        **{f"{prefix}p{p:g}_ms": percentile(sorted_ns, p) / NS_PER_MS for p in PERCENTILES},
        f"{prefix}max_ms": sorted_ns[-1] / NS_PER_MS,
        f"{prefix}mean_ms": sum(sorted_ns) / len(sorted_ns) / NS_PER_MS,
    }


async def _send_paced(
    producer: Producer,
    topic: str,
    records: int,
    rate_per_s: int,
    padding: bytes,
    acks_ns: list[int],
) -> dict[str, Any]:
    """Send `records` records at `rate_per_s`, each stamped; returns the achieved pace. Each
    record's time from send() to its acknowledgement goes to `acks_ns` once it is acknowledged."""
    send = producer.send
    started_ns = time.perf_counter_ns()
    sequence = 0
    behind_ns_max = 0
    while sequence < records:
        elapsed_ns = time.perf_counter_ns() - started_ns
        due = min(records, elapsed_ns * rate_per_s // 1_000_000_000 + 1)
        # How late the oldest record of this burst is against its schedule.
        behind_ns_max = max(behind_ns_max, elapsed_ns - sequence * 1_000_000_000 // rate_per_s)
        while sequence < due:
            sent_ns = time.perf_counter_ns()
            future = await send(topic, STAMP.pack(sequence, sent_ns) + padding, partition=0)
            future.add_done_callback(functools.partial(_note_ack, acks_ns, sent_ns))
            sequence += 1
        await asyncio.sleep(PACE_TICK_S)
    sent_s = (time.perf_counter_ns() - started_ns) / 1e9
    return {
        "started_ns": started_ns,
        "send_seconds": sent_s,
        "sent_records_per_s": records / sent_s,
        "schedule_lag_ms_max": behind_ns_max / NS_PER_MS,
    }


def _note_ack(acks_ns: list[int], sent_ns: int, future: DeliveryFuture) -> None:
    if future.exception() is None:
        acks_ns.append(time.perf_counter_ns() - sent_ns)


async def _receive(consumer: Consumer, records: int, timeout_s: float) -> list[tuple[int, Record]]:
    """Take `records` records; returns (time getmany returned in ns, record) for each."""
    received: list[tuple[int, Record]] = []
    deadline = time.monotonic() + timeout_s
    while len(received) < records:
        if time.monotonic() > deadline:
            raise ProcessFailed(f"consumed {len(received)} of {records} in {timeout_s} s")
        batches = await consumer.getmany(max_records=CONSUME_BATCH_MAX, timeout_ms=1000)
        now_ns = time.perf_counter_ns()
        received += [(now_ns, record) for batch in batches.values() for record in batch]
    return received


def _latencies(received: list[tuple[int, Record]], first_offset: int) -> list[int]:
    """Each record's latency in ns, sorted; checks every record arrived once, in order."""
    latencies_ns = []
    for expected, (received_ns, record) in enumerate(received):
        sequence, sent_ns = STAMP.unpack_from(record.value or b"")
        if sequence != expected or record.offset != first_offset + expected:
            raise ProcessFailed(
                f"record {expected} expected at offset {first_offset + expected}, got sequence "
                f"{sequence} at offset {record.offset}"
            )
        latencies_ns.append(received_ns - sent_ns)
    return sorted(latencies_ns)


def percentile(sorted_values: list[int], percent: float) -> float:
    """Nearest-rank percentile: the smallest value with `percent`% of values at or below it."""
    rank = math.ceil(percent / 100 * len(sorted_values))
    return float(sorted_values[max(rank, 1) - 1])
