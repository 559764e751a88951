"""Client settings that only show in the traffic: observed through a recording proxy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from riverbed import Admin, Producer
from riverbed.errors import UnknownTopicOrPartitionError

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.proxy import RecordingProxy

METADATA = 3


@pytest.fixture
async def proxied(broker_factory: BrokerFactory) -> AsyncIterator[tuple[RecordingProxy, str]]:
    """A broker that advertises the proxy's address, so every client request goes through it."""
    proxy = RecordingProxy()
    await proxy.start()
    broker: BrokerProcess = broker_factory(
        {
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.port}",
            "auto.create.topics.enable": "false",
        }
    )
    proxy.target_port = broker.port
    try:
        yield proxy, f"127.0.0.1:{proxy.port}"
    finally:
        await proxy.close()


async def test_client_id_is_sent_with_every_request(
    proxied: tuple[RecordingProxy, str],
) -> None:
    proxy, bootstrap = proxied
    async with Producer(
        bootstrap_servers=bootstrap, client_id="orders-service", max_block_ms=1000
    ) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            await producer.send("missing", b"v")  # any traffic will do
    assert proxy.requests
    assert {header.client_id for _, header in proxy.requests} == {"orders-service"}


async def test_metadata_max_age_ms_bounds_the_age_of_used_metadata(
    proxied: tuple[RecordingProxy, str],
) -> None:
    proxy, bootstrap = proxied
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic("in-use", partitions=1)
    for max_age_ms, expected in ((300, range(3, 100)), (600_000, range(0, 2))):
        async with Producer(
            bootstrap_servers=bootstrap, metadata_max_age_ms=max_age_ms
        ) as producer:
            await producer.send_and_wait("in-use", b"v")
            started = time.monotonic()
            # Metadata older than max age is refreshed before the next use.
            while time.monotonic() - started < 1.5:
                await producer.send_and_wait("in-use", b"v")
                await asyncio.sleep(0.1)
        refreshes = proxy.api_keys(since_s=started).count(METADATA)
        assert refreshes in expected, (max_age_ms, refreshes)


async def test_retry_backoff_ms_spaces_retries(proxied: tuple[RecordingProxy, str]) -> None:
    proxy, bootstrap = proxied
    counts = {}
    for backoff_ms in (20, 400):
        started = time.monotonic()
        async with Producer(
            bootstrap_servers=bootstrap,
            retry_backoff_ms=backoff_ms,
            retry_backoff_max_ms=backoff_ms,
            max_block_ms=1500,
        ) as producer:
            with pytest.raises(UnknownTopicOrPartitionError):
                await producer.send("missing", b"v")
        counts[backoff_ms] = proxy.api_keys(since_s=started).count(METADATA)
    # ~1.5 s of metadata retries for an unknown topic: one every backoff.
    assert counts[20] > 3 * counts[400], counts
    assert counts[400] <= 1500 // 400 + 2, counts
