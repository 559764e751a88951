"""One partition's state in ZooKeeper, read and written as a test arranges it (the platform reads
and writes them in batches: ClusterMetadataStore.read_partition_states, write_leader_states)."""

from __future__ import annotations

from riverbed.coordination.layout import PartitionState
from riverbed.coordination.metadata import ClusterMetadataStore, PartitionStateUpdate


async def get_partition_state(
    store: ClusterMetadataStore, topic: str, partition: int
) -> tuple[PartitionState, int]:
    """The partition's state and its znode version."""
    state, stat = await store.read_partition_state(topic, partition)
    return state, stat.version


async def update_partition_state(
    store: ClusterMetadataStore,
    topic: str,
    partition: int,
    new_state: PartitionState,
    expected_version: int,
) -> int:
    """Write the state if its znode is still at `expected_version`; the new version
    (zk.BadVersionError otherwise)."""
    update = PartitionStateUpdate(topic, partition, new_state, expected_version)
    (version,) = await store.write_leader_states([update])
    return version
