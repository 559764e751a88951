"""Authorization decisions: may this principal, from this host, do this operation on this
resource? Pure logic over an AclSnapshot (no I/O; the snapshot comes from the broker's ACL cache).

The rules are Kafka's AclAuthorizer's:

1. A super user (`super.users`) may do everything.
2. The ACLs that apply to a resource are those of its literal pattern, of its type's `*`
   wildcard and of every prefixed pattern its name starts with.
3. No such ACL at all: allowed only if `allow.everyone.if.no.acl.found` (default false).
4. Otherwise a matching DENY refuses, whatever allows it; else a matching ALLOW permits.
   An ACL matches when its principal is the caller's or `User:*`, its host the caller's address
   or `*`, and its operation the one asked or ALL.
5. ALLOWs imply: READ, WRITE, DELETE or ALTER allow DESCRIBE; ALTER_CONFIGS allows
   DESCRIBE_CONFIGS. DENYs imply nothing (a DENY of READ does not deny DESCRIBE).

`authorize_any` answers KIP-679's question (may the caller WRITE *some* topic?) as
AclAuthorizer.authorizeByResourceType does. A refusal of something the client asked for is
logged at INFO (`authorizer.denied`, Kafka's authorizer logger does the same), an allowed
access at DEBUG; checks that only filter (listing all topics, authorized-operation bitfields)
log nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from riverbed.common.log_events import event
from riverbed.security.acl import (
    SUPPORTED_OPERATIONS,
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    operations_bitfield,
)
from riverbed.security.acl_snapshot import AclSnapshot

log = logging.getLogger(__name__)

_O = AclOperation
_ALLOW, _DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
# Rule 5: the operations whose ALLOW grants each operation (ALL grants everything).
_GRANTED_BY: Final[dict[AclOperation, frozenset[AclOperation]]] = {
    op: frozenset({op, _O.ALL}) for op in AclOperation
} | {
    _O.DESCRIBE: frozenset({_O.DESCRIBE, _O.READ, _O.WRITE, _O.DELETE, _O.ALTER, _O.ALL}),
    _O.DESCRIBE_CONFIGS: frozenset({_O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS, _O.ALL}),
}
# Decisions remembered per snapshot before the memo is emptied (each ~200 bytes).
DECISIONS_MAX: Final = 100_000
# (principal, host, operation, resource type, resource name)
_Asked = tuple[str, str, AclOperation, ResourceType, str]
# What a DENY of each operation refuses, and what KIP-679's check counts: that operation, or ALL.
_OPERATION_OR_ALL: Final[dict[AclOperation, frozenset[AclOperation]]] = {
    op: frozenset({op, _O.ALL}) for op in AclOperation
}


@dataclass(frozen=True, slots=True)
class AuthorizerSettings:
    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False


class Authorizer:
    """Decides from `snapshot()`, the ACL cache's current snapshot, read once per decision.

    Decisions are remembered per snapshot (snapshots never change, so neither do their
    answers): a client repeating the same request is answered by one dict lookup. The memo is
    dropped when the snapshot is replaced, and emptied when it reaches DECISIONS_MAX.
    """

    def __init__(self, settings: AuthorizerSettings, snapshot: Callable[[], AclSnapshot]) -> None:
        self.settings = settings
        self._snapshot = snapshot
        self._decisions: dict[_Asked, bool] = {}
        self._decided_on: AclSnapshot | None = None

    def authorize(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
        *,
        api: str = "",
        log_denied: bool = True,
    ) -> bool:
        """Whether `principal` (`User:alice`) connected from `host` may do `operation` on the
        resource. `api` names the request in the log line."""
        allowed = principal in self.settings.super_users or self._acls_allow(
            principal, host, operation, resource_type, name
        )
        # The level is checked before the fields are built: this runs on every request.
        level = logging.DEBUG if allowed else logging.INFO
        if (allowed or log_denied) and log.isEnabledFor(level):
            event(
                log,
                level,
                "authorizer.allowed" if allowed else "authorizer.denied",
                principal=principal,
                host=host,
                operation=operation.kafka_name,
                resource_type=resource_type.kafka_name,
                resource=name,
                api=api,
            )
        return allowed

    def authorized_operations(
        self, principal: str, host: str, resource_type: ResourceType, name: str
    ) -> int:
        """The authorized-operations bitfield of one resource (Metadata, DescribeGroups)."""
        allowed = tuple(
            operation
            for operation in SUPPORTED_OPERATIONS[resource_type]
            if principal in self.settings.super_users
            or self._acls_allow(principal, host, operation, resource_type, name)
        )
        return operations_bitfield(allowed)

    def authorize_any(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        *,
        api: str = "",
    ) -> bool:
        """Whether some resource of `resource_type` may be the object of `operation` (KIP-679:
        an idempotent producer needs WRITE on at least one topic): an ALLOW on some literal name
        or prefix that no DENY covers. Implied operations do not count here (as in Kafka)."""
        allowed = principal in self.settings.super_users or self._any_allowed(
            principal, host, operation, resource_type
        )
        if not allowed:
            event(
                log,
                logging.INFO,
                "authorizer.denied",
                principal=principal,
                host=host,
                operation=operation.kafka_name,
                resource_type=resource_type.kafka_name,
                resource="<any>",
                api=api,
            )
        return allowed

    def _acls_allow(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        snapshot = self._snapshot()
        if snapshot is not self._decided_on:
            self._decisions, self._decided_on = {}, snapshot
        asked = (principal, host, operation, resource_type, name)
        decided = self._decisions.get(asked)
        if decided is None:
            decided = self._decide(snapshot, principal, host, operation, resource_type, name)
            if len(self._decisions) >= DECISIONS_MAX:
                self._decisions.clear()
            self._decisions[asked] = decided
        return decided

    def _decide(
        self,
        snapshot: AclSnapshot,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        matching = snapshot.matching(resource_type, name)
        if not matching:
            return self.settings.allow_everyone_if_no_acl_found
        denied_by, granted_by = _OPERATION_OR_ALL[operation], _GRANTED_BY[operation]
        granted = False
        for acls in matching:
            for who in (principal, WILDCARD_PRINCIPAL):
                for entry in acls.by_principal.get(who, ()):
                    if entry.host != host and entry.host != WILDCARD_HOST:
                        continue
                    if entry.permission is _DENY:
                        if entry.operation in denied_by:
                            return False
                    elif entry.operation in granted_by:
                        granted = True
        return granted

    def _any_allowed(
        self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        snapshot = self._snapshot()
        counted = _OPERATION_OR_ALL[operation]
        names: dict[tuple[AclPermissionType, PatternType], set[str]] = {
            (permission, pattern_type): set()
            for permission in (_ALLOW, _DENY)
            for pattern_type in (PatternType.LITERAL, PatternType.PREFIXED)
        }
        for pattern in snapshot.patterns_of(resource_type):
            for entry in snapshot.entries(pattern):
                if _applies(entry, principal, host) and entry.operation in counted:
                    names[(entry.permission, pattern.pattern_type)].add(pattern.name)
        deny_literals = names[(_DENY, PatternType.LITERAL)]
        deny_prefixes = names[(_DENY, PatternType.PREFIXED)]
        if WILDCARD_RESOURCE in deny_literals:
            return False
        if self.settings.allow_everyone_if_no_acl_found:
            return True

        def denied_by_prefix(name: str) -> bool:
            return any(name.startswith(prefix) for prefix in deny_prefixes)

        if any(not denied_by_prefix(p) for p in names[(_ALLOW, PatternType.PREFIXED)]):
            return True
        return any(
            literal == WILDCARD_RESOURCE
            or (literal not in deny_literals and not denied_by_prefix(literal))
            for literal in names[(_ALLOW, PatternType.LITERAL)]
        )


def _applies(entry: AclEntry, principal: str, host: str) -> bool:
    return (entry.principal == principal or entry.principal == WILDCARD_PRINCIPAL) and (
        entry.host == host or entry.host == WILDCARD_HOST
    )
