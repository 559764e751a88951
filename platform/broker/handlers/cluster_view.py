"""The cluster itself, as Metadata and DescribeCluster both describe it: the brokers a client
can reach on the listener it came in on, and the cluster's authorized operations.

Pure functions of the metadata cache's registrations and the request's access, so the two APIs
cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from riverbed.coordination.layout import BrokerRegistration
from riverbed.security.access import Access
from riverbed.security.acl import CLUSTER_NAME, AclOperation, ResourceType

# Kafka's "authorized operations not requested" marker (INT32_MIN), the schemas' default.
OPERATIONS_NOT_REQUESTED: Final = -(2**31)


@dataclass(frozen=True, slots=True)
class ListedBroker:
    """A broker at its address on one listener."""

    broker_id: int
    host: str
    port: int
    rack: str | None


def brokers_on(listener: str, brokers: Mapping[int, BrokerRegistration]) -> list[ListedBroker]:
    """The brokers with an endpoint on `listener`, by id, each at its address there: a client is
    told the addresses of the listener it came in on, and a broker without one is left out
    (Kafka's rule)."""
    listed = []
    for broker in sorted(brokers.values(), key=lambda b: b.broker_id):
        endpoint = broker.endpoint(listener)
        if endpoint is not None:
            host, port = endpoint
            listed.append(ListedBroker(broker.broker_id, host, port, broker.rack))
    return listed


def cluster_authorized_operations(access: Access, *, requested: bool) -> int:
    """The ClusterAuthorizedOperations bitfield: the marker unless `requested`; 0 without
    DESCRIBE on the cluster (Kafka checks it first, and logs the refusal); else every operation
    the ACLs allow on it (all of them without an authorizer)."""
    if not requested:
        return OPERATIONS_NOT_REQUESTED
    if not access.allows_cluster(AclOperation.DESCRIBE):
        return 0
    return access.operations(ResourceType.CLUSTER, CLUSTER_NAME)
