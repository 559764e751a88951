"""What the ACL tests with real brokers share: the settings that turn the authorizer on, ACLs
written straight to ZooKeeper (what `riverbed acls --zookeeper` does: the way in before any
principal may change ACLs), raw connections that show every error code, and polling.

Every connection is User:ANONYMOUS until SASL exists, so a test grants or refuses that
principal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Final

from riverbed.client.connection import BrokerConnection
from riverbed.coordination.zk import AsyncZooKeeper
from riverbed.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from riverbed.security.acl_cache import AclCache
from riverbed.security.acl_store import AclStore

from tests.support.broker import BrokerProcess

AUTHORIZER: Final = "kafka.security.authorizer.AclAuthorizer"
ANONYMOUS: Final = "User:ANONYMOUS"
SECURED: Final = {
    "authorizer.class.name": AUTHORIZER,
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "2",
    "group.initial.rebalance.delay.ms": "0",
}
WAIT_S: Final = 30.0


def acl(
    resource_type: ResourceType,
    name: str,
    *operations: AclOperation,
    pattern_type: PatternType = PatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
    principal: str = ANONYMOUS,
) -> list[AclBinding]:
    return [
        AclBinding(resource_type, name, pattern_type, principal, "*", operation, permission)
        for operation in operations
    ]


def cluster_acl(*operations: AclOperation, principal: str = ANONYMOUS) -> list[AclBinding]:
    return acl(ResourceType.CLUSTER, CLUSTER_NAME, *operations, principal=principal)


class ZooKeeperAcls:
    """ACLs written to the brokers' ZooKeeper directly; brokers follow within moments."""

    def __init__(self, store: AclStore) -> None:
        self._store = store

    async def add(self, *bindings: AclBinding) -> None:
        assert await self._store.create(bindings) == [None] * len(bindings)

    async def remove(self, *bindings: AclBinding) -> None:
        filters = [
            AclBindingFilter(
                b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host,
                b.operation, b.permission,
            )
            for b in bindings
        ]  # fmt: skip
        await self._store.delete(filters)


@asynccontextmanager
async def zookeeper_acls(zk_connect: str) -> AsyncIterator[ZooKeeperAcls]:
    async with AsyncZooKeeper(zk_connect) as zk:
        cache = AclCache(zk)
        await cache.start()
        try:
            yield ZooKeeperAcls(AclStore(zk, cache))
        finally:
            await cache.stop()


async def connect(broker: BrokerProcess) -> BrokerConnection:
    host, _, port = broker.bootstrap.rpartition(":")
    return await BrokerConnection.open(host, int(port), client_id="acl-test")


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S, interval_s: float = 0.1
) -> None:
    """Until `check()` is true (a broker following an ACL change it learned from ZooKeeper)."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval_s)


def flat(*groups: Sequence[AclBinding]) -> list[AclBinding]:
    return [binding for group in groups for binding in group]
