"""One transactional id's state (Kafka's TransactionMetadata), and its transitions, without I/O.

A transactional id goes Empty → Ongoing (the first AddPartitionsToTxn / AddOffsetsToTxn of a
transaction) → PrepareCommit or PrepareAbort (EndTxn, a fence, a timeout) → CompleteCommit or
CompleteAbort (once every partition has its marker) → Ongoing again with the next transaction,
or Empty with a new epoch (InitProducerId). PrepareEpochFence is only ever pending: InitProducerId
of an Ongoing id bumps the epoch and writes PrepareAbort at that epoch. Dead is the tombstone of
an id that expired.

`VALID_PREVIOUS` is the transition table (Kafka's validPreviousStates): a state absent from a
target's set cannot go there, and `TxnMetadata.transit` refuses it. The `prepare_*` functions
compute each transition's target metadata from the current one; the coordinator writes the
target to `__transaction_state` and only then takes it as current.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition

NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_TIMESTAMP: Final = -1
# Kafka never hands out Short.MaxValue, so that the coordinator can always fence with one bump;
# an epoch at or above this is exhausted and the next InitProducerId gets a new producer id.
PRODUCER_EPOCH_EXHAUSTED: Final = 2**15 - 2
PRODUCER_EPOCH_MAX: Final = 2**15 - 1


class TxnState(enum.Enum):
    """Kafka's TransactionState: the value is the id stored in TransactionLogValue."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        """The name DescribeTransactions and ListTransactions use ("PrepareCommit")."""
        return _NAMES[self]

    @classmethod
    def from_kafka_name(cls, name: str) -> TxnState | None:
        return _BY_NAME.get(name)

    @property
    def is_prepare(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def is_complete(self) -> bool:
        return self in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)

    @property
    def expiration_allowed(self) -> bool:
        """Whether an idle id in this state may expire (no transaction in flight)."""
        return self in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)


_S = TxnState
_NAMES: Final = {
    _S.EMPTY: "Empty",
    _S.ONGOING: "Ongoing",
    _S.PREPARE_COMMIT: "PrepareCommit",
    _S.PREPARE_ABORT: "PrepareAbort",
    _S.COMPLETE_COMMIT: "CompleteCommit",
    _S.COMPLETE_ABORT: "CompleteAbort",
    _S.DEAD: "Dead",
    _S.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_NAME: Final = {name: state for state, name in _NAMES.items()}

# target state -> the states it may be reached from (Kafka's validPreviousStates).
VALID_PREVIOUS: Final[Mapping[TxnState, frozenset[TxnState]]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    _S.PREPARE_ABORT: frozenset({_S.ONGOING, _S.PREPARE_EPOCH_FENCE}),
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}


class IllegalTransitionError(Exception):
    """A transition the table does not have: a bug in the coordinator, never a client's fault."""


def epoch_exhausted(producer_epoch: int) -> bool:
    return producer_epoch >= PRODUCER_EPOCH_EXHAUSTED


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """A transactional id's state as `__transaction_state` holds it (plus `last_producer_epoch`,
    which Kafka keeps in memory only: the epoch before the last bump, so that a retried
    InitProducerId of a bump it did not see the answer to gets the same epoch again)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_timestamp_ms: int  # when the current (or last) transaction began; NO_TIMESTAMP: none
    last_update_timestamp_ms: int
    previous_producer_id: int = NO_PRODUCER_ID
    last_producer_epoch: int = NO_PRODUCER_EPOCH

    def transit(self, state: TxnState, **changes: object) -> TxnMetadata:
        """This metadata moved to `state` with `changes`; IllegalTransitionError if the table
        has no such transition."""
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalTransitionError(
                f"transactional id {self.transactional_id!r}: {self.state.kafka_name} cannot "
                f"go to {state.kafka_name}"
            )
        return dataclasses.replace(self, state=state, **changes)  # type: ignore[arg-type]

    @property
    def epoch_exhausted(self) -> bool:
        return epoch_exhausted(self.producer_epoch)


def new_metadata(
    transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int
) -> TxnMetadata:
    """A transactional id seen for the first time: epoch -1, so its first bump gives 0."""
    return TxnMetadata(
        transactional_id=transactional_id,
        producer_id=producer_id,
        producer_epoch=NO_PRODUCER_EPOCH,
        timeout_ms=timeout_ms,
        state=TxnState.EMPTY,
        partitions=frozenset(),
        start_timestamp_ms=NO_TIMESTAMP,
        last_update_timestamp_ms=now_ms,
    )


# -- InitProducerId ---------------------------------------------------------------------------


def check_expected_producer(current: TxnMetadata, expected: tuple[int, int] | None) -> None:
    """KIP-360: the (producer id, epoch) a v3+ InitProducerId names must be this id's current
    producer (or the previous one, when a retried rotation exhausted its epoch)."""
    if expected is None or current.producer_epoch == NO_PRODUCER_EPOCH:
        return
    producer_id, epoch = expected
    if producer_id == current.producer_id:
        return
    if producer_id == current.previous_producer_id and epoch_exhausted(epoch):
        return
    raise KafkaError(
        ErrorCode.PRODUCER_FENCED,
        f"producer {producer_id} is not the current producer {current.producer_id} of "
        f"{current.transactional_id!r}",
    )


def needs_new_producer_id(current: TxnMetadata, expected: tuple[int, int] | None) -> bool:
    """An InitProducerId of an idle id whose epoch is exhausted gets a new producer id."""
    return current.epoch_exhausted and (expected is None or expected[1] == current.producer_epoch)


def prepare_increment_epoch(
    current: TxnMetadata, timeout_ms: int, expected_epoch: int | None, now_ms: int
) -> TxnMetadata:
    """InitProducerId of an idle id: the next epoch (or, for a retry of a bump whose answer was
    lost, the same one again). PRODUCER_FENCED for an epoch that is neither."""
    bumped = current.producer_epoch + 1
    if expected_epoch is None:
        epoch, last_epoch = bumped, NO_PRODUCER_EPOCH
    elif current.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == current.producer_epoch:
        epoch, last_epoch = bumped, current.producer_epoch
    elif expected_epoch == current.last_producer_epoch:
        epoch, last_epoch = current.producer_epoch, current.last_producer_epoch
    else:
        raise KafkaError(
            ErrorCode.PRODUCER_FENCED,
            f"epoch {expected_epoch} is neither the current epoch {current.producer_epoch} of "
            f"{current.transactional_id!r} nor the one before it",
        )
    return current.transit(
        TxnState.EMPTY,
        producer_epoch=epoch,
        last_producer_epoch=last_epoch,
        timeout_ms=timeout_ms,
        partitions=frozenset(),
        start_timestamp_ms=NO_TIMESTAMP,
        last_update_timestamp_ms=now_ms,
    )


def prepare_rotate_producer_id(
    current: TxnMetadata, producer_id: int, timeout_ms: int, now_ms: int, *, keep_last_epoch: bool
) -> TxnMetadata:
    """The epoch is exhausted: continue as a new producer id at epoch 0."""
    return current.transit(
        TxnState.EMPTY,
        producer_id=producer_id,
        previous_producer_id=current.producer_id,
        producer_epoch=0,
        last_producer_epoch=current.producer_epoch if keep_last_epoch else NO_PRODUCER_EPOCH,
        timeout_ms=timeout_ms,
        partitions=frozenset(),
        start_timestamp_ms=NO_TIMESTAMP,
        last_update_timestamp_ms=now_ms,
    )


def prepare_fence_epoch(current: TxnMetadata, *, failed_fence: bool) -> TxnMetadata:
    """Fence the producer of an Ongoing transaction (a new InitProducerId, or its timeout):
    the epoch goes up by one (not again after a fence whose write failed: that epoch was never
    handed out), and the transaction is then aborted at it."""
    if current.producer_epoch >= PRODUCER_EPOCH_MAX:
        raise IllegalTransitionError(f"{current.transactional_id!r}: epoch would overflow")
    epoch = current.producer_epoch if failed_fence else current.producer_epoch + 1
    return current.transit(
        TxnState.PREPARE_EPOCH_FENCE, producer_epoch=epoch, last_producer_epoch=NO_PRODUCER_EPOCH
    )


# -- a transaction ----------------------------------------------------------------------------


def prepare_add_partitions(
    current: TxnMetadata, added: Iterable[TopicPartition], now_ms: int
) -> TxnMetadata:
    """AddPartitionsToTxn / AddOffsetsToTxn: the first one starts the transaction."""
    starts = current.state in (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
    return current.transit(
        TxnState.ONGOING,
        partitions=current.partitions | frozenset(added),
        start_timestamp_ms=now_ms if starts else current.start_timestamp_ms,
        last_update_timestamp_ms=now_ms,
    )


def prepare_end(current: TxnMetadata, commit: bool, now_ms: int) -> TxnMetadata:
    """EndTxn (or an abort by the coordinator): PrepareCommit or PrepareAbort, same partitions."""
    state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    return current.transit(state, last_update_timestamp_ms=now_ms)


def prepare_complete(current: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Every partition has its marker: CompleteCommit or CompleteAbort, no partitions left."""
    if current.state is TxnState.PREPARE_COMMIT:
        state = TxnState.COMPLETE_COMMIT
    else:
        state = TxnState.COMPLETE_ABORT
    return current.transit(state, partitions=frozenset(), last_update_timestamp_ms=now_ms)


def prepare_dead(current: TxnMetadata) -> TxnMetadata:
    """An idle id past transactional.id.expiration.ms: its tombstone is written."""
    return current.transit(TxnState.DEAD, partitions=frozenset())
