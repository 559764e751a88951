"""The consumer's offset resetter alone. Committed offsets come from a function the test writes
(the group's OffsetFetch in a consumer), so most of these need no broker; reset timestamps go to
a real one (ListOffsets)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import pytest
from riverbed import Admin, Producer, TopicPartition
from riverbed.client.group.offset_requests import OffsetAndMetadata
from riverbed.client.offset_reset import CommittedOffsets, OffsetResetter, list_offsets
from riverbed.client.pool import BrokerPool
from riverbed.client.positions import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, FetchState, Positions
from riverbed.client.settings import ConsumerSettings
from riverbed.errors import KafkaTimeoutError, OffsetOutOfRangeError

from tests.client.consumer_events import RecordedEvents
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.proxy import OffsetNotAvailable, RecordingProxy, proxied_broker
from tests.support.waiting import eventually

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
# Where no broker listens: a test that needs none fails fast if the part asks one anyway.
NO_BROKER = "127.0.0.1:1"
RETRY_BACKOFF_MS = 300
JITTER = 0.2  # common/backoff.py's: a wait is at least (1 - JITTER) of its nominal length
LIST_OFFSETS_KEY = 2


class Committed:
    """The group's committed offsets as the resetter asks for them; each call recorded."""

    def __init__(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.offsets = dict(offsets)
        self.calls: list[tuple[float, list[TopicPartition]]] = []
        self.failures_left = 0  # calls to answer with a timeout first
        self.gate: asyncio.Event | None = None  # when set, calls wait for it
        self.cancelled = False

    async def __call__(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        self.calls.append((time.monotonic(), sorted(partitions)))
        if self.failures_left:
            self.failures_left -= 1
            raise KafkaTimeoutError("OffsetFetch timed out")
        if self.gate is not None:
            try:
                await self.gate.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        return {
            tp: None if tp not in self.offsets else OffsetAndMetadata(self.offsets[tp])
            for tp in partitions
        }


@asynccontextmanager
async def running_resetter(
    positions: Positions,
    committed: CommittedOffsets,
    bootstrap: str = NO_BROKER,
    **settings: object,
) -> AsyncIterator[tuple[OffsetResetter, RecordedEvents]]:
    config = ConsumerSettings.from_kwargs({"bootstrap_servers": bootstrap, **settings})
    pool = BrokerPool(config, allow_auto_topic_creation=False)
    events = RecordedEvents()
    resetter = OffsetResetter(config, pool, positions, committed, events)
    resetter.start()
    try:
        yield resetter, events
    finally:
        await resetter.close()
        await pool.close()
    assert events.crashes == []


def group_assigned(
    positions: Positions, resetter: OffsetResetter, *partitions: TopicPartition
) -> None:
    """What the consumer does when its group assigns `partitions` (all new)."""
    positions.assign(partitions)
    resetter.group_assigned(frozenset(partitions), frozenset(partitions))
    resetter.wake()


def state_of(positions: Positions, tp: TopicPartition) -> tuple[FetchState, int]:
    state = positions.get(tp)
    return state.state, state.position


async def test_group_assigned_partitions_start_at_their_committed_offsets() -> None:
    positions = Positions(EARLIEST_TIMESTAMP)
    committed = Committed({TP0: 5, TP1: 9})
    async with running_resetter(positions, committed) as (resetter, events):
        group_assigned(positions, resetter, TP0, TP1)
        await eventually(lambda: events.counts["fetch_due"] > 0)
        assert state_of(positions, TP0) == (FetchState.FETCHING, 5)
        assert state_of(positions, TP1) == (FetchState.FETCHING, 9)
        assert [asked for _, asked in committed.calls] == [[TP0, TP1]]  # one lookup for both


async def test_a_failed_committed_lookup_is_retried_after_a_backoff() -> None:
    positions = Positions(EARLIEST_TIMESTAMP)
    committed = Committed({TP0: 5})
    committed.failures_left = 1
    async with running_resetter(
        positions, committed, retry_backoff_ms=RETRY_BACKOFF_MS, retry_backoff_max_ms=1_000
    ) as (resetter, events):
        group_assigned(positions, resetter, TP0)
        await eventually(lambda: state_of(positions, TP0) == (FetchState.FETCHING, 5))
        assert len(committed.calls) == 2
        waited_s = committed.calls[1][0] - committed.calls[0][0]
        assert waited_s >= (1 - JITTER) * RETRY_BACKOFF_MS / 1000
        assert [type(error) for error in events.failures] == [KafkaTimeoutError]


async def test_a_seek_during_a_committed_lookup_wins() -> None:
    positions = Positions(EARLIEST_TIMESTAMP)
    committed = Committed({TP0: 5})
    committed.gate = asyncio.Event()
    async with running_resetter(positions, committed) as (resetter, _):
        group_assigned(positions, resetter, TP0)
        await eventually(lambda: len(committed.calls) == 1)
        positions.seek(TP0, 7)
        committed.gate.set()
        await asyncio.sleep(0.05)  # the lookup answers, for the position before the seek
        assert state_of(positions, TP0) == (FetchState.FETCHING, 7)
        assert len(committed.calls) == 1


async def test_close_cancels_a_lookup_in_flight() -> None:
    positions = Positions(EARLIEST_TIMESTAMP)
    committed = Committed({TP0: 5})
    committed.gate = asyncio.Event()  # never set: the lookup hangs until cancelled
    async with running_resetter(positions, committed) as (resetter, _):
        group_assigned(positions, resetter, TP0)
        await eventually(lambda: len(committed.calls) == 1)
    assert committed.cancelled
    assert positions.get(TP0).state is FetchState.AWAITING_RESET


async def test_without_a_reset_policy_a_partition_fails_and_getmany_is_told() -> None:
    positions = Positions(None)  # auto_offset_reset="none"
    positions.assign([TP0])
    async with running_resetter(positions, Committed({})) as (_, events):
        await eventually(lambda: positions.get(TP0).state is FetchState.FAILED)
        assert isinstance(positions.get(TP0).error, OffsetOutOfRangeError)
        assert events.counts["readable"] == 1
        assert events.counts["fetch_due"] == 0


async def create_topic(bootstrap: str, partitions: int) -> str:
    topic = f"reset-{uuid.uuid4().hex[:10]}"
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic(topic, partitions=partitions)
    return topic


async def produce(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    async with Producer(bootstrap_servers=bootstrap) as producer:
        for i in range(count):
            await producer.send_and_wait(topic, b"%d" % i, partition=partition)


async def test_partitions_without_a_committed_offset_start_by_policy(
    broker: BrokerProcess,
) -> None:
    topic = await create_topic(broker.bootstrap, partitions=3)
    for partition in range(3):
        await produce(broker.bootstrap, topic, 3, partition)
    committed_tp, by_policy, assigned = (TopicPartition(topic, p) for p in range(3))
    positions = Positions(LATEST_TIMESTAMP)
    committed = Committed({committed_tp: 1})
    async with running_resetter(positions, committed, broker.bootstrap) as (resetter, events):
        group_assigned(positions, resetter, committed_tp, by_policy)
        # Assigned by hand: no committed offset is looked up for it.
        positions.assign([committed_tp, by_policy, assigned])
        resetter.wake()
        await eventually(
            lambda: all(state.state is FetchState.FETCHING for _, state in positions.items())
        )
        assert state_of(positions, committed_tp) == (FetchState.FETCHING, 1)
        assert state_of(positions, by_policy) == (FetchState.FETCHING, 3)
        assert state_of(positions, assigned) == (FetchState.FETCHING, 3)
        assert [asked for _, asked in committed.calls] == [[committed_tp, by_policy]]
        assert events.counts["fetch_due"] >= 2


async def test_find_position_and_reset_positions_look_up_in_the_foreground(
    broker: BrokerProcess,
) -> None:
    topic = await create_topic(broker.bootstrap, partitions=1)
    await produce(broker.bootstrap, topic, 4)
    tp = TopicPartition(topic, 0)
    positions = Positions(LATEST_TIMESTAMP)
    positions.assign([tp])
    positions.seek(tp, 2)
    async with running_resetter(positions, Committed({}), broker.bootstrap) as (resetter, _):
        positions.request_reset(tp, EARLIEST_TIMESTAMP)
        await resetter.reset_positions([tp])
        assert state_of(positions, tp) == (FetchState.FETCHING, 0)
        positions.request_reset(tp, LATEST_TIMESTAMP)
        await resetter.find_position(tp)
        assert state_of(positions, tp) == (FetchState.FETCHING, 4)


@pytest.fixture
async def not_available_twice(broker_factory: BrokerFactory) -> AsyncIterator[RecordingProxy]:
    async with proxied_broker(broker_factory, OffsetNotAvailable(2)) as proxy:
        yield proxy


async def test_list_offsets_retries_offset_not_available(
    not_available_twice: RecordingProxy,
) -> None:
    bootstrap = f"127.0.0.1:{not_available_twice.port}"
    await produce(bootstrap, "offsets", 7)
    tp = TopicPartition("offsets", 0)
    config = ConsumerSettings.from_kwargs({"bootstrap_servers": bootstrap})
    pool = BrokerPool(config, allow_auto_topic_creation=False)
    try:
        answers = await list_offsets(config, pool, {tp: LATEST_TIMESTAMP})
    finally:
        await pool.close()
    assert answers[tp][0] == 7
    assert not_available_twice.api_keys().count(LIST_OFFSETS_KEY) == 3
