"""Right after a restart the broker leads a tiered partition before its offloader has read the
partition's manifest. The log start it answers must still be the remote one: the local log
start would send a consumer that seeks to the beginning (or resets to earliest) past every
tiered record, silently."""

from __future__ import annotations

import asyncio
from pathlib import Path

import confluent_kafka
from riverbed.client.admin import Admin
from riverbed.client.types import TopicPartition

from tests.support.broker import BrokerProcess
from tests.tiering.test_tiering_broker import (
    EXPECTED,
    RECORDS,
    read_all_from_zero,
    tiered_topic,
    wait_until,
)


async def test_after_a_restart_the_log_start_is_the_remote_one_even_before_the_manifest_is_read(
    tiered_broker: tuple[BrokerProcess, Path],
) -> None:
    broker, store = tiered_broker
    topic = await tiered_topic(broker)
    await wait_until(
        lambda: int(broker.segment_files(topic, 0)[0].stem) > RECORDS // 2,
        "segments tiered and deleted locally",
    )
    broker.terminate()
    # The store unreadable across the restart (its root replaced by a plain file): nothing can
    # load the manifest, so the broker either answers from it or does not answer yet.
    hidden = store.with_name("cold-away")
    store.rename(hidden)
    store.write_bytes(b"not a directory")
    broker.restart()
    tp = TopicPartition(topic, 0)
    async with Admin(bootstrap_servers=broker.bootstrap, request_timeout_ms=60_000) as admin:
        asking = asyncio.create_task(admin.list_offsets({tp: "earliest"}))
        # Not the local log start (a guess that skips every tiered record): a retriable
        # KAFKA_STORAGE_ERROR, which the broker logs and the Admin retries.
        await wait_until(
            lambda: "remote tier unavailable" in broker.log_path.read_text(),
            "the broker refusing the ListOffsets",
        )
        assert not asking.done()
        store.unlink()
        hidden.rename(store)
        assert (await asking)[tp].offset == 0
    assert await read_all_from_zero(broker, topic) == EXPECTED
    # A consumer that starts below the local log without asking for the log start.
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "from-zero",
            "auto.offset.reset": "error",
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        message = consumer.poll(30)
        assert message is not None
        assert message.error() is None
        assert (message.offset(), message.value()) == (0, EXPECTED[0][2])
    finally:
        consumer.close()
