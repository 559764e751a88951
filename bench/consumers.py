"""Consumer loops shared by the benchmarks: Riverbed's consumer and aiokafka-style getmany()."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from bench.procs import ProcessFailed

if TYPE_CHECKING:
    from riverbed.client.consumer import Consumer as RiverbedConsumer

CONSUME_TIMEOUT_S = 600.0
# Records asked for per getmany() (what an application would take per poll).
CONSUME_BATCH_MAX = 10_000
FETCH_MAX_BYTES = 50 * 1024 * 1024
PARTITION_FETCH_MAX_BYTES = 10 * 1024 * 1024
FETCH_MAX_WAIT_MS = 100


def riverbed_consumer(bootstrap: str) -> RiverbedConsumer:
    """Riverbed's consumer with the benchmarks' fetch sizes (start it with `async with`)."""
    from riverbed.client.consumer import Consumer

    return Consumer(
        bootstrap_servers=bootstrap,
        fetch_max_bytes=FETCH_MAX_BYTES,
        max_partition_fetch_bytes=PARTITION_FETCH_MAX_BYTES,
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
    )


async def consume_riverbed(
    bootstrap: str, topic: str, records: int, value: bytes
) -> dict[str, Any]:
    from riverbed.client.types import TopicPartition as RiverbedTopicPartition

    tp = RiverbedTopicPartition(topic, 0)
    async with riverbed_consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        return await count_getmany("riverbed", consumer.getmany, records, value)


async def count_getmany(
    client: str, getmany: Callable[..., Awaitable[dict[Any, list[Any]]]], records: int, value: bytes
) -> dict[str, Any]:
    """Read `records` records with an aiokafka-style getmany(); both async clients have one."""
    cpu_before = time.process_time()
    started = time.perf_counter()
    deadline = time.monotonic() + CONSUME_TIMEOUT_S
    count = 0
    first = last = None
    while count < records:
        if time.monotonic() > deadline:
            raise ProcessFailed(f"{client} consumed {count} of {records}")
        batches = await getmany(max_records=CONSUME_BATCH_MAX, timeout_ms=1000)
        for batch in batches.values():
            if first is None:
                first = (batch[0].offset, batch[0].value)
            last = (batch[-1].offset, batch[-1].value)
            count += len(batch)
    elapsed_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_before
    check_records(client, records, value, first, last)
    return rate(count, elapsed_s, cpu_s)


def check_records(client: str, records: int, value: bytes, first: object, last: object) -> None:
    if first != (0, value) or last != (records - 1, value):
        raise ProcessFailed(f"{client} consumed the wrong records: {first=} {last=}")


def rate(records: int, elapsed_s: float, cpu_s: float) -> dict[str, Any]:
    return {
        "records": records,
        "seconds": elapsed_s,
        "records_per_s": records / elapsed_s,
        "client_cpu_s": cpu_s,
    }
