"""The controller on a real ZooKeeper: elections after broker loss, restarts, failover, fencing of
stale controllers, conflicts with leaders' ISR writes, and controlled shutdown.

Each `ControllerNode` is what a broker runs for this: its own ZooKeeper session, store, cache,
watcher, election and Controller, and its own registration. `FakeBroker`s are bare sessions that
register /brokers/ids/<id>; closing one is that broker dying.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import pytest
from riverbed.broker.controlled_shutdown import request_controlled_shutdown
from riverbed.configs import CONFIG_RULES
from riverbed.coordination import controller as controller_module
from riverbed.coordination import layout
from riverbed.coordination.controller import Controller
from riverbed.coordination.controller_election import ControllerElection
from riverbed.coordination.layout import NO_LEADER, BrokerRegistration, PartitionState
from riverbed.coordination.leader_balance import REBALANCE_OFF, RebalancePolicy
from riverbed.coordination.metadata import ClusterMetadataStore, PartitionStateUpdate
from riverbed.coordination.metadata_cache import MetadataCache, MetadataChange, MetadataWatcher
from riverbed.coordination.zk import AsyncZooKeeper, CreateOp, DeleteOp
from riverbed.hot.replication.inter_broker import InterBrokerDialer
from riverbed.protocol.errors import ErrorCode, KafkaError

from tests.support.partition_states import get_partition_state, update_partition_state
from tests.support.zookeeper import expire_session

# No test here waits for a session to time out (sessions end by closing or expire_session), so
# the timeout is long: a loaded machine that stalls a process for a second must expire nothing.
SESSION_TIMEOUT_MS = 10_000
WAIT_S = 10.0
POLL_S = 0.02


def registration(broker_id: int, timestamp_ms: int = 1) -> BrokerRegistration:
    return BrokerRegistration(broker_id, "127.0.0.1", 9090 + broker_id, timestamp_ms=timestamp_ms)


async def open_store(connect: str) -> ClusterMetadataStore:
    zk = AsyncZooKeeper(connect, session_timeout_ms=SESSION_TIMEOUT_MS)
    await zk.start()
    store = ClusterMetadataStore(zk, CONFIG_RULES)
    await store.ensure_layout()
    return store


async def eventually(condition: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        outcome = condition()
        if outcome if isinstance(outcome, bool) else await outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {WAIT_S} s: {what}")
        await asyncio.sleep(POLL_S)


@dataclass
class ControllerNode:
    broker_id: int
    store: ClusterMetadataStore
    cache: MetadataCache
    watcher: MetadataWatcher
    controller: Controller
    election: ControllerElection
    changes: list[MetadataChange] = field(default_factory=list)

    @classmethod
    async def start(
        cls,
        connect: str,
        broker_id: int,
        unclean: Collection[str] = (),
        rebalance: RebalancePolicy = REBALANCE_OFF,
    ) -> ControllerNode:
        store = await open_store(connect)
        cache = MetadataCache()
        watcher = MetadataWatcher(store.zk, cache)
        await watcher.start()
        controller = Controller(
            store, cache, broker_id, lambda topic: topic in unclean, rebalance=rebalance
        )
        election = ControllerElection(store, broker_id, on_change=controller.on_election_change)
        node = cls(broker_id, store, cache, watcher, controller, election)
        cache.add_listener(node.changes.append)
        await store.register_broker(registration(broker_id))
        await election.start()
        return node

    async def stop(self) -> None:
        await self.election.stop()
        await self.controller.stop()
        await self.watcher.stop()
        await self.store.zk.stop()


class Cluster:
    """Starts nodes and fake brokers in one chroot; `close()` stops whatever is left."""

    def __init__(self, connect: str) -> None:
        self.connect = connect
        self.nodes: list[ControllerNode] = []
        self.brokers: dict[int, ClusterMetadataStore] = {}
        self.admin: ClusterMetadataStore | None = None

    async def node(
        self,
        broker_id: int,
        unclean: Collection[str] = (),
        rebalance: RebalancePolicy = REBALANCE_OFF,
    ) -> ControllerNode:
        node = await ControllerNode.start(self.connect, broker_id, unclean, rebalance)
        self.nodes.append(node)
        return node

    async def broker(self, broker_id: int, timestamp_ms: int = 1) -> ClusterMetadataStore:
        """A fake broker: a session holding the registration of `broker_id`."""
        store = await open_store(self.connect)
        await store.register_broker(registration(broker_id, timestamp_ms))
        self.brokers[broker_id] = store
        return store

    async def kill(self, broker_id: int) -> None:
        await self.brokers.pop(broker_id).zk.stop()

    async def store(self) -> ClusterMetadataStore:
        """A session for the test's own reads and writes (topics, leaders' ISR changes)."""
        if self.admin is None:
            self.admin = await open_store(self.connect)
        return self.admin

    async def close(self) -> None:
        for node in self.nodes:
            await node.stop()
        for store in [*self.brokers.values(), *([self.admin] if self.admin else [])]:
            await store.zk.stop()


@pytest.fixture
async def cluster(zk_chroot: str) -> AsyncIterator[Cluster]:
    created = Cluster(zk_chroot)
    yield created
    await created.close()


async def create_topic(
    cluster: Cluster, name: str, brokers: Collection[int], partitions: int = 1
) -> dict[int, tuple[int, ...]]:
    """Create a topic with one replica on each of `brokers`; return its replica assignment."""
    store = await cluster.store()
    await store.create_topic(name, partitions, len(brokers), {}, brokers)
    assignment = {}
    for index in range(partitions):
        state, _ = await get_partition_state(store, name, index)
        assignment[index] = state.isr  # a new topic's ISR is its replicas, in order
    return assignment


async def set_state(
    cluster: Cluster, topic: str, leader: int, isr: tuple[int, ...], partition: int = 0
) -> None:
    """A leader's conditional ISR write (also used to set up who leads a new partition)."""
    store = await cluster.store()
    state, version = await get_partition_state(store, topic, partition)
    await update_partition_state(
        store,
        topic,
        partition,
        PartitionState(leader, state.leader_epoch, isr, state.controller_epoch),
        version,
    )


async def state_of(cluster: Cluster, topic: str, partition: int = 0) -> PartitionState:
    store = await cluster.store()
    state, _ = await get_partition_state(store, topic, partition)
    return state


async def wait_for_state(
    cluster: Cluster, topic: str, condition: Callable[[PartitionState], bool], partition: int = 0
) -> PartitionState:
    async def reached() -> bool:
        return condition(await state_of(cluster, topic, partition))

    await eventually(reached, f"state of {topic}-{partition}")
    return await state_of(cluster, topic, partition)


def version_in_cache(node: ControllerNode, topic: str) -> int | None:
    state = node.cache.partition(topic, 0)
    return None if state is None else state.state_version


async def test_broker_loss_elects_the_next_isr_member(cluster: Cluster) -> None:
    node = await cluster.node(1)
    for broker_id in (2, 3, 4):
        await cluster.broker(broker_id)
    assignment = await create_topic(cluster, "t", {2, 3, 4}, partitions=3)
    assert node.controller.active

    await cluster.kill(2)
    for index, replicas in assignment.items():
        state = await wait_for_state(cluster, "t", lambda s: 2 not in s.isr, index)
        survivors = tuple(r for r in replicas if r != 2)
        # The leader moves only if it was 2, to the first surviving replica in assignment order;
        # either way the ISR shrinks and the leader epoch goes up by one.
        leader = survivors[0] if replicas[0] == 2 else replicas[0]
        assert state == PartitionState(leader, 1, survivors, controller_epoch=1)


async def test_offline_partition_and_unclean_election(cluster: Cluster) -> None:
    await cluster.node(1, unclean={"dirty"})
    await cluster.broker(2)
    await cluster.broker(3)
    for topic in ("clean", "dirty"):
        await create_topic(cluster, topic, {2, 3})
        await set_state(cluster, topic, 2, (2,))  # 3 fell out of sync

    await cluster.kill(2)
    # Nobody in sync is left: offline, the ISR kept for broker 2's return; 3 is not elected.
    clean = await wait_for_state(cluster, "clean", lambda s: s.leader_epoch == 1)
    assert (clean.leader, clean.isr) == (NO_LEADER, (2,))
    # Unclean election: the live replica leads alone.
    dirty = await wait_for_state(cluster, "dirty", lambda s: s.leader_epoch == 1)
    assert (dirty.leader, dirty.isr) == (3, (3,))

    await cluster.broker(2, timestamp_ms=2)  # broker 2 is back
    clean = await wait_for_state(cluster, "clean", lambda s: s.leader == 2)
    assert (clean.leader_epoch, clean.isr) == (2, (2,))
    assert await state_of(cluster, "dirty") == dirty  # led by 3, which 2 does not displace


async def test_controller_failover(cluster: Cluster) -> None:
    nodes = [await cluster.node(1), await cluster.node(2)]
    await cluster.broker(3)
    await cluster.broker(4)
    await cluster.broker(5)
    await create_topic(cluster, "t", {3, 4, 5}, partitions=2)
    assert nodes[0].controller.active
    assert not nodes[1].controller.active

    def active_at(epoch: int) -> ControllerNode | None:
        # A deposed controller may act until it hears its session expired: the epoch check
        # keeps its writes out. The current one is the active node that won `epoch`.
        won = [n for n in nodes if n.controller.active and n.store.controller_epoch == epoch]
        return won[0] if won else None

    # The controller's session expires. Its node reconnects with a new session and contends
    # again, so either may win; what matters is a new term whose controller acts.
    await expire_session(nodes[0].store.zk)
    await eventually(lambda: active_at(2) is not None, "a controller elected at epoch 2")
    await cluster.kill(3)
    for index in (0, 1):
        state = await wait_for_state(cluster, "t", lambda s: 3 not in s.isr, index)
        assert (state.leader_epoch, state.controller_epoch) == (1, 2)

    # The active controller's broker goes away for good: the other one takes over.
    survivor = nodes[1] if active_at(2) is nodes[0] else nodes[0]
    departed = nodes[0] if survivor is nodes[1] else nodes[1]
    await departed.stop()
    cluster.nodes.remove(departed)
    nodes.remove(departed)
    await eventually(lambda: active_at(3) is survivor, "the survivor becomes controller")
    await cluster.kill(4)
    for index in (0, 1):
        state = await wait_for_state(cluster, "t", lambda s: s.isr == (5,), index)
        assert (state.leader, state.leader_epoch, state.controller_epoch) == (5, 2, 3)


async def test_stale_controller_writes_nothing(cluster: Cluster) -> None:
    stale = await open_store(cluster.connect)
    cache = MetadataCache()
    watcher = MetadataWatcher(stale.zk, cache)
    await watcher.start()
    controller = Controller(stale, cache, 1, lambda _topic: False)
    try:
        await cluster.broker(2)
        await cluster.broker(3)
        await create_topic(cluster, "t", {2, 3})
        await set_state(cluster, "t", 2, (2, 3))
        assert await stale.elect_controller(1)
        controller.on_election_change(True)  # no ControllerElection: it never hears it lost
        # Another broker is elected behind its back (its /controller is gone, the epoch bumped).
        rival = await cluster.store()
        await rival.zk.delete(layout.CONTROLLER_PATH)
        assert await rival.elect_controller(9)
        assert rival.controller_epoch == 2

        await cluster.kill(2)
        await eventually(lambda: not controller.active, "the stale controller stands down")
        state, version = await get_partition_state(rival, "t", 0)
        assert (state.leader, state.leader_epoch, version) == (2, 0, 1)  # untouched
        with pytest.raises(KafkaError) as refused:
            await controller.controlled_shutdown(3)
        assert refused.value.code is ErrorCode.NOT_CONTROLLER
    finally:
        await controller.stop()
        await watcher.stop()
        await stale.zk.stop()


async def test_conflicting_leader_isr_write_is_kept(cluster: Cluster) -> None:
    node = await cluster.node(1)
    for broker_id in (2, 3, 4):
        await cluster.broker(broker_id)
    await create_topic(cluster, "t", {2, 3, 4})
    await set_state(cluster, "t", 2, (2, 3, 4))
    await eventually(lambda: version_in_cache(node, "t") == 1, "the cache has the state")

    # The controller's view goes stale (its watch is slow); meanwhile the leader drops 3.
    await node.watcher.stop()
    await set_state(cluster, "t", 2, (2, 4))
    shutdown = asyncio.create_task(node.controller.controlled_shutdown(4))
    # Decided from version 1, the write conflicts; the controller re-reads and decides again.
    state = await wait_for_state(cluster, "t", lambda s: 4 not in s.isr)
    node.watcher = MetadataWatcher(node.store.zk, node.cache)
    await node.watcher.start()
    assert await asyncio.wait_for(shutdown, WAIT_S) == []
    assert (state.leader, state.isr, state.leader_epoch) == (2, (2,), 1)
    _, version = await get_partition_state(await cluster.store(), "t", 0)
    assert version == 3  # the leader's write, then exactly one controller write


async def test_a_conflict_in_one_of_several_transactions_in_flight(cluster: Cluster) -> None:
    """A controlled shutdown of a broker in 450 partitions writes three transactions at once;
    a leader's ISR write conflicts with one partition of a later one. The other transactions
    land, the conflicting one's other partitions go again unchanged, and every partition ends
    written exactly once by the controller, leaders moved first."""
    node = await cluster.node(1)
    for broker_id in (2, 3, 4):
        await cluster.broker(broker_id)
    partitions = 2 * controller_module.STATE_WRITES_PER_TRANSACTION_MAX + 50
    assignment = await create_topic(cluster, "t", {2, 3, 4}, partitions=partitions)
    await eventually(
        lambda: all(node.cache.partition("t", p) is not None for p in range(partitions)),
        "the cache has every state",
    )
    # The last partition broker 4 does not lead: its ISR-only change is written after the
    # leader moves, in a later transaction.
    conflicted = max(p for p, replicas in assignment.items() if replicas[0] != 4)
    leader = assignment[conflicted][0]
    await node.watcher.stop()
    await set_state(cluster, "t", leader, (leader, 4), partition=conflicted)  # drops a follower
    assert await asyncio.wait_for(node.controller.controlled_shutdown(4), WAIT_S) == []
    node.watcher = MetadataWatcher(node.store.zk, node.cache)
    await node.watcher.start()

    store = await cluster.store()
    for index, replicas in assignment.items():
        state, version = await get_partition_state(store, "t", index)
        assert 4 not in state.isr, (index, state)
        assert state.leader != 4, (index, state)
        assert state.leader_epoch == 1, (index, state)  # one controller write each
        if index == conflicted:
            assert (state.leader, state.isr, version) == (leader, (leader,), 2)
        else:
            assert state.isr == tuple(r for r in replicas if r != 4), (index, state)
            assert version == 1, (index, version)

    def written_at(index: int) -> int:
        state = node.cache.partition("t", index)
        assert state is not None
        return state.state_modified_zxid

    def cached_epoch(index: int) -> int:
        state = node.cache.partition("t", index)
        return -1 if state is None else state.leader_epoch

    await eventually(
        lambda: all(cached_epoch(p) == 1 for p in range(partitions)),
        "the cache has every new state",
    )
    moved = [p for p, replicas in assignment.items() if replicas[0] == 4]
    shrunk = [p for p, replicas in assignment.items() if replicas[0] != 4]
    assert max(map(written_at, moved)) <= min(map(written_at, shrunk)), "leaders first"


async def test_restarted_broker_loses_its_old_term(cluster: Cluster) -> None:
    node = await cluster.node(1)
    broker_2 = await cluster.broker(2)
    await cluster.broker(3)
    for topic in ("moved", "alone"):
        await create_topic(cluster, topic, {2, 3})
    await set_state(cluster, "moved", 2, (2, 3))
    await set_state(cluster, "alone", 2, (2,))

    # Broker 2's registration is replaced in one transaction (a new creation zxid, i.e. a new
    # broker epoch), as one watch event can show a restart: the cache reports the old
    # incarnation removed and a new one added, and the controller fences the old one's terms.
    path = layout.broker_path(2)
    await broker_2.zk.transaction(
        [DeleteOp(path), CreateOp(path, registration(2, timestamp_ms=2).encode(), ephemeral=True)]
    )
    moved = await wait_for_state(cluster, "moved", lambda s: s.leader_epoch == 1)
    assert (moved.leader, moved.isr) == (3, (3,))
    # The only in-sync replica leads again, but in a new term.
    alone = await wait_for_state(cluster, "alone", lambda s: s.leader_epoch == 1)
    assert (alone.leader, alone.isr) == (2, (2,))
    assert any(c.brokers_removed == {2} and c.brokers_added == {2} for c in node.changes)

    # A crash and restart with a new session: again a new term for what it leads.
    await cluster.kill(2)
    await cluster.broker(2, timestamp_ms=3)
    alone = await wait_for_state(cluster, "alone", lambda s: s.leader == 2 and s.leader_epoch > 1)
    assert alone.isr == (2,)
    assert (await state_of(cluster, "moved")).leader == 3


async def test_controlled_shutdown(cluster: Cluster) -> None:
    node = await cluster.node(1)
    for broker_id in (2, 3, 4):
        await cluster.broker(broker_id)
    for topic, brokers in (("led", {2, 3}), ("followed", {2, 4}), ("alone", {2, 3})):
        await create_topic(cluster, topic, brokers)
    await create_topic(cluster, "single", {2})
    await set_state(cluster, "led", 2, (2, 3))
    await set_state(cluster, "followed", 4, (4, 2))
    await set_state(cluster, "alone", 2, (2,))
    await eventually(lambda: version_in_cache(node, "alone") == 1, "the cache has the states")

    # Only the replicated partition it cannot hand over remains (not the single-replica one).
    assert await node.controller.controlled_shutdown(2) == [("alone", 0)]
    led, followed = await state_of(cluster, "led"), await state_of(cluster, "followed")
    assert (led.leader, led.isr, led.leader_epoch) == (3, (3,), 1)
    assert (followed.leader, followed.isr, followed.leader_epoch) == (4, (4,), 1)
    assert (await state_of(cluster, "alone")).leader_epoch == 0
    assert (await state_of(cluster, "single")).leader == 2

    # While it shuts down, broker 2 is never elected, even back in an ISR.
    await set_state(cluster, "followed", 4, (4, 2))
    await cluster.kill(4)
    followed = await wait_for_state(cluster, "followed", lambda s: s.leader_epoch == 2)
    assert (followed.leader, followed.isr) == (NO_LEADER, (2,))

    # It stopped and came back: eligible again.
    await cluster.kill(2)
    await cluster.broker(2, timestamp_ms=2)
    followed = await wait_for_state(cluster, "followed", lambda s: s.leader == 2)
    alone = await wait_for_state(cluster, "alone", lambda s: s.leader == 2 and s.leader_epoch > 0)
    assert followed.isr == (2,)
    assert alone.isr == (2,)


async def test_request_controlled_shutdown_retries_then_gives_up(cluster: Cluster) -> None:
    node = await cluster.node(1)
    await cluster.broker(2)
    await create_topic(cluster, "t", {1, 2})
    await set_state(cluster, "t", 1, (1,))
    await eventually(lambda: version_in_cache(node, "t") == 1, "the cache has the state")

    # Broker 1 is the controller itself: the local controller answers, "t" cannot move.
    started = time.monotonic()
    dialer = InterBrokerDialer(node.cache, "PLAINTEXT")
    moved = await request_controlled_shutdown(
        node.cache, 1, node.controller, dialer, attempts_max=2, retry_backoff_ms=200
    )
    assert not moved
    assert time.monotonic() - started >= 0.2

    await set_state(cluster, "t", 1, (1, 2))  # broker 2 caught up
    assert await request_controlled_shutdown(node.cache, 1, node.controller, dialer, attempts_max=2)
    state = await state_of(cluster, "t")
    assert (state.leader, state.isr) == (2, (2,))


async def test_election_adopts_a_won_election_it_did_not_hear_of(cluster: Cluster) -> None:
    store = await cluster.store()
    assert await store.elect_controller(1)
    _, stat = await store.zk.get(layout.CONTROLLER_EPOCH_PATH)
    # A retried election (its first answer lost) finds its own /controller: same epoch.
    assert await store.elect_controller(1)
    assert (store.controller_epoch, store.controller_epoch_version) == (1, stat.version)

    # An election that starts while this session already holds /controller takes it up.
    changes: list[bool] = []
    election = ControllerElection(store, 1, on_change=changes.append)
    await election.start()
    try:
        await eventually(lambda: election.is_controller, "the election claims its /controller")
        assert changes == [True]
        assert store.controller_epoch == 1
    finally:
        await election.stop()


async def test_a_controller_elected_after_a_restart_still_fences_the_old_term(
    cluster: Cluster,
) -> None:
    first = await cluster.node(1)
    await cluster.broker(2)
    await cluster.broker(3)
    await create_topic(cluster, "alone", {2, 3})
    await set_state(cluster, "alone", 2, (2,))
    await eventually(lambda: version_in_cache(first, "alone") == 1, "the cache has the state")
    # No controller while broker 2 restarts: nobody sees its old registration go.
    await first.stop()
    cluster.nodes.remove(first)
    await cluster.kill(2)
    await cluster.broker(2, timestamp_ms=2)
    second = await cluster.node(4)
    await eventually(lambda: second.controller.active, "node 4 to become controller")
    # The broker epoch (its registration's creation zxid) is newer than the state's last write,
    # so the new controller, which never knew the old registration, still starts a new term.
    alone = await wait_for_state(cluster, "alone", lambda s: s.leader_epoch == 1)
    assert (alone.leader, alone.isr) == (2, (2,))


# Checks far more often than Kafka's 300 s, so the tests below see several within WAIT_S.
REBALANCE_CHECK_S = 0.3
REBALANCE_ON = RebalancePolicy(
    enabled=True, check_interval_s=REBALANCE_CHECK_S, imbalance_percentage=10
)


async def test_auto_rebalance_elects_preferred_leaders_in_batches(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Transactions of 2 states: 5 partitions to move take 3, through the ElectLeaders path.
    monkeypatch.setattr(controller_module, "STATE_WRITES_PER_TRANSACTION_MAX", 2)
    await cluster.broker(2)
    await cluster.broker(3)
    assignment = await create_topic(cluster, "t", [2, 3], partitions=5)
    for index, replicas in assignment.items():  # a failover moved every leadership
        await set_state(cluster, "t", replicas[1], replicas[::-1], index)
    node = await cluster.node(1, rebalance=REBALANCE_ON)
    batches: list[int] = []
    write = node.store.write_partition_states

    async def recording(updates: list[PartitionStateUpdate], *args: Any) -> list[int]:
        batches.append(len(updates))
        return await write(updates, *args)

    node.store.write_partition_states = recording  # type: ignore[method-assign,assignment]
    for index, replicas in assignment.items():
        preferred = replicas[0]
        state = await wait_for_state(cluster, "t", lambda s: s.leader == preferred, index)  # noqa: B023
        # What ElectLeaders writes: the ISR kept, a new leader epoch.
        assert (state.isr, state.leader_epoch) == (replicas[::-1], 1)
    assert batches == [2, 2, 1]


async def test_auto_rebalance_leaves_a_preferred_replica_out_of_the_isr(cluster: Cluster) -> None:
    await cluster.broker(2)
    await cluster.broker(3)
    assignment = await create_topic(cluster, "t", [2, 3], partitions=2)
    out, back = assignment[0], assignment[1]
    await set_state(cluster, "t", out[1], (out[1],), 0)  # its preferred replica fell behind
    await set_state(cluster, "t", back[1], back[::-1], 1)  # this one's is in sync
    await cluster.node(1, rebalance=REBALANCE_ON)

    # The check that moves partition 1 back planned partition 0 too, and left it: after it,
    # and after several more checks, partition 0 is as it was.
    await wait_for_state(cluster, "t", lambda s: s.leader == back[0], partition=1)
    await asyncio.sleep(3 * REBALANCE_CHECK_S)
    state = await state_of(cluster, "t", 0)
    assert (state.leader, state.isr, state.leader_epoch) == (out[1], (out[1],), 0)

    # Back in sync (the leader's ISR write), it gets its leadership back at the next check.
    await set_state(cluster, "t", out[1], out[::-1], 0)
    state = await wait_for_state(cluster, "t", lambda s: s.leader == out[0], partition=0)
    assert (state.isr, state.leader_epoch) == (out[::-1], 1)


async def test_auto_rebalance_stops_with_the_controller(cluster: Cluster) -> None:
    await cluster.broker(2)
    await cluster.broker(3)
    assignment = await create_topic(cluster, "t", [2, 3], partitions=1)
    node = await cluster.node(1, rebalance=REBALANCE_ON)
    await node.stop()
    cluster.nodes.remove(node)
    assert not node.controller.active
    replicas = assignment[0]
    await set_state(cluster, "t", replicas[1], replicas[::-1])
    # No controller, so no check: several intervals later nobody moved it back.
    await asyncio.sleep(3 * REBALANCE_CHECK_S)
    assert (await state_of(cluster, "t")).leader == replicas[1]
    # Its timer went with it (a resigned controller leaves nothing scheduled on the loop).
    assert node.controller._rebalance_timer is None
