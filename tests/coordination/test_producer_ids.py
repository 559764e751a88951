"""Producer id blocks claimed in a real ZooKeeper, and the InitProducerId epoch rules."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from riverbed.coordination.layout import MalformedZnodeError
from riverbed.coordination.producer_ids import (
    PRODUCER_EPOCH_MAX,
    PRODUCER_ID_BLOCK_PATH,
    PRODUCER_ID_BLOCK_SIZE,
    PRODUCER_ID_MAX,
    ProducerIdAllocator,
    ProducerIdBlock,
    ProducerIdClaimError,
    ProducerIdIssuer,
    ProducerIdsExhaustedError,
)
from riverbed.coordination.zk import AsyncZooKeeper
from riverbed.protocol.errors import ErrorCode, KafkaError


@pytest.fixture
async def zk(zk_chroot: str) -> AsyncIterator[AsyncZooKeeper]:
    async with AsyncZooKeeper(zk_chroot) as client:
        yield client


async def test_the_first_broker_claims_the_first_block(zk: AsyncZooKeeper) -> None:
    allocator = ProducerIdAllocator(zk, broker_id=7)
    assert [await allocator.next_producer_id() for _ in range(3)] == [0, 1, 2]
    data, _ = await zk.get(PRODUCER_ID_BLOCK_PATH)
    assert json.loads(data) == {
        "version": 1,
        "broker": 7,
        "block_start": "0",
        "block_end": str(PRODUCER_ID_BLOCK_SIZE - 1),
    }


async def test_a_used_up_block_is_followed_by_the_next_free_one(zk: AsyncZooKeeper) -> None:
    first = ProducerIdAllocator(zk, broker_id=1)
    second = ProducerIdAllocator(zk, broker_id=2)
    assert await first.next_producer_id() == 0
    assert await second.next_producer_id() == PRODUCER_ID_BLOCK_SIZE
    for _ in range(PRODUCER_ID_BLOCK_SIZE - 1):
        await first.next_producer_id()
    assert await first.next_producer_id() == 2 * PRODUCER_ID_BLOCK_SIZE
    block = ProducerIdBlock.decode((await zk.get(PRODUCER_ID_BLOCK_PATH))[0])
    assert block == ProducerIdBlock(1, 2 * PRODUCER_ID_BLOCK_SIZE, 3 * PRODUCER_ID_BLOCK_SIZE - 1)


async def test_a_restarted_broker_never_reuses_ids(zk: AsyncZooKeeper) -> None:
    assert await ProducerIdAllocator(zk, broker_id=1).next_producer_id() == 0
    assert await ProducerIdAllocator(zk, broker_id=1).next_producer_id() == PRODUCER_ID_BLOCK_SIZE


async def test_an_empty_znode_as_kafka_creates_it_means_no_block_yet(zk: AsyncZooKeeper) -> None:
    await zk.create(PRODUCER_ID_BLOCK_PATH, b"")
    assert await ProducerIdAllocator(zk, broker_id=1).next_producer_id() == 0


async def test_concurrent_claims_never_share_ids(zk_chroot: str) -> None:
    clients = [AsyncZooKeeper(zk_chroot) for _ in range(4)]
    await asyncio.gather(*(client.start() for client in clients))
    try:
        allocators = [ProducerIdAllocator(c, broker_id=i) for i, c in enumerate(clients)]
        # Each allocator also serves concurrent callers: they must wait for one claim.
        ids = await asyncio.gather(
            *(allocator.next_producer_id() for allocator in allocators for _ in range(3))
        )
    finally:
        await asyncio.gather(*(client.stop() for client in clients))
    assert len(set(ids)) == len(ids)
    assert {i // PRODUCER_ID_BLOCK_SIZE for i in ids} == {0, 1, 2, 3}


async def test_a_claim_gives_up_after_losing_every_race(
    zk: AsyncZooKeeper, monkeypatch: pytest.MonkeyPatch
) -> None:
    await zk.create(PRODUCER_ID_BLOCK_PATH, ProducerIdBlock(9, 0, 999).encode())
    real_get = zk.get

    async def get_then_lose_the_race(path: str) -> tuple[bytes, object]:
        found = await real_get(path)
        await zk.set(path, found[0])  # another broker writes in between: our version is stale
        return found

    monkeypatch.setattr(zk, "get", get_then_lose_the_race)
    with pytest.raises(ProducerIdClaimError):
        await ProducerIdAllocator(zk, broker_id=1).next_producer_id()


async def test_a_malformed_or_exhausted_block_is_an_error(zk: AsyncZooKeeper) -> None:
    await zk.create(PRODUCER_ID_BLOCK_PATH, b'{"version": 1, "broker": 1}')
    with pytest.raises(MalformedZnodeError):
        await ProducerIdAllocator(zk, broker_id=1).next_producer_id()
    last = ProducerIdBlock(1, PRODUCER_ID_MAX - 10, PRODUCER_ID_MAX)
    await zk.set(PRODUCER_ID_BLOCK_PATH, last.encode())
    with pytest.raises(ProducerIdsExhaustedError):
        await ProducerIdAllocator(zk, broker_id=1).next_producer_id()


class CountingSource:
    def __init__(self) -> None:
        self.next_id = 100

    async def next_producer_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


async def test_issuer_hands_out_fresh_ids_at_epoch_zero() -> None:
    issuer = ProducerIdIssuer(CountingSource())
    assert await issuer.init_producer(-1, -1) == (100, 0)
    assert await issuer.init_producer(-1, -1) == (101, 0)


async def test_issuer_bumps_the_latest_epoch_and_fences_older_ones() -> None:
    issuer = ProducerIdIssuer(CountingSource())
    producer_id, epoch = await issuer.init_producer(-1, -1)
    assert await issuer.init_producer(producer_id, epoch) == (producer_id, 1)
    with pytest.raises(KafkaError) as raised:
        await issuer.init_producer(producer_id, epoch)
    assert raised.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert await issuer.init_producer(producer_id, 1) == (producer_id, 2)


async def test_issuer_gives_unknown_ids_and_exhausted_epochs_a_fresh_id() -> None:
    source = CountingSource()
    issuer = ProducerIdIssuer(source)
    # Handed out before a restart: Kafka answers every non-transactional request with a new id.
    assert await issuer.init_producer(7, 3) == (100, 0)
    issuer._remember(100, PRODUCER_EPOCH_MAX)  # test-only: skip 32767 bumps
    assert await issuer.init_producer(100, PRODUCER_EPOCH_MAX) == (101, 0)


async def test_issuer_refuses_half_a_pair() -> None:
    issuer = ProducerIdIssuer(CountingSource())
    for producer_id, epoch in ((5, -1), (-1, 0)):
        with pytest.raises(KafkaError) as raised:
            await issuer.init_producer(producer_id, epoch)
        assert raised.value.code == ErrorCode.INVALID_REQUEST
