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
from riverbed.hot.replication.partitions import Partition, PartitionManager
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


@pytest.fixture
async def leader_side(
    store: ClusterMetadataStore, tmp_path: Path
) -> AsyncIterator[tuple[PartitionManager, IsrManager]]:
    """Broker BROKER_ID's partitions and its ISR manager (not started), on real logs."""
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
        yield partitions, manager
    finally:
        await manager.stop()
        logs.close()


async def _led_here(
    store: ClusterMetadataStore, partitions: PartitionManager, count: int
) -> tuple[list[int], list[Partition]]:
    """A topic of `count` partitions on BROKER_ID and FOLLOWER_ID; the indexes BROKER_ID leads,
    opened here as leader with both replicas in the ISR (the follower has not fetched since
    time 0: it lags)."""
    topic_id = await store.create_topic(TOPIC, count, 2, {}, {BROKER_ID, FOLLOWER_ID})
    led = []
    for index in range(count):
        state, _ = await get_partition_state(store, TOPIC, index)
        if state.leader == BROKER_ID:
            led.append(index)
    opened = []
    for index in led:
        partition = partitions.ensure(TOPIC, index, LogConfig(), topic_id)
        replicas = (BROKER_ID, FOLLOWER_ID)
        partition.become_leader(0, replicas, frozenset(replicas), 0, now_ms=0)
        opened.append(partition)
    return led, opened


async def test_isr_changes_of_many_partitions_are_written_in_a_few_transactions(
    store: ClusterMetadataStore,
    leader_side: tuple[PartitionManager, IsrManager],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A follower that never fetched leaves the ISR of every partition this broker leads: the
    changes are read with multiRead and written ISR_WRITES_PER_TRANSACTION_MAX per transaction,
    each conditional on its version. One partition whose state another writer moved meanwhile
    is decided again on the new state, and written with the others."""
    partitions, manager = leader_side
    led, led_partitions = await _led_here(store, partitions, PARTITIONS)
    moved = led[7]
    state, version = await get_partition_state(store, TOPIC, moved)
    await update_partition_state(store, TOPIC, moved, state, version)  # the version moves on

    writes: list[int] = []
    real_write = store.write_leader_states

    async def counted(updates: Sequence[PartitionStateUpdate]) -> list[int]:
        writes.append(len(updates))
        return await real_write(updates)

    monkeypatch.setattr(store, "write_leader_states", counted)
    await manager.start()
    for partition in led_partitions:
        manager.check(partition)
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


async def test_the_writer_outlives_an_unexpected_error_and_the_change_is_written_later(
    store: ClusterMetadataStore,
    leader_side: tuple[PartitionManager, IsrManager],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One writer task writes every change: an error nobody expected (a bug) costs that batch
    until the next check, never the writer, or every later ISR change would wait forever."""
    partitions, manager = leader_side
    _, led_partitions = await _led_here(store, partitions, 8)
    partition = led_partitions[0]
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
    await manager.start()
    manager.check(partition)
    await eventually(lambda: bool(failures) and partition.pending_isr is None)
    assert partition.isr == {BROKER_ID, FOLLOWER_ID}  # not written
    manager.check(partition)  # the next periodic check
    await eventually(lambda: partition.isr == {BROKER_ID})
