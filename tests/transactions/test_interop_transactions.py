"""The transaction coordinator with third-party transactional producers, on one real broker.

confluent-kafka (librdkafka), aiokafka and kafka-python each commit a transaction, abort one and
commit another; read_committed consumers of all three clients then see exactly the committed
records and read_uncommitted ones every record. The coordinator's own view (DescribeTransactions
and ListTransactions, through kafka-python's admin) agrees. A second producer with the same
transactional id fences the first and aborts its open transaction; a transaction left open past
its timeout is aborted by the coordinator, so that read_committed consumers move past it.
"""

from __future__ import annotations

import asyncio
import time

import confluent_kafka
import pytest

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.transactions.txn_clients import (
    ONE_BROKER_SETTINGS,
    PARTITIONS,
    confluent_producer,
    create_topic,
    describe,
    list_states,
    produce_commit_abort_commit,
    read_all_clients,
    read_confluent,
    values,
    wait_state,
)


@pytest.fixture
def txn_broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory(ONE_BROKER_SETTINGS)


@pytest.mark.parametrize("client", ["confluent-kafka", "aiokafka", "kafka-python"])
async def test_commit_abort_commit(txn_broker: BrokerProcess, client: str) -> None:
    bootstrap = txn_broker.bootstrap
    topic = f"txn-{client}"
    transactional_id = f"producer-{client}"
    await create_topic(bootstrap, topic, PARTITIONS)
    await produce_commit_abort_commit(client, bootstrap, transactional_id, topic)

    committed = sorted(values("c1", 6) + values("c2", 6))
    everything = sorted(committed + values("a", 6))
    read_committed = await read_all_clients(bootstrap, topic, "read_committed", PARTITIONS, 12)
    assert read_committed == dict.fromkeys(read_committed, committed)
    read_uncommitted = await read_all_clients(bootstrap, topic, "read_uncommitted", PARTITIONS, 18)
    assert read_uncommitted == dict.fromkeys(read_uncommitted, everything)

    # The coordinator ended the last transaction, committed, and holds no partitions.
    description = await asyncio.to_thread(wait_state, bootstrap, transactional_id, "CompleteCommit")
    assert description.producer_id >= 0
    assert description.topic_partitions == set()
    listed = await asyncio.to_thread(list_states, bootstrap)
    assert listed[transactional_id] == "CompleteCommit"
    assert transactional_id not in await asyncio.to_thread(list_states, bootstrap, ["Ongoing"])


async def test_a_second_producer_fences_the_first_and_aborts_its_transaction(
    txn_broker: BrokerProcess,
) -> None:
    bootstrap = txn_broker.bootstrap
    topic = "fencing"
    await create_topic(bootstrap, topic, PARTITIONS)

    def scenario() -> tuple[int, int, confluent_kafka.KafkaError | None]:
        first = confluent_producer(bootstrap, "shared-id")
        first.init_transactions(30)
        first.begin_transaction()
        for value in values("zombie", 4):
            first.produce(topic, value, partition=0)
        first.flush(30)
        ongoing = describe(bootstrap, "shared-id")
        assert str(ongoing.state.value) == "Ongoing"
        assert {(tp.topic, tp.partition) for tp in ongoing.topic_partitions} == {(topic, 0)}

        second = confluent_producer(bootstrap, "shared-id")
        second.init_transactions(30)  # fences `first`, aborting its transaction
        after = describe(bootstrap, "shared-id")
        second.begin_transaction()
        for value in values("winner", 3):
            second.produce(topic, value, partition=1)
        second.commit_transaction(30)

        error = None
        try:
            first.commit_transaction(30)
        except confluent_kafka.KafkaException as raised:
            error = raised.args[0]
        return ongoing.producer_epoch, after.producer_epoch, error

    first_epoch, second_epoch, error = await asyncio.to_thread(scenario)
    # One bump fences the open transaction, a second one is the new producer's epoch.
    assert second_epoch == first_epoch + 2
    assert error is not None
    assert error.fatal()
    assert error.code() in (
        confluent_kafka.KafkaError._FENCED,
        confluent_kafka.KafkaError.PRODUCER_FENCED,
        confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH,
    )
    seen = await asyncio.to_thread(
        read_confluent, bootstrap, topic, "read_committed", PARTITIONS, 3
    )
    assert sorted(seen) == values("winner", 3)
    everything = await asyncio.to_thread(
        read_confluent, bootstrap, topic, "read_uncommitted", PARTITIONS, 7
    )
    assert sorted(everything) == sorted(values("winner", 3) + values("zombie", 4))


async def test_a_transaction_open_past_its_timeout_is_aborted(txn_broker: BrokerProcess) -> None:
    bootstrap = txn_broker.bootstrap
    topic = "timeouts"
    await create_topic(bootstrap, topic, 1)

    def scenario() -> tuple[int, int, confluent_kafka.KafkaError | None]:
        stuck = confluent_producer(bootstrap, "slow", **{"transaction.timeout.ms": 2_000})
        stuck.init_transactions(30)
        stuck.begin_transaction()
        for value in values("stuck", 3):
            stuck.produce(topic, value, partition=0)
        stuck.flush(30)
        before = describe(bootstrap, "slow")
        # The coordinator aborts it (checking every 500 ms), bumping the epoch.
        after = wait_state(bootstrap, "slow", "CompleteAbort", timeout_s=15)
        error = None
        try:
            stuck.commit_transaction(30)
        except confluent_kafka.KafkaException as raised:
            error = raised.args[0]
        # Another producer's committed records after the aborted ones are readable.
        other = confluent_producer(bootstrap, "after-timeout")
        other.init_transactions(30)
        other.begin_transaction()
        for value in values("later", 2):
            other.produce(topic, value, partition=0)
        other.commit_transaction(30)
        return before.producer_epoch, after.producer_epoch, error

    started = time.monotonic()
    before_epoch, after_epoch, error = await asyncio.to_thread(scenario)
    assert after_epoch == before_epoch + 1  # the zombie is fenced
    assert error is not None
    assert time.monotonic() - started < 30
    seen = await asyncio.to_thread(read_confluent, bootstrap, topic, "read_committed", 1, 2)
    assert seen == values("later", 2)


async def test_describe_and_list_filters(txn_broker: BrokerProcess) -> None:
    bootstrap = txn_broker.bootstrap
    topic = "listing"
    await create_topic(bootstrap, topic, 1)

    def scenario() -> None:
        open_one = confluent_producer(bootstrap, "open-one")
        open_one.init_transactions(30)
        open_one.begin_transaction()
        open_one.produce(topic, b"x", partition=0)
        open_one.flush(30)
        done = confluent_producer(bootstrap, "done-one")
        done.init_transactions(30)
        assert str(describe(bootstrap, "done-one").state.value) == "Empty"
        assert list_states(bootstrap, ["Ongoing"]) == {"open-one": "Ongoing"}
        assert list_states(bootstrap, ["Empty"]) == {"done-one": "Empty"}
        assert list_states(bootstrap) == {"open-one": "Ongoing", "done-one": "Empty"}
        described = describe(bootstrap, "open-one")
        assert described.transaction_timeout_ms == 60_000  # librdkafka's default
        assert described.transaction_start_time_ms > 0
        open_one.abort_transaction(30)
        wait_state(bootstrap, "open-one", "CompleteAbort")

    await asyncio.to_thread(scenario)
    with pytest.raises(Exception, match="TransactionalIdNotFound"):
        await asyncio.to_thread(describe, bootstrap, "never-seen")
