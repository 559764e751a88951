"""The manifest side of a cold compaction, shared by the broker and the Spark job: claim, swap,
abort, and the deletion of replaced objects once their grace is over. Every step is one
manifest commit fenced by the leader epoch (riverbed.tiering.remote_metadata) or an
idempotent object delete, so each can be retried after a crash.

1. Claim: the plan's groups and the keys of the objects that will replace them are committed
   as the manifest's pending compaction before any is written. At most one compaction is
   pending per partition, so a Spark job and a broker (or two jobs) never compact one
   partition at once, and whoever finds it left behind knows which objects to delete.
2. The new objects are written (by the broker, or by Spark's executors).
3. Swap: one commit replaces each changed group's segments with its new object and retires the
   old ones (a reader of any version sees all old or all new segments of a range). It fails,
   changing nothing, if the compaction was aborted meanwhile or its segments changed.
4. After `grace_ms`, retired segments go DELETE_STARTED, their objects are deleted, then they
   are dropped from the manifest.
Abort: the pending entry is removed first, and only then are its outputs deleted (those the
manifest does not name): once it is gone, its owner's swap is refused, so nothing deletes an
object a manifest names. An output
written after the abort (a slow Spark task) or not deleted because of a crash is an orphan,
which the offloader's sweep deletes after remote.log.orphan.grace.ms.

Who aborts a pending compaction: the partition's leader, when the compaction was claimed at an
earlier leader epoch, when its lease expired (a Spark job's), or when it is its own but not the
one it is running (left by a crash or a restart). A Spark job never aborts another's.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping

from riverbed.tiering.cold_compaction import ColdPlan
from riverbed.tiering.manifest import (
    CompactionGroup,
    Manifest,
    PendingCompaction,
    RemoteSegment,
    SegmentState,
    segment_key,
)
from riverbed.tiering.remote_metadata import RemoteMetadata
from riverbed.tiering.store import ObjectStore

log = logging.getLogger(__name__)


def new_pending(
    plan: ColdPlan,
    topic: str,
    partition: int,
    *,
    owner: str,
    leader_epoch: int,
    now_ms: int,
    lease_expires_ms: int = 0,
) -> PendingCompaction:
    """A compaction of `plan`, each group's output under a key of its own."""
    groups = tuple(
        CompactionGroup(
            replaces=tuple(segment.key for segment in group),
            output=segment_key(
                topic,
                partition,
                group[0].base_offset,
                group[-1].last_offset,
                f"c{uuid.uuid4().hex}",
            ),
            base_offset=group[0].base_offset,
            last_offset=group[-1].last_offset,
        )
        for group in plan.groups
    )
    return PendingCompaction(
        id=uuid.uuid4().hex,
        owner=owner,
        leader_epoch=leader_epoch,
        started_ms=now_ms,
        lease_expires_ms=lease_expires_ms,
        groups=groups,
    )


async def claim(
    metadata: RemoteMetadata, leader_epoch: int, pending: PendingCompaction
) -> Manifest:
    """Step 1. ManifestError if another compaction is pending or the plan's segments changed;
    FENCED_LEADER_EPOCH if a later leader wrote the manifest."""
    return await metadata.commit(leader_epoch, lambda m: m.with_compaction_claimed(pending))


async def swap(
    metadata: RemoteMetadata,
    leader_epoch: int,
    pending: PendingCompaction,
    written: Mapping[str, RemoteSegment],
    compacted_end_offset: int,
    now_ms: int,
) -> Manifest:
    """Step 3: the atomic swap (Manifest.with_compaction_swapped)."""
    return await metadata.commit(
        leader_epoch,
        lambda m: m.with_compaction_swapped(pending.id, written, compacted_end_offset, now_ms),
    )


async def abort(
    store: ObjectStore, metadata: RemoteMetadata, leader_epoch: int, pending: PendingCompaction
) -> Manifest:
    """Remove `pending` from the manifest, then delete those of its outputs the manifest does not
    name (all of them, unless its swap landed after all: a swap whose answer was lost)."""
    manifest = await metadata.latest()
    if manifest.compaction is not None and manifest.compaction.id == pending.id:
        manifest = await metadata.commit(
            leader_epoch, lambda m: m.with_compaction_aborted(pending.id)
        )
    live = manifest.referenced_keys()
    for key in pending.outputs():
        if key not in live:
            await store.delete(key)
    log.info(
        "%s-%d: aborted compaction %s of %s",
        metadata.topic,
        metadata.partition,
        pending.id,
        pending.owner,
    )
    return manifest


def is_stale(
    pending: PendingCompaction,
    *,
    leader_epoch: int,
    owner: str,
    running_id: str | None,
    now_ms: int,
) -> bool:
    """Whether the leader at `leader_epoch` (named `owner`, running compaction `running_id`)
    should abort `pending`."""
    return (
        pending.leader_epoch < leader_epoch
        or pending.expired(now_ms)
        or (pending.owner == owner and pending.id != running_id)
    )


async def delete_retired(
    store: ObjectStore, metadata: RemoteMetadata, leader_epoch: int, now_ms: int, grace_ms: int
) -> Manifest:
    """Step 4 for the retired segments whose grace is over (and any left DELETE_STARTED by a
    crash)."""
    manifest = await metadata.latest()
    due = [
        r.segment.key
        for r in manifest.retired
        if now_ms - r.retired_ms >= grace_ms or r.segment.state is SegmentState.DELETE_STARTED
    ]
    if not due:
        return manifest
    manifest = await metadata.commit(
        leader_epoch, lambda m: m.with_retired_state(due, SegmentState.DELETE_STARTED)
    )
    for key in due:
        await store.delete(key)
    manifest = await metadata.commit(leader_epoch, lambda m: m.without_retired(due))
    log.info(
        "%s-%d: deleted %d objects replaced by compaction",
        metadata.topic,
        metadata.partition,
        len(due),
    )
    return manifest
