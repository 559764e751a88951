"""AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions and ListTransactions.

Each is a thin route to the transaction coordinator (riverbed.broker.transactions.coordinator),
which raises the KafkaError a client must see; here it becomes each API's error response.
(InitProducerId with a transactional id is in init_producer_id.py, FindCoordinator's transaction
keys in find_coordinator.py.)

Authorization, as in Kafka's KafkaApis: AddPartitionsToTxn, AddOffsetsToTxn and EndTxn need WRITE
on the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); AddPartitionsToTxn also WRITE on
each topic (TOPIC_AUTHORIZATION_FAILED, always for the internal topics) and AddOffsetsToTxn READ
on the group (GROUP_AUTHORIZATION_FAILED). DescribeTransactions needs DESCRIBE on each id and
shows only the topics the principal may DESCRIBE; ListTransactions lists only the ids it may
DESCRIBE.

Clients before the versions that know PRODUCER_FENCED (InitProducerId v4, the others v2) get
INVALID_PRODUCER_EPOCH instead, which they handle the same way.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Final

from riverbed.broker.groups.offsets_topic import OFFSETS_TOPIC, partition_for
from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.transactions.coordinator import TRANSACTION_STATE_TOPIC
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.record_types import TopicPartition
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

# The first version of each API that carries PRODUCER_FENCED (older ones get
# INVALID_PRODUCER_EPOCH).
PRODUCER_FENCED_SINCE_VERSION: Final = 2
INTERNAL_TOPICS: Final = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})

TopicResult = m.AddPartitionsToTxnResponse.TopicResult
PartitionResult = m.AddPartitionsToTxnResponse.PartitionResult
DescribedState = m.DescribeTransactionsResponse.TransactionState
TopicData = m.DescribeTransactionsResponse.TopicData
ListedState = m.ListTransactionsResponse.TransactionState


def client_code(
    code: ErrorCode, version: int, fenced_since: int = PRODUCER_FENCED_SINCE_VERSION
) -> int:
    """`code` as a client of `version` understands it."""
    if code == ErrorCode.PRODUCER_FENCED and version < fenced_since:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code


def _may_write(access: Access, transactional_id: str) -> bool:
    return access.allows(AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)


# -- AddPartitionsToTxn -------------------------------------------------------------------------


async def handle_add_partitions_to_txn(
    ctx: BrokerContext, request: m.AddPartitionsToTxnRequest, version: int, access: Access
) -> m.AddPartitionsToTxnResponse:
    transactional_id = request.v3_and_below_transactional_id
    partitions = [
        TopicPartition(topic.name, index)
        for topic in request.v3_and_below_topics
        for index in topic.partitions
    ]
    if not _may_write(access, transactional_id):
        codes = dict.fromkeys(partitions, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        return _add_partitions_response(codes)
    codes = _refused_partitions(ctx, access, partitions)
    if codes:
        # Any refused partition fails the whole request: the rest were not attempted.
        codes = dict.fromkeys(partitions, ErrorCode.OPERATION_NOT_ATTEMPTED) | codes
        return _add_partitions_response(codes)
    try:
        await ctx.transactions.add_partitions(
            transactional_id,
            request.v3_and_below_producer_id,
            request.v3_and_below_producer_epoch,
            partitions,
        )
        code = ErrorCode.NONE
    except KafkaError as error:
        code = error.code
    return _add_partitions_response(dict.fromkeys(partitions, client_code(code, version)))


def _refused_partitions(
    ctx: BrokerContext, access: Access, partitions: Collection[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    refused: dict[TopicPartition, ErrorCode] = {}
    allowed_topics: dict[str, bool] = {}
    for tp in partitions:
        allowed = allowed_topics.get(tp.topic)
        if allowed is None:
            # Kafka leaves internal topics out of the authorized set: a client cannot add them
            # (the offsets partition comes with AddOffsetsToTxn), with or without an authorizer.
            allowed = tp.topic not in INTERNAL_TOPICS and access.allows(
                AclOperation.WRITE, ResourceType.TOPIC, tp.topic
            )
            allowed_topics[tp.topic] = allowed
        if not allowed:
            refused[tp] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        elif ctx.cache.partition(tp.topic, tp.partition) is None:
            refused[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return refused


def _add_partitions_response(codes: Mapping[TopicPartition, int]) -> m.AddPartitionsToTxnResponse:
    by_topic: dict[str, list[PartitionResult]] = {}
    for tp, code in codes.items():
        by_topic.setdefault(tp.topic, []).append(
            PartitionResult(partition_index=tp.partition, partition_error_code=code)
        )
    return m.AddPartitionsToTxnResponse(
        results_by_topic_v3_and_below=[
            TopicResult(name=name, results_by_partition=results)
            for name, results in by_topic.items()
        ]
    )


# -- AddOffsetsToTxn ----------------------------------------------------------------------------


async def handle_add_offsets_to_txn(
    ctx: BrokerContext, request: m.AddOffsetsToTxnRequest, version: int, access: Access
) -> m.AddOffsetsToTxnResponse:
    """The group's __consumer_offsets partition joins the transaction (its TxnOffsetCommit goes
    there, and the markers then commit or drop the offsets)."""
    if not _may_write(access, request.transactional_id):
        return m.AddOffsetsToTxnResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not access.allows(AclOperation.READ, ResourceType.GROUP, request.group_id):
        return m.AddOffsetsToTxnResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    offsets_topic = ctx.cache.topic(OFFSETS_TOPIC)
    count = (
        len(offsets_topic.partitions)
        if offsets_topic is not None
        else ctx.config.offsets_topic_num_partitions
    )
    partition = TopicPartition(OFFSETS_TOPIC, partition_for(request.group_id, count))
    try:
        await ctx.transactions.add_partitions(
            request.transactional_id, request.producer_id, request.producer_epoch, [partition]
        )
        code = ErrorCode.NONE
    except KafkaError as error:
        code = error.code
    return m.AddOffsetsToTxnResponse(error_code=client_code(code, version))


# -- EndTxn -------------------------------------------------------------------------------------


async def handle_end_txn(
    ctx: BrokerContext, request: m.EndTxnRequest, version: int, access: Access
) -> m.EndTxnResponse:
    if not _may_write(access, request.transactional_id):
        return m.EndTxnResponse(error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    try:
        await ctx.transactions.end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch, request.committed
        )
        code = ErrorCode.NONE
    except KafkaError as error:
        code = error.code
    return m.EndTxnResponse(error_code=client_code(code, version))


# -- DescribeTransactions / ListTransactions ----------------------------------------------------


async def handle_describe_transactions(
    ctx: BrokerContext, request: m.DescribeTransactionsRequest, access: Access
) -> m.DescribeTransactionsResponse:
    return m.DescribeTransactionsResponse(
        transaction_states=[
            _describe(ctx, transactional_id, access)
            for transactional_id in request.transactional_ids
        ]
    )


def _describe(ctx: BrokerContext, transactional_id: str, access: Access) -> DescribedState:
    if not access.allows(AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        return DescribedState(
            transactional_id=transactional_id,
            error_code=ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        )
    try:
        metadata = ctx.transactions.describe(transactional_id)
    except KafkaError as error:
        return DescribedState(transactional_id=transactional_id, error_code=error.code)
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(metadata.partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return DescribedState(
        error_code=ErrorCode.NONE,
        transactional_id=transactional_id,
        transaction_state=metadata.state.kafka_name,
        transaction_timeout_ms=metadata.timeout_ms,
        transaction_start_time_ms=metadata.start_timestamp_ms,
        producer_id=metadata.producer_id,
        producer_epoch=metadata.producer_epoch,
        topics=[
            TopicData(topic=topic, partitions=indexes)
            for topic, indexes in by_topic.items()
            if access.allows(AclOperation.DESCRIBE, ResourceType.TOPIC, topic)
        ],
    )


async def handle_list_transactions(
    ctx: BrokerContext, request: m.ListTransactionsRequest, access: Access
) -> m.ListTransactionsResponse:
    try:
        listed = ctx.transactions.list_transactions(
            request.state_filters, request.producer_id_filters, request.duration_filter
        )
    except KafkaError as error:
        return m.ListTransactionsResponse(error_code=error.code)
    return m.ListTransactionsResponse(
        error_code=ErrorCode.NONE,
        unknown_state_filters=listed.unknown_state_filters,
        transaction_states=[
            ListedState(
                transactional_id=metadata.transactional_id,
                producer_id=metadata.producer_id,
                transaction_state=metadata.state.kafka_name,
            )
            for metadata in listed.transactions
            if access.allows(
                AclOperation.DESCRIBE,
                ResourceType.TRANSACTIONAL_ID,
                metadata.transactional_id,
                log_denied=False,
            )
        ],
    )
