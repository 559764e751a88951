"""Admin.list_offsets retries OFFSET_NOT_AVAILABLE, which a real leader answers while its high
watermark has not reached the start of its leader epoch (KIP-207; right after a failover or a
whole-cluster restart). That state is brief and hard to hold, so a proxy in front of a real
broker turns the broker's first ListOffsets answers into it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from riverbed import Admin, Producer, TopicPartition
from riverbed.protocol import messages as m
from riverbed.protocol.connection import RequestHeader
from riverbed.protocol.errors import ErrorCode

from tests.support.broker import BrokerFactory
from tests.support.proxy import RecordingProxy

TOPIC = "offsets"
RECORDS = 7
NOT_AVAILABLE_ANSWERS = 2


class NotAvailableYet:
    """Answers the first NOT_AVAILABLE_ANSWERS ListOffsets with OFFSET_NOT_AVAILABLE."""

    def __init__(self) -> None:
        self.rewritten = 0

    def __call__(self, header: RequestHeader, body: m.ResponseBody) -> m.ResponseBody:
        if not isinstance(body, m.ListOffsetsResponse) or self.rewritten >= NOT_AVAILABLE_ANSWERS:
            return body
        self.rewritten += 1
        for topic in body.topics:
            for partition in topic.partitions:
                partition.error_code = ErrorCode.OFFSET_NOT_AVAILABLE
                partition.offset = -1
        return body


@pytest.fixture
async def proxy(broker_factory: BrokerFactory) -> AsyncIterator[RecordingProxy]:
    rewriting = RecordingProxy(rewrite=NotAvailableYet())
    await rewriting.start()
    broker = broker_factory({"advertised.listeners": f"PLAINTEXT://127.0.0.1:{rewriting.port}"})
    rewriting.target_port = broker.port
    try:
        yield rewriting
    finally:
        await rewriting.close()


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
    assert isinstance(rewrite, NotAvailableYet)
    assert rewrite.rewritten == NOT_AVAILABLE_ANSWERS
    list_offsets_key = m.ListOffsetsRequest.API_KEY
    assert proxy.api_keys().count(list_offsets_key) == NOT_AVAILABLE_ANSWERS + 1
