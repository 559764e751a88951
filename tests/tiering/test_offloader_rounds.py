"""An offloader round over a backlog of sealed segments: local retention frees each segment as
soon as its upload is committed, so a round that fails halfway has already freed the disk of
the segments it did upload (driven by hand on a real log and a real file:// store)."""

from __future__ import annotations

from pathlib import Path

from riverbed.hot.storage.log import SegmentStats
from riverbed.protocol.compression import CompressionType
from riverbed.tiering.store import ObjectStoreError

from tests.tiering.cold_harness import NOW_MS, Model, TieredPartition

UPLOADS_BEFORE_THE_OUTAGE = 2
BACKLOG_WRITES = 4


def seal_a_backlog(part: TieredPartition) -> list[SegmentStats]:
    """A few records, each followed by a record that rolls the log; the sealed segments."""
    model = Model()
    for i in range(BACKLOG_WRITES):
        part.write(model, [(b"k%d" % i, b"v%d" % i, NOW_MS)], CompressionType.NONE)
        part.seal(model, key=b"~seal%d" % i)
    return part.log.segment_stats()[:-1]


async def test_a_round_that_fails_midway_has_freed_what_it_uploaded(tmp_path: Path) -> None:
    part = await TieredPartition.open(
        tmp_path,
        topic_overrides={"cleanup.policy": "delete", "local.retention.bytes": "1"},
    )
    try:
        sealed = seal_a_backlog(part)
        assert len(sealed) > UPLOADS_BEFORE_THE_OUTAGE + 1
        store = part.tiering.store
        put_file = store.put_file
        uploads = 0

        async def failing_put_file(key: str, path: Path) -> None:
            nonlocal uploads
            if uploads == UPLOADS_BEFORE_THE_OUTAGE:
                raise ObjectStoreError("the store went away")
            uploads += 1
            await put_file(key, path)

        store.put_file = failing_put_file  # type: ignore[method-assign]
        await part.tier()

        offloader = part.tiering.offloader
        assert offloader.status.upload_failures == 1
        uploaded_end = (await part.tiering.manifest(part.partition)).finished_end_offset
        assert uploaded_end == sealed[UPLOADS_BEFORE_THE_OUTAGE].base_offset
        # Both uploaded segments are gone locally; the rest waits for the store.
        assert part.log.log_start_offset == uploaded_end
        assert part.log.segment_stats()[0].base_offset == uploaded_end
    finally:
        await part.close()


async def test_a_round_writes_one_manifest_version_per_segment(tmp_path: Path) -> None:
    """Each COPY_FINISHED commit also records the COPY_STARTED of the copies scheduled after
    it; only the round's first copies get a commit of their own, while they convert."""
    part = await TieredPartition.open(tmp_path, topic_overrides={"cleanup.policy": "delete"})
    try:
        sealed = seal_a_backlog(part)
        await part.tier()
        manifest = await part.tiering.manifest(part.partition)
        assert [s.base_offset for s in manifest.finished()] == [s.base_offset for s in sealed]
        assert len(manifest.segments) == len(sealed)  # nothing left started
        assert manifest.version == len(sealed) + 1
    finally:
        await part.close()
