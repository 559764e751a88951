"""The client's public API exactly as the issue and the README show it."""

from __future__ import annotations

from riverbed import Admin, Consumer, Producer, TopicPartition

from tests.support.broker import BrokerProcess


async def test_the_documented_example_runs_as_written(broker: BrokerProcess) -> None:
    bootstrap = broker.bootstrap
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic("orders", partitions=1)
    async with Producer(
        bootstrap_servers=bootstrap, acks="all", linger_ms=5, compression_type="zstd"
    ) as p:
        fut = await p.send("orders", b"value", key=b"k")  # enqueued; awaits only under backpressure
        meta = await fut  # partition, offset, timestamp_ms
        await p.flush()
    assert (meta.partition, meta.offset) == (0, 0)
    async with Consumer(bootstrap_servers=bootstrap) as c:
        c.assign([TopicPartition("orders", 0)])
        await c.seek_to_beginning()
        batches = await c.getmany(max_records=10_000, timeout_ms=1000)
        (record,) = batches[TopicPartition("orders", 0)]
        assert (record.key, record.value, record.offset) == (b"k", b"value", 0)
        assert record.timestamp_ms == meta.timestamp_ms
        async with Producer(bootstrap_servers=bootstrap) as p:
            await p.send_and_wait("orders", b"more")
        async for streamed in c:  # the iterator resumes after what getmany returned
            assert (streamed.value, streamed.offset) == (b"more", 1)
            break
