"""The producer across a broker crash: retries with idempotence lose and duplicate nothing."""

from __future__ import annotations

import asyncio

from kafka.record import MemoryRecords
from riverbed.client.accumulator import DeliveryFuture
from riverbed.client.producer import Producer

from tests.support.broker import BrokerFactory

RECORDS = 3_000
KILL_AFTER = 1_000


async def test_kill_and_restart_mid_produce_loses_and_duplicates_nothing(
    broker_factory: BrokerFactory,
) -> None:
    # A short ZooKeeper session so the restarted broker can re-register soon after the SIGKILL.
    broker = broker_factory({"zookeeper.session.timeout.ms": "3000"})
    async with Producer(
        bootstrap_servers=broker.bootstrap,
        linger_ms=2,
        batch_size=2_000,
        request_timeout_ms=2_000,
        delivery_timeout_ms=60_000,
        retry_backoff_ms=50,
    ) as producer:
        futures: list[DeliveryFuture] = []
        for i in range(RECORDS):
            futures.append(await producer.send("crash", b"%06d" % i))
            if i % 50 == 0:
                await asyncio.sleep(0.005)  # let batches go out while we keep producing
            if i == KILL_AFTER:
                broker.kill()
                restart = asyncio.ensure_future(asyncio.to_thread(broker.restart))
        await restart
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert producer.status().idempotent
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, failures[:3]
    offsets = [r.offset for r in results if not isinstance(r, BaseException)]
    assert all(o >= 0 for o in offsets)
    assert offsets == sorted(offsets)  # retries kept the order
    data = b"".join(p.read_bytes() for p in broker.segment_files("crash", 0))
    records = MemoryRecords(data)
    values: list[bytes | None] = []
    while (batch := records.next_batch()) is not None:
        values.extend(record.value for record in batch)
    assert values == [b"%06d" % i for i in range(RECORDS)]  # each exactly once, in order
