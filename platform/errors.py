"""Typed exceptions for clients: one class per family of Kafka error codes, each carrying `.code`.

Every class subclasses `riverbed.protocol.errors.KafkaError`, so `except KafkaError` catches all
of them; `except RetriableError` catches exactly the codes Kafka's clients treat as transient
(`ErrorCode.retriable`). `error_for(code, message)` maps a response's error code to its class;
codes without a family of their own become a `BrokerError`.

Two errors are the client's own, not the broker's: `KafkaTimeoutError` (a record's
delivery.timeout.ms, or send()'s max.block.ms, ran out with no error from the broker to report)
and `ClientClosedError` (the producer or consumer is closed).
"""

from __future__ import annotations

from typing import Final

from riverbed.protocol.errors import ErrorCode, KafkaError

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "BrokerError",
    "BrokerNotAvailableError",
    "ClientClosedError",
    "ConcurrentTransactionsError",
    "ConfigError",
    "CoordinatorError",
    "CorruptMessageError",
    "DuplicateSequenceError",
    "ErrorCode",
    "FetchSessionError",
    "GroupError",
    "IdempotenceError",
    "InvalidRequestError",
    "KafkaError",
    "KafkaStorageError",
    "KafkaTimeoutError",
    "LeadershipError",
    "MessageTooLargeError",
    "NetworkError",
    "NotEnoughReplicasError",
    "NotLeaderOrFollowerError",
    "OffsetError",
    "OffsetNotAvailableError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "ProducerFencedError",
    "RecordError",
    "RequestTimedOutError",
    "RetriableError",
    "SecurityDisabledError",
    "ThrottlingQuotaExceededError",
    "TopicAlreadyExistsError",
    "TopicError",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "TransactionError",
    "TransactionFatalError",
    "UnknownProducerIdError",
    "UnknownServerError",
    "UnknownTopicOrPartitionError",
    "UnsupportedVersionError",
    "error_for",
]


class RetriableError(KafkaError):
    """Marker: the failure is transient and the same request may succeed when retried."""


class BrokerError(KafkaError):
    """A broker error code with no family of its own (see `.code`)."""


class UnknownServerError(KafkaError):
    """UNKNOWN_SERVER_ERROR: the broker failed in a way it did not classify."""


# Topics and partitions
class TopicError(KafkaError):
    """A topic cannot be created, named or changed as asked (invalid name, partitions, ...)."""


class TopicAlreadyExistsError(TopicError):
    """TOPIC_ALREADY_EXISTS."""


class UnknownTopicOrPartitionError(TopicError, RetriableError):
    """UNKNOWN_TOPIC_OR_PARTITION / UNKNOWN_TOPIC_ID: the cluster does not (yet) know it."""


# Leadership: the request went to the wrong broker, or the partition has no leader right now.
class LeadershipError(RetriableError):
    """The partition's leadership moved or is unknown: refresh metadata and retry."""


class NotLeaderOrFollowerError(LeadershipError):
    """NOT_LEADER_OR_FOLLOWER: this broker does not host the partition's leader."""


class NotEnoughReplicasError(RetriableError):
    """NOT_ENOUGH_REPLICAS(_AFTER_APPEND): fewer in-sync replicas than min.insync.replicas."""


# Records
class RecordError(KafkaError):
    """A record batch was refused: corrupt, too large, wrong format or invalid."""


class CorruptMessageError(RecordError, RetriableError):
    """CORRUPT_MESSAGE: the batch failed its CRC on the broker (retried: it may be the wire)."""


class MessageTooLargeError(RecordError):
    """MESSAGE_TOO_LARGE / RECORD_LIST_TOO_LARGE: larger than the topic's max.message.bytes."""


# Offsets
class OffsetError(KafkaError):
    """An offset cannot be served, committed or stored as asked."""


class OffsetOutOfRangeError(OffsetError):
    """OFFSET_OUT_OF_RANGE: the fetch offset is below log start or above log end."""


class OffsetNotAvailableError(OffsetError, RetriableError):
    """OFFSET_NOT_AVAILABLE: the leader cannot answer for that offset yet."""


# Security
class AuthorizationError(KafkaError):
    """*_AUTHORIZATION_FAILED: the principal may not do this."""


class SecurityDisabledError(KafkaError):
    """SECURITY_DISABLED: the broker has no authorizer, so it keeps no ACLs."""


class AuthenticationError(KafkaError):
    """SASL_AUTHENTICATION_FAILED and friends: the client could not authenticate."""


# Configuration and request shape
class ConfigError(KafkaError):
    """INVALID_CONFIG / POLICY_VIOLATION / INVALID_REQUIRED_ACKS: a setting was refused."""


class InvalidRequestError(KafkaError):
    """INVALID_REQUEST: the broker could not make sense of the request."""


class UnsupportedVersionError(KafkaError):
    """UNSUPPORTED_VERSION: no API version both sides implement."""


# Idempotence and transactions
class IdempotenceError(KafkaError):
    """A producer id, epoch or sequence number was refused."""


class TransactionError(KafkaError):
    """A transactional request was refused, or a transaction cannot go on (see the subclasses
    for what the application does next)."""


class TransactionFatalError(TransactionError):
    """The transactional producer cannot continue (authorization, an invalid state, a broker
    without transactions): close it. Kafka's "fatal" class; `__cause__` is the broker's error."""


class TransactionAbortableError(TransactionError):
    """The current transaction cannot commit (a record was refused, an offset commit failed):
    call abort_transaction(), then begin a new one. Kafka's "abortable" class; `.code` and
    `__cause__` are the underlying error."""


class TransactionAbortedError(TransactionError):
    """The record was dropped unsent because its transaction was aborted (no broker error:
    `.code` is NONE)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.NONE, message)
        self.args = (message,)


class ProducerFencedError(IdempotenceError, TransactionFatalError):
    """INVALID_PRODUCER_EPOCH / PRODUCER_FENCED: a newer instance of this producer exists (a
    producer with the same transactional id called init_transactions()); fatal: close it."""


class OutOfOrderSequenceError(IdempotenceError):
    """OUT_OF_ORDER_SEQUENCE_NUMBER: the broker saw a gap in the producer's sequence."""


class DuplicateSequenceError(IdempotenceError):
    """DUPLICATE_SEQUENCE_NUMBER: the batch was already written."""


class UnknownProducerIdError(IdempotenceError):
    """UNKNOWN_PRODUCER_ID: the broker has no state for this producer id."""


class ConcurrentTransactionsError(TransactionError, RetriableError):
    """CONCURRENT_TRANSACTIONS."""


# Groups and coordinators (consumer groups come later; the codes are mapped now)
class CoordinatorError(RetriableError):
    """The group or transaction coordinator is loading, moving or unavailable."""


class GroupError(KafkaError):
    """A consumer-group request was refused (generation, member id, protocol, ...)."""


# Transient broker-side conditions
class RequestTimedOutError(RetriableError):
    """REQUEST_TIMED_OUT: the broker gave up waiting (e.g. for replication)."""


class NetworkError(RetriableError):
    """NETWORK_EXCEPTION: the connection failed while the request was in flight."""


class BrokerNotAvailableError(KafkaError):
    """BROKER_NOT_AVAILABLE."""


class KafkaStorageError(RetriableError):
    """KAFKA_STORAGE_ERROR: the replica's disk is offline, or the remote tier cannot be read."""


class FetchSessionError(RetriableError):
    """A fetch session id or epoch the broker does not know: start a new session."""


class ThrottlingQuotaExceededError(RetriableError):
    """THROTTLING_QUOTA_EXCEEDED."""


# Raised by the client itself
class KafkaTimeoutError(KafkaError):
    """A client-side deadline ran out (delivery.timeout.ms, max.block.ms) without a broker error
    to report; the last transient failure, if any, is the `__cause__`."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.REQUEST_TIMED_OUT, message)


class ClientClosedError(RuntimeError):
    """The producer or consumer was closed: a lifecycle error of the caller, not a Kafka error."""


_E = ErrorCode
_FAMILIES: Final[dict[type[KafkaError], tuple[ErrorCode, ...]]] = {
    UnknownServerError: (_E.UNKNOWN_SERVER_ERROR,),
    TopicError: (
        _E.INVALID_TOPIC_EXCEPTION,
        _E.INVALID_PARTITIONS,
        _E.INVALID_REPLICATION_FACTOR,
        _E.INVALID_REPLICA_ASSIGNMENT,
        _E.TOPIC_DELETION_DISABLED,
        _E.REASSIGNMENT_IN_PROGRESS,
        _E.NO_REASSIGNMENT_IN_PROGRESS,
    ),
    TopicAlreadyExistsError: (_E.TOPIC_ALREADY_EXISTS,),
    UnknownTopicOrPartitionError: (
        _E.UNKNOWN_TOPIC_OR_PARTITION,
        _E.UNKNOWN_TOPIC_ID,
        _E.INCONSISTENT_TOPIC_ID,
    ),
    LeadershipError: (
        _E.LEADER_NOT_AVAILABLE,
        _E.REPLICA_NOT_AVAILABLE,
        _E.NOT_CONTROLLER,
        _E.FENCED_LEADER_EPOCH,
        _E.UNKNOWN_LEADER_EPOCH,
        _E.PREFERRED_LEADER_NOT_AVAILABLE,
        _E.ELIGIBLE_LEADERS_NOT_AVAILABLE,
        _E.ELECTION_NOT_NEEDED,
    ),
    NotLeaderOrFollowerError: (_E.NOT_LEADER_OR_FOLLOWER,),
    NotEnoughReplicasError: (_E.NOT_ENOUGH_REPLICAS, _E.NOT_ENOUGH_REPLICAS_AFTER_APPEND),
    RecordError: (
        _E.INVALID_RECORD,
        _E.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        _E.INVALID_TIMESTAMP,
        _E.UNSUPPORTED_COMPRESSION_TYPE,
    ),
    CorruptMessageError: (_E.CORRUPT_MESSAGE,),
    MessageTooLargeError: (_E.MESSAGE_TOO_LARGE, _E.RECORD_LIST_TOO_LARGE),
    OffsetError: (
        _E.OFFSET_METADATA_TOO_LARGE,
        _E.INVALID_COMMIT_OFFSET_SIZE,
        _E.OFFSET_MOVED_TO_TIERED_STORAGE,
    ),
    OffsetOutOfRangeError: (_E.OFFSET_OUT_OF_RANGE,),
    OffsetNotAvailableError: (_E.OFFSET_NOT_AVAILABLE, _E.UNSTABLE_OFFSET_COMMIT),
    AuthorizationError: (
        _E.TOPIC_AUTHORIZATION_FAILED,
        _E.GROUP_AUTHORIZATION_FAILED,
        _E.CLUSTER_AUTHORIZATION_FAILED,
        _E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        _E.DELEGATION_TOKEN_AUTHORIZATION_FAILED,
    ),
    SecurityDisabledError: (_E.SECURITY_DISABLED,),
    AuthenticationError: (
        _E.SASL_AUTHENTICATION_FAILED,
        _E.UNSUPPORTED_SASL_MECHANISM,
        _E.ILLEGAL_SASL_STATE,
    ),
    ConfigError: (
        _E.INVALID_CONFIG,
        _E.POLICY_VIOLATION,
        _E.INVALID_REQUIRED_ACKS,
        _E.INVALID_FETCH_SIZE,
        _E.INVALID_SESSION_TIMEOUT,
        _E.INVALID_TRANSACTION_TIMEOUT,
    ),
    InvalidRequestError: (_E.INVALID_REQUEST,),
    UnsupportedVersionError: (_E.UNSUPPORTED_VERSION,),
    ProducerFencedError: (
        _E.INVALID_PRODUCER_EPOCH,
        _E.PRODUCER_FENCED,
        _E.TRANSACTION_COORDINATOR_FENCED,
    ),
    OutOfOrderSequenceError: (_E.OUT_OF_ORDER_SEQUENCE_NUMBER,),
    DuplicateSequenceError: (_E.DUPLICATE_SEQUENCE_NUMBER,),
    UnknownProducerIdError: (_E.UNKNOWN_PRODUCER_ID, _E.INVALID_PRODUCER_ID_MAPPING),
    TransactionError: (
        _E.INVALID_TXN_STATE,
        _E.TRANSACTIONAL_ID_NOT_FOUND,
        _E.TRANSACTION_ABORTABLE,
    ),
    ConcurrentTransactionsError: (_E.CONCURRENT_TRANSACTIONS,),
    CoordinatorError: (
        _E.COORDINATOR_LOAD_IN_PROGRESS,
        _E.COORDINATOR_NOT_AVAILABLE,
        _E.NOT_COORDINATOR,
    ),
    GroupError: (
        _E.ILLEGAL_GENERATION,
        _E.INCONSISTENT_GROUP_PROTOCOL,
        _E.INVALID_GROUP_ID,
        _E.UNKNOWN_MEMBER_ID,
        _E.REBALANCE_IN_PROGRESS,
        _E.NON_EMPTY_GROUP,
        _E.GROUP_ID_NOT_FOUND,
        _E.GROUP_MAX_SIZE_REACHED,
        _E.FENCED_INSTANCE_ID,
        _E.MEMBER_ID_REQUIRED,
        _E.GROUP_SUBSCRIBED_TO_TOPIC,
        _E.FENCED_MEMBER_EPOCH,
        _E.STALE_MEMBER_EPOCH,
        _E.UNRELEASED_INSTANCE_ID,
        _E.UNSUPPORTED_ASSIGNOR,
    ),
    RequestTimedOutError: (_E.REQUEST_TIMED_OUT,),
    NetworkError: (_E.NETWORK_EXCEPTION, _E.LISTENER_NOT_FOUND),
    BrokerNotAvailableError: (_E.BROKER_NOT_AVAILABLE,),
    KafkaStorageError: (_E.KAFKA_STORAGE_ERROR,),
    FetchSessionError: (
        _E.FETCH_SESSION_ID_NOT_FOUND,
        _E.INVALID_FETCH_SESSION_EPOCH,
        _E.FETCH_SESSION_TOPIC_ID_ERROR,
        _E.SHARE_SESSION_NOT_FOUND,
        _E.INVALID_SHARE_SESSION_EPOCH,
    ),
    ThrottlingQuotaExceededError: (_E.THROTTLING_QUOTA_EXCEEDED,),
}
_CLASS_BY_CODE: Final[dict[ErrorCode, type[KafkaError]]] = {
    code: cls for cls, codes in _FAMILIES.items() for code in codes
}


def error_class(code: ErrorCode) -> type[KafkaError]:
    """The exception class for `code` (`BrokerError` for a code without a family)."""
    return _CLASS_BY_CODE.get(code, BrokerError)


def error_for(code: int, message: str | None = None) -> KafkaError:
    """The typed exception for an error code from a response (`code` must not be NONE)."""
    error_code = ErrorCode(code)
    if error_code == ErrorCode.NONE:
        raise ValueError("error code NONE is not an error")
    return error_class(error_code)(error_code, message or "")
