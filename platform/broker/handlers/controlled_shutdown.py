"""ControlledShutdown: a broker being stopped asks the controller to move its leaderships away.

Answered by the active controller only (NOT_CONTROLLER elsewhere, so the broker finds the new
one); the response lists the replicated partitions the broker still leads because no other
replica is in sync. The broker retries while any remain, then stops anyway (Kafka's
controlled.shutdown.max.retries). The controller's ZooKeeper work is bounded by the session
timeout (REQUEST_TIMED_OUT after it): while ZooKeeper is down, each attempt of a stopping broker
ends then, instead of when ZooKeeper is back or the broker's own 30 s socket timeout passes.
"""

from __future__ import annotations

from riverbed.broker.handlers.context import BrokerContext
from riverbed.broker.handlers.zookeeper_bound import zookeeper_bound
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.security.access import Access
from riverbed.security.acl import AclOperation

RemainingPartition = m.ControlledShutdownResponse.RemainingPartition


async def handle_controlled_shutdown(
    ctx: BrokerContext, request: m.ControlledShutdownRequest, access: Access
) -> m.ControlledShutdownResponse:
    """Only for brokers: needs CLUSTER_ACTION on the cluster (CLUSTER_AUTHORIZATION_FAILED)."""
    if not access.allows_cluster(AclOperation.CLUSTER_ACTION):
        return m.ControlledShutdownResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    if ctx.controller is None:
        return m.ControlledShutdownResponse(error_code=ErrorCode.NOT_CONTROLLER)
    try:
        async with zookeeper_bound(
            ctx.config,
            f"moving broker {request.broker_id}'s leaderships away",
            waiting_for="the controller",
        ):
            remaining = await ctx.controller.controlled_shutdown(request.broker_id)
    except KafkaError as error:
        return m.ControlledShutdownResponse(error_code=error.code)
    return m.ControlledShutdownResponse(
        error_code=ErrorCode.NONE,
        remaining_partitions=[
            RemainingPartition(topic_name=topic, partition_index=index)
            for topic, index in remaining
        ],
    )
