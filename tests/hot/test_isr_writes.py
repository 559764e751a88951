"""A leader's ISR changes reach ZooKeeper in batches: real ZooKeeper, real logs and partitions."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from prometheus_client import Counter
from riverbed.configs import CONFIG_RULES
from riverbed.coordination.layout import PartitionState
from riverbed.coordination.metadata import ClusterMetadataStore, PartitionStateUpdate
from riverbed.coordination.zk import AsyncZooKeeper
from riverbed.hot.replication import isr
from riverbed.hot.replication.isr import IsrManager
from riverbed.hot.replication.partitions import PartitionManager
from riverbed.hot.storage.log import LogConfig
from riverbed.hot.storage.log_manager import LogManager

from tests.support.partition_states import get_partition_state, update_partition_state
from tests.support.waiting import eventually

BROKER_ID = 1
FOLLOWER_ID = 2
TOPIC = "isr-batches"
PARTITIONS = 1_200
LAG_MAX_MS = 10_000


@pytest.fixture
async def store(zk_chroot: str) -> AsyncIterator[ClusterMetadataStore]:
    async with AsyncZooKeeper(zk_chroot) as zk:
        opened = ClusterMetadataStore(zk, CONFIG_RULES)
        await opened.ensure_layout()
        yield opened


async def test_isr_changes_of_many_partitions_are_written_in_a_few_transactions(
    store: ClusterMetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower that never fetched leaves the ISR of every partition this broker leads: the
    changes are read with multiRead and written ISR_WRITES_PER_TRANSACTION_MAX per transaction,
    each conditional on its version. One partition whose state another writer moved meanwhile
    is decided again on the new state, and written with the others."""
    topic_id = await store.create_topic(TOPIC, PARTITIONS, 2, {}, {BROKER_ID, FOLLOWER_ID})
    led = []
    for index in range(PARTITIONS):
        state, _ = await get_partition_state(store, TOPIC, index)
        if state.leader == BROKER_ID:
            led.append(index)
    moved = led[7]
    state, version = await get_partition_state(store, TOPIC, moved)
    await update_partition_state(store, TOPIC, moved, state, version)  # the version moves on

    writes: list[int] = []
    real_write = store.write_leader_states

    async def counted(updates: Sequence[PartitionStateUpdate]) -> list[int]:
        writes.append(len(updates))
        return await real_write(updates)

    monkeypatch.setattr(store, "write_leader_states", counted)
    logs = LogManager(tmp_path, LogConfig())
    partitions = PartitionManager(logs, BROKER_ID)
    manager = IsrManager(
        store,
        partitions,
        broker_id=BROKER_ID,
        lag_max_ms=LAG_MAX_MS,
        shrinks=Counter("test_isr_shrinks", "", registry=None),
        expands=Counter("test_isr_expands", "", registry=None),
    )
    try:
        led_partitions = []
        for index in led:
            partition = partitions.ensure(TOPIC, index, LogConfig(), topic_id)
            replicas = (BROKER_ID, FOLLOWER_ID)
            partition.become_leader(0, replicas, frozenset(replicas), 0, now_ms=0)
            led_partitions.append(partition)
        await manager.start()
        for partition in led_partitions:
            manager.check(partition)  # the follower has not fetched since time 0: it lags
        await eventually(lambda: all(p.isr == {BROKER_ID} for p in led_partitions))
        assert writes == [
            min(
                isr.ISR_WRITES_PER_TRANSACTION_MAX,
                len(led) - i * isr.ISR_WRITES_PER_TRANSACTION_MAX,
            )
            for i in range(math.ceil(len(led) / isr.ISR_WRITES_PER_TRANSACTION_MAX))
        ]
        states = await store.read_partition_states([(TOPIC, index) for index in led])
        expected_state = PartitionState(BROKER_ID, 0, (BROKER_ID,), state.controller_epoch)
        for index, read in zip(led, states, strict=True):
            assert read is not None
            assert read[0] == expected_state
            assert read[1] == (2 if index == moved else 1)
        assert all(p.pending_isr is None for p in led_partitions)
    finally:
        await manager.stop()
        logs.close()


async def test_the_writer_outlives_an_unexpected_error_and_the_change_is_written_later(
    store: ClusterMetadataStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One writer task writes every change: an error nobody expected (a bug) costs that batch
    until the next check, never the writer, or every later ISR change would wait forever."""
    topic_id = await store.create_topic(TOPIC, 1, 2, {}, {BROKER_ID, FOLLOWER_ID})
    failures: list[Sequence[tuple[str, int]]] = []
    real_read = store.read_partition_states

    async def failing_once(
        keys: Sequence[tuple[str, int]],
    ) -> list[tuple[PartitionState, int] | None]:
        if not failures:
            failures.append(keys)
            raise RuntimeError("a bug in the read")
        return await real_read(keys)

    monkeypatch.setattr(store, "read_partition_states", failing_once)
    logs = LogManager(tmp_path, LogConfig())
    partitions = PartitionManager(logs, BROKER_ID)
    manager = IsrManager(
        store,
        partitions,
        broker_id=BROKER_ID,
        lag_max_ms=LAG_MAX_MS,
        shrinks=Counter("test_isr_shrinks_2", "", registry=None),
        expands=Counter("test_isr_expands_2", "", registry=None),
    )
    try:
        state, _ = await get_partition_state(store, TOPIC, 0)
        partition = partitions.ensure(TOPIC, 0, LogConfig(), topic_id)
        replicas = (state.leader, FOLLOWER_ID if state.leader == BROKER_ID else BROKER_ID)
        monkeypatch.setattr(manager, "_broker_id", state.leader)
        partition.broker_id = state.leader
        partition.become_leader(0, replicas, frozenset(replicas), 0, now_ms=0)
        await manager.start()
        manager.check(partition)
        await eventually(lambda: bool(failures) and partition.pending_isr is None)
        assert partition.isr == frozenset(replicas)  # not written
        manager.check(partition)  # the next periodic check
        await eventually(lambda: partition.isr == {state.leader})
    finally:
        await manager.stop()
        logs.close()
