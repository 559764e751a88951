"""read_committed through the cold tier, with a real broker, its transaction coordinator and a
file:// object store.

One partition with small segments holds a committed transaction, an aborted one, an aborted one
and a committed one that each span segment rolls (the aborted one interleaved with plain,
non-transactional records), and a transaction left open, also across rolls, with plain records
behind it. Tiering uploads the sealed segments while that transaction is still open. Raw Fetch
requests at read_committed taken from the hot log are then compared with the same requests once
local retention deleted the segments and the remote tier serves them: the same batch bytes, the
same `aborted_transactions`, the same stop at the last stable offset. Consumers of
confluent-kafka, kafka-python, aiokafka and Riverbed read the partition from offset 0: at
read_committed exactly the committed records in order and no marker, at read_uncommitted every
data record; and once the open transaction commits, its records and those behind it too.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest
from riverbed.client.admin import Admin
from riverbed.client.connection import BrokerConnection
from riverbed.client.consumer import Consumer
from riverbed.client.producer import Producer
from riverbed.client.types import TopicPartition
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records_header import iter_batch_headers

from tests.support.broker import HOST, BrokerFactory, BrokerProcess
from tests.tiering.test_tiering_broker import latest_manifest, wait_until
from tests.transactions.txn_clients import (
    ONE_BROKER_SETTINGS,
    QUIET_S,
    TIMEOUT_S,
    read_aiokafka,
    read_confluent,
    read_kafka_python,
)

SEGMENT_BYTES: Final = 4096  # a dozen of the records below: transactions of 30 span rolls
VALUE_PAD: Final = "x" * 200
ROLL_SPANNING_RECORDS: Final = 30
# The open transaction must outlive tiering and local deletion: far from its timeout.
TRANSACTION_TIMEOUT_MS: Final = 600_000
READ_COMMITTED: Final = 1
READ_UNCOMMITTED: Final = 0
FETCH_MAX_BYTES: Final = 1024 * 1024


def value_of(name: str, i: int) -> bytes:
    return f"{name}-{i:03d}-{VALUE_PAD}".encode()


@dataclass
class History:
    """What was written, in offset order."""

    topic: str
    topic_id: uuid.UUID
    committed: list[bytes] = field(default_factory=list)  # visible to read_committed already
    aborted: list[bytes] = field(default_factory=list)
    # The open transaction's records and the plain ones written after it began: hidden from
    # read_committed until it commits.
    pending: list[bytes] = field(default_factory=list)
    everything: list[bytes] = field(default_factory=list)  # every data record
    offset_of: dict[bytes, int] = field(default_factory=dict)
    open_first_offset: int = -1

    def add(self, offset: int, value: bytes, kind: str) -> None:
        getattr(self, kind).append(value)
        self.everything.append(value)
        self.offset_of[value] = offset


def tiered_txn_broker(broker_factory: BrokerFactory, store: Path) -> BrokerProcess:
    return broker_factory(
        {
            **ONE_BROKER_SETTINGS,
            "remote.storage.url": f"file://{store}",
            "remote.log.manager.task.interval.ms": "200",
        }
    )


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "cold"


@pytest.fixture
def txn_tiered_broker(broker_factory: BrokerFactory, store: Path) -> BrokerProcess:
    return tiered_txn_broker(broker_factory, store)


async def create_tiered_topic(bootstrap: str, topic: str, **configs: str) -> uuid.UUID:
    """One partition, small segments, tiered; sealed segments stay on local disk too (local
    retention as retention: unlimited) until a test lowers local.retention.bytes."""
    async with Admin(bootstrap_servers=bootstrap) as admin:
        return await admin.create_topic(
            topic,
            partitions=1,
            replication_factor=1,
            configs={
                "remote.storage.enable": "true",
                "segment.bytes": str(SEGMENT_BYTES),
                **configs,
            },
        )


async def send(producer: Producer, topic: str, value: bytes, key: bytes | None = None) -> int:
    """One record, in a batch of its own; its offset."""
    return (await producer.send_and_wait(topic, value, key=key, partition=0)).offset


async def write_history(bootstrap: str, topic: str, producer: Producer) -> History:
    """The transactions named in the module docstring, the last one left open (in `producer`)."""
    history = History(topic, uuid.UUID(int=0))
    async with Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=0) as plain:
        # A committed transaction, then an aborted one, inside one segment.
        for name, commit in (("c1", True), ("a1", False)):
            producer.begin_transaction()
            for i in range(5):
                value = value_of(name, i)
                history.add(await send(producer, topic, value), value, _kind(commit))
            await _end(producer, commit)
        # An aborted transaction across rolls, with plain records between its own.
        producer.begin_transaction()
        for i in range(ROLL_SPANNING_RECORDS):
            value = value_of("a2", i)
            history.add(await send(producer, topic, value), value, "aborted")
            if i % 5 == 2:
                plain_value = value_of("p1", i)
                history.add(await send(plain, topic, plain_value), plain_value, "committed")
        await producer.abort_transaction()
        # A committed transaction across rolls.
        producer.begin_transaction()
        for i in range(ROLL_SPANNING_RECORDS):
            value = value_of("c2", i)
            history.add(await send(producer, topic, value), value, "committed")
        await producer.commit_transaction()
        # A transaction left open across rolls, plain records behind it.
        producer.begin_transaction()
        for i in range(ROLL_SPANNING_RECORDS):
            value = value_of("o1", i)
            offset = await send(producer, topic, value)
            if i == 0:
                history.open_first_offset = offset
            history.add(offset, value, "pending")
            if i % 10 == 5:
                plain_value = value_of("p2", i)
                history.add(await send(plain, topic, plain_value), plain_value, "pending")
    return history


def _kind(commit: bool) -> str:
    return "committed" if commit else "aborted"


async def _end(producer: Producer, commit: bool) -> None:
    if commit:
        await producer.commit_transaction()
    else:
        await producer.abort_transaction()


def transactional_producer(bootstrap: str) -> Producer:
    return Producer(
        bootstrap_servers=bootstrap,
        transactional_id=f"tiering-txn-{uuid.uuid4().hex[:8]}",
        transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
        linger_ms=0,
    )


def finished_end_offset(store: Path, topic: str) -> int:
    manifest = latest_manifest(store, topic)
    if manifest is None:
        return 0
    end = 0
    for segment in sorted(manifest["segments"], key=lambda s: s["base_offset"]):
        if segment["state"] != "COPY_FINISHED" or segment["base_offset"] != end:
            break
        end = segment["last_offset"] + 1
    return end


def local_log_start(broker: BrokerProcess, topic: str) -> int:
    return int(broker.segment_files(topic, 0)[0].stem)


def active_segment_base(broker: BrokerProcess, topic: str) -> int:
    return int(broker.segment_files(topic, 0)[-1].stem)


# -- raw fetches ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fetched:
    error_code: int
    last_stable_offset: int
    aborted: tuple[tuple[int, int], ...] | None  # (producer id, first offset)
    batches: tuple[bytes, ...]  # whole batches, as sent

    @property
    def next_offset(self) -> int | None:
        if not self.batches:
            return None
        (_, header), *_ = iter_batch_headers(self.batches[-1])
        return header.last_offset + 1


async def raw_fetch(
    connection: BrokerConnection,
    history: History,
    offset: int,
    *,
    isolation_level: int = READ_COMMITTED,
    max_bytes: int = FETCH_MAX_BYTES,
) -> Fetched:
    request = m.FetchRequest(
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_epoch=-1,
        topics=[
            m.FetchRequest.FetchTopic(
                topic=history.topic,
                topic_id=history.topic_id,
                partitions=[
                    m.FetchRequest.FetchPartition(
                        partition=0, fetch_offset=offset, partition_max_bytes=max_bytes
                    )
                ],
            )
        ],
    )
    response = await connection.request(request)
    data = response.responses[0].partitions[0]
    records = bytes(data.records or b"")
    batches = tuple(
        records[position : position + header.size_bytes]
        for position, header in iter_batch_headers(records)
    )
    aborted = (
        None
        if data.aborted_transactions is None
        else tuple((a.producer_id, a.first_offset) for a in data.aborted_transactions)
    )
    return Fetched(data.error_code, data.last_stable_offset, aborted, batches)


def batch_offsets(batches: tuple[bytes, ...]) -> Iterator[tuple[int, int, bool]]:
    """(base offset, last offset, is a control batch) of each batch."""
    for batch in batches:
        for _, header in iter_batch_headers(batch):
            yield header.base_offset, header.last_offset, header.is_control


async def fetch_each_batch(connection: BrokerConnection, history: History) -> dict[int, Fetched]:
    """A read_committed fetch of 1 byte (one whole batch: KIP-74) at every batch's base offset
    below the last stable offset, and one at the LSO itself."""
    fetched: dict[int, Fetched] = {}
    offset = 0
    while True:
        answer = await raw_fetch(connection, history, offset, max_bytes=1)
        assert answer.error_code == ErrorCode.NONE, (offset, answer)
        fetched[offset] = answer
        if answer.next_offset is None:
            return fetched
        assert len(answer.batches) == 1, (offset, answer)
        offset = answer.next_offset


# -- consumers ------------------------------------------------------------------------------


async def read_riverbed(bootstrap: str, topic: str, isolation: str, expected: int) -> list[bytes]:
    values: list[bytes] = []
    async with Consumer(bootstrap_servers=bootstrap, isolation_level=isolation) as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TIMEOUT_S
        while len(values) < expected and loop.time() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                values += [r.value for r in records if r.value is not None]
        quiet_until = loop.time() + QUIET_S
        while loop.time() < quiet_until:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                values += [r.value for r in records if r.value is not None]
    return values


async def read_with_every_client(
    bootstrap: str, topic: str, isolation: str, expected: int
) -> dict[str, list[bytes]]:
    """What each client's consumer reads of the partition from offset 0, in its order."""
    return {
        "confluent-kafka": await asyncio.to_thread(
            read_confluent, bootstrap, topic, isolation, 1, expected
        ),
        "kafka-python": await asyncio.to_thread(
            read_kafka_python, bootstrap, topic, isolation, 1, expected
        ),
        "aiokafka": await read_aiokafka(bootstrap, topic, isolation, 1, expected),
        "riverbed": await read_riverbed(bootstrap, topic, isolation, expected),
    }


def assert_every_client_read(read: dict[str, list[bytes]], expected: list[bytes]) -> None:
    for client, values in read.items():
        assert values == expected, (client, len(values), len(expected))


# -- the test -------------------------------------------------------------------------------


async def tier_everything_sealed(broker: BrokerProcess, store: Path, topic: str) -> None:
    await wait_until(
        lambda: finished_end_offset(store, topic) >= active_segment_base(broker, topic),
        "every sealed segment tiered",
    )


async def test_read_committed_from_the_cold_tier_matches_the_hot_log(
    txn_tiered_broker: BrokerProcess, store: Path
) -> None:
    broker = txn_tiered_broker
    bootstrap = broker.bootstrap
    topic = f"txn-tiered-{uuid.uuid4().hex[:8]}"
    topic_id = await create_tiered_topic(bootstrap, topic)
    async with transactional_producer(bootstrap) as producer:
        await producer.init_transactions()
        history = await write_history(bootstrap, topic, producer)
        history.topic_id = topic_id
        # The open transaction's first records are tiered while it is open.
        await tier_everything_sealed(broker, store, topic)
        assert finished_end_offset(store, topic) > history.open_first_offset + 1
        assert local_log_start(broker, topic) == 0  # all still on local disk too

        connection = await BrokerConnection.open(HOST, broker.port)
        try:
            hot = await fetch_each_batch(connection, history)
            hot_whole = await raw_fetch(connection, history, 0)
            assert_read_committed_fetches(hot, history)

            async with Admin(bootstrap_servers=bootstrap) as admin:
                await admin.alter_configs(topic, set={"local.retention.bytes": "1"})
            await wait_until(
                lambda: local_log_start(broker, topic) > history.open_first_offset,
                "tiered segments deleted locally, past the open transaction's start",
            )
            cold = await fetch_each_batch(connection, history)
            cold_whole = await raw_fetch(connection, history, 0)
        finally:
            await connection.close()

        # The remote tier serves the same batches and the same aborted transactions, and stops
        # at the same last stable offset.
        assert cold.keys() == hot.keys()
        for offset, answer in cold.items():
            assert answer == hot[offset], offset
        assert_read_committed_fetches(cold, history)
        # A fetch of many batches from the remote tier: a run of the hot log's, with the aborted
        # transactions among them.
        assert cold_whole.batches
        assert cold_whole.batches == hot_whole.batches[: len(cold_whole.batches)]
        cold_end = cold_whole.next_offset
        assert cold_end is not None
        assert cold_whole.aborted == tuple(a for a in hot_whole.aborted or () if a[1] < cold_end)

        # Every client: read_committed stops at the open transaction, read_uncommitted does not.
        read = await read_with_every_client(
            bootstrap, topic, "read_committed", len(history.committed)
        )
        assert_every_client_read(read, history.committed)
        read = await read_with_every_client(
            bootstrap, topic, "read_uncommitted", len(history.everything)
        )
        assert_every_client_read(read, history.everything)

        await producer.commit_transaction()

    expected = history.committed + history.pending
    read = await read_with_every_client(bootstrap, topic, "read_committed", len(expected))
    assert_every_client_read(read, expected)


def assert_read_committed_fetches(fetched: dict[int, Fetched], history: History) -> None:
    """The fetches of fetch_each_batch: data and markers below the open transaction, nothing
    from it on; each fetch names the aborted transactions its batch belongs to."""
    offsets = sorted(fetched)
    assert offsets[-1] == history.open_first_offset
    last = fetched[offsets[-1]]
    assert last.batches == ()
    assert last.last_stable_offset == history.open_first_offset
    assert last.aborted == ()
    aborted_firsts: set[int] = set()
    for offset in offsets[:-1]:
        answer = fetched[offset]
        assert answer.last_stable_offset == history.open_first_offset
        assert answer.aborted is not None
        aborted_firsts.update(first for _, first in answer.aborted)
    # The two aborted transactions (a1, a2), each named by the fetches of its batches.
    assert len(aborted_firsts) == 2, aborted_firsts
    markers = [
        base
        for offset in offsets
        for base, _, control in batch_offsets(fetched[offset].batches)
        if control
    ]
    assert len(markers) == 4  # c1, a1, a2, c2
