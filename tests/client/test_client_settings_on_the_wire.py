"""Client settings that only show in the traffic: observed through a recording proxy."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable

import pytest
from riverbed import Admin, Producer
from riverbed.common.backoff import BACKOFF_JITTER
from riverbed.errors import UnknownTopicOrPartitionError

from tests.support.broker import BrokerFactory
from tests.support.proxy import RecordingProxy, proxied_broker
from tests.support.waiting import WAIT_S

METADATA = 3
# The proxy's timestamps and the client's timers read one clock, a task hop apart.
CLOCK_SLACK_S = 0.005


@pytest.fixture
async def proxied(broker_factory: BrokerFactory) -> AsyncIterator[tuple[RecordingProxy, str]]:
    """A broker that advertises the proxy's address, so every client request goes through it."""
    settings = {"auto.create.topics.enable": "false"}
    async with proxied_broker(broker_factory, settings=settings) as proxy:
        yield proxy, f"127.0.0.1:{proxy.port}"


async def test_client_id_is_sent_with_every_request(
    proxied: tuple[RecordingProxy, str],
) -> None:
    proxy, bootstrap = proxied
    # max_block_ms is long enough for a first answer on a loaded machine (any traffic will do).
    async with Producer(
        bootstrap_servers=bootstrap, client_id="orders-service", max_block_ms=5000
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

    async def send_every_100_ms(producer: Producer, until: Callable[[float], bool]) -> float:
        """Sends until `until(started)`; the time the sending started."""
        await producer.send_and_wait("in-use", b"v")
        started = time.monotonic()
        while not until(started):
            await producer.send_and_wait("in-use", b"v")
            await asyncio.sleep(0.1)
        return started

    # Metadata older than max age is refreshed before its next use: with 300 ms, refreshes
    # keep coming. Counted, not timed, so that a slow machine only makes this take longer.
    def refreshed_3_times(started: float) -> bool:
        assert time.monotonic() - started < WAIT_S, "fewer than 3 metadata refreshes"
        return proxy.api_keys(since_s=started).count(METADATA) >= 3

    async with Producer(bootstrap_servers=bootstrap, metadata_max_age_ms=300) as producer:
        started = await send_every_100_ms(producer, refreshed_3_times)
    span_s = max(time.monotonic() - started, 1.5)
    # With 10 minutes, the same span of sends uses the metadata fetched first.
    async with Producer(bootstrap_servers=bootstrap, metadata_max_age_ms=600_000) as producer:
        started = await send_every_100_ms(producer, lambda t: time.monotonic() - t >= span_s)
    assert proxy.api_keys(since_s=started).count(METADATA) <= 1


async def test_retry_backoff_ms_spaces_retries(proxied: tuple[RecordingProxy, str]) -> None:
    proxy, bootstrap = proxied
    gaps_s: dict[int, list[float]] = {}
    for backoff_ms in (20, 400):
        started = time.monotonic()
        async with Producer(
            bootstrap_servers=bootstrap,
            retry_backoff_ms=backoff_ms,
            retry_backoff_max_ms=backoff_ms,
            max_block_ms=3000,
        ) as producer:
            with pytest.raises(UnknownTopicOrPartitionError):
                await producer.send("missing", b"v")
        asked_at = [at for at, hdr in proxy.requests if at >= started and hdr.api_key == METADATA]
        gaps_s[backoff_ms] = [later - earlier for earlier, later in itertools.pairwise(asked_at)]
    # ~3 s of metadata retries for an unknown topic, one every backoff less its jitter (Kafka's
    # +-20%): never sooner (a slow machine only spaces them more), and with 20 ms some come
    # sooner than 400 ms could.
    shortest_400_s = 0.4 * (1 - BACKOFF_JITTER) - CLOCK_SLACK_S
    assert len(gaps_s[400]) >= 1, gaps_s[400]
    assert min(gaps_s[400]) >= shortest_400_s, gaps_s[400]
    assert len(gaps_s[20]) > len(gaps_s[400]), gaps_s
    assert min(gaps_s[20]) < shortest_400_s, gaps_s[20]
