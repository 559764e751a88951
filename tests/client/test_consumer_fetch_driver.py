"""The consumer's fetch driver alone, against a real broker: it fetches the partitions that have
a position, prefetches no more than positions.PREFETCHED_FETCHES_MAX, hands records out
round-robin, backs a broker off after a retriable error, leaves out-of-range partitions to the
offset resetter, and cancels a Fetch parked on the broker when it closes."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from riverbed import Admin, Producer, TopicPartition
from riverbed.client.fetch_driver import FetchDriver
from riverbed.client.pool import BrokerPool
from riverbed.client.positions import (
    EARLIEST_TIMESTAMP,
    PREFETCHED_FETCHES_MAX,
    FetchState,
    Positions,
)
from riverbed.client.settings import ConsumerSettings
from riverbed.client.types import Record
from riverbed.errors import OffsetOutOfRangeError
from riverbed.protocol import messages as m
from riverbed.protocol.connection import RequestHeader
from riverbed.protocol.errors import ErrorCode

from tests.client.consumer_events import RecordedEvents
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.proxy import RecordingProxy, proxied_broker
from tests.support.waiting import WAIT_S, eventually

FETCH_KEY = 1
METADATA_KEY = 3
RETRY_BACKOFF_MS = 300
JITTER = 0.2  # common/backoff.py's: a wait is at least (1 - JITTER) of its nominal length
REFUSED_FETCHES = 2
# Long enough that a close() which waited for the parked Fetch would be seen.
PARKED_FETCH_WAIT_MS = 20_000
CLOSE_BOUND_S = 2.0


@asynccontextmanager
async def running_driver(
    bootstrap: str, positions: Positions, **settings: object
) -> AsyncIterator[tuple[FetchDriver, RecordedEvents, BrokerPool]]:
    config = ConsumerSettings.from_kwargs({"bootstrap_servers": bootstrap, **settings})
    pool = BrokerPool(config, allow_auto_topic_creation=False)
    events = RecordedEvents()
    driver = FetchDriver(config, pool, positions, events)
    driver.start()
    try:
        yield driver, events, pool
    finally:
        await driver.close()
        await pool.close()
    assert events.crashes == []


async def create_topic(bootstrap: str, partitions: int = 1) -> str:
    topic = f"fetch-{uuid.uuid4().hex[:10]}"
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic(topic, partitions=partitions)
    return topic


async def produce(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    """`count` records, each in a batch of its own."""
    async with Producer(bootstrap_servers=bootstrap) as producer:
        for i in range(count):
            await producer.send_and_wait(topic, b"%d" % i, partition=partition)


def seeked(tps: list[TopicPartition], offset: int = 0) -> Positions:
    positions = Positions(EARLIEST_TIMESTAMP)
    positions.assign(tps)
    for tp in tps:
        positions.seek(tp, offset)
    return positions


async def take_all(driver: FetchDriver, count: int, limit: int) -> list[Record]:
    records: list[Record] = []
    deadline = time.monotonic() + WAIT_S
    while len(records) < count and time.monotonic() < deadline:
        for taken in driver.take(limit, ()).values():
            records += taken
        await asyncio.sleep(0.01)
    return records


async def test_prefetch_is_bounded_and_taking_records_makes_room_for_the_next_fetch(
    broker: BrokerProcess,
) -> None:
    topic = await create_topic(broker.bootstrap)
    await produce(broker.bootstrap, topic, 10)
    tp = TopicPartition(topic, 0)
    positions = seeked([tp])
    # A tiny partition limit: each Fetch brings back little more than one batch (KIP-74).
    async with running_driver(broker.bootstrap, positions, max_partition_fetch_bytes=1) as (
        driver,
        events,
        _,
    ):
        state = positions.get(tp)
        await eventually(lambda: len(state.buffered) == PREFETCHED_FETCHES_MAX + 1)
        fetched_up_to = state.fetch_offset
        await asyncio.sleep(0.3)  # nothing taken: no more fetches
        assert len(state.buffered) == PREFETCHED_FETCHES_MAX + 1
        assert state.fetch_offset == fetched_up_to < 10
        assert events.counts["readable"] >= PREFETCHED_FETCHES_MAX + 1
        records = await take_all(driver, 10, limit=1)
        assert [r.value for r in records] == [b"%d" % i for i in range(10)]
        assert state.position == 10


async def test_take_starts_one_partition_further_each_call(broker: BrokerProcess) -> None:
    topic = await create_topic(broker.bootstrap, partitions=3)
    for partition in range(3):
        await produce(broker.bootstrap, topic, 2, partition)
    tps = [TopicPartition(topic, p) for p in range(3)]
    positions = seeked(tps)
    async with running_driver(broker.bootstrap, positions) as (driver, _, _):
        await eventually(lambda: all(positions.get(tp).buffered for tp in tps))
        firsts = [next(iter(driver.take(1, ()))) for _ in range(3)]
        assert sorted(firsts) == tps  # one record of each partition in turn, none starved


async def test_out_of_range_leaves_the_partition_to_the_resetter_or_fails_it(
    broker: BrokerProcess,
) -> None:
    topic = await create_topic(broker.bootstrap)
    await produce(broker.bootstrap, topic, 3)
    tp = TopicPartition(topic, 0)
    positions = seeked([tp], offset=1_000)
    async with running_driver(broker.bootstrap, positions) as (_, events, _):
        await eventually(lambda: positions.get(tp).state is FetchState.AWAITING_RESET)
        assert events.counts["reset_due"] == 1
        assert positions.get(tp).error is None
    without_policy = Positions(None)
    without_policy.assign([tp])
    without_policy.seek(tp, 1_000)
    async with running_driver(broker.bootstrap, without_policy) as (driver, events, _):
        await eventually(lambda: without_policy.get(tp).state is FetchState.FAILED)
        with pytest.raises(OffsetOutOfRangeError):
            driver.take(10, ())
        assert events.counts["readable"] >= 1


async def test_close_cancels_a_fetch_parked_on_the_broker(broker: BrokerProcess) -> None:
    topic = await create_topic(broker.bootstrap)
    tp = TopicPartition(topic, 0)
    positions = seeked([tp])  # an empty partition: the broker holds the Fetch
    async with running_driver(
        broker.bootstrap,
        positions,
        fetch_max_wait_ms=PARKED_FETCH_WAIT_MS,
        request_timeout_ms=PARKED_FETCH_WAIT_MS,
    ) as (driver, events, pool):
        await eventually(lambda: any(node >= 0 for node in pool.connected_node_ids))
        await asyncio.sleep(0.3)  # the Fetch is on the broker now
        async with asyncio.timeout(CLOSE_BOUND_S):  # not PARKED_FETCH_WAIT_MS
            await driver.close()
        assert events.counts["readable"] == 0  # it was never answered


class RefuseFetches:
    """Answers the first `answers` Fetches with NOT_LEADER_OR_FOLLOWER for every partition."""

    def __init__(self, answers: int) -> None:
        self.left = answers

    def __call__(self, header: RequestHeader, body: m.ResponseBody) -> m.ResponseBody:
        if not isinstance(body, m.FetchResponse) or not self.left:
            return body
        self.left -= 1
        for topic in body.responses:
            for partition in topic.partitions:
                partition.error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
        return body


@pytest.fixture
async def refusing_proxy(broker_factory: BrokerFactory) -> AsyncIterator[RecordingProxy]:
    async with proxied_broker(broker_factory, RefuseFetches(REFUSED_FETCHES)) as proxy:
        yield proxy


async def test_a_refused_fetch_refreshes_metadata_and_backs_the_broker_off(
    refusing_proxy: RecordingProxy,
) -> None:
    bootstrap = f"127.0.0.1:{refusing_proxy.port}"
    topic = await create_topic(bootstrap)
    await produce(bootstrap, topic, 3)
    tp = TopicPartition(topic, 0)
    positions = seeked([tp])
    since = time.monotonic()
    async with running_driver(
        bootstrap, positions, retry_backoff_ms=RETRY_BACKOFF_MS, retry_backoff_max_ms=10_000
    ) as (driver, _, _):
        records = await take_all(driver, 3, limit=10)
    assert [r.value for r in records] == [b"0", b"1", b"2"]
    sent = [(at, header.api_key) for at, header in refusing_proxy.requests if at >= since]
    fetches = [at for at, key in sent if key == FETCH_KEY]
    assert len(fetches) > REFUSED_FETCHES
    # Each refusal backed the broker off retry_backoff_ms (less the jitter): it answered, so
    # the wait does not double, but it is not retried at once either.
    waited_s = fetches[REFUSED_FETCHES] - fetches[0]
    assert waited_s >= (1 - JITTER) * REFUSED_FETCHES * RETRY_BACKOFF_MS / 1000
    # The refusal marked the metadata stale: the driver asked for it again.
    assert any(key == METADATA_KEY and at > fetches[0] for at, key in sent)
