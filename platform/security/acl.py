"""The ACL model: Kafka's enums with their wire codes, resource patterns, entries, bindings and the
filters DescribeAcls and DeleteAcls match them with.

An ACL *binding* says: `principal` from `host` is ALLOWed (or DENYed) `operation` on the
resources a *pattern* names. A pattern is a resource type plus a name that is LITERAL (one
resource; the name `*` means every resource of the type) or PREFIXED (every resource whose name
starts with it, KIP-290). The values here are Kafka's: the wire codes of
org.apache.kafka.common.acl / .resource, the names its tools print and ZooKeeper stores
("Topic", "Read", "Allow"), and its validation rules, so bindings made by Kafka's own clients
and tools mean the same here.

Everything is validated when built: a malformed pattern, entry or binding raises InvalidAclError
(a ValueError naming what is wrong), which request handlers answer with INVALID_REQUEST.
Unknown wire codes (Kafka's UNKNOWN is 0) raise it too.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import Final, Self

from riverbed.protocol.errors import ErrorCode
from riverbed.security.session import USER_TYPE, KafkaPrincipal

# Kafka's fixed name of the one CLUSTER resource (org.apache.kafka.common.resource.Resource).
CLUSTER_NAME: Final = "kafka-cluster"
# A LITERAL pattern with this name covers every resource of its type.
WILDCARD_RESOURCE: Final = "*"
WILDCARD_HOST: Final = "*"
# Matches every principal of type User (AclEntry.WILDCARD_PRINCIPAL).
WILDCARD_PRINCIPAL: Final = f"{USER_TYPE}:*"
# Resource names become ZooKeeper znode names (/kafka-acl/Topic/<name>): a slash would nest them,
# and ZooKeeper refuses these as path components.
_ILLEGAL_NAMES: Final = frozenset({".", ".."})


class InvalidAclError(ValueError):
    """A pattern, entry, binding or filter that Kafka would refuse; the message says why."""


class _KafkaEnum(enum.IntEnum):
    """An enum whose values are Kafka's wire codes and whose names parse as Kafka's tools write
    them: `Read`, `READ`, `read`, `IdempotentWrite` or `idempotent_write`."""

    @property
    def kafka_name(self) -> str:
        """Kafka's PascalCase name (`IdempotentWrite`), as ZooKeeper and kafka-acls.sh show it."""
        return _pascal_case(self.name)

    @classmethod
    def from_code(cls, code: int) -> Self:
        try:
            return cls(code)
        except ValueError:
            raise InvalidAclError(f"unknown {_label(cls)} code {code}") from None

    @classmethod
    def parse(cls, text: str) -> Self:
        wanted = text.strip().replace("_", "").replace("-", "").upper()
        for member in cls:
            if member.name.replace("_", "") == wanted:
                return member
        names = ", ".join(member.kafka_name for member in cls)
        raise InvalidAclError(f"unknown {_label(cls)} {text!r}; known: {names}")


@functools.cache
def _pascal_case(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _label(cls: type) -> str:
    """`AclPermissionType` -> `permission type`, for error messages."""
    words = "".join(f" {c.lower()}" if c.isupper() else c for c in cls.__name__).split()
    return " ".join(word for word in words if word not in ("acl",)) or cls.__name__


class ResourceType(_KafkaEnum):
    """org.apache.kafka.common.resource.ResourceType (0 is UNKNOWN, never valid here)."""

    ANY = 1  # filters only
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(_KafkaEnum):
    """org.apache.kafka.common.resource.PatternType (KIP-290)."""

    ANY = 1  # filters: LITERAL or PREFIXED, the name compared exactly
    MATCH = 2  # filters: every pattern that would match a resource of the filter's name
    LITERAL = 3
    PREFIXED = 4


class AclOperation(_KafkaEnum):
    """org.apache.kafka.common.acl.AclOperation."""

    ANY = 1  # filters only
    ALL = 2  # in a binding: every operation
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13  # USER resources (delegation tokens, which Riverbed does not have)
    DESCRIBE_TOKENS = 14


class AclPermissionType(_KafkaEnum):
    """org.apache.kafka.common.acl.AclPermissionType."""

    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


_O = AclOperation
# The operations each resource type has (Kafka's AclEntry.supportedOperations): what the
# authorized-operations bitfields of Metadata and DescribeGroups report. Riverbed has no group
# configs (KIP-848), so groups keep the three operations of Kafka before them.
SUPPORTED_OPERATIONS: Final[dict[ResourceType, tuple[AclOperation, ...]]] = {
    ResourceType.TOPIC: (
        _O.READ,
        _O.WRITE,
        _O.CREATE,
        _O.DELETE,
        _O.ALTER,
        _O.DESCRIBE,
        _O.DESCRIBE_CONFIGS,
        _O.ALTER_CONFIGS,
    ),
    ResourceType.GROUP: (_O.READ, _O.DELETE, _O.DESCRIBE),
    ResourceType.CLUSTER: (
        _O.CREATE,
        _O.ALTER,
        _O.DESCRIBE,
        _O.CLUSTER_ACTION,
        _O.DESCRIBE_CONFIGS,
        _O.ALTER_CONFIGS,
        _O.IDEMPOTENT_WRITE,
    ),
    ResourceType.TRANSACTIONAL_ID: (_O.WRITE, _O.DESCRIBE),
    ResourceType.DELEGATION_TOKEN: (_O.DESCRIBE,),
    ResourceType.USER: (_O.CREATE_TOKENS, _O.DESCRIBE_TOKENS),
}
# The error a request gets when the principal may not act on a resource of the type.
AUTHORIZATION_ERRORS: Final[dict[ResourceType, ErrorCode]] = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ResourceType.DELEGATION_TOKEN: ErrorCode.DELEGATION_TOKEN_AUTHORIZATION_FAILED,
}


def operations_bitfield(operations: tuple[AclOperation, ...] | frozenset[AclOperation]) -> int:
    """Kafka's authorized-operations field: bit `code` set for each operation."""
    bits = 0
    for operation in operations:
        bits |= 1 << operation
    return bits


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    """A resource type and a LITERAL or PREFIXED name: what one ZooKeeper ACL znode covers."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType = PatternType.LITERAL

    def __post_init__(self) -> None:
        if self.resource_type is ResourceType.ANY:
            raise InvalidAclError("a resource pattern's type cannot be ANY")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError(
                f"a resource pattern is LITERAL or PREFIXED, not {self.pattern_type.name}"
            )
        if not self.name:
            raise InvalidAclError("invalid empty resource name")
        if "/" in self.name or "\0" in self.name or self.name in _ILLEGAL_NAMES:
            raise InvalidAclError(f"invalid resource name {self.name!r}")
        if self.resource_type is ResourceType.CLUSTER and self.name != CLUSTER_NAME:
            raise InvalidAclError(
                f"the only valid name for the CLUSTER resource is {CLUSTER_NAME}, not {self.name!r}"
            )

    def __str__(self) -> str:
        return f"{self.resource_type.kafka_name}:{self.pattern_type.name}:{self.name}"


@dataclass(frozen=True, slots=True)
class AclEntry:
    """Who may (or may not) do what from where: Kafka's AccessControlEntry."""

    principal: str  # `Type:name`, `User:*` for every user
    host: str  # an IP address as the client's connection shows it, or `*`
    operation: AclOperation
    permission: AclPermissionType

    def __post_init__(self) -> None:
        try:
            KafkaPrincipal.parse(self.principal)
        except ValueError as error:
            raise InvalidAclError(str(error)) from None
        if not self.host:
            raise InvalidAclError("an ACL's host is an IP address or '*', not empty")
        if self.operation is AclOperation.ANY:
            raise InvalidAclError("an ACL's operation cannot be ANY")
        if self.permission is AclPermissionType.ANY:
            raise InvalidAclError("an ACL's permission type is ALLOW or DENY, not ANY")

    def __str__(self) -> str:
        return (
            f"{self.principal} has {self.permission.name} permission for operations: "
            f"{self.operation.kafka_name} from hosts: {self.host}"
        )


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: a resource pattern and an entry, as CreateAcls sends and DescribeAcls lists
    them. Validated when built (InvalidAclError)."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType
    pattern: ResourcePattern = field(init=False, repr=False, compare=False)
    entry: AclEntry = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pattern = ResourcePattern(self.resource_type, self.resource_name, self.pattern_type)
        entry = AclEntry(self.principal, self.host, self.operation, self.permission)
        object.__setattr__(self, "pattern", pattern)
        object.__setattr__(self, "entry", entry)

    @classmethod
    def of(cls, pattern: ResourcePattern, entry: AclEntry) -> AclBinding:
        return cls(
            pattern.resource_type,
            pattern.name,
            pattern.pattern_type,
            entry.principal,
            entry.host,
            entry.operation,
            entry.permission,
        )

    @classmethod
    def from_codes(
        cls,
        resource_type: int,
        resource_name: str,
        pattern_type: int,
        principal: str,
        host: str,
        operation: int,
        permission: int,
    ) -> AclBinding:
        """A binding from its wire fields (CreateAcls, DescribeAcls' answer)."""
        return cls(
            ResourceType.from_code(resource_type),
            resource_name,
            PatternType.from_code(pattern_type),
            principal,
            host,
            AclOperation.from_code(operation),
            AclPermissionType.from_code(permission),
        )

    def __str__(self) -> str:
        return f"{self.pattern}: {self.entry}"


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """What DescribeAcls and DeleteAcls select, field by field: ANY (or None, for the names,
    principal and host) matches every value. The pattern type filters as Kafka's
    ResourcePatternFilter does: ANY compares names exactly across LITERAL and PREFIXED patterns;
    MATCH selects every pattern that covers a resource called `resource_name` (the literal one,
    the `*` wildcard, and each prefix of it); LITERAL / PREFIXED select that type only."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    @classmethod
    def from_codes(
        cls,
        resource_type: int,
        resource_name: str | None,
        pattern_type: int,
        principal: str | None,
        host: str | None,
        operation: int,
        permission: int,
    ) -> AclBindingFilter:
        """A filter from its wire fields (DescribeAcls, DeleteAcls); unknown codes are invalid."""
        return cls(
            ResourceType.from_code(resource_type),
            resource_name,
            PatternType.from_code(pattern_type),
            principal,
            host,
            AclOperation.from_code(operation),
            AclPermissionType.from_code(permission),
        )

    def matches(self, binding: AclBinding) -> bool:
        return self.matches_pattern(binding.pattern) and self.matches_entry(binding.entry)

    def matches_pattern(self, pattern: ResourcePattern) -> bool:
        if self.resource_type not in (ResourceType.ANY, pattern.resource_type):
            return False
        wanted = self.pattern_type
        if wanted not in (PatternType.ANY, PatternType.MATCH, pattern.pattern_type):
            return False
        name = self.resource_name
        if name is None:
            return True
        if wanted in (PatternType.ANY, pattern.pattern_type):
            return name == pattern.name
        # MATCH: every pattern that would cover a resource called `name`.
        if pattern.pattern_type is PatternType.LITERAL:
            return name == pattern.name or pattern.name == WILDCARD_RESOURCE
        return name.startswith(pattern.name)

    def matches_entry(self, entry: AclEntry) -> bool:
        return (
            (self.principal is None or self.principal == entry.principal)
            and (self.host is None or self.host == entry.host)
            and self.operation in (AclOperation.ANY, entry.operation)
            and self.permission in (AclPermissionType.ANY, entry.permission)
        )

    def exact_patterns(self) -> tuple[ResourcePattern, ...]:
        """The patterns this filter can match when its pattern part names them exactly (Kafka's
        matchesAtMostOne): DeleteAcls reads those from ZooKeeper even if no broker cached them
        yet. Empty when the filter can match more (a type or name of ANY, or MATCH)."""
        name = self.resource_name
        if self.resource_type is ResourceType.ANY or name is None:
            return ()
        if self.pattern_type is PatternType.MATCH:
            return ()
        types = (
            (PatternType.LITERAL, PatternType.PREFIXED)
            if self.pattern_type is PatternType.ANY
            else (self.pattern_type,)
        )
        patterns = []
        for pattern_type in types:
            try:
                patterns.append(ResourcePattern(self.resource_type, name, pattern_type))
            except InvalidAclError:
                continue  # no binding can have this pattern, so none can match
        return tuple(patterns)


def binding_order(binding: AclBinding) -> tuple[int, int, str, str, str, int, int]:
    """How lists of bindings are sorted: by resource type, pattern type and name, then by
    principal, host, operation and permission."""
    return (
        binding.resource_type,
        binding.pattern_type,
        binding.resource_name,
        binding.principal,
        binding.host,
        binding.operation,
        binding.permission,
    )


# The filter that matches every binding.
ANY_BINDING: Final = AclBindingFilter()


def parse_principal(text: str) -> str:
    """`User:alice` checked and returned as it is; InvalidAclError for a malformed one."""
    try:
        return str(KafkaPrincipal.parse(text))
    except ValueError as error:
        raise InvalidAclError(str(error)) from None


def parse_super_users(text: str) -> frozenset[str]:
    """`super.users`: `User:alice;User:bob` (Kafka's separator is `;`, as a principal's name may
    hold commas). InvalidAclError names a malformed item."""
    return frozenset(parse_principal(item.strip()) for item in text.split(";") if item.strip())
