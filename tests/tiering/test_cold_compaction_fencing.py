"""Who may compact a partition's cold tier, and when: one compaction at a time per partition,
whoever runs it (the leader broker or a Spark job); a Spark job's claim holds until its lease
runs out, then the leader aborts it and the job's swap is refused; a leader change fences the
job's swap (its commit is at the old leader epoch) and the new leader aborts what it left.

The job's side is played here with the very steps the job runs (riverbed.tiering.cold_commit:
claim, swap at the manifest's leader epoch); the broker's side is the broker's compactor
(tests/tiering/cold_harness.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from riverbed.protocol.compression import CompressionType
from riverbed.protocol.errors import ErrorCode, KafkaError
from riverbed.tiering import cold_commit
from riverbed.tiering.cold_compaction import plan_cold_compaction
from riverbed.tiering.manifest import Manifest, ManifestError, PendingCompaction
from riverbed.tiering.remote_metadata import RemoteMetadata
from riverbed.tiering.stores import open_store

from tests.tiering.cold_harness import NOW_MS, TOPIC, Model, TieredPartition

OVERRIDES = {"local.retention.bytes": "1"}


async def filled(root: Path, *, leader_epoch: int = 1) -> TieredPartition:
    tiered = await TieredPartition.open(root, topic_overrides=OVERRIDES, leader_epoch=leader_epoch)
    model = Model()
    for round_ in range(8):
        tiered.write(
            model,
            [(b"k%d" % i, b"round %d" % round_ * 8, NOW_MS) for i in range(4)],
            CompressionType.NONE,
        )
    tiered.seal(model)
    await tiered.tier()
    return tiered


async def spark_claim(
    tiered: TieredPartition, lease_ms: int
) -> tuple[RemoteMetadata, PendingCompaction, int]:
    """What the job does before its executors run: read the manifest, plan, claim at the
    manifest's epoch with a lease. Through a store of its own, as the job opens one."""
    store = open_store(f"file://{tiered.store_root}", {})
    metadata = RemoteMetadata(store, TOPIC, 0)
    manifest = await metadata.latest()
    plan = plan_cold_compaction(manifest, tiered.config, NOW_MS)
    assert plan is not None
    pending = cold_commit.new_pending(
        plan,
        TOPIC,
        0,
        owner="spark-app-1",
        leader_epoch=manifest.leader_epoch,
        now_ms=NOW_MS,
        lease_expires_ms=NOW_MS + lease_ms,
    )
    await cold_commit.claim(metadata, manifest.leader_epoch, pending)
    return metadata, pending, manifest.leader_epoch


async def test_a_claimed_job_keeps_the_broker_out_until_its_lease_runs_out(tmp_path: Path) -> None:
    tiered = await filled(tmp_path)
    try:
        metadata, pending, epoch = await spark_claim(tiered, lease_ms=60_000)
        # The broker neither compacts nor aborts while the lease holds.
        assert await tiered.compact_cold() is None
        assert tiered.manifest().compaction == pending
        # A second claim (another job, or the broker's) is refused.
        plan = plan_cold_compaction(tiered.manifest(), tiered.config, NOW_MS)
        assert plan is not None
        other = cold_commit.new_pending(
            plan,
            TOPIC,
            0,
            owner="spark-app-2",
            leader_epoch=epoch,
            now_ms=NOW_MS,
        )
        with pytest.raises(ManifestError, match="spark-app-1 is in progress"):
            await cold_commit.claim(metadata, epoch, other)

        # The lease runs out: the leader aborts the claim and compacts itself; the job's swap
        # is refused.
        tiered.now_ms = NOW_MS + 60_000
        result = await tiered.compact_cold()
        assert result is not None
        assert result.swapped
        with pytest.raises(ManifestError, match="not pending"):
            await cold_commit.swap(metadata, epoch, pending, {}, 0, NOW_MS)
    finally:
        await tiered.close()


async def test_a_leader_change_fences_the_jobs_swap_and_the_new_leader_aborts_its_claim(
    tmp_path: Path,
) -> None:
    tiered = await filled(tmp_path)
    metadata, pending, epoch = await spark_claim(tiered, lease_ms=3_600_000)
    await tiered.close()
    # A new leader (epoch 2) takes the partition over: it claims the manifest at its epoch.
    leader = await TieredPartition.open(tmp_path, topic_overrides=OVERRIDES, leader_epoch=2)
    try:
        await leader.tier()
        with pytest.raises(KafkaError) as fenced:
            await cold_commit.swap(metadata, epoch, pending, {}, 0, NOW_MS)
        assert fenced.value.code == ErrorCode.FENCED_LEADER_EPOCH
        # The claim of the old epoch is aborted (the lease has hours left) and the new leader
        # compacts.
        result = await leader.compact_cold()
        assert result is not None
        assert result.swapped
        manifest = leader.manifest()
        assert manifest.compaction is None
        assert manifest.leader_epoch == 2
    finally:
        await leader.close()


async def test_a_deposed_brokers_own_pass_is_fenced_and_changes_nothing(tmp_path: Path) -> None:
    """The broker's pass claims at its epoch; if a newer leader writes the manifest before the
    swap, the swap is fenced and the old leader does not abort (the new leader will)."""
    tiered = await filled(tmp_path)
    try:
        store = open_store(f"file://{tiered.store_root}", {})
        newer = RemoteMetadata(store, TOPIC, 0)
        original_swap = cold_commit.swap

        async def a_new_leader_claims_first(*args: Any, **kwargs: Any) -> Manifest:
            await newer.commit(5, lambda m: m)  # the new leader's claim of the manifest
            return await original_swap(*args, **kwargs)

        cold_commit.swap = a_new_leader_claims_first
        try:
            assert await tiered.compact_cold() is None
        finally:
            cold_commit.swap = original_swap
        latest = await newer.latest()
        assert latest.leader_epoch == 5
        assert latest.compaction is not None  # left for epoch 5
        assert latest.retired == ()
        assert latest.compacted_end_offset == 0
    finally:
        await tiered.close()
