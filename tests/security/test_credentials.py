"""SCRAM credentials in a real ZooKeeper: Kafka's znode layout, writers that leave other keys
alone, and the watch-fed broker cache (two brokers' caches, stop, a ZooKeeper outage)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import scramp
from riverbed.coordination import layout
from riverbed.coordination.embedded_zk import EmbeddedZooKeeper
from riverbed.coordination.layout import MalformedZnodeError
from riverbed.coordination.zk import AsyncZooKeeper, ConnectionState, ZkConnectionError
from riverbed.security.credentials import (
    CredentialCache,
    CredentialWatcher,
    UnknownUserError,
    UserSummary,
    delete_scram_credentials,
    list_users,
    read_scram_credentials,
    set_scram_credential,
)
from riverbed.security.scram import (
    ScramClient,
    ScramCredential,
    ScramMechanism,
    ScramServer,
    new_credential,
)

from tests.support.waiting import eventually
from tests.support.zookeeper import expire_session, new_test_server

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
# A ZooKeeper restarted on a busy machine takes a while to serve again.
RECONNECT_WAIT_S = 30.0


@pytest.fixture
async def zk(zk_connect: str) -> AsyncIterator[AsyncZooKeeper]:
    async with AsyncZooKeeper(zk_connect, session_timeout_ms=4000) as client:
        yield client


def logs_in(cache: CredentialCache, user: str, password: str, mechanism: ScramMechanism) -> bool:
    server = ScramServer(mechanism, cache)
    client = ScramClient(mechanism, user, password)
    try:
        final = client.evaluate_challenge(server.evaluate(client.initial_response()))
        assert final is not None
        client.evaluate_challenge(server.evaluate(final))
    except Exception:
        return False
    return server.complete and client.complete


# ---- the znodes ---------------------------------------------------------------------------------


def test_entity_names_are_sanitized_like_kafka() -> None:
    # Java's URLEncoder keeps [A-Za-z0-9._-], Kafka turns '*' into %2A and a space into %20.
    cases = {
        "alice": "alice",
        "a.b-c_d": "a.b-c_d",
        "alice@example.com": "alice%40example.com",
        "a b*c+d~e": "a%20b%2Ac%2Bd%7Ee",
        "é/": "%C3%A9%2F",
        "<default>": "%3Cdefault%3E",
    }
    for name, sanitized in cases.items():
        assert layout.sanitize_entity_name(name) == sanitized
        assert layout.desanitize_entity_name(sanitized) == name
    assert layout.desanitize_entity_name("a+b") == "a b"  # URLDecoder reads '+' as a space
    for bad, problem in (
        ("a%", "does not start a %XX escape"),
        ("a%4", "does not start a %XX escape"),
        ("a%zz", "does not start a %XX escape"),
        ("%FF", "does not decode to UTF-8"),
    ):
        with pytest.raises(ValueError, match=problem):
            layout.desanitize_entity_name(bad)
    assert layout.user_config_path("alice@example.com") == "/config/users/alice%40example.com"


async def test_znode_is_kafkas_json_and_other_keys_survive(zk: AsyncZooKeeper) -> None:
    path = layout.user_config_path("alice@example.com")
    # Kafka keeps user quotas in the same znode.
    await zk.create(path, b'{"version":1,"config":{"producer_byte_rate":"1024"}}', makepath=True)
    credential = new_credential(SHA512, "wonderland")
    await set_scram_credential(zk, "alice@example.com", SHA512, credential)
    data, _ = await zk.get(path)
    assert json.loads(data) == {
        "version": 1,
        "config": {"SCRAM-SHA-512": credential.to_kafka_string(), "producer_byte_rate": "1024"},
    }
    assert b"wonderland" not in data
    assert await read_scram_credentials(zk, "alice@example.com") == {SHA512: credential}
    # Deleting the credential leaves the quota, and the znode.
    assert await delete_scram_credentials(zk, "alice@example.com") == (SHA512,)
    data, _ = await zk.get(path)
    assert json.loads(data) == {"version": 1, "config": {"producer_byte_rate": "1024"}}


async def test_add_replace_delete_and_list(zk: AsyncZooKeeper) -> None:
    assert await list_users(zk) == []
    await set_scram_credential(zk, "bob", SHA256, new_credential(SHA256, "pw", 8192))
    await set_scram_credential(zk, "bob", SHA512, new_credential(SHA512, "pw"))
    await set_scram_credential(zk, "alice", SHA512, new_credential(SHA512, "pw"))
    replacement = new_credential(SHA512, "new-pw", 16384)
    await set_scram_credential(zk, "alice", SHA512, replacement)
    assert await list_users(zk) == [
        UserSummary("alice", {SHA512: 16384}),
        UserSummary("bob", {SHA256: 8192, SHA512: 4096}),
    ]
    assert await delete_scram_credentials(zk, "bob", [SHA256]) == (SHA256,)
    assert (await read_scram_credentials(zk, "bob")).keys() == {SHA512}
    with pytest.raises(UnknownUserError, match="'bob' has no SCRAM-SHA-256"):
        await delete_scram_credentials(zk, "bob", [SHA256])
    with pytest.raises(UnknownUserError, match="'carol'"):
        await delete_scram_credentials(zk, "carol")
    # The last key gone, the znode goes too.
    assert await delete_scram_credentials(zk, "bob") == (SHA512,)
    assert await zk.exists(layout.user_config_path("bob")) is None
    assert [summary.name for summary in await list_users(zk)] == ["alice"]


async def test_concurrent_writers_both_land(zk: AsyncZooKeeper, zk_connect: str) -> None:
    """Two tools adding different mechanisms at once: the version check makes one retry."""
    async with AsyncZooKeeper(zk_connect) as other:
        for round_ in range(5):
            user = f"racer-{round_}"
            await asyncio.gather(
                set_scram_credential(zk, user, SHA256, new_credential(SHA256, "a")),
                set_scram_credential(other, user, SHA512, new_credential(SHA512, "b")),
            )
            assert (await read_scram_credentials(zk, user)).keys() == {SHA256, SHA512}


async def test_listing_reports_a_malformed_znode(zk: AsyncZooKeeper) -> None:
    await zk.create(
        layout.user_config_path("broken"),
        b'{"version":1,"config":{"SCRAM-SHA-256":"x"}}',
        makepath=True,
    )
    with pytest.raises(MalformedZnodeError, match="/config/users/broken: SCRAM-SHA-256"):
        await list_users(zk)


async def test_kafka_tooling_credentials_are_read(zk: AsyncZooKeeper) -> None:
    """A znode as kafka-configs writes it, from a credential another implementation derived."""
    salt, stored_key, server_key, iterations = scramp.ScramMechanism(
        "SCRAM-SHA-256"
    ).make_auth_info("from-kafka", iteration_count=8192)
    credential = ScramCredential(salt, stored_key, server_key, iterations)
    await zk.create(
        layout.user_config_path("kafka-user"),
        json.dumps(
            {"version": 1, "config": {"SCRAM-SHA-256": credential.to_kafka_string()}}
        ).encode(),
        makepath=True,
    )
    await zk.create(f"{layout.CONFIG_USERS_PATH}/<default>", b'{"version":1,"config":{}}')
    assert await list_users(zk) == [UserSummary("kafka-user", {SHA256: 8192})]
    cache = CredentialCache()
    watcher = CredentialWatcher(zk, cache)
    await watcher.start()
    try:
        assert cache.users() == {"kafka-user"}  # the <default> quota entity is not a user
        assert logs_in(cache, "kafka-user", "from-kafka", SHA256)
    finally:
        await watcher.stop()


# ---- the cache ----------------------------------------------------------------------------------


async def test_caches_follow_adds_updates_and_deletes(zk: AsyncZooKeeper, zk_connect: str) -> None:
    await set_scram_credential(zk, "early", SHA512, new_credential(SHA512, "pw"))
    async with AsyncZooKeeper(zk_connect) as second_zk:
        caches = [CredentialCache(), CredentialCache()]  # two brokers
        watchers = [CredentialWatcher(zk, caches[0]), CredentialWatcher(second_zk, caches[1])]
        for watcher in watchers:
            await watcher.start()
        try:
            # Loaded by start() itself.
            assert all(logs_in(cache, "early", "pw", SHA512) for cache in caches)

            await set_scram_credential(zk, "a b@c", SHA256, new_credential(SHA256, "first"))
            await eventually(lambda: all(logs_in(c, "a b@c", "first", SHA256) for c in caches))

            await set_scram_credential(zk, "a b@c", SHA256, new_credential(SHA256, "second"))
            await eventually(lambda: all(logs_in(c, "a b@c", "second", SHA256) for c in caches))
            assert not any(logs_in(c, "a b@c", "first", SHA256) for c in caches)

            await delete_scram_credentials(zk, "a b@c")
            await eventually(lambda: all(c.credential("a b@c", SHA256) is None for c in caches))
            assert all(c.users() == {"early"} for c in caches)
        finally:
            for watcher in watchers:
                await watcher.stop()


async def test_a_malformed_user_fails_closed_alone(zk: AsyncZooKeeper) -> None:
    cache = CredentialCache()
    watcher = CredentialWatcher(zk, cache)
    await watcher.start()
    try:
        await set_scram_credential(zk, "good", SHA256, new_credential(SHA256, "pw"))
        await set_scram_credential(zk, "turns-bad", SHA256, new_credential(SHA256, "pw"))
        await eventually(lambda: cache.users() == {"good", "turns-bad"})
        await zk.set(layout.user_config_path("turns-bad"), b"not json")
        await eventually(lambda: cache.users() == {"good"})
        assert logs_in(cache, "good", "pw", SHA256)
    finally:
        await watcher.stop()


async def test_stop_cancels_every_watch_and_task(zk: AsyncZooKeeper) -> None:
    for user in ("u1", "u2", "u3"):
        await set_scram_credential(zk, user, SHA256, new_credential(SHA256, "pw"))
    cache = CredentialCache()
    watcher = CredentialWatcher(zk, cache)
    await watcher.start()
    assert watcher.active_watches == 4  # /config/users and each user
    assert watcher.running_tasks == 0
    await watcher.stop()
    assert watcher.active_watches == 0
    assert watcher.running_tasks == 0
    # Nothing follows ZooKeeper any more: the cache keeps what it had. Checked once a watcher on
    # the same session followed the changes and one more: ZooKeeper's events reach the session's
    # watches in order, so a watch left running had them by then.
    followed = CredentialCache()
    witness = CredentialWatcher(zk, followed)
    await witness.start()
    try:
        await set_scram_credential(zk, "u4", SHA256, new_credential(SHA256, "pw"))
        await delete_scram_credentials(zk, "u1")
        await eventually(lambda: followed.users() == {"u2", "u3", "u4"})
        await set_scram_credential(zk, "u5", SHA256, new_credential(SHA256, "pw"))
        await eventually(lambda: "u5" in followed.users())
    finally:
        await witness.stop()
    assert cache.users() == {"u1", "u2", "u3"}
    await watcher.stop()  # idempotent
    with pytest.raises(RuntimeError):
        await watcher.start()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[EmbeddedZooKeeper]:
    with new_test_server(tmp_path) as server:
        yield server


async def test_authentication_keeps_working_while_zookeeper_is_down(
    own_server: EmbeddedZooKeeper,
) -> None:
    # A client that connects while the restarted server is still loading waits up to its session
    # timeout for an answer: kept short so the reconnection is quick.
    async with AsyncZooKeeper(own_server.connect_string + "/c", session_timeout_ms=4000) as zk:
        await set_scram_credential(zk, "alice", SHA512, new_credential(SHA512, "before"))
        cache = CredentialCache()
        watcher = CredentialWatcher(zk, cache)
        await watcher.start()
        try:
            await asyncio.to_thread(own_server.stop)
            await eventually(lambda: zk.state is ConnectionState.SUSPENDED)  # the outage is seen
            started = time.monotonic()
            assert logs_in(cache, "alice", "before", SHA512)
            assert time.monotonic() - started < 1.0  # no waiting on ZooKeeper
            await asyncio.to_thread(own_server.start)
            # The session is resumed, or (on a slow restart: the test server's ticks are short)
            # replaced; the watches follow new writes either way.
            await write_when_connected(zk, "alice", SHA512, "after")
            await eventually(lambda: logs_in(cache, "alice", "after", SHA512))
            # A new session for certain: the watches are set up again on it.
            await expire_session(zk)
            await write_when_connected(zk, "alice", SHA512, "after-expiry")
            await eventually(lambda: logs_in(cache, "alice", "after-expiry", SHA512))
        finally:
            await watcher.stop()


async def write_when_connected(
    zk: AsyncZooKeeper, user: str, mechanism: ScramMechanism, password: str
) -> None:
    """What an operator does when ZooKeeper has just come back: retry the write."""
    deadline = time.monotonic() + RECONNECT_WAIT_S
    while True:
        try:
            await zk.wait_connected(int(RECONNECT_WAIT_S * 1000))
            await set_scram_credential(zk, user, mechanism, new_credential(mechanism, password))
            return
        except ZkConnectionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
