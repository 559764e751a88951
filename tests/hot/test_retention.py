"""Deletion retention on the hot tier.

The rule (`log_start_after_retention`) on segment statistics with an injected clock; then a real
broker: segments past `retention.ms` (by their records' timestamps) and past `retention.bytes`
(set live, no restart) are deleted, ListOffsets earliest moves to the new log start, and a
consumer positioned below it gets OFFSET_OUT_OF_RANGE and resets by its policy."""

from __future__ import annotations

import time
import uuid

import pytest
from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition
from riverbed.errors import OffsetOutOfRangeError
from riverbed.hot.storage.log import SegmentStats
from riverbed.hot.storage.retention import UNLIMITED, log_start_after_retention

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.cluster import ClusterFactory, partition_state, wait_for
from tests.support.metrics import WITH_METRICS, scrape
from tests.tiering.test_tiering_broker import wait_until

NOW_MS = 1_000_000_000
HOUR_MS = 3_600_000


def segments(*spec: tuple[int, int, int]) -> list[SegmentStats]:
    """(base offset, size bytes, max timestamp) per segment, the last one active."""
    out = []
    for slot, (base, size, newest) in enumerate(spec):
        sealed = slot + 1 < len(spec)
        next_offset = spec[slot + 1][0] if sealed else base + 10
        out.append(SegmentStats(base, next_offset, size, newest, sealed))
    return out


def start(
    stats: list[SegmentStats],
    *,
    retention_ms: int = UNLIMITED,
    retention_bytes: int = UNLIMITED,
    limit_offset: int = 10**9,
) -> int | None:
    return log_start_after_retention(
        stats,
        retention_ms=retention_ms,
        retention_bytes=retention_bytes,
        now_ms=NOW_MS,
        limit_offset=limit_offset,
    )


OLD, NEW = NOW_MS - 2 * HOUR_MS, NOW_MS - 1
LOG = segments((0, 100, OLD), (10, 100, OLD), (20, 100, NEW), (30, 100, OLD), (40, 100, OLD))


def test_by_time_the_oldest_segments_whose_newest_record_is_too_old_go() -> None:
    # The third segment is new: the old one after it stays too (retention stops at the first kept).
    assert start(LOG, retention_ms=HOUR_MS) == 20
    assert start(LOG, retention_ms=3 * HOUR_MS) is None


def test_by_size_the_oldest_go_while_what_stays_still_reaches_the_limit() -> None:
    assert start(LOG, retention_bytes=250) == 20  # 500 -> 300 stays >= 250; 200 would not
    assert start(LOG, retention_bytes=300) == 20
    assert start(LOG, retention_bytes=301) == 10
    assert start(LOG, retention_bytes=500) is None


def test_the_active_segment_and_offsets_past_the_limit_are_never_deleted() -> None:
    assert start(LOG, retention_bytes=1) == 40  # everything but the active segment
    assert start(LOG, retention_bytes=1, limit_offset=25) == 20  # not uncommitted records
    assert start(LOG, retention_ms=0, limit_offset=5) is None
    assert start(LOG) is None  # unlimited


async def produce(broker: BrokerProcess, topic: str, timestamps_ms: list[int]) -> None:
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5) as producer:
        futures = [
            await producer.send(topic, b"%08d" % i * 10, partition=0, timestamp_ms=timestamp_ms)
            for i, timestamp_ms in enumerate(timestamps_ms)
        ]
        await producer.flush()
        for future in futures:
            await future


def log_start(broker: BrokerProcess, topic: str) -> int:
    return int(broker.segment_files(topic, 0)[0].stem)


def retention_passes(broker: BrokerProcess) -> float:
    return scrape(broker).value("riverbed_retention_passes_total")


async def after_a_retention_pass(broker: BrokerProcess) -> None:
    """Return once a whole retention pass ran after this call, over everything written before
    it: a pass runs in one go on the broker's event loop, which also serves the scrape."""
    before = retention_passes(broker)
    await wait_until(lambda: retention_passes(broker) > before, "a retention pass")


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory({"log.retention.check.interval.ms": "200", **WITH_METRICS})


RECORDS = 2_000


async def new_topic(bootstrap: str, replication_factor: int, configs: dict[str, str]) -> str:
    """A one-partition topic with 16 KiB segments (many to delete) and `configs`."""
    topic = f"retained-{uuid.uuid4().hex[:8]}"
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic(
            topic,
            partitions=1,
            replication_factor=replication_factor,
            configs={"segment.bytes": "16384", **configs},
        )
    return topic


async def test_a_broker_deletes_segments_past_retention_and_readers_below_reset(
    broker: BrokerProcess,
) -> None:
    topic = await new_topic(broker.bootstrap, 1, {"retention.ms": str(HOUR_MS)})
    now_ms = int(time.time() * 1000)
    old = RECORDS // 2
    await produce(broker, topic, [now_ms - 2 * HOUR_MS] * old + [now_ms] * (RECORDS - old))

    # By time: every segment holding only two-hour-old records goes; the one with the first new
    # record stays whole. A pass that ran while the records were still arriving saw fewer
    # sealed segments (a CI run read the start between two passes): the first pass after the
    # last record decides, and the passes after it find nothing more to delete.
    await after_a_retention_pass(broker)
    by_time = log_start(broker, topic)
    assert 0 < by_time <= old
    tp = TopicPartition(topic, 0)
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        assert (await admin.list_offsets({tp: "earliest"}))[tp].offset == by_time

        # By size, set live: the log shrinks to about the limit.
        total = sum(p.stat().st_size for p in broker.segment_files(topic, 0))
        await admin.alter_configs(topic, set={"retention.bytes": str(total // 2)})
        await wait_until(lambda: log_start(broker, topic) > by_time, "size retention ran")
        kept = sum(p.stat().st_size for p in broker.segment_files(topic, 0))
        assert total // 2 <= kept < total
        by_size = (await admin.list_offsets({tp: "earliest"}))[tp].offset
        assert by_size == log_start(broker, topic)

    # A reader below the log start: OFFSET_OUT_OF_RANGE with no reset policy...
    async with Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        with pytest.raises(OffsetOutOfRangeError):
            await consumer.getmany(timeout_ms=5000)
    # ...and, with "earliest", it resets to the log start and reads everything from there.
    async with Consumer(bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        c.seek(tp, 0)
        offsets: list[int] = []
        while len(offsets) < RECORDS - by_size:
            batches = await c.getmany(timeout_ms=5000)
            assert batches, f"stalled after {len(offsets)} records"
            offsets += [r.offset for records in batches.values() for r in records]
    assert offsets == list(range(by_size, RECORDS))


@pytest.mark.parametrize("policy", ["compact", ""], ids=["compact", "empty"])
async def test_a_topic_without_the_delete_policy_is_not_deleted_by_retention(
    broker: BrokerProcess, policy: str
) -> None:
    """compact only, or the empty policy (neither: Kafka 4's infinite retention)."""
    topic = await new_topic(broker.bootstrap, 1, {"retention.ms": "1", "cleanup.policy": policy})
    await produce(broker, topic, [int(time.time() * 1000) - 2 * HOUR_MS] * 500)
    await after_a_retention_pass(broker)  # one that saw every record, all past retention.ms
    assert log_start(broker, topic) == 0


async def test_a_follower_back_after_retention_passed_its_log_end_restarts_at_the_leaders_start(
    cluster_factory: ClusterFactory,
) -> None:
    """Kafka's rule: a follower whose log ends below the leader's log start (deleted by
    retention while it was down) truncates fully and goes on from the leader's log start;
    before, it took OFFSET_OUT_OF_RANGE for a divergence and never caught up."""
    cluster = await cluster_factory(
        2, {"log.retention.check.interval.ms": "200", "zookeeper.session.timeout.ms": "6000"}
    )
    topic = await new_topic(cluster.bootstrap, 2, {"retention.bytes": "40000"})
    state = await partition_state(cluster.bootstrap, topic, 0)
    follower = next(b for b in state.replicas if b != state.leader)
    cluster.kill(follower)

    async with Producer(bootstrap_servers=cluster.bootstrap, acks=1, linger_ms=5) as producer:
        for i in range(RECORDS):
            await producer.send(topic, b"%08d" % i * 10, partition=0)
        await producer.flush()
    leader_broker = cluster.brokers[state.leader]
    follower_broker = cluster.brokers[follower]
    await wait_until(lambda: log_start(leader_broker, topic) > 1000, "retention on the leader")

    leader_start = log_start(leader_broker, topic)
    await cluster.restart(follower)

    async def back_in_sync() -> bool:
        now = await partition_state(cluster.bootstrap, topic, 0)
        return follower in now.isr

    await wait_for(back_in_sync, 60.0, what="the follower back in the ISR")
    assert "restarting the log there" in follower_broker.log_path.read_text()
    # It starts where the leader's log started (or later: its own retention runs too).
    assert log_start(follower_broker, topic) >= leader_start > 0
