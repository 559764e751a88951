"""Produce: validate each batch's header and CRC, assign offsets in place, append.

The broker never decodes records here (the hot-path rule): `validate_records` reads batch headers
and checks CRCs, `Partition.append_as_leader` rewrites base offsets in place and writes the bytes.
"""

from __future__ import annotations

from riverbed.hot.handlers.context import BrokerContext
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records import validate_records

TopicResponse = m.ProduceResponse.TopicProduceResponse
PartitionResponse = m.ProduceResponse.PartitionProduceResponse

ACKS_NONE = 0
ACKS_LEADER = 1
ACKS_ALL = -1


async def handle_produce(ctx: BrokerContext, request: m.ProduceRequest) -> m.ProduceResponse | None:
    responses = []
    for topic in request.topic_data:
        partition_responses = [
            _produce_partition(ctx, request.acks, topic.name, data.index, data.records)
            for data in topic.partition_data
        ]
        responses.append(TopicResponse(name=topic.name, partition_responses=partition_responses))
    if request.acks == ACKS_NONE:
        # acks=0: the client expects no response at all (errors are only visible in logs).
        return None
    return m.ProduceResponse(responses=responses)


def _produce_partition(
    ctx: BrokerContext, acks: int, topic: str, index: int, records: object
) -> PartitionResponse:
    try:
        if acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
            raise KafkaError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks={acks} is not 0, 1 or -1")
        partition = ctx.leader_partition(topic, index)
        if not isinstance(records, memoryview) or len(records) == 0:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "produce request carries no record batch")
        headers = validate_records(records, partition.log.config.max_message_bytes)
        now_ms = ctx.now_ms()
        result = partition.append_as_leader(records, headers, now_ms)
    except KafkaError as error:
        return PartitionResponse(
            index=index, error_code=error.code, base_offset=-1, error_message=str(error)
        )
    return PartitionResponse(
        index=index,
        error_code=ErrorCode.NONE,
        base_offset=result.first_offset,
        log_append_time_ms=now_ms if partition.log_append_time else -1,
        log_start_offset=partition.log.log_start_offset,
    )
