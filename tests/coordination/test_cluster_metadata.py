"""ClusterMetadataStore, ControllerElection and the watch-driven MetadataCache on real ZooKeeper."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import pytest
from riverbed.configs import CONFIG_RULES
from riverbed.coordination import layout, metadata
from riverbed.coordination.controller_election import ControllerElection
from riverbed.coordination.embedded_zk import EmbeddedZooKeeper
from riverbed.coordination.layout import BrokerRegistration, PartitionState, TopicAssignment
from riverbed.coordination.metadata import BrokerIdConflictError, ClusterMetadataStore
from riverbed.coordination.metadata_cache import MetadataCache, MetadataChange, MetadataWatcher
from riverbed.coordination.zk import (
    AsyncZooKeeper,
    BadVersionError,
    ConnectionState,
    NodeStat,
    ZkConnectionError,
)
from riverbed.protocol.errors import ErrorCode, KafkaError

from tests.support.partition_states import get_partition_state, update_partition_state
from tests.support.waiting import WAIT_S, eventually
from tests.support.zookeeper import restart_proof_connect

# Short, since a test waits for a rival's registration for two of them; not shorter: a client
# whose server does not answer for 2/3 of it drops the connection (ConnectionLoss), and a loaded
# machine made a 1 s session do that while a fixture created its chroot.
SESSION_TIMEOUT_MS = 3000
# A session that outlives a ZooKeeper server's restart (seconds on a loaded machine).
RESTART_SESSION_TIMEOUT_MS = 30_000


async def open_store(connect: str) -> ClusterMetadataStore:
    zk = AsyncZooKeeper(connect, session_timeout_ms=SESSION_TIMEOUT_MS)
    await zk.start()
    store = ClusterMetadataStore(zk, CONFIG_RULES)
    await store.ensure_layout()
    return store


@pytest.fixture
async def store(zk_chroot: str) -> AsyncIterator[ClusterMetadataStore]:
    opened = await open_store(zk_chroot)
    yield opened
    await opened.zk.stop()


def registration(broker_id: int) -> BrokerRegistration:
    return BrokerRegistration(broker_id, "127.0.0.1", 9090 + broker_id, timestamp_ms=1)


async def test_registration_is_ephemeral(store: ClusterMetadataStore, zk_chroot: str) -> None:
    other = await open_store(zk_chroot)
    await other.register_broker(registration(2))
    await other.register_broker(registration(2))  # a retry by the same session is fine
    data, _ = await store.zk.get(layout.broker_path(2))
    assert BrokerRegistration.decode(2, data) == registration(2)
    assert await store.ensure_cluster_id() == await other.ensure_cluster_id()
    await other.zk.stop()
    assert await store.zk.exists(layout.broker_path(2)) is None


async def test_stale_registration_of_a_live_session_is_a_conflict(
    store: ClusterMetadataStore, zk_chroot: str, caplog: pytest.LogCaptureFixture
) -> None:
    await store.register_broker(registration(1))
    rival = await open_store(zk_chroot)
    started = time.monotonic()
    with pytest.raises(BrokerIdConflictError, match="broker id 1 is registered"):
        await rival.register_broker(registration(1))
    assert time.monotonic() - started >= 2 * SESSION_TIMEOUT_MS / 1000 - 0.1

    # Once the holder's session ends, a waiting registration goes through.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=metadata.__name__):
        waiting = asyncio.create_task(rival.register_broker(registration(1)))
        await eventually(lambda: "waiting for the stale registration" in caplog.text)
    await store.zk.stop()
    await asyncio.wait_for(waiting, WAIT_S)
    stat = await rival.zk.exists(layout.broker_path(1))
    assert stat is not None
    assert stat.ephemeral_owner == rival.zk.session_id
    await rival.zk.stop()


async def test_controller_failover(zk_chroot: str) -> None:
    first, second = await open_store(zk_chroot), await open_store(zk_chroot)
    changes: list[tuple[int, bool]] = []
    election_1 = ControllerElection(first, 1, lambda won: changes.append((1, won)))
    election_2 = ControllerElection(second, 2, lambda won: changes.append((2, won)))
    await election_1.start()
    await election_2.start()
    assert election_1.is_controller
    assert not election_2.is_controller
    assert first.controller_epoch == 1
    assert await second.get_controller() == 1
    assert await second.elect_controller(2) is False

    await first.zk.stop()  # the controller's session ends: the other contender takes over
    await eventually(lambda: election_2.is_controller)
    await eventually(lambda: not election_1.is_controller)
    assert second.controller_epoch == 2
    assert await second.get_controller() == 2
    # Each contender's news comes from its own session, so which of the two is heard first is a
    # race (one CI run heard 2 win before 1 lose); Kafka does not order them either and fences a
    # stale controller by its epoch instead, checked above. Each contender's own story is fixed.
    assert [won for broker_id, won in changes if broker_id == 1] == [True, False]
    assert [won for broker_id, won in changes if broker_id == 2] == [True]
    await election_2.stop()
    await second.zk.stop()


async def test_create_and_delete_topic(store: ClusterMetadataStore) -> None:
    topic_id = await store.create_topic("orders", 6, 2, {"retention.ms": "60000"}, {1, 2, 3})
    data, _ = await store.zk.get(layout.topic_path("orders"))
    assignment = TopicAssignment.decode("orders", data)
    assert assignment.topic_id == topic_id
    assert Counter(replicas[0] for replicas in assignment.partitions.values()) == {1: 2, 2: 2, 3: 2}
    for partition, replicas in assignment.partitions.items():
        state, version = await get_partition_state(store, "orders", partition)
        assert state == PartitionState(replicas[0], 0, replicas, 0)
        assert version == 0
    config, _ = await store.zk.get(layout.topic_config_path("orders"))
    assert b'"retention.ms":"60000"' in config

    assert await store.delete_topic("orders") == topic_id
    assert await store.zk.get_children(layout.BROKER_TOPICS_PATH) == []
    assert await store.zk.get_children(layout.CONFIG_TOPICS_PATH) == []
    with pytest.raises(KafkaError) as caught:
        await store.delete_topic("orders")
    assert caught.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_delete_topic_writes_its_intent_first_and_brokers_finish_it(
    store: ClusterMetadataStore,
) -> None:
    topic_id = await store.create_topic("orders", 2, 2, {}, {1, 2, 3})
    assert await store.delete_topic("orders") == topic_id
    # The marker outlives the topic: it is what lets each replica delete its log.
    [marker] = await store.topic_deletions()
    assert (marker.topic_id, marker.topic) == (topic_id, "orders")
    assert marker.replicas == {1, 2, 3}
    await store.finish_topic_deletion(topic_id, 2)
    await store.finish_topic_deletion(topic_id, 2)  # a retry changes nothing
    [marker] = await store.topic_deletions()
    assert marker.replicas == {1, 3}
    await store.finish_topic_deletion(topic_id, 1)
    await store.finish_topic_deletion(topic_id, 3)
    assert await store.topic_deletions() == []
    assert await store.zk.get_children(layout.DELETE_TOPICS_PATH) == []


async def test_delete_topic_by_id_spares_a_topic_created_again_under_the_name(
    store: ClusterMetadataStore,
) -> None:
    old_id = await store.create_topic("orders", 1, 1, {}, {1})
    await store.delete_topic("orders")
    new_id = await store.create_topic("orders", 1, 1, {}, {1})
    with pytest.raises(KafkaError) as caught:
        await store.delete_topic("orders", old_id)  # a stale marker's deletion
    assert caught.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert await store.zk.get_children(layout.BROKER_TOPICS_PATH) == ["orders"]
    assert await store.delete_topic("orders", new_id) == new_id
    assert {m.topic_id for m in await store.topic_deletions()} == {old_id, new_id}


@pytest.mark.parametrize(
    ("name", "partitions", "replication", "configs", "code"),
    [
        ("bad/name", 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("..", 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("x" * 250, 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("t", 0, 1, {}, ErrorCode.INVALID_PARTITIONS),
        ("t", 1, 0, {}, ErrorCode.INVALID_REPLICATION_FACTOR),
        ("t", 1, 3, {}, ErrorCode.INVALID_REPLICATION_FACTOR),
        ("t", 1, 1, {"retention.msec": "1"}, ErrorCode.INVALID_CONFIG),
    ],
)
async def test_create_topic_errors(
    store: ClusterMetadataStore,
    name: str,
    partitions: int,
    replication: int,
    configs: dict[str, str],
    code: ErrorCode,
) -> None:
    with pytest.raises(KafkaError) as caught:
        await store.create_topic(name, partitions, replication, configs, {1, 2})
    assert caught.value.code is code
    assert await store.zk.get_children(layout.BROKER_TOPICS_PATH) == []


async def test_duplicate_topic_and_conditional_state_update(store: ClusterMetadataStore) -> None:
    await store.create_topic("t", 1, 1, {}, {1})
    with pytest.raises(KafkaError) as caught:
        await store.create_topic("t", 3, 1, {}, {1})
    assert caught.value.code is ErrorCode.TOPIC_ALREADY_EXISTS

    state, version = await get_partition_state(store, "t", 0)
    moved = PartitionState(-1, state.leader_epoch + 1, (), 1)
    assert await update_partition_state(store, "t", 0, moved, version) == version + 1
    with pytest.raises(BadVersionError):
        await update_partition_state(store, "t", 0, state, version)
    assert (await get_partition_state(store, "t", 0))[0] == moved

    await store.set_topic_config("t", {"cleanup.policy": "compact"})
    with pytest.raises(KafkaError) as unknown:
        await store.set_topic_config("nope", {"cleanup.policy": "compact"})
    assert unknown.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_add_partitions(store: ClusterMetadataStore) -> None:
    """The assignment grows in place (same topic id, conditional on its version) and each new
    partition's state is written as create_topic writes its partitions'."""
    topic_id = await store.create_topic("grow", 3, 2, {}, {1, 2, 3})
    data, before = await store.zk.get(layout.topic_path("grow"))
    existing = TopicAssignment.decode("grow", data).partitions

    added = await store.add_partitions("grow", 7, {1, 2, 3})
    assert sorted(added) == [3, 4, 5, 6]
    data, after = await store.zk.get(layout.topic_path("grow"))
    assert after.version == before.version + 1
    assignment = TopicAssignment.decode("grow", data)
    assert assignment.topic_id == topic_id
    assert assignment.partitions == {**existing, **added}
    for partition, replicas in added.items():
        assert len(set(replicas)) == 2
        state, version = await get_partition_state(store, "grow", partition)
        assert (state, version) == (PartitionState(replicas[0], 0, replicas, 0), 0)
    children = await store.zk.get_children(layout.partitions_path("grow"))
    assert sorted(int(child) for child in children) == list(range(7))

    # Checked and placed only: nothing is written.
    planned = await store.add_partitions("grow", 9, {1, 2, 3}, validate_only=True)
    assert sorted(planned) == [7, 8]
    assert (await store.zk.get(layout.topic_path("grow")))[1].version == after.version
    assert await store.zk.exists(layout.partition_path("grow", 7)) is None
    # Given replicas, as given.
    assert await store.add_partitions("grow", 8, {1, 2, 3}, [[3, 1]]) == {7: (3, 1)}
    assert (await get_partition_state(store, "grow", 7))[0] == PartitionState(3, 0, (3, 1), 0)


async def test_the_most_partitions_added_at_once_fit_one_transaction(
    store: ClusterMetadataStore,
) -> None:
    """PARTITIONS_ADDED_AT_ONCE_MAX partitions of a topic with the longest legal name, all in
    one transaction that ZooKeeper accepts."""
    name = "x" * 249
    await store.create_topic(name, 1, 3, {}, {1, 2, 3})
    added = await store.add_partitions(name, 1 + metadata.PARTITIONS_ADDED_AT_ONCE_MAX, {1, 2, 3})
    assert len(added) == metadata.PARTITIONS_ADDED_AT_ONCE_MAX
    children = await store.zk.get_children(layout.partitions_path(name))
    assert len(children) == 1 + metadata.PARTITIONS_ADDED_AT_ONCE_MAX


@pytest.mark.parametrize(
    ("count", "live", "manual", "code", "message"),
    [
        (2, {1, 2}, None, ErrorCode.INVALID_PARTITIONS, "'t' already has 2 partitions"),
        (1, {1, 2}, None, ErrorCode.INVALID_PARTITIONS, "more than the 1 asked for"),
        (3, {1}, None, ErrorCode.INVALID_REPLICATION_FACTOR, "replication factor 2"),
        (1003, {1, 2}, None, ErrorCode.INVALID_PARTITIONS, "at most 1000 are added at once"),
        (4, {1, 2}, [[1, 2]], ErrorCode.INVALID_REPLICA_ASSIGNMENT, "but 1 replica lists"),
        (3, {1, 2}, [[2, 2]], ErrorCode.INVALID_REPLICA_ASSIGNMENT, "names a broker twice"),
        (3, {1, 2}, [[1, 3]], ErrorCode.INVALID_REPLICA_ASSIGNMENT, "unknown or stopped"),
        (3, {1, 2}, [[1]], ErrorCode.INVALID_REPLICA_ASSIGNMENT, "has 1 replicas"),
    ],
)
async def test_add_partitions_errors(
    store: ClusterMetadataStore,
    count: int,
    live: set[int],
    manual: list[list[int]] | None,
    code: ErrorCode,
    message: str,
) -> None:
    await store.create_topic("t", 2, 2, {}, {1, 2})
    _, before = await store.zk.get(layout.topic_path("t"))
    with pytest.raises(KafkaError, match=message) as caught:
        await store.add_partitions("t", count, live, manual)
    assert caught.value.code is code
    assert (await store.zk.get(layout.topic_path("t")))[1].version == before.version
    assert len(await store.zk.get_children(layout.partitions_path("t"))) == 2


async def test_add_partitions_to_a_missing_or_moving_topic(store: ClusterMetadataStore) -> None:
    with pytest.raises(KafkaError) as unknown:
        await store.add_partitions("nope", 3, {1, 2})
    assert unknown.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    await store.create_topic("moving", 2, 1, {}, {1, 2})
    data, stat = await store.zk.get(layout.topic_path("moving"))
    assignment = TopicAssignment.decode("moving", data)
    # Partition 1 moving from its broker to both (KIP-455: target replicas first).
    (source,) = assignment.partitions[1]
    target = 3 - source
    moving = TopicAssignment(
        assignment.topic_id,
        {0: assignment.partitions[0], 1: (target, source)},
        adding={1: (target,)},
        removing={1: (source,)},
    )
    await store.zk.set(layout.topic_path("moving"), moving.encode(), stat.version)
    with pytest.raises(KafkaError, match=r"partitions \[1\] of topic 'moving' are being") as busy:
        await store.add_partitions("moving", 3, {1, 2})
    assert busy.value.code is ErrorCode.REASSIGNMENT_IN_PROGRESS


async def test_concurrent_additions_are_decided_on_what_the_other_wrote(
    store: ClusterMetadataStore, zk_chroot: str
) -> None:
    """Two stores growing one topic at once: the conditional write makes the loser decide again
    on the winner's assignment, so no partition is written twice or lost."""
    other = await open_store(zk_chroot)
    try:
        await store.create_topic("race", 1, 1, {}, {1, 2})
        outcomes = await asyncio.gather(
            store.add_partitions("race", 4, {1, 2}),
            other.add_partitions("race", 6, {1, 2}),
            return_exceptions=True,
        )
    finally:
        await other.zk.stop()
    data, stat = await store.zk.get(layout.topic_path("race"))
    final = TopicAssignment.decode("race", data).partitions
    children = await store.zk.get_children(layout.partitions_path("race"))
    assert sorted(int(child) for child in children) == sorted(final)
    added = [set(outcome) for outcome in outcomes if isinstance(outcome, dict)]
    refused = [o for o in outcomes if isinstance(o, KafkaError)]
    assert len(added) + len(refused) == 2
    # Either both grew it (to 4, then to 6) or the 6 came first and the 4 was refused.
    if refused:
        assert refused[0].code is ErrorCode.INVALID_PARTITIONS
        assert added == [set(range(1, 6))]
        assert stat.version == 1
    else:
        assert sorted(map(sorted, added)) == [[1, 2, 3], [4, 5]]
        assert stat.version == 2
    assert len(final) == 6


async def test_cache_shows_added_partitions_whole(
    store: ClusterMetadataStore, zk_chroot: str
) -> None:
    """The watcher follows new partitions of a known topic: the topic is replaced once every
    new partition's state is loaded (never shown with partitions that have no state), and the
    change names exactly the new partitions."""
    await store.create_topic("grows", 2, 1, {}, {1, 2})
    cache = MetadataCache()
    watcher_zk = AsyncZooKeeper(zk_chroot)
    await watcher_zk.start()
    watcher = MetadataWatcher(watcher_zk, cache)
    await watcher.start()
    changes: list[MetadataChange] = []
    seen: list[int] = []

    def record(change: MetadataChange) -> None:
        changes.append(change)
        topic = cache.topic("grows")
        assert topic is not None
        seen.append(len(topic.partitions))

    cache.add_listener(record)
    try:
        added = await store.add_partitions("grows", 5, {1, 2})
        await cache.wait_until(lambda c: c.partition("grows", 4) is not None, 5000)
        topic = cache.topic("grows")
        assert topic is not None
        for partition, replicas in added.items():
            assert topic.partitions[partition].replicas == replicas
            assert topic.partitions[partition].leader == replicas[0]
            assert topic.partitions[partition].isr == replicas
        assert seen == [5]
        (change,) = changes
        assert change.partitions_changed == {("grows", 2), ("grows", 3), ("grows", 4)}
        assert not change.topics_added
        assert not change.topics_removed
    finally:
        await watcher.stop()
        await watcher_zk.stop()


async def test_cache_initial_load_and_updates(store: ClusterMetadataStore, zk_chroot: str) -> None:
    await store.ensure_cluster_id()
    await store.register_broker(registration(1))
    await store.elect_controller(1)
    first_id = await store.create_topic("first", 2, 1, {"retention.ms": "5"}, {1})

    cache = MetadataCache()
    changes: list[MetadataChange] = []
    cache.add_listener(changes.append)
    watcher_zk = AsyncZooKeeper(zk_chroot)
    await watcher_zk.start()
    watcher = MetadataWatcher(watcher_zk, cache)
    await watcher.start()
    # Complete as soon as start() returns.
    assert set(cache.brokers()) == {1}
    assert cache.controller_id == 1
    assert cache.cluster_id == await store.ensure_cluster_id()
    assert cache.topic_names() == {"first"}
    first = cache.topic("first")
    assert first is not None
    assert first.topic_id == first_id
    assert first.configs == {"retention.ms": "5"}
    assert cache.topic_by_id(first_id) is first
    assert cache.partition("first", 1) is not None
    assert any(change.topics_added == {"first"} for change in changes)

    second_store = await open_store(zk_chroot)
    await second_store.register_broker(registration(2))
    second_id = await store.create_topic("second", 3, 2, {}, {1, 2})
    await cache.wait_until(lambda c: c.topic("second") is not None and 2 in c.brokers(), 5000)
    second = cache.topic("second")
    assert second is not None
    assert second.topic_id == second_id
    assert len(second.partitions) == 3

    state, version = await get_partition_state(store, "second", 0)
    await update_partition_state(
        store, "second", 0, PartitionState(state.isr[-1], 1, state.isr, 0), version
    )
    await cache.wait_until(
        lambda c: (p := c.partition("second", 0)) is not None and p.leader_epoch == 1, 5000
    )
    assert any(("second", 0) in change.partitions_changed for change in changes)

    await store.set_topic_config("first", {"segment.bytes": "1000"})
    await cache.wait_until(
        lambda c: (t := c.topic("first")) is not None and t.configs == {"segment.bytes": "1000"},
        5000,
    )

    await store.delete_topic("first")
    await cache.wait_until(lambda c: c.topic("first") is None, 5000)
    removed = [t for change in changes for t in change.topics_removed]
    assert [t.topic_id for t in removed] == [first_id]
    assert cache.topic_by_id(first_id) is None

    await second_store.zk.stop()  # broker 2's session ends
    await cache.wait_until(lambda c: set(c.brokers()) == {1}, 5000)
    await store.zk.stop()  # the controller goes
    await cache.wait_until(lambda c: c.controller_id is None, 5000)
    await watcher.stop()
    await watcher_zk.stop()


async def test_the_cache_follows_new_topics_and_states_after_zookeeper_restarts(
    own_server: EmbeddedZooKeeper,
) -> None:
    """The watcher's session outlives ZooKeeper's restarts; afterwards a new topic, a state
    change and a deleted topic still reach the cache. (A children watch on /brokers/topics beside
    the persistent one lost new topics after a restart: ZooKeeper before 3.9 keeps one watch
    mode per path and session.)"""
    connect = restart_proof_connect(own_server, "/metadata")
    store = await open_store(connect)
    await store.register_broker(registration(1))
    await store.create_topic("before", 2, 1, {}, {1})
    cache = MetadataCache()
    watcher_zk = AsyncZooKeeper(connect, session_timeout_ms=RESTART_SESSION_TIMEOUT_MS)
    await watcher_zk.start()
    watcher = MetadataWatcher(watcher_zk, cache)
    await watcher.start()
    assert cache.topic_names() == {"before"}
    await store.zk.stop()
    for _ in range(2):
        await asyncio.to_thread(own_server.stop)
        await eventually(lambda: watcher_zk.state is ConnectionState.SUSPENDED)
        await asyncio.to_thread(own_server.start)
        await watcher_zk.wait_connected(RESTART_SESSION_TIMEOUT_MS)
    store = await open_store(connect)
    await store.register_broker(registration(1))
    await store.create_topic("after", 3, 1, {}, {1})
    await cache.wait_until(lambda c: c.topic_names() == {"before", "after"}, int(WAIT_S * 1000))
    state, version = await get_partition_state(store, "before", 1)
    await update_partition_state(store, "before", 1, replace(state, leader_epoch=7), version)
    await cache.wait_until(
        lambda c: (p := c.partition("before", 1)) is not None and p.leader_epoch == 7,
        int(WAIT_S * 1000),
    )
    await store.delete_topic("before")
    await cache.wait_until(lambda c: c.topic_names() == {"after"}, int(WAIT_S * 1000))
    await watcher.stop()
    await watcher_zk.stop()
    await store.zk.stop()


async def test_start_returns_only_once_every_state_is_read(
    store: ClusterMetadataStore, zk_chroot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of partition states that fails while the watcher starts (ZooKeeper's connection
    dropped) is retried, and start() returns only with every topic whole: a broker takes a
    topic missing from its cache for one deleted while it was down, and deletes its logs."""
    await store.register_broker(registration(1))
    await store.create_topic("whole", 4, 1, {}, {1})
    watcher_zk = AsyncZooKeeper(zk_chroot)
    await watcher_zk.start()
    real_get_many = watcher_zk.get_many
    failures: list[int] = []

    async def get_many_failing_once(paths: Sequence[str]) -> list[tuple[bytes, NodeStat] | None]:
        if not failures:
            failures.append(len(paths))
            raise ZkConnectionError("ConnectionLoss (injected)")
        return await real_get_many(paths)

    monkeypatch.setattr(watcher_zk, "get_many", get_many_failing_once)
    cache = MetadataCache()
    watcher = MetadataWatcher(watcher_zk, cache)
    await watcher.start()
    assert failures == [4]
    whole = cache.topic("whole")
    assert whole is not None
    assert sorted(whole.partitions) == [0, 1, 2, 3]
    await watcher.stop()
    await watcher_zk.stop()


async def test_topic_larger_than_one_transaction(
    store: ClusterMetadataStore, zk_chroot: str
) -> None:
    """A topic whose znodes exceed one ZooKeeper request (jute.maxbuffer: the server drops the
    connection of a larger one) is created and deleted in several transactions; a watching
    broker shows it only whole, and a state change then costs one partition, not the topic."""
    name = "t" * 200  # long paths: ~700 bytes of znodes per partition
    partitions = 5000
    ops = metadata._create_topic_ops(
        name, uuid.uuid4(), {p: (1, 2) for p in range(partitions)}, {}, 0
    )
    assert len(metadata._transaction_chunks(ops, len(store.zk.chroot))) > 1
    cache = MetadataCache()
    watcher_zk = AsyncZooKeeper(zk_chroot)
    await watcher_zk.start()
    watcher = MetadataWatcher(watcher_zk, cache)
    await watcher.start()
    changes: list[MetadataChange] = []
    sizes: list[int] = []

    def record(change: MetadataChange) -> None:
        changes.append(change)
        topic = cache.topic(name)
        sizes.append(0 if topic is None else len(topic.partitions))

    cache.add_listener(record)
    try:
        topic_id = await store.create_topic(name, partitions, 2, {"retention.ms": "5"}, {1, 2})
        await cache.wait_until(lambda c: c.topic(name) is not None, 30_000)
        topic = cache.topic(name)
        assert topic is not None
        assert topic.topic_id == topic_id
        assert topic.configs == {"retention.ms": "5"}
        assert sizes == [partitions]  # shown once, whole
        assert changes[0].topics_added == {name}

        state = topic.partitions[7]
        moved = PartitionState(state.replicas[1], 1, (state.replicas[1],), 0)
        await update_partition_state(store, name, 7, moved, state.state_version)
        await cache.wait_until(lambda c: c.partition(name, 7) != state, 5000)
        assert changes[-1].partitions_changed == {(name, 7)}
        assert cache.partition(name, 7) == replace(
            state, leader=moved.leader, leader_epoch=1, isr=moved.isr, state_version=1,
            state_modified_zxid=cache.partition(name, 7).state_modified_zxid,  # type: ignore[union-attr]
        )  # fmt: skip

        assert await store.delete_topic(name) == topic_id
        assert await store.zk.get_children(layout.BROKER_TOPICS_PATH) == []
        await cache.wait_until(lambda c: c.topic(name) is None, 30_000)
    finally:
        await watcher.stop()
        await watcher_zk.stop()
