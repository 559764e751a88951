"""WriteTxnMarkers (API 27): a transaction coordinator asks this broker to end a transaction in
the partitions it leads, by appending a COMMIT or ABORT marker to each (KIP-98).

As Kafka's KafkaApis/ReplicaManager handle it:
- the request is inter-broker: CLUSTER_ACTION on the Cluster resource, else every partition gets
  CLUSTER_AUTHORIZATION_FAILED;
- per partition: UNKNOWN_TOPIC_OR_PARTITION if the topic or partition does not exist,
  NOT_LEADER_OR_FOLLOWER if this broker does not lead it, NOT_ENOUGH_REPLICAS if its ISR is
  below min.insync.replicas (markers are written with acks=all), then the producer state's
  checks (INVALID_PRODUCER_EPOCH, TRANSACTION_COORDINATOR_FENCED);
- the answer waits until every appended marker is committed (the HW passes it), at most
  WRITE_TXN_MARKERS_TIMEOUT_MS: REQUEST_TIMED_OUT for those that are not by then. The
  coordinator retries what failed; an appended but uncommitted marker written again is a
  marker for a transaction already ended here, which changes nothing;
- a committed marker on a `__consumer_offsets` partition ends the transaction's pending offset
  commits in the group coordinator (`GroupCoordinator.complete_transaction`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Final

from riverbed.broker.groups.offsets_topic import OFFSETS_TOPIC
from riverbed.broker.handlers.context import BrokerContext
from riverbed.hot.replication.partitions import Partition
from riverbed.protocol import messages as m
from riverbed.protocol.control_records import ControlType
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation

MarkerResult = m.WriteTxnMarkersResponse.WritableTxnMarkerResult
TopicResult = m.WriteTxnMarkersResponse.WritableTxnMarkerTopicResult
PartitionResult = m.WriteTxnMarkersResponse.WritableTxnMarkerPartitionResult

# How long the answer waits for the markers to be replicated to the ISR: Kafka's default
# request.timeout.ms, which bounds its coordinator's wait for this answer too.
WRITE_TXN_MARKERS_TIMEOUT_MS: Final = 30_000


@dataclass(slots=True)
class _Appended:
    """A marker appended here, waiting for its commit."""

    result: PartitionResult
    partition: Partition
    producer_id: int
    committed: bool  # COMMIT (True) or ABORT
    done: asyncio.Future[None]


async def handle_write_txn_markers(
    ctx: BrokerContext, request: m.WriteTxnMarkersRequest, access: Access
) -> m.WriteTxnMarkersResponse:
    allowed = access.allows_cluster(AclOperation.CLUSTER_ACTION)
    markers = []
    appended: list[_Appended] = []
    for marker in request.markers:
        control_type = ControlType.COMMIT if marker.transaction_result else ControlType.ABORT
        topics = []
        for topic in marker.topics:
            results = []
            for index in topic.partition_indexes:
                result = PartitionResult(partition_index=index)
                results.append(result)
                if not allowed:
                    result.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
                    continue
                try:
                    partition = _append(ctx, topic.name, index, marker, control_type)
                except KafkaError as error:
                    result.error_code = error.code
                    continue
                done = partition.committed(partition.log.log_end_offset)
                appended.append(
                    _Appended(
                        result,
                        partition,
                        marker.producer_id,
                        control_type == ControlType.COMMIT,
                        done,
                    )
                )
            topics.append(TopicResult(name=topic.name, partitions=results))
        markers.append(MarkerResult(producer_id=marker.producer_id, topics=topics))
    if appended:
        await _wait_committed(ctx, appended)
    return m.WriteTxnMarkersResponse(markers=markers)


def _append(
    ctx: BrokerContext,
    topic: str,
    index: int,
    marker: m.WriteTxnMarkersRequest.WritableTxnMarker,
    control_type: ControlType,
) -> Partition:
    partition = ctx.leader_partition(topic, index)
    if partition.under_min_isr():
        raise KafkaError(
            ErrorCode.NOT_ENOUGH_REPLICAS,
            f"{partition}: {len(partition.isr)} in-sync replicas, "
            f"min.insync.replicas is {partition.min_insync_replicas}",
        )
    partition.append_txn_marker(
        marker.producer_id,
        marker.producer_epoch,
        marker.coordinator_epoch,
        control_type,
        ctx.now_ms(),
    )
    return partition


async def _wait_committed(ctx: BrokerContext, appended: list[_Appended]) -> None:
    """Wait for the markers' commits (one bound for all); settle each result, and hand each
    committed marker of `__consumer_offsets` to the group coordinator."""
    pending = [item.done for item in appended if not item.done.done()]
    if pending:
        await asyncio.wait(pending, timeout=WRITE_TXN_MARKERS_TIMEOUT_MS / 1000)
    for item in appended:
        if not item.done.done():
            item.done.cancel()
            item.result.error_code = ErrorCode.REQUEST_TIMED_OUT
            continue
        error = item.done.exception()
        if isinstance(error, KafkaError):
            item.result.error_code = error.code
            continue
        if error is not None:
            raise error
        if item.partition.topic == OFFSETS_TOPIC:
            ctx.groups.complete_transaction(item.partition.index, item.producer_id, item.committed)
