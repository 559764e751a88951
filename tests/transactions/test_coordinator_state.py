"""The transaction coordinator's pure parts: the transition table, each transition's target,
and the `__transaction_state` record codec (Kafka's bytes)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from riverbed.broker.transactions import log_store
from riverbed.broker.transactions.state import (
    NO_PRODUCER_EPOCH,
    PRODUCER_EPOCH_EXHAUSTED,
    VALID_PREVIOUS,
    IllegalTransitionError,
    TxnMetadata,
    TxnState,
    check_expected_producer,
    needs_new_producer_id,
    new_metadata,
    prepare_add_partitions,
    prepare_complete,
    prepare_end,
    prepare_fence_epoch,
    prepare_increment_epoch,
    prepare_rotate_producer_id,
)
from riverbed.coordination.internal_topics import partition_for
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition

TP0 = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)

# Kafka's TransactionState.validPreviousStates, spelled out independently of the table.
KAFKA_TRANSITIONS = {
    ("Empty", "Empty"),
    ("CompleteCommit", "Empty"),
    ("CompleteAbort", "Empty"),
    ("Ongoing", "Ongoing"),
    ("Empty", "Ongoing"),
    ("CompleteCommit", "Ongoing"),
    ("CompleteAbort", "Ongoing"),
    ("Ongoing", "PrepareCommit"),
    ("Ongoing", "PrepareAbort"),
    ("PrepareEpochFence", "PrepareAbort"),
    ("PrepareCommit", "CompleteCommit"),
    ("PrepareAbort", "CompleteAbort"),
    ("Empty", "Dead"),
    ("CompleteCommit", "Dead"),
    ("CompleteAbort", "Dead"),
    ("Ongoing", "PrepareEpochFence"),
}


def metadata(state: TxnState, **changes: object) -> TxnMetadata:
    base = TxnMetadata(
        transactional_id="txn",
        producer_id=1000,
        producer_epoch=5,
        timeout_ms=60_000,
        state=state,
        partitions=frozenset({TP0}) if state not in (TxnState.EMPTY,) else frozenset(),
        start_timestamp_ms=100,
        last_update_timestamp_ms=200,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("source", "target"), list(itertools.product(TxnState, TxnState)))
def test_every_pair_of_states_is_allowed_exactly_as_kafka_allows_it(
    source: TxnState, target: TxnState
) -> None:
    allowed = (source.kafka_name, target.kafka_name) in KAFKA_TRANSITIONS
    assert (source in VALID_PREVIOUS[target]) == allowed
    current = metadata(source)
    if allowed:
        assert current.transit(target).state is target
    else:
        with pytest.raises(IllegalTransitionError):
            current.transit(target)


def test_state_ids_and_names_are_kafkas() -> None:
    assert [(s.value, s.kafka_name) for s in TxnState] == [
        (0, "Empty"),
        (1, "Ongoing"),
        (2, "PrepareCommit"),
        (3, "PrepareAbort"),
        (4, "CompleteCommit"),
        (5, "CompleteAbort"),
        (6, "Dead"),
        (7, "PrepareEpochFence"),
    ]
    assert TxnState.from_kafka_name("Ongoing") is TxnState.ONGOING
    assert TxnState.from_kafka_name("ongoing") is None


def test_a_transaction_from_start_to_end() -> None:
    fresh = new_metadata("txn", 7, 30_000, now_ms=10)
    initialized = prepare_increment_epoch(fresh, 30_000, None, now_ms=20)
    assert (initialized.producer_id, initialized.producer_epoch) == (7, 0)
    ongoing = prepare_add_partitions(initialized, [TP0], now_ms=30)
    assert ongoing.state is TxnState.ONGOING
    assert ongoing.start_timestamp_ms == 30
    more = prepare_add_partitions(ongoing, [TP1], now_ms=40)
    assert more.partitions == {TP0, TP1}
    assert more.start_timestamp_ms == 30
    prepared = prepare_end(more, commit=True, now_ms=50)
    assert prepared.state is TxnState.PREPARE_COMMIT
    assert prepared.partitions == {TP0, TP1}
    done = prepare_complete(prepared, now_ms=60)
    assert done.state is TxnState.COMPLETE_COMMIT
    assert not done.partitions
    assert done.producer_epoch == 0
    # The next transaction restarts the clock.
    assert prepare_add_partitions(done, [TP1], now_ms=70).start_timestamp_ms == 70


def test_fencing_an_open_transaction_bumps_the_epoch_once_and_aborts_it() -> None:
    ongoing = metadata(TxnState.ONGOING)
    fenced = prepare_fence_epoch(ongoing, failed_fence=False)
    assert fenced.state is TxnState.PREPARE_EPOCH_FENCE
    assert fenced.producer_epoch == 6
    aborting = prepare_end(fenced, commit=False, now_ms=300)
    assert aborting.state is TxnState.PREPARE_ABORT
    assert aborting.producer_epoch == 6
    assert aborting.partitions == ongoing.partitions
    # A fence whose write failed was never handed out: the retry reuses its epoch.
    assert prepare_fence_epoch(ongoing, failed_fence=True).producer_epoch == 5
    with pytest.raises(IllegalTransitionError):
        prepare_end(fenced, commit=True, now_ms=300)


def test_kip_360_epoch_checks() -> None:
    idle = metadata(TxnState.COMPLETE_COMMIT, last_producer_epoch=4)
    assert prepare_increment_epoch(idle, 1_000, 5, 0).producer_epoch == 6
    # A retry of the bump from 4 to 5 whose answer was lost: 5 again.
    assert prepare_increment_epoch(idle, 1_000, 4, 0).producer_epoch == 5
    with pytest.raises(KafkaError) as fenced:
        prepare_increment_epoch(idle, 1_000, 3, 0)
    assert fenced.value.code == ErrorCode.PRODUCER_FENCED
    with pytest.raises(KafkaError) as other:
        check_expected_producer(idle, (999, 5))
    assert other.value.code == ErrorCode.PRODUCER_FENCED
    check_expected_producer(idle, (1000, 5))
    check_expected_producer(metadata(TxnState.EMPTY, producer_epoch=NO_PRODUCER_EPOCH), (5, 5))


def test_an_exhausted_epoch_rotates_the_producer_id() -> None:
    exhausted = metadata(TxnState.COMPLETE_ABORT, producer_epoch=PRODUCER_EPOCH_EXHAUSTED)
    assert needs_new_producer_id(exhausted, None)
    assert not needs_new_producer_id(metadata(TxnState.EMPTY), None)
    rotated = prepare_rotate_producer_id(exhausted, 2000, 1_000, 0, keep_last_epoch=False)
    assert (rotated.producer_id, rotated.producer_epoch) == (2000, 0)
    assert rotated.previous_producer_id == 1000
    # The previous id at its exhausted epoch is still recognised (a retried rotation).
    check_expected_producer(rotated, (1000, PRODUCER_EPOCH_EXHAUSTED))


states = st.sampled_from([s for s in TxnState if s is not TxnState.DEAD])
partitions = st.frozensets(
    st.builds(TopicPartition, st.text(min_size=1, max_size=20), st.integers(0, 10_000)),
    max_size=8,
)


@given(
    state=states,
    parts=partitions,
    producer_id=st.integers(0, 2**63 - 1),
    epoch=st.integers(-1, 2**15 - 1),
    timestamps=st.tuples(st.integers(-1, 2**62), st.integers(0, 2**62)),
    previous=st.integers(-1, 2**63 - 1),
)
def test_records_round_trip(
    state: TxnState,
    parts: frozenset[TopicPartition],
    producer_id: int,
    epoch: int,
    timestamps: tuple[int, int],
    previous: int,
) -> None:
    written = TxnMetadata(
        transactional_id="tx-é",
        producer_id=producer_id,
        producer_epoch=epoch,
        timeout_ms=60_000,
        state=state,
        partitions=parts,
        start_timestamp_ms=timestamps[0],
        last_update_timestamp_ms=timestamps[1],
        previous_producer_id=previous,
    )
    key, value = log_store.entry(written)
    assert value is not None
    assert log_store.decode_key(key) == "tx-é"
    assert log_store.decode_value("tx-é", value) == written


def test_record_bytes_are_kafkas() -> None:
    """Key v0 = int16 0 + string; value v1 (flexible) starts with int16 1, then the producer id."""
    key, value = log_store.entry(metadata(TxnState.ONGOING))
    assert key == b"\x00\x00" + b"\x00\x03txn"
    assert value is not None
    assert value[:2] == b"\x00\x01"
    assert int.from_bytes(value[2:10], "big") == 1000
    assert log_store.entry(metadata(TxnState.ONGOING).transit(TxnState.PREPARE_ABORT))[1]
    dead = metadata(TxnState.EMPTY).transit(TxnState.DEAD)
    assert log_store.entry(dead) == (key, None)


def _java_hash(text: str) -> int:
    """java.lang.String.hashCode over UTF-16 code units, written out independently."""
    code = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        code = (31 * code + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return code - 2**32 if code >= 2**31 else code


@pytest.mark.parametrize("transactional_id", ["my-txn", "tx-é", "producer-1", "😀"])
def test_transactional_ids_are_placed_as_kafka_places_them(transactional_id: str) -> None:
    assert partition_for(transactional_id, 50) == abs(_java_hash(transactional_id)) % 50
    # "polygenelubricants" hashes to Integer.MIN_VALUE, which Kafka's Utils.abs maps to 0.
    assert _java_hash("polygenelubricants") == -(2**31)
    assert partition_for("polygenelubricants", 50) == 0
