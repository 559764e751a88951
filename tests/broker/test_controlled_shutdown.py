"""Controlled shutdown across real broker processes: a broker asks the controller (over the
ControlledShutdown API) to move its leaderships away, and Metadata shows them moved."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
from riverbed import Admin
from riverbed.broker.controlled_shutdown import request_controlled_shutdown
from riverbed.client.admin import TopicDescription
from riverbed.client.connection import BrokerConnection
from riverbed.configs import CONFIG_RULES
from riverbed.coordination.controller import Controller
from riverbed.coordination.metadata import ClusterMetadataStore
from riverbed.coordination.metadata_cache import MetadataCache, MetadataWatcher
from riverbed.coordination.zk import AsyncZooKeeper
from riverbed.hot.replication.inter_broker import InterBrokerDialer
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode

from tests.support.broker import HOST, BrokerFactory, BrokerProcess

TOPIC = "orders"
PARTITIONS = 6
WAIT_S = 30.0
REQUEST_TIMEOUT_MS = 20_000
# How long after a broker's exit no partition may change again.
EXIT_WATCH_S = 3.0


@pytest.fixture
async def cluster_view(
    zk_connect: str,
) -> AsyncIterator[tuple[ClusterMetadataStore, MetadataCache]]:
    """The test's own session on the cluster's ZooKeeper, as a broker's would be."""
    async with AsyncZooKeeper(zk_connect) as zk:
        cache = MetadataCache()
        watcher = MetadataWatcher(zk, cache)
        await watcher.start()
        try:
            yield ClusterMetadataStore(zk, CONFIG_RULES), cache
        finally:
            await watcher.stop()


async def describe_until(
    admin: Admin, done: Callable[[TopicDescription], bool], what: str
) -> TopicDescription:
    deadline = time.monotonic() + WAIT_S
    while True:
        described = await admin.describe_topic(TOPIC)
        if done(described):
            return described
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {WAIT_S} s: {what}; last seen {described}")
        await asyncio.sleep(0.1)


async def test_controlled_shutdown_moves_leaderships(
    broker_factory: BrokerFactory, cluster_view: tuple[ClusterMetadataStore, MetadataCache]
) -> None:
    brokers = {i: broker_factory(broker_id=i) for i in (1, 2, 3)}
    store, cache = cluster_view
    async with Admin(bootstrap_servers=brokers[1].bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=2)
        before = await describe_until(
            admin, lambda d: all(p.leader >= 0 for p in d.partitions), "every partition led"
        )
        await cache.wait_until(lambda c: c.controller_id is not None, int(WAIT_S * 1000))
        controller_id = cache.controller_id
        assert controller_id in brokers
        # A broker other than the controller that leads something: it must ask over the wire.
        led = {p.leader for p in before.partitions}
        leaving = min(b for b in brokers if b != controller_id and b in led)

        # Its own Controller is not the active one, so the request goes to the controller.
        local = Controller(store, cache, leaving, lambda _topic: False)
        dialer = InterBrokerDialer(cache, "PLAINTEXT")
        assert await request_controlled_shutdown(
            cache, leaving, local, dialer, timeout_ms=REQUEST_TIMEOUT_MS
        )

        after = await describe_until(
            admin,
            lambda d: all(p.leader != leaving for p in d.partitions),
            f"no partition led by broker {leaving}",
        )
        for old, new in zip(before.partitions, after.partitions, strict=True):
            if leaving not in old.replicas:
                assert new.leader_epoch == old.leader_epoch
                continue
            # Every partition it led or followed got exactly one new leader epoch (it left the
            # ISR; its leaderships went to a replica that was in sync). Its ISR membership is not
            # checked: a leader may take it back in while the process still runs and fetches.
            assert new.leader_epoch == old.leader_epoch + 1, (old, new)
            expected_leader = old.leader if old.leader != leaving else new.leader
            assert new.leader == expected_leader, (old, new)
            assert new.leader in old.isr, (old, new)


async def test_only_the_controller_answers_controlled_shutdown(
    broker_factory: BrokerFactory, cluster_view: tuple[ClusterMetadataStore, MetadataCache]
) -> None:
    brokers = {i: broker_factory(broker_id=i) for i in (1, 2)}
    _, cache = cluster_view
    await cache.wait_until(lambda c: c.controller_id is not None, int(WAIT_S * 1000))
    controller_id = cache.controller_id
    assert controller_id in brokers
    other = next(b for b in brokers.values() if b.broker_id != controller_id)

    async def ask(broker: BrokerProcess) -> m.ControlledShutdownResponse:
        connection = await BrokerConnection.open(HOST, broker.port)
        try:
            return await connection.call(
                m.ControlledShutdownRequest(broker_id=other.broker_id),
                m.ControlledShutdownResponse,
            )
        finally:
            await connection.close()

    assert (await ask(other)).error_code == ErrorCode.NOT_CONTROLLER
    # Nothing replicated on it: nothing remains.
    answer = await ask(brokers[controller_id])
    assert (answer.error_code, answer.remaining_partitions) == (ErrorCode.NONE, [])


async def test_a_stopped_broker_leaves_each_isr_once(
    broker_factory: BrokerFactory, cluster_view: tuple[ClusterMetadataStore, MetadataCache]
) -> None:
    """SIGTERM: the broker stops fetching before it asks the controller to take it out of its
    ISRs, so no leader takes it back in meanwhile, and its exit changes nothing more: each
    partition got exactly one new leader epoch, and no ISR names the broker."""
    brokers = {i: broker_factory(broker_id=i) for i in (1, 2, 3)}
    _, cache = cluster_view
    async with Admin(bootstrap_servers=brokers[1].bootstrap) as admin:
        await admin.create_topic(TOPIC, partitions=60, replication_factor=3)
        before = await describe_until(
            admin,
            lambda d: all(p.leader >= 0 and len(p.isr) == 3 for p in d.partitions),
            "every partition led, every ISR full",
        )
        await cache.wait_until(lambda c: c.controller_id is not None, int(WAIT_S * 1000))
        leaving = max(b for b in brokers if b != cache.controller_id)
        await asyncio.to_thread(brokers[leaving].terminate)
        await cache.wait_until(lambda c: leaving not in c.live_broker_ids(), int(WAIT_S * 1000))
        # A second change would come from the controller handling the exit, just after it:
        # watched for a while, none may come.
        deadline = time.monotonic() + EXIT_WATCH_S
        while time.monotonic() < deadline:
            after = await admin.describe_topic(TOPIC)
            for old, new in zip(before.partitions, after.partitions, strict=True):
                assert leaving not in new.isr, (old, new)
                assert new.leader_epoch == old.leader_epoch + 1, (old, new)
            await asyncio.sleep(0.2)
