"""Crash injection through a cold compaction and its manifest swap: after a restart, the log reads
exactly as before the compaction or exactly as after it, never anything else; and the next
leader's rounds finish the job, leaving exactly the objects the manifest names.

In-process, with the broker's parts (tests/tiering/cold_harness.py): every call that changes the
store during a pass and the deletion of what it replaced (manifest commits, object uploads,
object deletes) is in turn made to raise a `Crash` that nothing catches, either before the call
reaches the store or right after it did (the answer lost). The partition is then opened afresh
on the same files and store, by a broker at the same leader epoch (a restart) or a later one (a
new leader). A real SIGKILL of a broker in the middle of a pass is in
tests/tiering/test_cold_compaction_broker.py."""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from riverbed.protocol.compression import CompressionType

from tests.tiering.cold_harness import (
    NOW_MS,
    KeyedRecord,
    Model,
    TieredPartition,
    as_model,
)

# The store calls that change it: every step of a pass that a crash can fall between.
MUTATIONS = ("put_if_absent", "put_file", "delete")
BROKER = {"remote.log.compaction.grace.ms": "0"}  # replaced objects go at the next round
TOPIC = {"local.retention.bytes": "1", "segment.bytes": "1200"}


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so no handler on the way catches it."""


class CrashingStore:
    """Counts the store's mutating calls; the `crash_at`-th raises Crash, before the call
    (`after=False`) or once it is done (`after=True`)."""

    def __init__(self, store: Any, crash_at: int, *, after: bool) -> None:
        self.calls = 0
        self.crash_at = crash_at
        self.after = after
        for name in MUTATIONS:
            setattr(store, name, self._wrap(getattr(store, name)))

    def _wrap(self, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def step(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.crash_at and not self.after:
                raise Crash
            result = await call(*args, **kwargs)
            if self.calls == self.crash_at:
                raise Crash
            return result

        return step


async def build(root: Path) -> None:
    """A compacted tiered partition, uploaded and deleted locally, most of its records
    overwritten (some by records still in the hot tier) and a few keys deleted long ago."""
    tiered = await TieredPartition.open(root, topic_overrides=TOPIC, broker_overrides=BROKER)
    model = Model()
    for round_ in range(12):
        records: list[KeyedRecord] = [
            (b"k%d" % i, b"round %d value %d " % (round_, i) * 3, NOW_MS) for i in range(6)
        ]
        codec = CompressionType.ZSTD if round_ % 2 else CompressionType.NONE
        tiered.write(model, records, codec)
    tiered.write(
        model, [(b"k0", None, NOW_MS - 500_000), (b"k1", None, NOW_MS)], CompressionType.NONE
    )
    await tiered.tier()
    tiered.write(model, [(b"k2", b"hot", NOW_MS)], CompressionType.NONE)
    await tiered.close()


async def contents(root: Path, *, leader_epoch: int = 1) -> dict[int, KeyedRecord]:
    tiered = await TieredPartition.open(
        root, topic_overrides=TOPIC, broker_overrides=BROKER, leader_epoch=leader_epoch
    )
    try:
        await tiered.tier()
        return as_model(await tiered.read_from(0))
    finally:
        await tiered.close()


async def compact_fully(tiered: TieredPartition) -> int:
    """Rounds until nothing is left to do (the deletion of replaced objects included)."""
    rounds = 0
    while await tiered.compact_cold() is not None or tiered.manifest().retired:
        rounds += 1
        assert rounds < 10
    return rounds


async def crash_and_restart(
    source: Path, root: Path, crash_at: int, *, after: bool, leader_epoch: int
) -> tuple[bool, dict[int, KeyedRecord], Path]:
    """Copy `source`, crash its `crash_at`-th store mutation; True if the crash happened.
    Returns what the restarted partition reads, and its root."""
    shutil.copytree(source, root)
    tiered = await TieredPartition.open(root, topic_overrides=TOPIC, broker_overrides=BROKER)
    await tiered.tier()  # the leader claims the manifest (no mutation: it is its epoch already)
    crashing = CrashingStore(tiered.tiering.store, crash_at, after=after)
    crashed = False
    try:
        await compact_fully(tiered)
    except Crash:
        crashed = True
    finally:
        await tiered.close()
    assert crashing.calls >= min(crash_at, 1)
    return crashed, await contents(root, leader_epoch=leader_epoch), root


@pytest.mark.parametrize("leader_epoch", [1, 2], ids=["restart", "new-leader"])
async def test_a_crash_at_any_step_leaves_the_log_as_before_or_after_and_the_next_rounds_finish(
    tmp_path: Path, leader_epoch: int
) -> None:
    original = tmp_path / "original"
    await build(original)
    before = await contents(original)

    reference = tmp_path / "reference"
    shutil.copytree(original, reference)
    tiered = await TieredPartition.open(reference, topic_overrides=TOPIC, broker_overrides=BROKER)
    await tiered.tier()
    counter = CrashingStore(tiered.tiering.store, 0, after=False)
    assert await compact_fully(tiered) >= 1
    steps = counter.calls
    await tiered.close()
    after = await contents(reference)
    assert len(after) < len(before) / 3, "the pass must drop most records"
    assert steps >= 6, f"a pass and its clean-up are more steps than {steps}"

    seen = {"before": 0, "after": 0}
    for crash_at in range(1, steps + 1):
        for crash_after in (False, True):
            name = f"crash-{crash_at}-{'after' if crash_after else 'before'}"
            crashed, read, root = await crash_and_restart(
                original, tmp_path / name, crash_at, after=crash_after, leader_epoch=leader_epoch
            )
            assert crashed, name
            assert read in (before, after), f"{name}: the log reads as neither"
            seen["before" if read == before else "after"] += 1
            # The next leader's rounds abort what was left or finish its clean-up: the log then
            # reads as after, and the store holds exactly what the manifest names.
            restarted = await TieredPartition.open(
                root, topic_overrides=TOPIC, broker_overrides=BROKER, leader_epoch=leader_epoch
            )
            try:
                await restarted.tier()
                await compact_fully(restarted)
                assert as_model(await restarted.read_from(0)) == after, name
                manifest = restarted.manifest()
                stored = {
                    p.relative_to(restarted.store_root).as_posix()
                    for p in restarted.store_root.rglob("*.parquet")
                }
                assert manifest.compaction is None
                assert manifest.retired == ()
                assert stored == {s.key for s in manifest.segments}, f"{name}: orphans"
            finally:
                await restarted.close()
    # Crashes before the swap's commit read as before, from its commit on as after.
    assert seen["before"] > 0, seen
    assert seen["after"] > 0, seen
