"""The transactional producer's state, without I/O: Kafka's TransactionManager as a table.

States (Kafka's names, KIP-98):

- UNINITIALIZED: `transactional_id` set, `init_transactions()` not called yet;
- INITIALIZING: InitProducerId under way (also after an abort that needs a new epoch);
- READY: a producer id and epoch, no transaction open;
- IN_TRANSACTION: `begin_transaction()` was called; records and offsets join it;
- COMMITTING_TRANSACTION / ABORTING_TRANSACTION: EndTxn under way;
- ABORTABLE_ERROR: the transaction cannot commit; only `abort_transaction()` moves on;
- FATAL_ERROR: the producer cannot go on (fenced by a newer instance, not authorized, a broker
  error no retry fixes); only `close()` is left.

`TRANSITIONS` lists every legal (source -> targets) pair; anything else is a bug of the caller
(calling commit_transaction() before begin_transaction(), say) and raises
`TransactionStateError` naming both states, without changing the state.

`classify(api, code)` maps each transactional API's error code to what the producer does, by
Kafka's handlers (TransactionManager.*Handler.handleResponse) and librdkafka's rd_kafka_txnmgr:
retry, look the coordinator up again and retry, or fail as fenced, abortable or fatal.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final

from riverbed.client.types import TopicPartition
from riverbed.errors import (
    ProducerFencedError,
    TransactionAbortableError,
    TransactionFatalError,
)
from riverbed.protocol.errors import ErrorCode, KafkaError

__all__ = [
    "TRANSITIONS",
    "TransactionManager",
    "TransactionStateError",
    "TxnAction",
    "TxnApi",
    "TxnState",
    "classify",
]


class TxnState(enum.Enum):
    UNINITIALIZED = "uninitialized"
    INITIALIZING = "initializing"
    READY = "ready"
    IN_TRANSACTION = "in_transaction"
    COMMITTING_TRANSACTION = "committing_transaction"
    ABORTING_TRANSACTION = "aborting_transaction"
    ABORTABLE_ERROR = "abortable_error"
    FATAL_ERROR = "fatal_error"


_S = TxnState
# source -> the states it may move to. FATAL_ERROR is reachable from everywhere (as in Kafka)
# and leads nowhere.
TRANSITIONS: Final[dict[TxnState, frozenset[TxnState]]] = {
    _S.UNINITIALIZED: frozenset({_S.INITIALIZING, _S.FATAL_ERROR}),
    # INITIALIZING -> INITIALIZING: init_transactions() called again after a timeout.
    _S.INITIALIZING: frozenset({_S.INITIALIZING, _S.READY, _S.ABORTABLE_ERROR, _S.FATAL_ERROR}),
    _S.READY: frozenset({_S.IN_TRANSACTION, _S.FATAL_ERROR}),
    _S.IN_TRANSACTION: frozenset(
        {_S.COMMITTING_TRANSACTION, _S.ABORTING_TRANSACTION, _S.ABORTABLE_ERROR, _S.FATAL_ERROR}
    ),
    # -> itself: commit_transaction() / abort_transaction() called again after a timeout
    # resends EndTxn (the coordinator answers a repeated EndTxn of the same outcome with NONE).
    _S.COMMITTING_TRANSACTION: frozenset(
        {_S.COMMITTING_TRANSACTION, _S.READY, _S.ABORTABLE_ERROR, _S.FATAL_ERROR}
    ),
    _S.ABORTING_TRANSACTION: frozenset(
        {_S.ABORTING_TRANSACTION, _S.READY, _S.INITIALIZING, _S.FATAL_ERROR}
    ),
    _S.ABORTABLE_ERROR: frozenset({_S.ABORTING_TRANSACTION, _S.ABORTABLE_ERROR, _S.FATAL_ERROR}),
    _S.FATAL_ERROR: frozenset(),
}


class TransactionStateError(RuntimeError):
    """An operation called in a state that does not allow it: a mistake of the caller (Kafka's
    IllegalStateException), not a broker's answer."""


class TxnApi(enum.Enum):
    INIT_PRODUCER_ID = "InitProducerId"
    ADD_PARTITIONS = "AddPartitionsToTxn"
    ADD_OFFSETS = "AddOffsetsToTxn"
    TXN_OFFSET_COMMIT = "TxnOffsetCommit"
    END_TXN = "EndTxn"
    PRODUCE = "Produce"


class TxnAction(enum.Enum):
    DONE = "done"
    RETRY = "retry"  # the same request again after a backoff
    FIND_COORDINATOR = "find_coordinator"  # look the coordinator up again, then retry
    FENCED = "fenced"  # fatal: a newer producer with this transactional id exists
    ABORTABLE = "abortable"  # the transaction must be aborted; the producer goes on
    FATAL = "fatal"  # the producer cannot go on


_E = ErrorCode
_COORDINATOR_MOVED: Final = frozenset({_E.NOT_COORDINATOR, _E.COORDINATOR_NOT_AVAILABLE})
_FENCED: Final = frozenset({_E.PRODUCER_FENCED, _E.INVALID_PRODUCER_EPOCH})
# Fatal whatever the API: the principal may not use the id, or the coordinator's state and ours
# disagree in a way no retry mends.
_ALWAYS_FATAL: Final = frozenset(
    {
        _E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        _E.CLUSTER_AUTHORIZATION_FAILED,
        _E.INVALID_TXN_STATE,
        _E.UNSUPPORTED_VERSION,
        _E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        _E.INVALID_TRANSACTION_TIMEOUT,
    }
)
# Abortable per API (anything not listed, and not retriable, is fatal).
_ABORTABLE: Final[dict[TxnApi, frozenset[ErrorCode]]] = {
    TxnApi.INIT_PRODUCER_ID: frozenset({_E.TRANSACTION_ABORTABLE}),
    TxnApi.ADD_PARTITIONS: frozenset(
        {
            _E.TOPIC_AUTHORIZATION_FAILED,
            _E.OPERATION_NOT_ATTEMPTED,
            _E.UNKNOWN_PRODUCER_ID,
            _E.INVALID_PRODUCER_ID_MAPPING,
            _E.TRANSACTION_ABORTABLE,
        }
    ),
    TxnApi.ADD_OFFSETS: frozenset(
        {
            _E.GROUP_AUTHORIZATION_FAILED,
            _E.UNKNOWN_PRODUCER_ID,
            _E.INVALID_PRODUCER_ID_MAPPING,
            _E.TRANSACTION_ABORTABLE,
        }
    ),
    TxnApi.TXN_OFFSET_COMMIT: frozenset(
        {
            _E.GROUP_AUTHORIZATION_FAILED,
            _E.FENCED_INSTANCE_ID,
            _E.UNKNOWN_MEMBER_ID,
            _E.ILLEGAL_GENERATION,
            _E.TRANSACTION_ABORTABLE,
        }
    ),
    TxnApi.END_TXN: frozenset(
        {_E.UNKNOWN_PRODUCER_ID, _E.INVALID_PRODUCER_ID_MAPPING, _E.TRANSACTION_ABORTABLE}
    ),
}


def classify(api: TxnApi, code: int) -> TxnAction:
    """What the producer does with `api`'s answer `code`."""
    error = ErrorCode(code)
    if error == _E.NONE:
        return TxnAction.DONE
    if error in _FENCED:
        return TxnAction.FENCED
    if error in _ALWAYS_FATAL:
        return TxnAction.FATAL
    if api is TxnApi.PRODUCE:
        # A record refused inside a transaction: that transaction cannot commit (Kafka's
        # maybeTransitionToErrorState); the sender has retried what was retriable already.
        return TxnAction.ABORTABLE
    if error in _COORDINATOR_MOVED or (
        api is TxnApi.TXN_OFFSET_COMMIT and error == _E.REQUEST_TIMED_OUT
    ):
        return TxnAction.FIND_COORDINATOR
    if error.retriable:
        return TxnAction.RETRY
    if error in _ABORTABLE[api]:
        return TxnAction.ABORTABLE
    return TxnAction.FATAL


def error_for_action(
    action: TxnAction, api: TxnApi, code: int, transactional_id: str, detail: str = ""
) -> KafkaError:
    """The exception the application sees for a FENCED, ABORTABLE or FATAL outcome."""
    error = ErrorCode(code)
    where = f"transactional_id {transactional_id!r}: {api.value} answered {error.name}"
    if detail:
        where += f" ({detail})"
    if action is TxnAction.FENCED:
        return ProducerFencedError(
            error,
            f"{where}: another producer with this transactional id has called "
            "init_transactions() since; this one is fenced and must be closed",
        )
    if action is TxnAction.ABORTABLE:
        return TransactionAbortableError(
            error, f"{where}: call abort_transaction(), then begin a new transaction"
        )
    if action is TxnAction.FATAL:
        return TransactionFatalError(error, f"{where}: the producer cannot go on; close it")
    raise ValueError(f"{action} is not a failure")


class TransactionManager:
    """The transaction's state and what it holds: the partitions added to it (AddPartitionsToTxn
    answered), those being added, and whether the coordinator knows of it at all (`started`:
    without a partition or an offset added, EndTxn is skipped, as in Kafka)."""

    def __init__(self, transactional_id: str, transaction_timeout_ms: int) -> None:
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.state = TxnState.UNINITIALIZED
        self.last_error: BaseException | None = None
        self.partitions: set[TopicPartition] = set()  # added to the open transaction
        self.adding: set[TopicPartition] = set()  # AddPartitionsToTxn in flight for these
        self.offsets_added = False
        # A batch of the transaction failed after it got a sequence number (or was dropped
        # after one): the partition's sequence has a gap, so the next transaction needs a new
        # epoch, which resets every sequence to 0 (KIP-360).
        self.epoch_bump_required = False

    # -- transitions ----------------------------------------------------------------------
    def transition(self, target: TxnState) -> None:
        if target not in TRANSITIONS[self.state]:
            raise TransactionStateError(
                f"transactional_id {self.transactional_id!r}: cannot go from "
                f"{self.state.name} to {target.name}"
            )
        self.state = target

    def require(self, operation: str, *states: TxnState) -> None:
        """Raise unless the state is one of `states`: the error that put the producer in
        ABORTABLE_ERROR / FATAL_ERROR, else a TransactionStateError naming the operation."""
        if self.state in states:
            return
        if self.state in (TxnState.ABORTABLE_ERROR, TxnState.FATAL_ERROR):
            raise self.failure()
        if self.state is TxnState.UNINITIALIZED:
            raise TransactionStateError(
                f"transactional_id {self.transactional_id!r}: call init_transactions() before "
                f"{operation}"
            )
        raise TransactionStateError(
            f"transactional_id {self.transactional_id!r}: {operation} is not allowed in state "
            f"{self.state.name}"
        )

    def failure(self) -> BaseException:
        """The error the application sees in ABORTABLE_ERROR / FATAL_ERROR."""
        if self.last_error is not None:
            return self.last_error
        return TransactionFatalError(
            ErrorCode.UNKNOWN_SERVER_ERROR,
            f"transactional_id {self.transactional_id!r} is in state {self.state.name}",
        )

    def fail(self, action: TxnAction, error: BaseException) -> None:
        """Record a FENCED / FATAL / ABORTABLE outcome. An abortable error while the transaction
        is being aborted changes nothing (the abort goes on); a fatal one always wins."""
        if self.state is TxnState.FATAL_ERROR:
            return
        if action is TxnAction.ABORTABLE:
            if self.state in (
                TxnState.ABORTING_TRANSACTION,
                TxnState.READY,
                TxnState.UNINITIALIZED,
            ):
                return
            if self.state is not TxnState.ABORTABLE_ERROR:
                self.last_error = error
            self.transition(TxnState.ABORTABLE_ERROR)
            return
        self.last_error = error
        self.transition(TxnState.FATAL_ERROR)

    # -- the open transaction ---------------------------------------------------------------
    def begin(self) -> None:
        self.require("begin_transaction()", TxnState.READY)
        self.transition(TxnState.IN_TRANSACTION)
        self.partitions.clear()
        self.adding.clear()
        self.offsets_added = False
        self.last_error = None

    @property
    def started(self) -> bool:
        """Whether the coordinator knows of the transaction (EndTxn is needed to end it)."""
        return bool(self.partitions) or self.offsets_added

    @property
    def sending_allowed(self) -> bool:
        """Whether the sender may send the transaction's batches (of partitions added)."""
        return self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION)

    @property
    def dropping(self) -> bool:
        """Whether unsent batches are to be dropped: the transaction will be aborted."""
        return self.state in (
            TxnState.ABORTABLE_ERROR,
            TxnState.ABORTING_TRANSACTION,
            TxnState.FATAL_ERROR,
        )

    def to_add(self, wanted: Iterable[TopicPartition]) -> list[TopicPartition]:
        """The partitions of `wanted` that must be added before their batches go out (and not
        being added already); marks them as being added."""
        new = sorted(
            tp for tp in set(wanted) if tp not in self.partitions and tp not in self.adding
        )
        self.adding.update(new)
        return new

    def added(self, tps: Iterable[TopicPartition]) -> None:
        tps = set(tps)
        self.adding -= tps
        if self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION):
            self.partitions |= tps

    def add_failed(self, tps: Iterable[TopicPartition]) -> None:
        self.adding -= set(tps)

    def batch_failed(self, error: BaseException, had_sequence: bool) -> None:
        """A batch of the transaction failed for good (after the sender's retries)."""
        if had_sequence:
            self.epoch_bump_required = True
        code = error.code if isinstance(error, KafkaError) else ErrorCode.UNKNOWN_SERVER_ERROR
        action = classify(TxnApi.PRODUCE, code)
        if action is not TxnAction.ABORTABLE:  # fenced or fatal: the producer cannot go on
            failure = error_for_action(action, TxnApi.PRODUCE, code, self.transactional_id)
            failure.__cause__ = error
            self.fail(action, failure)
            return
        wrapped = TransactionAbortableError(
            code,
            f"transactional_id {self.transactional_id!r}: a record of the transaction failed "
            f"({error}); call abort_transaction(), then begin a new transaction",
        )
        wrapped.__cause__ = error
        self.fail(TxnAction.ABORTABLE, wrapped)

    def completed(self) -> None:
        """EndTxn answered (or was not needed): no transaction is open any more."""
        self.partitions.clear()
        self.adding.clear()
        self.offsets_added = False
        self.last_error = None
        self.transition(TxnState.READY)
