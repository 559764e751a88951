"""DescribeCluster (KIP-700): the cluster id, the controller and the brokers, with their racks,
for admin clients' describe_cluster(); the same view of the cluster as Metadata's
(`cluster_view`).

- Endpoint types (KIP-919, v1+): Riverbed's brokers are its only endpoints (ZooKeeper holds the
  metadata: there are no KRaft controllers to list). A request for controllers (2) gets
  MISMATCHED_ENDPOINT_TYPE, as a Kafka broker answers it; any other unknown type
  UNSUPPORTED_ENDPOINT_TYPE. v0 has no EndpointType field: it decodes as brokers (1).
- Fenced brokers (KIP-1073, v2): no Riverbed broker is ever fenced. A broker is listed from its
  ZooKeeper registration, an ephemeral znode that exists only while the broker's session lives
  (as Kafka's ZooKeeper-mode brokers were), so IncludeFencedBrokers adds nobody and IsFenced is
  always false.
- The controller id is -1 when the controller is not among the brokers listed (it has no
  endpoint on the request's listener, or none is elected), as Kafka answers: a client looks the
  controller up in that list.
- Authorization as Kafka's KafkaApis: describing the cluster needs no ACL;
  ClusterAuthorizedOperations, when asked for, is 0 without DESCRIBE on the cluster.
"""

from __future__ import annotations

from typing import Final

from riverbed.broker.handlers.cluster_view import brokers_on, cluster_authorized_operations
from riverbed.broker.handlers.context import BrokerContext
from riverbed.coordination.metadata_cache import MetadataCache
from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.security.access import Access

Broker = m.DescribeClusterResponse.DescribeClusterBroker

# KIP-919's endpoint types (Kafka's EndpointType ids).
BROKER_ENDPOINTS: Final = 1
CONTROLLER_ENDPOINTS: Final = 2


async def handle_describe_cluster(
    ctx: BrokerContext, request: m.DescribeClusterRequest, access: Access, listener: str
) -> m.DescribeClusterResponse:
    return describe_cluster(ctx.cache, request, access, listener)


def describe_cluster(
    cache: MetadataCache, request: m.DescribeClusterRequest, access: Access, listener: str
) -> m.DescribeClusterResponse:
    """The answer from this broker's metadata cache; `listener` is the name of the listener the
    request came in on (each broker is described by its address there)."""
    if request.endpoint_type == CONTROLLER_ENDPOINTS:
        return m.DescribeClusterResponse(
            error_code=ErrorCode.MISMATCHED_ENDPOINT_TYPE,
            error_message="the request was sent to a broker, but asks for controllers",
        )
    if request.endpoint_type != BROKER_ENDPOINTS:
        return m.DescribeClusterResponse(
            error_code=ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
            error_message=f"unsupported endpoint type {request.endpoint_type}",
        )
    operations = cluster_authorized_operations(
        access, requested=request.include_cluster_authorized_operations
    )
    brokers = [
        Broker(broker_id=b.broker_id, host=b.host, port=b.port, rack=b.rack, is_fenced=False)
        for b in brokers_on(listener, cache.brokers())
    ]
    controller_id = cache.controller_id
    if controller_id is None or all(b.broker_id != controller_id for b in brokers):
        controller_id = -1
    return m.DescribeClusterResponse(
        error_code=ErrorCode.NONE,
        endpoint_type=BROKER_ENDPOINTS,
        # The metadata watcher reads the id into the cache before the broker serves; the field
        # is not nullable.
        cluster_id=cache.cluster_id or "",
        controller_id=controller_id,
        brokers=brokers,
        cluster_authorized_operations=operations,
    )
