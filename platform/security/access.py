"""What one request may do: the one object every handler asks before acting.

The dispatcher makes one `Access` per request (BrokerContext.access): `ALLOW_ALL` when no
authorizer is configured (Riverbed's default, and Kafka's: every check passes, at the cost of a
method call returning a constant), or an `AclAccess` binding the authorizer to the request's
principal, client address and API name. Handlers check in batches, once per distinct resource
of a request (`denied(...)` over a request's topic names), never per record or partition.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Final

from riverbed.security.acl import (
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    AclOperation,
    ResourceType,
    operations_bitfield,
)
from riverbed.security.authorizer import Authorizer
from riverbed.security.session import Session

_NOTHING: Final[frozenset[str]] = frozenset()
_ALL_OPERATIONS: Final = {
    resource_type: operations_bitfield(operations)
    for resource_type, operations in SUPPORTED_OPERATIONS.items()
}


class Access:
    """Everything allowed: the access of every request while no authorizer is configured."""

    enabled: ClassVar[bool] = False
    __slots__ = ()

    def allows(
        self,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        *,
        log_denied: bool = True,
    ) -> bool:
        """Whether the request may do `operation` on the named resource."""
        return True

    def allows_cluster(self, operation: AclOperation, *, log_denied: bool = True) -> bool:
        return self.allows(operation, ResourceType.CLUSTER, CLUSTER_NAME, log_denied=log_denied)

    def denied(
        self,
        operation: AclOperation,
        resource_type: ResourceType,
        names: Iterable[str],
        *,
        log_denied: bool = True,
    ) -> frozenset[str]:
        """The names among `names` the request may NOT do `operation` on (each checked once)."""
        return _NOTHING

    def allows_any(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether `operation` is allowed on some resource of the type (KIP-679)."""
        return True

    def operations(self, resource_type: ResourceType, name: str) -> int:
        """The authorized-operations bitfield of a resource (every supported one here)."""
        return _ALL_OPERATIONS[resource_type]


ALLOW_ALL: Final = Access()


class AclAccess(Access):
    """A request's access under the ACL authorizer."""

    enabled: ClassVar[bool] = True
    __slots__ = ("_api", "_authorizer", "_host", "_principal")

    def __init__(self, authorizer: Authorizer, session: Session, api: str) -> None:
        self._authorizer = authorizer
        self._principal = str(session.principal)
        self._host = session.client_host
        self._api = api

    def allows(
        self,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        *,
        log_denied: bool = True,
    ) -> bool:
        return self._authorizer.authorize(
            self._principal,
            self._host,
            operation,
            resource_type,
            name,
            api=self._api,
            log_denied=log_denied,
        )

    def denied(
        self,
        operation: AclOperation,
        resource_type: ResourceType,
        names: Iterable[str],
        *,
        log_denied: bool = True,
    ) -> frozenset[str]:
        return frozenset(
            name
            for name in set(names)
            if not self.allows(operation, resource_type, name, log_denied=log_denied)
        )

    def allows_any(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        return self._authorizer.authorize_any(
            self._principal, self._host, operation, resource_type, api=self._api
        )

    def operations(self, resource_type: ResourceType, name: str) -> int:
        return self._authorizer.authorized_operations(
            self._principal, self._host, resource_type, name
        )
