"""Admin.list_offsets retries OFFSET_NOT_AVAILABLE, which a real leader answers while its high
watermark has not reached the start of its leader epoch (KIP-207; right after a failover or a
whole-cluster restart). That state is brief and hard to hold, so a proxy in front of a real
broker turns the broker's first ListOffsets answers into it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from riverbed import Admin, Producer, TopicPartition
from riverbed.protocol import messages as m

from tests.support.broker import BrokerFactory
from tests.support.proxy import OffsetNotAvailable, RecordingProxy, proxied_broker

TOPIC = "offsets"
RECORDS = 7
NOT_AVAILABLE_ANSWERS = 2


@pytest.fixture
async def proxy(broker_factory: BrokerFactory) -> AsyncIterator[RecordingProxy]:
    async with proxied_broker(broker_factory, OffsetNotAvailable(NOT_AVAILABLE_ANSWERS)) as proxy:
        yield proxy


async def test_list_offsets_retries_offset_not_available(proxy: RecordingProxy) -> None:
    bootstrap = f"127.0.0.1:{proxy.port}"
    async with Producer(bootstrap_servers=bootstrap) as producer:
        for i in range(RECORDS):
            await producer.send(TOPIC, str(i).encode(), partition=0)
    async with Admin(bootstrap_servers=bootstrap) as admin:
        tp = TopicPartition(TOPIC, 0)
        answers = await admin.list_offsets({tp: "latest"})
    assert answers[tp].offset == RECORDS
    rewrite = proxy.rewrite
    assert isinstance(rewrite, OffsetNotAvailable)
    assert rewrite.rewritten == NOT_AVAILABLE_ANSWERS
    list_offsets_key = m.ListOffsetsRequest.API_KEY
    assert proxy.api_keys().count(list_offsets_key) == NOT_AVAILABLE_ANSWERS + 1
