"""The transaction coordinator's answers, request by request, on one real broker: Kafka's error
codes for each state and epoch case, by API version, sent with kafka-python's protocol classes
(generated from Kafka's own schemas) so that the encoding is not Riverbed's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

import pytest
from kafka.protocol.admin import DescribeTransactionsRequest, ListTransactionsRequest
from kafka.protocol.metadata import FindCoordinatorRequest
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
)
from riverbed.protocol.errors import ErrorCode

from tests.groups.group_support import KafkaWire
from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.cluster import wait_for
from tests.transactions.txn_clients import ONE_BROKER_SETTINGS, create_topic

TOPIC: Final = "coordinated"
Topic = AddPartitionsToTxnRequest.AddPartitionsToTxnTopic


@pytest.fixture
def txn_broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory({**ONE_BROKER_SETTINGS, "transaction.max.timeout.ms": "100000"})


@pytest.fixture
async def wire(txn_broker: BrokerProcess) -> AsyncIterator[KafkaWire]:
    await create_topic(txn_broker.bootstrap, TOPIC, 2)
    connection = await KafkaWire.open(txn_broker.bootstrap)
    try:
        yield connection
    finally:
        await connection.close()


async def coordinated(wire: KafkaWire, transactional_id: str) -> None:
    """Wait until FindCoordinator names this (only) broker for the id, its partition loaded."""

    async def found() -> bool:
        response = await wire.call(
            FindCoordinatorRequest, version=3, key=transactional_id, key_type=1
        )
        return bool(response.error_code == 0)

    await wait_for(found, 30, what=f"a coordinator for {transactional_id}")


async def init(wire: KafkaWire, transactional_id: str, *, version: int = 4, **fields: Any) -> Any:
    fields.setdefault("transaction_timeout_ms", 60_000)
    if version >= 3:
        fields.setdefault("producer_id", -1)
        fields.setdefault("producer_epoch", -1)

    async def answered() -> Any:
        response = await wire.call(
            InitProducerIdRequest, version=version, transactional_id=transactional_id, **fields
        )
        # A loading partition or an abort in progress: retried, as clients do.
        retried = (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS)
        return None if response.error_code in retried else response

    return await wait_for(answered, 30, what=f"InitProducerId of {transactional_id}")


async def add_partitions(
    wire: KafkaWire,
    transactional_id: str,
    pid: int,
    epoch: int,
    partitions: list[int],
    *,
    version: int = 3,
    topic: str = TOPIC,
) -> dict[tuple[str, int], int]:
    response = await wire.call(
        AddPartitionsToTxnRequest,
        version=version,
        v3_and_below_transactional_id=transactional_id,
        v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=[Topic(name=topic, partitions=partitions)],
    )
    return {
        (result.name, p.partition_index): p.partition_error_code
        for result in response.results_by_topic_v3_and_below
        for p in result.results_by_partition
    }


async def end(
    wire: KafkaWire, transactional_id: str, pid: int, epoch: int, commit: bool, *, version: int = 3
) -> int:
    response = await wire.call(
        EndTxnRequest,
        version=version,
        transactional_id=transactional_id,
        producer_id=pid,
        producer_epoch=epoch,
        committed=commit,
    )
    return int(response.error_code)


async def state_of(wire: KafkaWire, transactional_id: str) -> Any:
    response = await wire.call(
        DescribeTransactionsRequest, version=0, transactional_ids=[transactional_id]
    )
    (state,) = response.transaction_states
    return state


async def test_init_producer_id_new_and_bumped(wire: KafkaWire) -> None:
    await coordinated(wire, "t-init")
    first = await init(wire, "t-init")
    assert (first.error_code, first.producer_epoch) == (0, 0)
    second = await init(wire, "t-init")
    assert (second.producer_id, second.producer_epoch) == (first.producer_id, 1)
    # KIP-360: the current (id, epoch) gets the next epoch; a stale epoch is fenced...
    third = await init(wire, "t-init", producer_id=first.producer_id, producer_epoch=1)
    assert third.producer_epoch == 2
    stale = await init(wire, "t-init", producer_id=first.producer_id, producer_epoch=0)
    assert stale.error_code == ErrorCode.PRODUCER_FENCED
    # ...reported as INVALID_PRODUCER_EPOCH to a client that predates PRODUCER_FENCED (v3).
    old = await init(wire, "t-init", version=3, producer_id=first.producer_id, producer_epoch=0)
    assert old.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    # Only one of id and epoch given.
    half = await init(wire, "t-init", producer_id=first.producer_id, producer_epoch=-1)
    assert half.error_code == ErrorCode.INVALID_REQUEST


async def test_invalid_transaction_timeout(wire: KafkaWire) -> None:
    await coordinated(wire, "t-timeout")
    too_long = await init(wire, "t-timeout", transaction_timeout_ms=100_001)
    assert too_long.error_code == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert (await init(wire, "t-timeout", transaction_timeout_ms=0)).error_code == (
        ErrorCode.INVALID_TRANSACTION_TIMEOUT
    )
    assert (await init(wire, "t-timeout", transaction_timeout_ms=100_000)).error_code == 0


async def test_transaction_lifecycle_error_codes(wire: KafkaWire) -> None:
    tid = "t-life"
    await coordinated(wire, tid)
    producer = await init(wire, tid)
    pid, epoch = producer.producer_id, producer.producer_epoch
    # Nothing to end yet.
    assert await end(wire, tid, pid, epoch, commit=True) == ErrorCode.INVALID_TXN_STATE
    # Wrong producer id, then wrong epoch (PRODUCER_FENCED from v2, INVALID_PRODUCER_EPOCH before).
    assert set((await add_partitions(wire, tid, pid + 1, epoch, [0])).values()) == {
        ErrorCode.INVALID_PRODUCER_ID_MAPPING
    }
    assert set((await add_partitions(wire, tid, pid, epoch + 1, [0])).values()) == {
        ErrorCode.PRODUCER_FENCED
    }
    assert set((await add_partitions(wire, tid, pid, epoch + 1, [0], version=1)).values()) == {
        ErrorCode.INVALID_PRODUCER_EPOCH
    }
    # An unknown partition fails the request; the others were not attempted.
    codes = await add_partitions(wire, tid, pid, epoch, [0, 7])
    assert codes == {
        (TOPIC, 0): ErrorCode.OPERATION_NOT_ATTEMPTED,
        (TOPIC, 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
    # Internal topics cannot be added by a client (the offsets come with AddOffsetsToTxn).
    internal = await add_partitions(wire, tid, pid, epoch, [0], topic="__consumer_offsets")
    assert internal == {("__consumer_offsets", 0): ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    assert (await state_of(wire, tid)).transaction_state == "Empty"

    assert set((await add_partitions(wire, tid, pid, epoch, [0, 1])).values()) == {0}
    ongoing = await state_of(wire, tid)
    assert ongoing.transaction_state == "Ongoing"
    assert sorted(ongoing.topics[0].partitions) == [0, 1]
    offsets = await wire.call(
        AddOffsetsToTxnRequest,
        version=3,
        transactional_id=tid,
        producer_id=pid,
        producer_epoch=epoch,
        group_id="g",
    )
    assert offsets.error_code == 0
    described = await state_of(wire, tid)
    assert {t.topic for t in described.topics} == {TOPIC, "__consumer_offsets"}

    assert await end(wire, tid, pid, epoch + 1, commit=True, version=1) == (
        ErrorCode.INVALID_PRODUCER_EPOCH
    )
    assert await end(wire, tid, pid, epoch + 1, commit=True) == ErrorCode.PRODUCER_FENCED
    assert await end(wire, tid, pid, epoch, commit=True) == 0

    async def completed() -> bool:
        return bool((await state_of(wire, tid)).transaction_state == "CompleteCommit")

    await wait_for(completed, 30, what="CompleteCommit")
    # A retried EndTxn with the same result succeeds; the other result is refused.
    assert await end(wire, tid, pid, epoch, commit=True) == 0
    assert await end(wire, tid, pid, epoch, commit=False) == ErrorCode.INVALID_TXN_STATE


async def test_find_coordinator_batched_and_list_filters(
    wire: KafkaWire, txn_broker: BrokerProcess
) -> None:
    await coordinated(wire, "t-a")
    batched = await wire.call(
        FindCoordinatorRequest, version=4, key_type=1, coordinator_keys=["t-a", "t-b"]
    )
    assert [(c.key, c.error_code, c.node_id) for c in batched.coordinators] == [
        ("t-a", 0, 1),
        ("t-b", 0, 1),
    ]
    await coordinated(wire, "t-b")
    assert (await init(wire, "t-a")).error_code == 0
    listed = await wire.call(
        ListTransactionsRequest,
        version=1,
        state_filters=["Empty", "Bogus"],
        producer_id_filters=[],
        duration_filter=-1,
    )
    assert listed.error_code == 0
    assert listed.unknown_state_filters == ["Bogus"]
    assert [(t.transactional_id, t.transaction_state) for t in listed.transaction_states] == [
        ("t-a", "Empty")
    ]
    missing = await state_of(wire, "t-b")
    assert missing.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND


async def test_state_is_reloaded_after_a_restart(
    wire: KafkaWire, txn_broker: BrokerProcess
) -> None:
    """A restarted broker replays __transaction_state: the id keeps its producer id and epoch
    (the next InitProducerId bumps the stored epoch), and an open transaction stays open."""
    tid = "t-reload"
    await coordinated(wire, tid)
    first = await init(wire, tid)
    pid = first.producer_id
    assert set((await add_partitions(wire, tid, pid, 0, [1])).values()) == {0}
    await wire.close()
    await asyncio.to_thread(txn_broker.restart)
    reopened = await KafkaWire.open(txn_broker.bootstrap)
    try:
        await coordinated(reopened, tid)

        async def loaded() -> Any:
            state = await state_of(reopened, tid)
            return state if state.error_code == 0 else None

        state = await wait_for(loaded, 30, what=f"{tid} loaded")
        assert (state.transaction_state, state.producer_id, state.producer_epoch) == (
            "Ongoing",
            pid,
            0,
        )
        assert [(t.topic, list(t.partitions)) for t in state.topics] == [(TOPIC, [1])]
        # InitProducerId fences the open transaction (aborting it), then bumps once more.
        again = await init(reopened, tid)
        assert (again.producer_id, again.producer_epoch) == (pid, 2)
        assert (await state_of(reopened, tid)).transaction_state == "Empty"
    finally:
        await reopened.close()


@pytest.fixture
def expiring_broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory(
        {
            **ONE_BROKER_SETTINGS,
            "transactional.id.expiration.ms": "1000",
            "transaction.remove.expired.transaction.cleanup.interval.ms": "300",
        }
    )


async def test_idle_transactional_ids_expire(expiring_broker: BrokerProcess) -> None:
    wire = await KafkaWire.open(expiring_broker.bootstrap)
    try:
        await coordinated(wire, "t-idle")
        first = await init(wire, "t-idle")
        assert first.error_code == 0
        assert (await state_of(wire, "t-idle")).error_code == 0

        async def expired() -> bool:
            state = await state_of(wire, "t-idle")
            return bool(state.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND)

        await wait_for(expired, 15, what="t-idle to expire")
        # Forgotten: the next InitProducerId starts it afresh with a new producer id.
        again = await init(wire, "t-idle")
        assert again.error_code == 0
        assert again.producer_id != first.producer_id
        assert again.producer_epoch == 0
    finally:
        await wire.close()
