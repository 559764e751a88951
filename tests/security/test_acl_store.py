"""ACLs in a real ZooKeeper: Kafka's znode layout, conditional writes that lose nothing under
concurrency, and caches (one per broker) that follow each other's changes, survive a ZooKeeper
outage and a session expiry, and clean up old change notifications."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from riverbed.coordination.zk import AsyncZooKeeper, ConnectionState
from riverbed.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclEntry,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from riverbed.security.acl_cache import AclCache
from riverbed.security.acl_layout import decode_acls, decode_change, encode_change
from riverbed.security.acl_store import AclStore, AclWrite

from tests.support.waiting import eventually
from tests.support.zookeeper import (
    DedicatedZooKeeper,
    expire_session,
)

TOPIC = ResourcePattern(ResourceType.TOPIC, "orders")
PREFIXED_GROUP = ResourcePattern(ResourceType.GROUP, "team-", PatternType.PREFIXED)
READ = AclEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)
DENY = AclEntry("User:bob", "10.0.0.1", AclOperation.ALL, AclPermissionType.DENY)


@asynccontextmanager
async def broker_side(connect: str) -> AsyncIterator[tuple[AsyncZooKeeper, AclCache, AclStore]]:
    """What one broker has: its own session, a started cache and a store writing through it."""
    async with AsyncZooKeeper(connect, session_timeout_ms=4000) as zk:
        cache = AclCache(zk)
        await cache.start()
        try:
            yield zk, cache, AclStore(zk, cache)
        finally:
            await cache.stop()


@asynccontextmanager
async def witness_on(zk: AsyncZooKeeper) -> AsyncIterator[AclStore]:
    """A started cache on `zk`'s session, to wait through: what it applies has reached every
    watch of that session, so a cache there that should not follow it is checked after that."""
    cache = AclCache(zk)
    await cache.start()
    try:
        yield AclStore(zk, cache)
    finally:
        await cache.stop()


async def followed(witness: AclStore, writer: AclStore, change: AclWrite) -> None:
    """Return once the witness applied `change` and then one more (written after it): a cache
    on its session still following would have had `change` long before, with the round trips
    of that second change to spare (the two caches' refreshes are separate tasks)."""
    assert await witness.wait_applied([change])
    assert await witness.wait_applied([await writer.update(PREFIXED_GROUP, adding(DENY))])


def adding(*entries: AclEntry) -> Callable[[frozenset[AclEntry]], frozenset[AclEntry]]:
    return lambda current: current | frozenset(entries)


def removing(*entries: AclEntry) -> Callable[[frozenset[AclEntry]], frozenset[AclEntry]]:
    return lambda current: current - frozenset(entries)


async def test_kafkas_layout(zk_chroot: str) -> None:
    async with broker_side(zk_chroot) as (zk, cache, store):
        await store.update(TOPIC, adding(READ, DENY))
        written = await store.update(PREFIXED_GROUP, adding(READ))
        data, _ = await zk.get("/kafka-acl/Topic/orders")
        assert json.loads(data) == {
            "version": 1,
            "acls": [
                {
                    "principal": "User:alice",
                    "permissionType": "Allow",
                    "operation": "Read",
                    "host": "*",
                },
                {
                    "principal": "User:bob",
                    "permissionType": "Deny",
                    "operation": "All",
                    "host": "10.0.0.1",
                },
            ],
        }
        data, _ = await zk.get("/kafka-acl-extended/prefixed/Group/team-")
        assert decode_acls("x", data) == {READ}
        literal_changes = await zk.get_children("/kafka-acl-changes")
        assert [name[: len("acl_changes_")] for name in literal_changes] == ["acl_changes_"]
        (change,) = literal_changes
        assert (await zk.get(f"/kafka-acl-changes/{change}"))[0] == b"TOPIC:orders"
        assert written.notification is not None
        data, _ = await zk.get(written.notification)
        assert json.loads(data) == {
            "version": 1,
            "resourceType": "GROUP",
            "name": "team-",
            "patternType": "PREFIXED",
        }
        # The last ACL gone, its znode goes too (and a notification says so).
        await store.update(PREFIXED_GROUP, removing(READ))
        assert await zk.exists("/kafka-acl-extended/prefixed/Group/team-") is None
        assert len(await zk.get_children("/kafka-acl-extended-changes")) == 2
        await eventually(lambda: cache.snapshot.entries(PREFIXED_GROUP) == frozenset())


def test_notifications_decode_both_spellings() -> None:
    assert decode_change(PatternType.LITERAL, "x", b"Topic:a:b") == ResourcePattern(
        ResourceType.TOPIC, "a:b"
    )
    assert decode_change(PatternType.LITERAL, "x", b"TRANSACTIONAL_ID:t") == ResourcePattern(
        ResourceType.TRANSACTIONAL_ID, "t"
    )
    for pattern in (TOPIC, PREFIXED_GROUP):
        decoded = decode_change(pattern.pattern_type, "x", encode_change(pattern))
        assert decoded == pattern


async def test_acls_written_by_kafka_tools_are_loaded(zk_chroot: str) -> None:
    """Znodes as Kafka writes them (spacing, upper-case names, an operation this version
    does not know) are read like ours."""
    async with AsyncZooKeeper(zk_chroot) as zk:
        await zk.create(
            "/kafka-acl/Topic/orders",
            b'{"version": 1, "acls": [{"host": "*", "permissionType": "ALLOW", '
            b'"operation": "READ", "principal": "User:alice"}, {"host": "*", '
            b'"permissionType": "Allow", "operation": "Teleport", "principal": "User:x"}]}',
            makepath=True,
        )
        await zk.create("/kafka-acl/Nonsense/x", b"{}", makepath=True)
        cache = AclCache(zk)
        await cache.start()
        try:
            assert cache.snapshot.acls == {TOPIC: frozenset({READ})}
        finally:
            await cache.stop()


async def test_two_brokers_see_each_others_changes_promptly(zk_chroot: str) -> None:
    async with (
        broker_side(zk_chroot) as (_, cache_1, store_1),
        broker_side(zk_chroot) as (
            _,
            cache_2,
            store_2,
        ),
    ):
        written = await store_1.update(TOPIC, adding(READ))
        assert await store_1.wait_applied([written])
        assert cache_1.snapshot.entries(TOPIC) == {READ}  # read-your-writes on the writer
        seen_s = await eventually(lambda: cache_2.snapshot.entries(TOPIC) == {READ})
        await store_2.update(PREFIXED_GROUP, adding(DENY))
        await eventually(lambda: cache_1.snapshot.entries(PREFIXED_GROUP) == {DENY})
        await store_2.update(TOPIC, removing(READ))
        await eventually(lambda: cache_1.snapshot.entries(TOPIC) == frozenset())
        assert seen_s < 2.0, f"the second broker took {seen_s:.2f} s"


async def test_concurrent_writers_lose_nothing(zk_chroot: str) -> None:
    """Two brokers, each adding 15 ACLs to one pattern at once (and removing a few): every
    change survives, and both caches end up agreeing with ZooKeeper."""
    entries = [
        AclEntry(f"User:u{i}", "*", AclOperation.WRITE, AclPermissionType.ALLOW) for i in range(30)
    ]
    async with (
        broker_side(zk_chroot) as (_, cache_1, store_1),
        broker_side(zk_chroot) as (
            _,
            cache_2,
            store_2,
        ),
    ):
        await store_1.update(TOPIC, adding(READ, DENY))
        writes = await asyncio.gather(
            *(
                (store_1 if i % 2 else store_2).update(TOPIC, adding(entry))
                for i, entry in enumerate(entries)
            ),
            store_1.update(TOPIC, removing(READ)),
            store_2.update(TOPIC, removing(DENY)),
        )
        expected = frozenset(entries)
        assert await store_1.read(TOPIC) == expected
        assert all(isinstance(w, AclWrite) for w in writes)
        await eventually(lambda: cache_1.snapshot.entries(TOPIC) == expected)
        await eventually(lambda: cache_2.snapshot.entries(TOPIC) == expected)


async def test_an_unchanged_pattern_is_not_written(zk_chroot: str) -> None:
    async with broker_side(zk_chroot) as (zk, _, store):
        first = await store.update(TOPIC, adding(READ))
        again = await store.update(TOPIC, adding(READ))
        assert first.notification is not None
        assert again.notification is None
        assert again.before == again.after == {READ}
        assert len(await zk.get_children("/kafka-acl-changes")) == 1


async def test_a_session_expiry_reloads_everything(zk_chroot: str) -> None:
    """A change whose notification was deleted while this broker's session was gone (another
    broker purged it) is still found: a new session reloads every ACL."""
    async with (
        broker_side(zk_chroot) as (zk_1, cache_1, _),
        broker_side(zk_chroot) as (
            zk_2,
            _,
            store_2,
        ),
    ):
        for handle in cache_1._handles:  # test-only: as if the notification never reached us
            handle.cancel()
        async with witness_on(zk_1) as witness:
            written = await store_2.update(TOPIC, adding(READ))
            assert written.notification is not None
            await followed(witness, store_2, written)
        await zk_2.delete(written.notification)
        assert cache_1.snapshot.entries(TOPIC) == frozenset()
        await expire_session(zk_1)
        await eventually(lambda: cache_1.snapshot.entries(TOPIC) == {READ})


async def test_old_notifications_are_deleted(zk_chroot: str) -> None:
    async with AsyncZooKeeper(zk_chroot) as zk:
        cache = AclCache(zk, change_expiration_ms=0)
        await cache.start()
        store = AclStore(zk, cache)
        try:
            for entry in (READ, DENY):
                assert await store.wait_applied([await store.update(TOPIC, adding(entry))])
            await eventually(lambda: len(cache._children["/kafka-acl-changes"]) <= 1)
            assert cache.snapshot.entries(TOPIC) == {READ, DENY}
        finally:
            await cache.stop()


async def test_a_stopped_cache_follows_nothing(zk_chroot: str) -> None:
    async with broker_side(zk_chroot) as (_, _, store), AsyncZooKeeper(zk_chroot) as zk:
        cache = AclCache(zk)
        await cache.start()
        await cache.stop()
        async with witness_on(zk) as witness:
            await followed(witness, store, await store.update(TOPIC, adding(READ)))
        assert cache.snapshot.entries(TOPIC) == frozenset()


async def test_a_malformed_change_keeps_what_was_known(zk_chroot: str) -> None:
    """Failing closed: a znode that cannot be read never drops the DENY the cache had."""
    async with broker_side(zk_chroot) as (zk, cache, store):
        assert await store.wait_applied([await store.update(TOPIC, adding(DENY))])
        await zk.set("/kafka-acl/Topic/orders", b"not json")
        await zk.create("/kafka-acl-changes/acl_changes_", b"TOPIC:orders", sequence=True)
        written = await store.update(PREFIXED_GROUP, adding(READ))  # a later change, applied
        assert await store.wait_applied([written])
        assert cache.snapshot.entries(TOPIC) == {DENY}


async def test_decisions_go_on_while_zookeeper_is_down(own_zookeeper: DedicatedZooKeeper) -> None:
    connect = f"{own_zookeeper.server.connect_string}/acl-outage"
    async with broker_side(connect) as (zk, cache, store):
        assert await store.wait_applied([await store.update(TOPIC, adding(READ))])
        await own_zookeeper.stop()
        await eventually(lambda: zk.state is ConnectionState.SUSPENDED)  # the outage is seen
        assert cache.snapshot.entries(TOPIC) == {READ}
        await own_zookeeper.start()
        async with AsyncZooKeeper(connect) as zk_2:
            other = AclStore(zk_2, AclCache(zk_2))
            await other.update(TOPIC, adding(DENY))
        await eventually(lambda: cache.snapshot.entries(TOPIC) == {READ, DENY}, timeout_s=30)


async def test_delete_reads_exactly_named_patterns_from_zookeeper(zk_chroot: str) -> None:
    """Kafka's rule: a filter naming one pattern exactly removes it even if this broker's cache
    has not seen it yet; a filter that can match many works on the cache."""
    async with broker_side(zk_chroot) as (zk, _, writer):
        await writer.update(TOPIC, adding(READ, DENY))
        behind = AclCache(zk)  # never started: it has seen nothing
        store = AclStore(zk, behind)
        wide = AclBindingFilter(ResourceType.TOPIC, "orders", PatternType.MATCH)
        exact = AclBindingFilter(ResourceType.TOPIC, "orders", PatternType.LITERAL, "User:bob")
        assert await store.delete([wide]) == [[]]
        (removed,) = await store.delete([exact])
        assert [(d.binding.entry, d.error) for d in removed] == [(DENY, None)]
        assert await store.read(TOPIC) == {READ}


async def test_create_and_delete_report_per_binding(zk_chroot: str) -> None:
    async with broker_side(zk_chroot) as (_, cache, store):
        bindings = [
            AclBinding.of(TOPIC, READ),
            AclBinding.of(PREFIXED_GROUP, READ),
            AclBinding.of(TOPIC, DENY),
        ]
        assert await store.create(bindings) == [None, None, None]
        assert set(cache.snapshot.bindings()) == set(bindings)  # read-your-writes
        by_alice = AclBindingFilter(principal="User:alice")
        everything = AclBindingFilter()
        first, second = await store.delete([by_alice, everything])
        # Each removed binding is reported once, under the first filter that matches it.
        assert {d.binding for d in first} == {bindings[0], bindings[1]}
        assert [d.binding for d in second] == [bindings[2]]
        assert cache.snapshot.bindings() == []
