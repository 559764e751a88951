"""The transactional producer's sans-IO parts: the state table, the error classes per API
(Kafka's TransactionManager handlers), the partitions a transaction holds, the TxnOffsetCommit
request with KIP-447 group metadata, and the settings a transactional_id implies."""

from __future__ import annotations

import itertools

import pytest
from riverbed.client.producer import Producer
from riverbed.client.settings import ProducerSettings
from riverbed.client.transactions import (
    TRANSITIONS,
    TransactionManager,
    TransactionStateError,
    TxnAction,
    TxnApi,
    TxnState,
    classify,
    error_for_action,
)
from riverbed.client.txn_coordinator import txn_offset_commit_request, worst_code
from riverbed.client.types import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from riverbed.errors import (
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionError,
    TransactionFatalError,
    error_for,
)
from riverbed.protocol.errors import ErrorCode

TID = "orders-enricher-1"
E = ErrorCode
TP0, TP1 = TopicPartition("t", 0), TopicPartition("t", 1)


def state_of(manager: TransactionManager) -> TxnState:
    """The state, read through a call: mypy would otherwise keep an earlier assert's narrowing
    across the calls that change it."""
    return manager.state


def started(manager: TransactionManager) -> bool:
    return manager.started


def manager_in(state: TxnState) -> TransactionManager:
    manager = TransactionManager(TID, 60_000)
    manager.state = state
    return manager


@pytest.mark.parametrize(("source", "target"), list(itertools.product(TxnState, TxnState)))
def test_every_transition_is_in_the_table_or_refused(source: TxnState, target: TxnState) -> None:
    manager = manager_in(source)
    if target in TRANSITIONS[source]:
        manager.transition(target)
        assert state_of(manager) is target
    else:
        with pytest.raises(TransactionStateError, match=f"{source.name} to {target.name}"):
            manager.transition(target)
        assert state_of(manager) is source  # a refused transition changes nothing


def test_the_happy_path_follows_kafkas_states() -> None:
    manager = TransactionManager(TID, 60_000)
    manager.transition(TxnState.INITIALIZING)
    manager.completed()
    assert state_of(manager) is TxnState.READY
    manager.begin()
    manager.transition(TxnState.COMMITTING_TRANSACTION)
    manager.completed()
    assert state_of(manager) is TxnState.READY


def test_calls_in_the_wrong_state_name_the_operation_and_the_id() -> None:
    manager = TransactionManager(TID, 60_000)
    with pytest.raises(TransactionStateError, match=r"init_transactions\(\) before begin"):
        manager.begin()
    manager.state = TxnState.READY
    with pytest.raises(TransactionStateError, match=f"'{TID}'.*send.*READY"):
        manager.require("send()", TxnState.IN_TRANSACTION)


def test_an_abortable_error_keeps_the_first_error_until_the_abort() -> None:
    manager = manager_in(TxnState.IN_TRANSACTION)
    first = TransactionAbortableError(E.TOPIC_AUTHORIZATION_FAILED, "first")
    manager.fail(TxnAction.ABORTABLE, first)
    manager.fail(TxnAction.ABORTABLE, TransactionAbortableError(E.UNKNOWN_PRODUCER_ID, "second"))
    assert state_of(manager) is TxnState.ABORTABLE_ERROR
    with pytest.raises(TransactionAbortableError, match="first"):
        manager.require("commit_transaction()", TxnState.IN_TRANSACTION)
    manager.require("abort_transaction()", TxnState.ABORTABLE_ERROR)  # the way on
    manager.transition(TxnState.ABORTING_TRANSACTION)
    # Errors of the batches the abort drops change nothing while aborting.
    manager.fail(TxnAction.ABORTABLE, TransactionAbortableError(E.REQUEST_TIMED_OUT, "late"))
    assert state_of(manager) is TxnState.ABORTING_TRANSACTION
    manager.completed()
    assert state_of(manager) is TxnState.READY
    assert manager.last_error is None


def test_a_fatal_error_wins_and_is_final() -> None:
    manager = manager_in(TxnState.ABORTABLE_ERROR)
    fenced = error_for_action(TxnAction.FENCED, TxnApi.END_TXN, E.PRODUCER_FENCED, TID)
    manager.fail(TxnAction.FENCED, fenced)
    manager.fail(TxnAction.ABORTABLE, TransactionAbortableError(E.UNKNOWN_PRODUCER_ID, "x"))
    assert state_of(manager) is TxnState.FATAL_ERROR
    for operation in ("abort_transaction()", "begin_transaction()", "send()"):
        with pytest.raises(ProducerFencedError):
            manager.require(operation, TxnState.ABORTABLE_ERROR, TxnState.READY)


@pytest.mark.parametrize(
    ("api", "code", "action"),
    [
        (TxnApi.INIT_PRODUCER_ID, E.NONE, TxnAction.DONE),
        (TxnApi.INIT_PRODUCER_ID, E.CONCURRENT_TRANSACTIONS, TxnAction.RETRY),
        (TxnApi.INIT_PRODUCER_ID, E.COORDINATOR_LOAD_IN_PROGRESS, TxnAction.RETRY),
        (TxnApi.INIT_PRODUCER_ID, E.NOT_COORDINATOR, TxnAction.FIND_COORDINATOR),
        (TxnApi.INIT_PRODUCER_ID, E.COORDINATOR_NOT_AVAILABLE, TxnAction.FIND_COORDINATOR),
        (TxnApi.INIT_PRODUCER_ID, E.PRODUCER_FENCED, TxnAction.FENCED),
        (TxnApi.INIT_PRODUCER_ID, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TxnAction.FATAL),
        (TxnApi.INIT_PRODUCER_ID, E.INVALID_TRANSACTION_TIMEOUT, TxnAction.FATAL),
        (TxnApi.ADD_PARTITIONS, E.CONCURRENT_TRANSACTIONS, TxnAction.RETRY),
        (TxnApi.ADD_PARTITIONS, E.UNKNOWN_TOPIC_OR_PARTITION, TxnAction.RETRY),
        (TxnApi.ADD_PARTITIONS, E.TOPIC_AUTHORIZATION_FAILED, TxnAction.ABORTABLE),
        (TxnApi.ADD_PARTITIONS, E.OPERATION_NOT_ATTEMPTED, TxnAction.ABORTABLE),
        (TxnApi.ADD_PARTITIONS, E.INVALID_PRODUCER_EPOCH, TxnAction.FENCED),
        (TxnApi.ADD_PARTITIONS, E.INVALID_TXN_STATE, TxnAction.FATAL),
        (TxnApi.ADD_OFFSETS, E.GROUP_AUTHORIZATION_FAILED, TxnAction.ABORTABLE),
        (TxnApi.ADD_OFFSETS, E.UNKNOWN_PRODUCER_ID, TxnAction.ABORTABLE),
        (TxnApi.TXN_OFFSET_COMMIT, E.ILLEGAL_GENERATION, TxnAction.ABORTABLE),
        (TxnApi.TXN_OFFSET_COMMIT, E.UNKNOWN_MEMBER_ID, TxnAction.ABORTABLE),
        (TxnApi.TXN_OFFSET_COMMIT, E.FENCED_INSTANCE_ID, TxnAction.ABORTABLE),
        (TxnApi.TXN_OFFSET_COMMIT, E.REQUEST_TIMED_OUT, TxnAction.FIND_COORDINATOR),
        (TxnApi.TXN_OFFSET_COMMIT, E.UNSTABLE_OFFSET_COMMIT, TxnAction.RETRY),
        (TxnApi.END_TXN, E.CONCURRENT_TRANSACTIONS, TxnAction.RETRY),
        (TxnApi.END_TXN, E.INVALID_TXN_STATE, TxnAction.FATAL),
        (TxnApi.END_TXN, E.UNKNOWN_PRODUCER_ID, TxnAction.ABORTABLE),
        (TxnApi.END_TXN, E.PRODUCER_FENCED, TxnAction.FENCED),
        (TxnApi.END_TXN, E.INVALID_REQUEST, TxnAction.FATAL),
        (TxnApi.PRODUCE, E.MESSAGE_TOO_LARGE, TxnAction.ABORTABLE),
        (TxnApi.PRODUCE, E.INVALID_PRODUCER_EPOCH, TxnAction.FENCED),
        (TxnApi.PRODUCE, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, TxnAction.FATAL),
    ],
)
def test_error_codes_are_classified_as_kafka_does(
    api: TxnApi, code: ErrorCode, action: TxnAction
) -> None:
    assert classify(api, code) is action


def test_the_errors_name_their_class_and_the_transactional_id() -> None:
    fenced = error_for_action(TxnAction.FENCED, TxnApi.INIT_PRODUCER_ID, E.PRODUCER_FENCED, TID)
    assert isinstance(fenced, ProducerFencedError)
    assert isinstance(fenced, TransactionFatalError)
    abortable = error_for_action(
        TxnAction.ABORTABLE, TxnApi.TXN_OFFSET_COMMIT, E.ILLEGAL_GENERATION, TID
    )
    fatal = error_for_action(TxnAction.FATAL, TxnApi.END_TXN, E.INVALID_TXN_STATE, TID)
    assert isinstance(abortable, TransactionAbortableError)
    assert type(fatal) is TransactionFatalError
    for error in (fenced, abortable, fatal):
        assert isinstance(error, TransactionError)
        assert repr(TID) in str(error)
    assert "abort_transaction()" in str(abortable)
    # The broker's codes map to the fenced class wherever they are read.
    assert isinstance(error_for(E.INVALID_PRODUCER_EPOCH), TransactionFatalError)


def test_a_failed_batch_makes_the_transaction_abortable_and_asks_for_a_new_epoch() -> None:
    manager = manager_in(TxnState.IN_TRANSACTION)
    manager.batch_failed(KafkaTimeoutError("expired"), had_sequence=True)
    assert state_of(manager) is TxnState.ABORTABLE_ERROR
    assert manager.epoch_bump_required
    assert isinstance(manager.last_error, TransactionAbortableError)
    assert isinstance(manager.last_error.__cause__, KafkaTimeoutError)


def test_a_fenced_batch_is_fatal() -> None:
    manager = manager_in(TxnState.IN_TRANSACTION)
    manager.batch_failed(error_for(E.PRODUCER_FENCED, "t-0"), had_sequence=False)
    assert state_of(manager) is TxnState.FATAL_ERROR
    assert isinstance(manager.last_error, ProducerFencedError)
    assert not manager.epoch_bump_required


def test_partitions_are_added_once_and_batched() -> None:
    manager = manager_in(TxnState.READY)
    manager.begin()
    assert not started(manager)
    assert manager.to_add([TP1, TP0, TP0]) == [TP0, TP1]
    assert manager.to_add([TP0, TP1]) == []  # being added: not asked for twice
    manager.added([TP0, TP1])
    assert manager.partitions == {TP0, TP1}
    assert started(manager)
    assert manager.to_add([TP0]) == []
    manager.transition(TxnState.COMMITTING_TRANSACTION)
    manager.completed()
    manager.begin()
    assert manager.partitions == set()
    assert not started(manager)
    assert manager.to_add([TP0]) == [TP0]  # a new transaction adds it again


def test_offsets_alone_start_a_transaction() -> None:
    manager = manager_in(TxnState.READY)
    manager.begin()
    manager.offsets_added = True
    assert started(manager)


def test_the_worst_partition_error_decides() -> None:
    api = TxnApi.ADD_PARTITIONS
    assert worst_code(api, []) is E.NONE
    assert worst_code(api, [E.NONE, E.OPERATION_NOT_ATTEMPTED]) is E.OPERATION_NOT_ATTEMPTED
    assert worst_code(api, [E.OPERATION_NOT_ATTEMPTED, E.CONCURRENT_TRANSACTIONS]) is (
        E.CONCURRENT_TRANSACTIONS
    )
    assert worst_code(api, [E.NOT_COORDINATOR, E.PRODUCER_FENCED, E.NONE]) is E.PRODUCER_FENCED


def test_txn_offset_commit_carries_the_group_metadata() -> None:
    group = ConsumerGroupMetadata("g", generation_id=7, member_id="m-1", group_instance_id="i")
    request = txn_offset_commit_request(
        TID,
        42,
        3,
        group,
        {TP1: OffsetAndMetadata(10, "meta", 2), TP0: OffsetAndMetadata(5)},
    )
    assert (request.transactional_id, request.group_id) == (TID, "g")
    assert (request.producer_id, request.producer_epoch) == (42, 3)
    assert (request.generation_id, request.member_id, request.group_instance_id) == (7, "m-1", "i")
    [topic] = request.topics
    assert [
        (p.partition_index, p.committed_offset, p.committed_leader_epoch, p.committed_metadata)
        for p in topic.partitions
    ] == [(0, 5, -1, ""), (1, 10, 2, "meta")]


def test_a_bare_group_id_is_the_pre_kip_447_form() -> None:
    group = ConsumerGroupMetadata("g")
    assert (group.generation_id, group.member_id, group.group_instance_id) == (-1, "", None)
    with pytest.raises(ValueError, match="group id"):
        ConsumerGroupMetadata("")


BOOTSTRAP = "127.0.0.1:9092"


def test_a_transactional_id_implies_idempotence_and_keeps_kafkas_timeout() -> None:
    settings = ProducerSettings.from_kwargs(
        {"bootstrap_servers": BOOTSTRAP, "transactional_id": TID}
    )
    assert settings.transactional_id == TID
    assert settings.enable_idempotence
    assert settings.acks == -1
    assert settings.transaction_timeout_ms == 60_000
    assert ProducerSettings.from_kwargs({"bootstrap_servers": BOOTSTRAP}).transactional_id is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"acks": 1}, "acks"),
        ({"enable_idempotence": False}, "enable_idempotence"),
        ({"max_in_flight_requests_per_connection": 6}, "max_in_flight"),
        ({"transactional_id": ""}, "empty"),
        ({"transaction_timeout_ms": 0}, "transaction_timeout_ms"),
    ],
)
def test_settings_that_contradict_transactions_are_refused(
    extra: dict[str, object], message: str
) -> None:
    kwargs: dict[str, object] = {"bootstrap_servers": BOOTSTRAP, "transactional_id": TID}
    kwargs.update(extra)
    with pytest.raises(ValueError, match=message):
        ProducerSettings.from_kwargs(kwargs)


async def test_a_transactional_producer_sends_only_inside_a_transaction() -> None:
    # No broker is reached: the state is checked before any I/O.
    producer = Producer(bootstrap_servers="127.0.0.1:1", transactional_id=TID)
    with pytest.raises(TransactionStateError, match=r"init_transactions\(\) before send"):
        await producer.send("t", b"v")
    with pytest.raises(TransactionStateError, match="init_transactions"):
        producer.begin_transaction()
    with pytest.raises(TransactionStateError, match="init_transactions"):
        await producer.commit_transaction()
    assert producer.status().transaction_state is TxnState.UNINITIALIZED
    plain = Producer(bootstrap_servers="127.0.0.1:1")
    with pytest.raises(TransactionStateError, match="needs a producer with a transactional_id"):
        plain.begin_transaction()
    assert plain.status().transaction_state is None
