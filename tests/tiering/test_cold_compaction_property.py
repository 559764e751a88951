"""The issue's property on the cold tier and across both tiers, with hypothesis: for any sequence
of keyed writes (tombstones and keyless records among them, timestamps on both sides of the
delete horizon), rolls, uploads to the cold tier, hot cleaner passes and cold compaction passes
(offset maps that fill up or not; local copies kept or deleted once uploaded), a consumer
reading through the broker's read path

- from offset 0 gets strictly increasing offsets, each record exactly as written at its offset,
  and folds them into the model's state: no value resurfaces, no latest record is missing;
- from any position a consumer held, reads on the same way, with the latest record of every key
  written from there on;
- and once everything is sealed, tiered and compacted, reads exactly the latest record of each
  key minus tombstones past delete.retention.ms, also after a restart (a new TieredStorage and
  log opened on the same files and store).

The parts are the broker's own (tests/tiering/cold_harness.py): nothing here reimplements a
read, an upload or a pass."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from riverbed.protocol.compression import CompressionType

from tests.tiering.cold_harness import (
    DELETE_RETENTION_MS,
    HORIZON_MS,
    NOW_MS,
    KeyedRecord,
    Model,
    TieredPartition,
    as_model,
    fold,
)

RECORD = st.tuples(
    st.sampled_from([b"k0", b"k1", b"k2", b"k3", b"k4", b"k5", None]),
    st.one_of(st.none(), st.binary(min_size=1, max_size=40)),
    st.sampled_from([NOW_MS - 2 * DELETE_RETENTION_MS, NOW_MS - 1_000]),
)
WRITE = st.tuples(
    st.just("write"),
    st.lists(RECORD, min_size=1, max_size=8),
    st.sampled_from([CompressionType.NONE, CompressionType.GZIP, CompressionType.ZSTD]),
)


def other(action: str) -> st.SearchStrategy[tuple[str, list[KeyedRecord], CompressionType]]:
    return st.just((action, [], CompressionType.NONE))


# Writes about half the time; uploads and cold passes often enough that most histories compact
# cold objects and are read back through cold reads.
STEP = st.one_of(
    WRITE, WRITE, WRITE, other("tier"), other("cold"), other("tier"), other("seal"), other("hot")
)

assert HORIZON_MS == NOW_MS - DELETE_RETENTION_MS


async def check_reads(tiered: TieredPartition, model: Model, positions: list[int]) -> None:
    survivors = await tiered.read_from(0)
    offsets = [r.offset for r in survivors]
    assert offsets == sorted(set(offsets)), "offsets must strictly increase"
    assert all(model.records[r.offset] == (r.key, r.value, r.timestamp_ms) for r in survivors)
    assert fold(survivors) == model.folded()
    latest = model.latest()
    for position in positions:
        read_on = await tiered.read_from(position)
        assert [r.offset for r in read_on] == sorted({r.offset for r in read_on})
        assert all(r.offset >= position for r in read_on)
        assert all(model.records[r.offset] == (r.key, r.value, r.timestamp_ms) for r in read_on)
        # The latest record of every key written from `position` on is there (expired
        # tombstones may be gone), and nothing older of such a key comes after it.
        assert {o for o in latest if o >= position} <= {r.offset for r in read_on}
        assert fold(read_on) == model.folded(position)


def check_cold_tier(
    tiered: TieredPartition, model: Model, compacted_end: int, high_watermark: int
) -> None:
    """After a pass whose map reached the high watermark: every cold record below the compacted
    end is the latest of its key among all records below the high watermark, cold or hot, and
    no tombstone there is past the horizon."""
    latest: dict[bytes, int] = {}
    for offset, (key, _, _) in sorted(model.records.items()):
        if key is not None and offset < high_watermark:
            latest[key] = offset
    for offset, key, value, timestamp, control in tiered.cold_rows():
        if offset >= compacted_end or control:
            continue
        assert key is not None, f"offset {offset}: superseded"
        assert latest[key] == offset, f"offset {offset}: superseded"
        assert not (value is None and timestamp < HORIZON_MS), f"offset {offset}: expired"


async def run_history(
    root: Path,
    steps: list[tuple[str, list[KeyedRecord], CompressionType]],
    map_bytes: int,
    local_retention_bytes: str,
) -> None:
    overrides = {"local.retention.bytes": local_retention_bytes}
    tiered = await TieredPartition.open(root, map_bytes=map_bytes, topic_overrides=overrides)
    model = Model()
    positions: list[int] = []
    try:
        for action, records, codec in steps:
            if action == "write":
                positions.append(tiered.write(model, records, codec))
            elif action == "seal":
                tiered.seal(model)
            elif action == "tier":
                await tiered.tier()
            elif action == "hot":
                tiered.compact_hot()
            else:
                high_watermark = tiered.log.high_watermark
                result = await tiered.compact_cold()
                if result is not None and result.groups_rewritten:
                    event("a cold pass rewrote groups")
                if result is not None and result.map_full:
                    event("a cold pass ended where its map was full")
                elif result is not None:
                    check_cold_tier(tiered, model, result.compacted_end_offset, high_watermark)
            if tiered.log.log_start_offset > 0:
                event("reads start in the cold tier")
            await check_reads(tiered, model, positions[-4:])

        # Everything sealed, tiered (local copies deleted) and compacted on both tiers. The
        # active segment then holds only a key of its own: with a map too small to reach it, a
        # pass ends before it, as the hot cleaner never looks at the active segment.
        tiered.seal(model, b"~last")
        tiered.config = replace(tiered.config, local_retention_bytes=1)
        await tiered.tier()
        tiered.compact_hot()
        while await tiered.compact_cold() is not None:
            pass  # a small offset map takes several passes
        expected = model.latest()
        assert as_model(await tiered.read_from(0)) == expected
    finally:
        await tiered.close()
    reopened = await TieredPartition.open(root, map_bytes=map_bytes, topic_overrides=overrides)
    try:
        await reopened.tier()  # a new leader's first round: it loads and claims the manifest
        assert as_model(await reopened.read_from(0)) == expected
    finally:
        await reopened.close()


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(STEP, min_size=10, max_size=50),
    map_bytes=st.sampled_from([300, 64 << 20]),
    local_retention_bytes=st.sampled_from(["1", "-1"]),
)
def test_any_history_compacts_to_the_latest_record_per_key_across_both_tiers(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[str, list[KeyedRecord], CompressionType]],
    map_bytes: int,
    local_retention_bytes: str,
) -> None:
    root = tmp_path_factory.mktemp("tiered")
    asyncio.run(run_history(root, steps, map_bytes, local_retention_bytes))
