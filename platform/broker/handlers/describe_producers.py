"""DescribeProducers (API 61, KIP-664): the active producers of partitions, from the producer
state of their leaders, as Kafka answers it: READ on the topic (TOPIC_AUTHORIZATION_FAILED),
UNKNOWN_TOPIC_OR_PARTITION / NOT_LEADER_OR_FOLLOWER per partition. A producer's open
transaction shows as its first offset here (CurrentTxnStartOffset): what finds a hanging one."""

from __future__ import annotations

from riverbed.broker.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

TopicResponse = m.DescribeProducersResponse.TopicResponse
PartitionResponse = m.DescribeProducersResponse.PartitionResponse
ProducerState = m.DescribeProducersResponse.ProducerState


async def handle_describe_producers(
    ctx: BrokerContext, request: m.DescribeProducersRequest, access: Access
) -> m.DescribeProducersResponse:
    denied = access.denied(AclOperation.READ, ResourceType.TOPIC, (t.name for t in request.topics))
    topics = []
    for topic in request.topics:
        partitions = []
        for index in topic.partition_indexes:
            response = PartitionResponse(partition_index=index)
            partitions.append(response)
            if topic.name in denied:
                response.error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                partition = ctx.leader_partition(topic.name, index)
            except KafkaError as error:
                response.error_code = error.code
                response.error_message = error.message or None
                continue
            response.active_producers = [
                ProducerState(
                    producer_id=entry.producer_id,
                    producer_epoch=entry.epoch,
                    last_sequence=entry.last_seq,
                    last_timestamp=entry.last_timestamp_ms,
                    coordinator_epoch=entry.coordinator_epoch,
                    current_txn_start_offset=entry.current_txn_first_offset,
                )
                for entry in partition.producer_state.producers()
            ]
        topics.append(TopicResponse(name=topic.name, partitions=partitions))
    return m.DescribeProducersResponse(topics=topics)
