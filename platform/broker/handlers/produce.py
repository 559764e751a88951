"""Produce: validate each batch's header and CRC, assign offsets in place, append.

The broker never decodes records here (the hot-path rule): `validate_records` reads batch headers
and checks CRCs, `Partition.append_as_leader` rewrites base offsets in place and writes the bytes.

acks=all: refused up front with NOT_ENOUGH_REPLICAS when the ISR is smaller than
`min.insync.replicas`; otherwise every partition's append is parked until the high watermark
passes it (all ISR members have it) — all partitions of the request wait together, up to the
request's `timeout_ms` — and the answer is NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR shrank
below the minimum meanwhile. acks=1 answers after the leader's own append.

The wait is callbacks on the commit futures and one timer, like Kafka's delayed produce: no task
or coroutine per request, on the path of every acks=all answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from riverbed.broker.handlers.context import BrokerContext
from riverbed.common.log_events import event
from riverbed.hot.replication.partitions import Partition
from riverbed.hot.storage.log import AppendResult
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.protocol.records import validate_records
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation, ResourceType

TopicResponse = m.ProduceResponse.TopicProduceResponse
PartitionResponse = m.ProduceResponse.PartitionProduceResponse

ACKS_NONE: Final = 0
ACKS_LEADER: Final = 1
ACKS_ALL: Final = -1
# The longest an acks=all request may wait for its followers, whatever the client asks.
PRODUCE_TIMEOUT_MS_MAX: Final = 300_000
# Rejections of what a client sent (logged at WARNING; other errors are routine, at DEBUG).
REJECTED_INPUT: Final = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.INVALID_RECORD,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.RECORD_LIST_TOO_LARGE,
        ErrorCode.INVALID_TIMESTAMP,
        ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
        ErrorCode.INVALID_REQUIRED_ACKS,
    }
)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    """An acks=all append waiting for its commit."""

    response: PartitionResponse
    partition: Partition
    committed: asyncio.Future[None]


async def handle_produce(
    ctx: BrokerContext, request: m.ProduceRequest, access: Access
) -> m.ProduceResponse | asyncio.Future[m.ProduceResponse] | None:
    """Append every partition's batches now (in request order: nothing awaits before the
    appends). The response, or — for acks=all appends still waiting for their followers — its
    future, so the connection can go on to its next request meanwhile.
    Topics the principal may not WRITE get TOPIC_AUTHORIZATION_FAILED (checked once per topic),
    every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED if it may not WRITE the request's
    transactional id, as in Kafka."""
    responses = []
    pending: list[_Pending] = []
    denied = _denied_topics(request, access)
    for topic in request.topic_data:
        partition_responses = []
        refused = denied.get(topic.name)
        for data in topic.partition_data:
            if refused is not None:
                partition_responses.append(_error_response(data.index, refused))
                continue
            response, appended = _produce_partition(
                ctx, request.acks, topic.name, data.index, data.records
            )
            partition_responses.append(response)
            if appended is not None and request.acks == ACKS_ALL:
                partition, end_offset = appended
                committed = partition.committed(end_offset)
                pending.append(_Pending(response, partition, committed))
        responses.append(TopicResponse(name=topic.name, partition_responses=partition_responses))
    if request.acks == ACKS_NONE:
        # acks=0: the client expects no response at all (errors are only visible in logs).
        return None
    produce_response = m.ProduceResponse(responses=responses)
    if any(not item.committed.done() for item in pending):
        timeout_ms = min(max(request.timeout_ms, 0), PRODUCE_TIMEOUT_MS_MAX)
        return _respond_when_committed(ctx, produce_response, pending, timeout_ms)
    # Committed already (the ISR is the leader alone, or the followers were ahead): answered
    # now, without a wait.
    _settle(pending, 0)
    return produce_response


def _denied_topics(request: m.ProduceRequest, access: Access) -> dict[str, KafkaError]:
    """The error of each topic of `request` the principal may not produce to."""
    if not access.enabled:
        return {}
    names = [topic.name for topic in request.topic_data]
    transactional_id = request.transactional_id
    if transactional_id is not None and not access.allows(
        AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id
    ):
        refused = KafkaError(
            ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            f"not authorized to write as transactional id {transactional_id!r}",
        )
        return dict.fromkeys(names, refused)
    return {
        name: KafkaError(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"not authorized to write {name!r}")
        for name in access.denied(AclOperation.WRITE, ResourceType.TOPIC, names)
    }


def _respond_when_committed(
    ctx: BrokerContext, response: m.ProduceResponse, pending: list[_Pending], timeout_ms: int
) -> asyncio.Future[m.ProduceResponse]:
    """The future of `response`, resolved once each pending append is settled into it."""
    responded: asyncio.Future[m.ProduceResponse] = asyncio.get_running_loop().create_future()
    metrics = ctx.metrics
    metrics.produce_purgatory_size += 1

    def answer() -> None:
        metrics.produce_purgatory_size -= 1
        if not responded.done():  # else the connection ended: nobody waits for it
            responded.set_result(response)

    when_committed(pending, timeout_ms, answer)
    return responded


def _produce_partition(
    ctx: BrokerContext, acks: int, topic: str, index: int, records: object
) -> tuple[PartitionResponse, tuple[Partition, int] | None]:
    """Append one partition's batches; the response, and the partition with the offset its HW
    must reach for the append to count as committed (None after an error)."""
    try:
        if acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
            raise KafkaError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks={acks} is not 0, 1 or -1")
        partition = ctx.leader_partition(topic, index)
        if not isinstance(records, memoryview) or len(records) == 0:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "produce request carries no record batch")
        headers = validate_records(records, partition.log.config.max_message_bytes)
        if acks == ACKS_ALL and partition.under_min_isr():
            raise KafkaError(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"{partition}: {len(partition.isr)} in-sync replicas, "
                f"min.insync.replicas is {partition.min_insync_replicas}",
            )
        now_ms = ctx.now_ms()
        result = partition.append_as_leader(records, headers, now_ms)
    except KafkaError as error:
        # Bad input is worth a line; what clients retry (a moved leader, ...) would flood.
        level = logging.WARNING if error.code in REJECTED_INPUT else logging.DEBUG
        event(
            log,
            level,
            "client.produce_rejected",
            topic=topic,
            partition=index,
            error=error.code.name,
            message=error.message,
        )
        return _error_response(index, error), None
    if isinstance(result, AppendResult):  # not a retried duplicate, which appended nothing
        traffic = ctx.metrics.traffic_in(topic)
        traffic.bytes.inc(len(records))
        traffic.records.inc(result.last_offset - result.first_offset + 1)
    response = PartitionResponse(
        index=index,
        error_code=ErrorCode.NONE,
        base_offset=result.first_offset,
        log_append_time_ms=now_ms if partition.log_append_time else -1,
        log_start_offset=partition.log.log_start_offset,
    )
    # A retried duplicate waits for its original offsets, as Kafka's delayed produce does.
    return response, (partition, result.last_offset + 1)


class _NotCommittedInTime(Exception):
    """Set on an append's commit future when its request's timeout_ms has passed."""


def when_committed(pending: list[_Pending], timeout_ms: int, then: Callable[[], None]) -> None:
    """Call `then()` once every pending append is committed, failed, or out of time (at most
    `timeout_ms` from now), each one's outcome settled into its response by then.

    The timer fails the commit futures still waiting; either way each future's done-callback
    counts it, and the last one settles. A future that is done already counts at once.
    """
    waiting = [item.committed for item in pending if not item.committed.done()]
    if not waiting:
        _settle(pending, timeout_ms)
        then()
        return
    timer = asyncio.get_running_loop().call_later(timeout_ms / 1000, _expire, pending)
    left = len(waiting)

    def one_done(_future: asyncio.Future[None]) -> None:
        nonlocal left
        left -= 1
        if left == 0:
            timer.cancel()
            _settle(pending, timeout_ms)
            then()

    for future in waiting:
        future.add_done_callback(one_done)


def _expire(pending: list[_Pending]) -> None:
    for item in pending:
        if not item.committed.done():
            item.committed.set_exception(_NotCommittedInTime())


def _settle(pending: list[_Pending], timeout_ms: int) -> None:
    """Each pending append's outcome in its response (every commit future is done): committed,
    or why not."""
    for item in pending:
        error = item.committed.exception()
        if isinstance(error, _NotCommittedInTime):
            message = f"{item.partition}: not replicated to the ISR within {timeout_ms} ms"
            _fail(item, KafkaError(ErrorCode.REQUEST_TIMED_OUT, message))
        elif isinstance(error, KafkaError):
            _fail(item, error)
        elif item.partition.under_min_isr():
            message = (
                f"{item.partition}: the ISR shrank below min.insync.replicas "
                f"({item.partition.min_insync_replicas}) after the append"
            )
            _fail(item, KafkaError(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, message))


def _fail(item: _Pending, error: KafkaError) -> None:
    item.response.error_code = error.code
    item.response.error_message = str(error)


def _error_response(index: int, error: KafkaError) -> PartitionResponse:
    return PartitionResponse(
        index=index, error_code=error.code, base_offset=-1, error_message=error.message or None
    )
