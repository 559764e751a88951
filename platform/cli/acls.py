"""`riverbed acls add|list|remove`: manage ACLs like Kafka's kafka-acls.sh.

    riverbed acls add --allow-principal User:alice --operation Read --operation Describe \\
        --topic orders [--resource-pattern-type prefixed] [--allow-host 10.0.0.5]
    riverbed acls add --deny-principal User:mallory --operation All --cluster
    riverbed acls list [--topic orders] [--resource-pattern-type any|match|literal|prefixed]
        [--principal User:alice] [--json]
    riverbed acls remove --allow-principal User:alice --operation Read --topic orders
    riverbed acls remove --topic orders          # every ACL of the topic's literal pattern

Resources: `--topic`, `--group`, `--transactional-id` (each repeatable) and `--cluster`.
Principals are written `User:name` (`User:*` for everyone); hosts are IP addresses or `*` (the
default). `--operation` takes Kafka's names (Read, Write, Create, Delete, Alter, Describe,
ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All; any case) and is repeatable:
`add` defaults to All, `remove` to every operation. The pattern type defaults to literal for
`add` and `remove`, to any for `list` (match lists every ACL that applies to the named
resources, wildcard and prefixes included).

The requests go to a broker (`--bootstrap-server`, which needs ALTER / DESCRIBE on the cluster
for the principal the CLI connects as), or straight to ZooKeeper with `--zookeeper
HOST:PORT[/CHROOT]`, as kafka-acls.sh's `--authorizer-properties zookeeper.connect=...` did:
the way to write the first ACLs before any principal may. Every broker picks the change up
within moments either way. Failures are one line (the Kafka error's name and message).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final, Protocol

from riverbed.cli.connect import add_command_config, client_settings
from riverbed.cli.render import plain_table
from riverbed.client.admin import Admin
from riverbed.coordination.zk import AsyncZooKeeper, digest_from_environment
from riverbed.security.acl import (
    CLUSTER_NAME,
    WILDCARD_HOST,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourceType,
    binding_order,
    parse_principal,
)
from riverbed.security.acl_cache import AclCache
from riverbed.security.acl_store import AclStore

COLUMNS: Final = ("RESOURCE_TYPE", "PATTERN_TYPE", "RESOURCE", "PRINCIPAL", "HOST", "OPERATION",
                  "PERMISSION")  # fmt: skip
PATTERN_TYPES: Final = ("literal", "prefixed", "any", "match")
# How long the ZooKeeper mode waits for ZooKeeper before giving up.
ZOOKEEPER_TIMEOUT_MS: Final = 10_000


def add_parser(commands: Any, bootstrap_default: str) -> argparse.ArgumentParser:
    """Add `acls` and its actions to the `riverbed` subcommands (each sets `command`)."""
    acls: argparse.ArgumentParser = commands.add_parser(
        "acls", help="add, list and remove ACLs (like kafka-acls.sh)"
    )
    actions = acls.add_subparsers(required=True, metavar="ACTION")
    add = actions.add_parser("add", help="add ACLs: each principal x host x operation x resource")
    listing = actions.add_parser("list", help="list ACLs (of the resources given, or all)")
    remove = actions.add_parser("remove", help="remove the ACLs that match")
    for sub, pattern_default in ((add, "literal"), (listing, "any"), (remove, "literal")):
        _resource_flags(sub, pattern_default)
        target = sub.add_mutually_exclusive_group()
        target.add_argument("--bootstrap-server", default=bootstrap_default, metavar="HOST:PORT")
        add_command_config(sub)
        target.add_argument(
            "--zookeeper",
            metavar="HOST:PORT[/CHROOT]",
            help="read and write the ACLs in ZooKeeper directly (the brokers' zookeeper.connect)",
        )
    for sub in (add, remove):
        _entry_flags(sub)
    listing.add_argument(
        "--principal", action="append", type=parse_principal, default=[], metavar="PRINCIPAL",
        help="only ACLs of this principal (repeatable)",
    )  # fmt: skip
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    add.set_defaults(command=lambda args: _run(args, add_acls))
    listing.set_defaults(command=lambda args: _run(args, list_acls))
    remove.set_defaults(command=lambda args: _run(args, remove_acls))
    return acls


def _resource_flags(sub: argparse.ArgumentParser, pattern_default: str) -> None:
    sub.add_argument("--topic", action="append", default=[], metavar="TOPIC")
    sub.add_argument("--group", action="append", default=[], metavar="GROUP")
    sub.add_argument("--transactional-id", action="append", default=[], metavar="ID")
    sub.add_argument("--cluster", action="store_true", help="the cluster resource")
    sub.add_argument(
        "--resource-pattern-type",
        choices=PATTERN_TYPES,
        default=pattern_default,
        help=f"how resource names match (default: {pattern_default})",
    )


def _entry_flags(sub: argparse.ArgumentParser) -> None:
    for kind in ("allow", "deny"):
        sub.add_argument(
            f"--{kind}-principal", action="append", type=parse_principal, default=[],
            metavar="PRINCIPAL", help=f"{kind.upper()} this principal, Type:name (repeatable)",
        )  # fmt: skip
        sub.add_argument(
            f"--{kind}-host", action="append", default=[], metavar="HOST",
            help=f"hosts of the --{kind}-principal ACLs (default: *)",
        )  # fmt: skip
    sub.add_argument(
        "--operation", action="append", type=AclOperation.parse, default=[], metavar="OPERATION",
        help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
        "AlterConfigs, IdempotentWrite or All (repeatable)",
    )  # fmt: skip


# -- where the ACLs are read and written --------------------------------------------------


class AclBackend(Protocol):
    async def create(self, bindings: Sequence[AclBinding]) -> None: ...

    async def describe(self, wanted: AclBindingFilter) -> list[AclBinding]: ...

    async def delete(self, filters: Sequence[AclBindingFilter]) -> list[AclBinding]: ...


class _Brokers:
    """Through a broker's ACL APIs."""

    def __init__(self, admin: Admin) -> None:
        self._admin = admin

    async def create(self, bindings: Sequence[AclBinding]) -> None:
        await self._admin.create_acls(bindings)

    async def describe(self, wanted: AclBindingFilter) -> list[AclBinding]:
        return await self._admin.describe_acls(wanted)

    async def delete(self, filters: Sequence[AclBindingFilter]) -> list[AclBinding]:
        return await self._admin.delete_acls(filters)


class _ZooKeeper:
    """Straight to ZooKeeper, as a broker writes them (riverbed.security.acl_store)."""

    def __init__(self, cache: AclCache, store: AclStore) -> None:
        self._cache = cache
        self._store = store

    async def create(self, bindings: Sequence[AclBinding]) -> None:
        for binding, error in zip(bindings, await self._store.create(bindings), strict=True):
            if error is not None:
                raise InvalidAclError(f"could not add {binding}: {error}")

    async def describe(self, wanted: AclBindingFilter) -> list[AclBinding]:
        return self._cache.snapshot.bindings(wanted)

    async def delete(self, filters: Sequence[AclBindingFilter]) -> list[AclBinding]:
        deleted = []
        for deletions in await self._store.delete(filters):
            for deletion in deletions:
                if deletion.error is not None:
                    raise InvalidAclError(f"could not remove {deletion.binding}: {deletion.error}")
                deleted.append(deletion.binding)
        return deleted


@contextlib.asynccontextmanager
async def _backend(args: argparse.Namespace) -> AsyncIterator[AclBackend]:
    if args.zookeeper is None:
        async with Admin(**client_settings(args)) as admin:
            yield _Brokers(admin)
        return
    zk = AsyncZooKeeper(
        args.zookeeper,
        connect_timeout_ms=ZOOKEEPER_TIMEOUT_MS,
        digest=digest_from_environment(os.environ),
    )
    async with zk:
        cache = AclCache(zk)
        await cache.start()
        try:
            yield _ZooKeeper(cache, AclStore(zk, cache))
        finally:
            await cache.stop()


def _run(args: argparse.Namespace, action: Any) -> int:
    async def run() -> int:
        async with _backend(args) as backend:
            status: int = await action(backend, args)
            return status

    return asyncio.run(run())


# -- actions -------------------------------------------------------------------------------


async def add_acls(backend: AclBackend, args: argparse.Namespace) -> int:
    bindings = bindings_to_add(args)
    await backend.create(bindings)
    print(plain_table(COLUMNS, (_row(b) for b in bindings)))
    print(f"added {len(bindings)} ACL{'s' if len(bindings) != 1 else ''}")
    return 0


async def list_acls(backend: AclBackend, args: argparse.Namespace) -> int:
    found: dict[AclBinding, None] = {}
    for wanted in filters_to_list(args):
        found.update(dict.fromkeys(await backend.describe(wanted)))
    bindings = sorted(found, key=binding_order)
    if args.json:
        print(json.dumps([_document(b) for b in bindings], indent=2))
    else:
        print(plain_table(COLUMNS, (_row(b) for b in bindings)))
    return 0


async def remove_acls(backend: AclBackend, args: argparse.Namespace) -> int:
    removed = await backend.delete(filters_to_remove(args))
    if removed:
        print(plain_table(COLUMNS, (_row(b) for b in sorted(removed, key=binding_order))))
    print(f"removed {len(removed)} ACL{'s' if len(removed) != 1 else ''}")
    return 0


# -- flags to bindings and filters ------------------------------------------------------------


def resources(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    named = [
        *((ResourceType.TOPIC, name) for name in args.topic),
        *((ResourceType.GROUP, name) for name in args.group),
        *((ResourceType.TRANSACTIONAL_ID, name) for name in args.transactional_id),
    ]
    if args.cluster:
        named.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return named


def bindings_to_add(args: argparse.Namespace) -> list[AclBinding]:
    pattern_type = PatternType.parse(args.resource_pattern_type)
    if pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAclError("ACLs are added with --resource-pattern-type literal or prefixed")
    targets = _required_resources(args, "add")
    entries = _entries(args, default_operation=AclOperation.ALL)
    if not entries:
        raise InvalidAclError("add needs --allow-principal or --deny-principal")
    return [
        AclBinding(
            resource_type, name, pattern_type, principal, host or WILDCARD_HOST, operation,
            permission,
        )
        for resource_type, name in targets
        for principal, host, operation, permission in entries
    ]  # fmt: skip


def filters_to_list(args: argparse.Namespace) -> list[AclBindingFilter]:
    pattern_type = PatternType.parse(args.resource_pattern_type)
    targets: list[tuple[ResourceType, str | None]] = list(resources(args)) or [
        (ResourceType.ANY, None)
    ]
    principals: list[str | None] = list(args.principal) or [None]
    return [
        AclBindingFilter(resource_type, name, pattern_type, principal=principal)
        for resource_type, name in targets
        for principal in principals
    ]


def filters_to_remove(args: argparse.Namespace) -> list[AclBindingFilter]:
    pattern_type = PatternType.parse(args.resource_pattern_type)
    targets = _required_resources(args, "remove")
    entries = _entries(args, default_operation=AclOperation.ANY, default_host=None)
    if not entries:  # no principal: every ACL of the resources
        return [
            AclBindingFilter(resource_type, name, pattern_type) for resource_type, name in targets
        ]
    return [
        AclBindingFilter(resource_type, name, pattern_type, principal, host, operation, permission)
        for resource_type, name in targets
        for principal, host, operation, permission in entries
    ]


def _required_resources(args: argparse.Namespace, action: str) -> list[tuple[ResourceType, str]]:
    targets = resources(args)
    if not targets:
        raise InvalidAclError(
            f"{action} needs a resource: --topic, --group, --transactional-id or --cluster"
        )
    return targets


# (principal, host, operation, permission); a None host: any host (filters only)
_Entry = tuple[str, str | None, AclOperation, AclPermissionType]


def _entries(
    args: argparse.Namespace,
    *,
    default_operation: AclOperation,
    default_host: str | None = WILDCARD_HOST,
) -> list[_Entry]:
    """(principal, host, operation, permission) for each combination of the flags."""
    operations = args.operation or [default_operation]
    entries: list[_Entry] = []
    for permission, principals, hosts in (
        (AclPermissionType.ALLOW, args.allow_principal, args.allow_host),
        (AclPermissionType.DENY, args.deny_principal, args.deny_host),
    ):
        if hosts and not principals:
            kind = permission.name.lower()
            raise InvalidAclError(f"--{kind}-host needs --{kind}-principal")
        for principal in principals:
            for host in hosts or [default_host]:
                entries.extend((principal, host, operation, permission) for operation in operations)
    return entries


def _row(binding: AclBinding) -> tuple[str, ...]:
    return (
        binding.resource_type.kafka_name,
        binding.pattern_type.name.lower(),
        binding.resource_name,
        binding.principal,
        binding.host,
        binding.operation.kafka_name,
        binding.permission.kafka_name,
    )


def _document(binding: AclBinding) -> dict[str, str]:
    return dict(
        zip(
            ("resource_type", "pattern_type", "resource", "principal", "host", "operation",
             "permission"),
            _row(binding),
            strict=True,
        )
    )  # fmt: skip
