"""Where ACLs live in ZooKeeper, and the one place their JSON is encoded and decoded.

Kafka's ZooKeeper layout (AclAuthorizer's, kafka.zk.ZkData), so ACLs written by Kafka's tools
against a Kafka cluster read the same here and the other way round. Paths are relative to the
connect string's chroot:

| Path                                               | Mode                  | Data        |
|----------------------------------------------------|-----------------------|-------------|
| /kafka-acl/<ResourceType>/<name>                   | persistent            | ACL entries |
| /kafka-acl-extended/prefixed/<ResourceType>/<name> | persistent            | ACL entries |
| /kafka-acl-changes/acl_changes_<seq>               | persistent sequential | literal     |
| /kafka-acl-extended-changes/acl_changes_<seq>      | persistent sequential | extended    |

- `<ResourceType>` is Kafka's PascalCase name: `Topic`, `Group`, `Cluster`, `TransactionalId`,
  `DelegationToken`, `User` (the CLUSTER resource's name is always `kafka-cluster`).
- ACL entries, one znode per resource pattern: `{"version":1,"acls":[{"principal":"User:alice",
  "permissionType":"Allow","operation":"Read","host":"*"}]}`. A pattern with no ACL left has no
  znode.
- Change notifications, one per write, tell every broker which pattern to read again: a literal
  one holds `<RESOURCE_TYPE>:<name>` (Kafka writes the enum's upper-case name, e.g.
  `TOPIC:orders`; both spellings are read), an extended one `{"version":1,"resourceType":"TOPIC",
  "name":"orders-","patternType":"PREFIXED"}`. Kafka's brokers delete notifications older than
  15 minutes; so do ours.

Decoding is strict about structure (MalformedZnodeError names the znode and the field) and
skips single entries whose operation or permission name this version does not know, as Kafka
reads them as UNKNOWN, which never matches a request.
"""

from __future__ import annotations

import json
import logging
from typing import Final

from riverbed.coordination.layout import MalformedZnodeError
from riverbed.security.acl import (
    AclEntry,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourcePattern,
    ResourceType,
)

log = logging.getLogger(__name__)

LITERAL_ACL_PATH: Final = "/kafka-acl"
EXTENDED_ACL_PATH: Final = "/kafka-acl-extended"
LITERAL_CHANGES_PATH: Final = "/kafka-acl-changes"
EXTENDED_CHANGES_PATH: Final = "/kafka-acl-extended-changes"
CHANGE_PREFIX: Final = "acl_changes_"
ACL_VERSION: Final = 1
CHANGE_EVENT_VERSION: Final = 1
# Where each stored pattern type lives, and where its change notifications go.
ACL_ROOTS: Final = {
    PatternType.LITERAL: LITERAL_ACL_PATH,
    PatternType.PREFIXED: f"{EXTENDED_ACL_PATH}/prefixed",
}
CHANGE_PATHS: Final = {
    PatternType.LITERAL: LITERAL_CHANGES_PATH,
    PatternType.PREFIXED: EXTENDED_CHANGES_PATH,
}
# Created at startup, so watches and the first write always find their parents.
ACL_PATHS: Final = (*ACL_ROOTS.values(), *CHANGE_PATHS.values())


def type_path(pattern_type: PatternType, resource_type: ResourceType) -> str:
    return f"{ACL_ROOTS[pattern_type]}/{resource_type.kafka_name}"


def resource_path(pattern: ResourcePattern) -> str:
    return f"{type_path(pattern.pattern_type, pattern.resource_type)}/{pattern.name}"


def change_path(pattern_type: PatternType) -> str:
    """The prefix of a new sequential notification znode for a pattern of this type."""
    return f"{CHANGE_PATHS[pattern_type]}/{CHANGE_PREFIX}"


def resource_type_of_dir(name: str) -> ResourceType | None:
    """The resource type a child of an ACL root names, or None for one this version lacks."""
    for resource_type in ResourceType:
        if resource_type.kafka_name == name and resource_type is not ResourceType.ANY:
            return resource_type
    return None


# ---- ACL entries ------------------------------------------------------------------------------


def encode_acls(entries: frozenset[AclEntry]) -> bytes:
    acls = [
        {
            "principal": entry.principal,
            "permissionType": entry.permission.kafka_name,
            "operation": entry.operation.kafka_name,
            "host": entry.host,
        }
        for entry in sorted(entries, key=lambda e: (e.principal, e.host, e.operation, e.permission))
    ]
    return _dump({"version": ACL_VERSION, "acls": acls})


def decode_acls(path: str, data: bytes) -> frozenset[AclEntry]:
    document = _load(path, data)
    if document.get("version") != ACL_VERSION:
        raise MalformedZnodeError(path, f"expected version {ACL_VERSION}")
    items = document.get("acls")
    if not isinstance(items, list):
        raise MalformedZnodeError(path, "field 'acls' must be a list")
    entries = set()
    for item in items:
        if not isinstance(item, dict) or not all(
            isinstance(item.get(key), str)
            for key in ("principal", "permissionType", "operation", "host")
        ):
            raise MalformedZnodeError(path, f"an ACL must have four string fields, not {item!r}")
        try:
            entries.add(
                AclEntry(
                    item["principal"],
                    item["host"],
                    AclOperation.parse(item["operation"]),
                    AclPermissionType.parse(item["permissionType"]),
                )
            )
        except InvalidAclError as error:
            log.warning("skipping an ACL of %s that cannot apply: %s", path, error)
    return frozenset(entries)


# ---- change notifications ---------------------------------------------------------------------


def encode_change(pattern: ResourcePattern) -> bytes:
    if pattern.pattern_type is PatternType.LITERAL:
        return f"{pattern.resource_type.name}:{pattern.name}".encode()
    return _dump(
        {
            "version": CHANGE_EVENT_VERSION,
            "resourceType": pattern.resource_type.name,
            "name": pattern.name,
            "patternType": pattern.pattern_type.name,
        }
    )


def decode_change(pattern_type: PatternType, path: str, data: bytes) -> ResourcePattern:
    """The pattern a notification under CHANGE_PATHS[pattern_type] names."""
    try:
        if pattern_type is PatternType.LITERAL:
            resource_type, sep, name = data.decode("utf-8").partition(":")
            if not sep:
                raise MalformedZnodeError(path, "expected <ResourceType>:<name>")
            return ResourcePattern(ResourceType.parse(resource_type), name, PatternType.LITERAL)
        document = _load(path, data)
        fields = [document.get(key) for key in ("resourceType", "name", "patternType")]
        if not all(isinstance(value, str) for value in fields):
            raise MalformedZnodeError(path, "expected resourceType, name and patternType")
        resource_type, name, stored_type = (str(value) for value in fields)
        return ResourcePattern(
            ResourceType.parse(resource_type), name, PatternType.parse(stored_type)
        )
    except (InvalidAclError, UnicodeDecodeError) as error:
        raise MalformedZnodeError(path, str(error)) from error


def _dump(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def _load(path: str, data: bytes) -> dict[str, object]:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MalformedZnodeError(path, f"not JSON ({error})") from error
    if not isinstance(document, dict):
        raise MalformedZnodeError(path, "expected a JSON object")
    return document
