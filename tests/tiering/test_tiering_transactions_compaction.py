"""Cold compaction of a compacted tiered topic holding transactions, in a real broker process.

Keys get committed values from a plain producer; then a transaction writes newer values for
half of them and aborts, another writes newer values for the other half and commits. Once the
broker tiered everything and compacted its cold tier, read_committed consumers (Riverbed's and
confluent-kafka's) fold the partition into exactly the committed state: an aborted record never
decides which record of its key survives, so the committed values it would have superseded are
still there.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Final

import confluent_kafka
from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition

from tests.support.broker import BrokerFactory
from tests.tiering.test_cold_compaction_broker import BROKER, COMPACTED_TIERED, wait_compacted
from tests.tiering.test_tiering_broker import latest_manifest
from tests.tiering.test_tiering_transactions import TRANSACTION_TIMEOUT_MS
from tests.transactions.txn_clients import ONE_BROKER_SETTINGS, TIMEOUT_S

KEYS: Final = 20
ROUNDS: Final = 3
ABORTED_KEYS: Final = range(0, 10)  # newer values in an aborted transaction
COMMITTED_KEYS: Final = range(10, 20)  # newer values in a committed one
FILLER_KEYS: Final = 40
FILLER_ROUNDS: Final = 20  # roll and tier the segments holding the transactions
PAD: Final = b"-" * 150

Row = tuple[int, bytes | None, bytes | None]


def key_of(i: int) -> bytes:
    return b"key-%03d" % i


async def fill(bootstrap: str, topic: str) -> dict[bytes, bytes]:
    """The history above; the state a read_committed reader must fold it into."""
    state: dict[bytes, bytes] = {}
    async with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5) as plain:
        for round_ in range(ROUNDS):
            for i in range(KEYS):
                value = b"committed-%d-%03d" % (round_, i) + PAD
                await plain.send(topic, value, key=key_of(i), partition=0)
                state[key_of(i)] = value
        await plain.flush()
        async with Producer(
            bootstrap_servers=bootstrap,
            transactional_id=f"compaction-txn-{uuid.uuid4().hex[:8]}",
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            linger_ms=0,
        ) as producer:
            await producer.init_transactions()
            for keys, commit in ((ABORTED_KEYS, False), (COMMITTED_KEYS, True)):
                producer.begin_transaction()
                for round_ in range(ROUNDS):  # several batches, across a roll
                    for i in keys:
                        value = b"txn-%d-%03d" % (round_, i) + PAD
                        await producer.send_and_wait(topic, value, key=key_of(i), partition=0)
                        if commit:
                            state[key_of(i)] = value
                if commit:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
        for round_ in range(FILLER_ROUNDS):
            for i in range(KEYS, KEYS + FILLER_KEYS):
                value = b"filler-%d-%03d" % (round_, i) + PAD
                await plain.send(topic, value, key=key_of(i), partition=0)
                state[key_of(i)] = value
        await plain.flush()
    return state


async def read_riverbed(bootstrap: str, topic: str, end: int) -> list[Row]:
    tp = TopicPartition(topic, 0)
    rows: list[Row] = []
    async with Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed") as reader:
        reader.assign([tp])
        reader.seek(tp, 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT_S
        while await reader.position(tp) < end:
            assert loop.time() < deadline, f"stalled at {await reader.position(tp)} of {end}"
            for records in (await reader.getmany(timeout_ms=1000)).values():
                rows += [(r.offset, r.key, r.value) for r in records]
    return rows


def read_confluent(bootstrap: str, topic: str, end: int) -> list[Row]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        rows: list[Row] = []
        while True:
            message = consumer.poll(TIMEOUT_S)
            assert message is not None, f"nothing within {TIMEOUT_S} s after {len(rows)} rows"
            error = message.error()
            offset = message.offset()
            assert offset is not None
            if error is not None and error.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                if offset >= end:
                    return rows
                continue
            assert error is None, error
            rows.append((offset, message.key(), message.value()))
    finally:
        consumer.close()


def folded(rows: list[Row]) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for _, key, value in rows:
        assert key is not None
        assert value is not None
        state[key] = value
    return state


async def test_aborted_records_never_decide_what_cold_compaction_keeps(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    store = tmp_path / "cold"
    broker = broker_factory(
        {**ONE_BROKER_SETTINGS, **BROKER, "remote.storage.url": f"file://{store}"}
    )
    bootstrap = broker.bootstrap
    topic = f"compacted-txn-{uuid.uuid4().hex[:8]}"
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic(
            topic, partitions=1, replication_factor=1, configs=COMPACTED_TIERED
        )
    state = await fill(bootstrap, topic)

    manifest = await wait_compacted(broker, topic, lambda: latest_manifest(store, topic))
    cold_end = manifest["compacted_end_offset"]
    segments = [s for s in manifest["segments"] if s["state"] == "COPY_FINISHED"]
    assert segments[-1]["last_offset"] + 1 == cold_end
    # Compaction ran over the transactions (the records they superseded are gone) and kept
    # what the aborted transaction's objects say about it.
    assert sum(s["records"] for s in segments) < KEYS * ROUNDS * 3 + FILLER_KEYS * FILLER_ROUNDS
    assert any(s.get("transactions", {}).get("aborted") for s in segments) or any(
        e[2] for s in segments for e in s.get("transactions", {}).get("ended", [])
    )

    tp = TopicPartition(topic, 0)
    async with Admin(bootstrap_servers=bootstrap) as admin:
        end = (await admin.list_offsets({tp: "latest"}, isolation_level="read_committed"))[
            tp
        ].offset
    rows = await read_riverbed(bootstrap, topic, end)
    assert folded(rows) == state
    aborted_keys = {key_of(i) for i in ABORTED_KEYS}
    assert not [r for r in rows if r[1] in aborted_keys and (r[2] or b"").startswith(b"txn-")]
    assert folded(await asyncio.to_thread(read_confluent, bootstrap, topic, end)) == state
