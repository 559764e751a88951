"""Cold-tier compaction, the part shared by the broker (riverbed.tiering.cold_compactor) and the
Spark job (riverbed_spark.jobs.compact_cold): which remote segments a pass covers and how they
are grouped, which records stay, and one group's objects rewritten into one new object. Pure:
Arrow tables and local files in, local files out; the callers do the store and the manifest.

The rule is the hot cleaner's (riverbed.hot.storage.compaction), decided by the whole partition: a
record stays if it is in a control batch, or if it has a key, no later record of the partition
(cold or hot, up to the last stable offset when the pass began) has that key, and it is not a
tombstone older than `delete.retention.ms` below the map's end. The latest offset of each key
comes from an offset map built over the dirty part, [first dirty offset, map end): the cold
segments from the manifest's `compacted_end_offset` on, then the hot log above the cold tier.
Records of aborted transactions never enter the map (as in Kafka's cleaner, they must not
decide which record of a key survives), nor do those of open transactions: the map ends at the
last stable offset. Records in the clean part have no later record of their key inside the
clean part (an earlier pass removed them), so keys the map never saw keep their records. A
tombstone can go with every older record of its key, all of which are below it in the cold
range being rewritten; one at or past the map's end stays, because older records of its key
may not have been looked at.

Offsets never change: a kept record keeps its offset and a batch its base offset, last offset
delta, timestamps, producer fields and attributes (so cold reads rebuild valid Kafka batches
with gaps). A thinned batch's `batch_size_bytes` becomes the size of the batch a cold read
rebuilds from its remaining rows; a batch losing every row disappears. A group's new object
covers the same offsets as the segments it replaces, with no row at all if nothing in them
stays, so the manifest's offsets stay contiguous and the offloader's end offset never moves.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from riverbed.configs import MAP_ENTRY_OVERHEAD_BYTES, TopicConfig
from riverbed.tiering.arrow_schema import SCHEMA
from riverbed.tiering.batch_rebuild import rebuilt_sizes
from riverbed.tiering.manifest import Manifest, RemoteSegment, SegmentState
from riverbed.tiering.parquet_codec import ROW_GROUP_BYTES_MAX, ROW_GROUP_ROWS_MAX, open_writer
from riverbed.tiering.txn_ranges import (
    NOTHING_RESOLVED,
    AbortedRange,
    Resolved,
    merged,
    resolve,
)

CONTROL_BATCH_BIT = 1 << 5  # of batch_attributes: a transaction marker's batch
TRANSACTIONAL_BATCH_BIT = 1 << 4  # of batch_attributes: a transactional producer's batch
# Rows offered to the offset map are merged into it in chunks of at least this many rows (and
# at least as many as the map holds, so merging costs O(rows) overall); until then they wait.
MAP_MERGE_ROWS_MIN = 256 * 1024
# Columns the offset map reads from a cold object.
MAP_COLUMNS = ["key", "offset", "batch_attributes", "batch_producer_id"]


class ColdOffsetMap:
    """key -> offset of its latest record, over offsets [start_offset, end_offset) offered
    oldest first; Arrow arrays, so lookups run in Arrow's kernels and not one Python call per
    record.

    Bounded like the hot cleaner's map (`log.cleaner.dedupe.buffer.size`, counted the same way:
    each key's bytes plus MAP_ENTRY_OVERHEAD_BYTES, so a setting holds as many keys on either
    tier; Arrow needs about the key plus 12 bytes, so the real size is well below the
    estimate). Rows wait in chunks before they are merged in; when a merge would pass the bound,
    the map takes the rows before the first key that does not fit and stops there:
    `end_offset` is that key's first offset and `full` is set."""

    def __init__(self, capacity_bytes: int, start_offset: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.start_offset = start_offset
        self.end_offset = start_offset  # every record below it was taken in
        self.size_bytes = 0  # estimated, as above
        self.full = False
        self._keys = pa.array([], pa.binary())
        self._offsets = pa.array([], pa.int64())
        self._lookup: pc.SetLookupOptions | None = None
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._pending_end = start_offset

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, keys: pa.Array, offsets: pa.Array, end_offset: int) -> bool:
        """Offer rows (keys not null, offsets increasing and at or above every offset offered
        before) that cover every offset below `end_offset` not offered yet. False once the map
        is full (the rows past its end are not taken)."""
        if self.full:
            return False
        if len(keys):
            self._pending.append(pa.table({"key": keys, "offset": offsets}))
            self._pending_rows += len(keys)
        self._pending_end = max(self._pending_end, end_offset)
        if self._pending_rows >= max(MAP_MERGE_ROWS_MIN, len(self._keys)):
            return self._merge()
        return True

    def finish(self) -> None:
        """Merge the rows still waiting (`end_offset` is final after it): call before
        `latest`."""
        if not self.full:
            self._merge()

    def latest(self, keys: pa.Array) -> pa.Array:
        """The latest offset of each key (int64; null where the map has not seen the key)."""
        if self._pending:
            raise RuntimeError("ColdOffsetMap.finish() before looking keys up")
        if self._lookup is None:
            self._lookup = pc.SetLookupOptions(value_set=self._keys)
        return pc.take(self._offsets, pc.index_in(keys, options=self._lookup))

    def _merge(self) -> bool:
        pending = pa.concat_tables(self._pending) if self._pending else None
        self._pending, self._pending_rows = [], 0
        if pending is None:
            self.end_offset = self._pending_end
            return True
        firsts = pending.group_by("key", use_threads=False).aggregate([("offset", "min")])
        new = firsts.filter(pc.invert(pc.is_in(firsts.column("key"), value_set=self._keys)))
        costs = pc.add(pc.binary_length(new.column("key")), MAP_ENTRY_OVERHEAD_BYTES)
        room = self.capacity_bytes - self.size_bytes
        end = self._pending_end
        if (pc.sum(costs).as_py() or 0) > room:
            # Take the new keys in the order they first appear while they fit; the first that
            # does not ends the map at its first offset.
            new = new.sort_by("offset_min")
            costs = pc.add(pc.binary_length(new.column("key")), MAP_ENTRY_OVERHEAD_BYTES)
            fitting = sum(1 for _ in itertools.takewhile(lambda c: c <= room, _cumsum(costs)))
            if fitting < new.num_rows:
                end = new.column("offset_min")[fitting].as_py()
                if end <= self.start_offset:
                    raise ValueError(
                        "log.cleaner.dedupe.buffer.size cannot hold a single key of the cold tier"
                    )
                pending = pending.filter(pc.less(pending.column("offset"), end))
                self.full = True
        latest = pending.group_by("key", use_threads=False).aggregate([("offset", "max")])
        merged = pa.concat_tables(
            [
                pa.table({"key": self._keys, "offset": self._offsets}),
                latest.rename_columns(["key", "offset"]).select(["key", "offset"]),
            ]
        )
        merged = merged.group_by("key", use_threads=False).aggregate([("offset", "max")])
        self._keys = merged.column("key").combine_chunks()
        self._offsets = merged.column("offset_max").combine_chunks()
        self._lookup = None
        self.size_bytes = (pc.sum(pc.binary_length(self._keys)).as_py() or 0) + len(
            self._keys
        ) * MAP_ENTRY_OVERHEAD_BYTES
        self.end_offset = end
        return not self.full


def _cumsum(values: pa.Array) -> Iterator[int]:
    return itertools.accumulate(values.to_pylist())


def map_rows(
    rows: pa.Table,
    start_offset: int,
    aborted: Sequence[AbortedRange] = (),
    end_offset: int | None = None,
) -> tuple[pa.Array, pa.Array]:
    """(keys, offsets) of the rows an offset map takes: keyed data records in [start_offset,
    end_offset) that are not records of an `aborted` transaction (control batches, keyless
    records and aborted records never decide anything: as Kafka's cleaner, a record of an
    aborted transaction must not remove the committed record of its key before it)."""
    offsets = rows.column("offset")
    wanted = pc.and_(
        pc.and_(pc.is_valid(rows.column("key")), pc.greater_equal(offsets, start_offset)),
        pc.equal(pc.bit_wise_and(rows.column("batch_attributes"), CONTROL_BATCH_BIT), 0),
    )
    if end_offset is not None:
        wanted = pc.and_(wanted, pc.less(offsets, end_offset))
    if aborted:
        wanted = pc.and_(wanted, pc.invert(aborted_mask(rows, aborted)))
    chosen = rows.filter(wanted)
    return chosen.column("key").combine_chunks(), chosen.column("offset").combine_chunks()


def aborted_mask(rows: pa.Table, aborted: Sequence[AbortedRange]) -> pa.Array:
    """Which of `rows` (columns offset, batch_attributes, batch_producer_id) are records of an
    `aborted` transaction: a transactional batch of its producer within its offsets (a producer
    has one transaction at a time, so nothing else of its lies there)."""
    offsets, producers = rows.column("offset"), rows.column("batch_producer_id")
    hit = pc.equal(offsets, -1)  # all false
    for txn in overlapping_rows(aborted, offsets):
        inside = pc.and_(
            pc.greater_equal(offsets, txn.first_offset), pc.less_equal(offsets, txn.last_offset)
        )
        hit = pc.or_(hit, pc.and_(inside, pc.equal(producers, txn.producer_id)))
    transactional = pc.not_equal(
        pc.bit_wise_and(rows.column("batch_attributes"), TRANSACTIONAL_BATCH_BIT), 0
    )
    return pc.and_(hit, transactional)


def overlapping_rows(aborted: Sequence[AbortedRange], offsets: pa.Array) -> list[AbortedRange]:
    """The `aborted` transactions that meet the offsets of a chunk of rows (a pass's chunks are
    small next to its aborted list: each is tested against those only)."""
    if not aborted or len(offsets) == 0:
        return []
    extremes = pc.min_max(offsets)
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    return [a for a in aborted if a.last_offset >= low and a.first_offset <= high]


# -- the plan --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColdPlan:
    """What a pass over a partition's cold tier covers: finished segments from the log start
    to `end_offset` in rewrite groups (each at most segment.bytes of log, at least one
    segment); its dirty part starts at `first_dirty_offset`. The offset map reads
    `map_segments` (every finished segment from the first dirty offset on, those newer than
    min.compaction.lag.ms too: their keys count) and then the hot log from `cold_end_offset`
    (the end of the finished segments) to the high watermark."""

    groups: tuple[tuple[RemoteSegment, ...], ...]
    map_segments: tuple[RemoteSegment, ...]
    first_dirty_offset: int
    end_offset: int
    cold_end_offset: int
    log_bytes: int
    dirty_bytes: int
    dirty_ratio: float
    due: bool
    # The finished segments' transactions (riverbed.tiering.txn_ranges): which records the
    # offset map must skip, and from where the cold tier alone cannot tell.
    transactions: Resolved = NOTHING_RESOLVED

    @property
    def segments(self) -> list[RemoteSegment]:
        return [segment for group in self.groups for segment in group]


def plan_cold_compaction(manifest: Manifest, config: TopicConfig, now_ms: int) -> ColdPlan | None:
    """Pure: the pass a partition's cold tier needs, or None if nothing in it is dirty.

    Cleanable: the finished segments not wholly below the log start, up to the first one with
    records newer than `min.compaction.lag.ms`. Dirty: those from `compacted_end_offset` on.
    Due when dirty bytes / cleanable bytes reaches `min.cleanable.dirty.ratio` or the oldest
    dirty segment's newest record is older than `max.compaction.lag.ms` (the hot cleaner's
    rule, with each segment's bytes in the log)."""
    cleanable: list[RemoteSegment] = []
    for segment in manifest.finished():
        if segment.next_offset <= manifest.log_start_offset:
            continue
        age_ms = now_ms - segment.max_timestamp_ms
        if config.min_compaction_lag_ms > 0 and age_ms < config.min_compaction_lag_ms:
            break
        cleanable.append(segment)
    if not cleanable:
        return None
    first_dirty = max(manifest.compacted_end_offset, cleanable[0].base_offset)
    dirty = [s for s in cleanable if s.next_offset > first_dirty]
    if not dirty:
        return None
    log_bytes = sum(s.log_bytes for s in cleanable)
    dirty_bytes = sum(s.log_bytes for s in dirty)
    ratio = dirty_bytes / log_bytes if log_bytes else 1.0
    overdue = now_ms - dirty[0].max_timestamp_ms > config.max_compaction_lag_ms
    return ColdPlan(
        groups=tuple(_groups(cleanable, config.segment_bytes)),
        map_segments=tuple(s for s in manifest.finished() if s.next_offset > first_dirty),
        first_dirty_offset=first_dirty,
        end_offset=cleanable[-1].next_offset,
        cold_end_offset=manifest.finished_end_offset,
        log_bytes=log_bytes,
        dirty_bytes=dirty_bytes,
        dirty_ratio=ratio,
        due=ratio >= config.min_cleanable_dirty_ratio or overdue,
        transactions=resolve([(s.base_offset, s.transactions) for s in manifest.finished()]),
    )


def _groups(segments: list[RemoteSegment], bytes_max: int) -> Iterator[tuple[RemoteSegment, ...]]:
    """Consecutive segments whose log bytes add up to at most `bytes_max` (at least one each):
    compaction shrinks segments, and the next pass merges the small ones it left."""
    group: list[RemoteSegment] = []
    group_bytes = 0
    for segment in segments:
        if group and (
            group_bytes + segment.log_bytes > bytes_max
            or segment.base_offset != group[-1].next_offset
        ):
            yield tuple(group)
            group, group_bytes = [], 0
        group.append(segment)
        group_bytes += segment.log_bytes
    if group:
        yield tuple(group)


# -- the rule --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KeepRule:
    """`delete_horizon_ms`: tombstones whose timestamp is below it may go (now minus
    delete.retention.ms); `map_end_offset`: the offset map covered everything below it, so only
    tombstones below it may go."""

    delete_horizon_ms: int
    map_end_offset: int


def keep_mask(rows: pa.Table, latest: pa.Array, rule: KeepRule) -> pa.Array:
    """Which of `rows` (SCHEMA columns key, value, offset, timestamp, batch_attributes) stay,
    given the latest offset of each row's key (null: the map never saw it). The module
    docstring has the rule; a tombstone's age is its `timestamp` (the batch's for
    LogAppendTime, its own otherwise), as on the hot tier."""
    offsets = rows.column("offset")
    control = pc.not_equal(pc.bit_wise_and(rows.column("batch_attributes"), CONTROL_BATCH_BIT), 0)
    superseded = pc.fill_null(pc.less(offsets, latest), False)
    expired = pc.and_(
        pc.and_(
            pc.is_null(rows.column("value")),
            pc.less(pc.cast(rows.column("timestamp"), pa.int64()), rule.delete_horizon_ms),
        ),
        pc.less(offsets, rule.map_end_offset),
    )
    stays = pc.and_(pc.is_valid(rows.column("key")), pc.invert(pc.or_(superseded, expired)))
    return pc.or_(control, stays)


# -- rewriting a group -----------------------------------------------------------------------


@dataclass(slots=True)
class GroupRewrite:
    """What rewriting one group made: `changed` is False when every row stayed (its file is
    then not used: the group keeps its segments)."""

    rows_in: int = 0
    rows_out: int = 0
    log_bytes: int = 0  # of the batches left, as cold reads rebuild them
    min_timestamp_ms: int | None = None
    max_timestamp_ms: int | None = None
    object_bytes_read: int = 0
    row_groups_out: int = 0

    @property
    def changed(self) -> bool:
        return self.rows_out != self.rows_in


@dataclass(slots=True)
class _Pending:
    tables: list[pa.Table] = field(default_factory=list)
    rows: int = 0
    nbytes: int = 0


# Reads a source row group (account its bytes, check for a stop); raises to stop.
Pacer = Callable[[int], None]


def rewrite_group(
    sources: Sequence[pq.ParquetFile],
    latest_for: Callable[[pa.Table], pa.Array],
    rule: KeepRule,
    out_path: Path,
    pace: Pacer,
) -> GroupRewrite:
    """Write the rows of `sources` (one group's objects, oldest first) that stay into a new
    object at `out_path`, row groups of whole batches as the offloader writes them.
    `latest_for(rows)` gives each row's key's latest offset; `pace(bytes)` is called before each
    source row group is read (throttle, stop)."""
    result = GroupRewrite()
    pending = _Pending()
    with open_writer(out_path) as writer:
        for rows in _row_groups(sources, pace, result):
            kept = rows.filter(keep_mask(rows, latest_for(rows), rule))
            result.rows_in += rows.num_rows
            result.rows_out += kept.num_rows
            if kept.num_rows == 0:
                continue
            kept = _resize_thinned(rows, kept)
            _account(kept, result)
            if pending.rows and (
                pending.rows + kept.num_rows > ROW_GROUP_ROWS_MAX
                or pending.nbytes + kept.nbytes > ROW_GROUP_BYTES_MAX
            ):
                _flush(writer, pending, result)
            pending.tables.append(kept)
            pending.rows += kept.num_rows
            pending.nbytes += kept.nbytes
        if pending.rows:
            _flush(writer, pending, result)
    return result


def row_group_bytes(metadata: pq.FileMetaData, group: int) -> int:
    """A row group's bytes in its object (compressed): what reading it costs."""
    row_group = metadata.row_group(group)
    return sum(
        row_group.column(column).total_compressed_size for column in range(row_group.num_columns)
    )


def _row_groups(
    sources: Sequence[pq.ParquetFile], pace: Pacer, result: GroupRewrite
) -> Iterator[pa.Table]:
    for source in sources:
        metadata = source.metadata
        for group in range(metadata.num_row_groups):
            size = row_group_bytes(metadata, group)
            pace(size)
            result.object_bytes_read += size
            yield source.read_row_group(group, use_threads=False).cast(SCHEMA)


def _flush(writer: pq.ParquetWriter, pending: _Pending, result: GroupRewrite) -> None:
    table = pa.concat_tables(pending.tables).combine_chunks()
    writer.write_table(table, row_group_size=table.num_rows)
    result.row_groups_out += 1
    pending.tables, pending.rows, pending.nbytes = [], 0, 0


def _account(kept: pa.Table, result: GroupRewrite) -> None:
    extremes = pc.min_max(pc.cast(kept.column("timestamp"), pa.int64()))
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    result.min_timestamp_ms = (
        low if result.min_timestamp_ms is None else min(result.min_timestamp_ms, low)
    )
    result.max_timestamp_ms = (
        high if result.max_timestamp_ms is None else max(result.max_timestamp_ms, high)
    )
    runs = pc.run_end_encode(kept.column("batch_base_offset").combine_chunks())
    starts = pa.array([0, *runs.run_ends.to_pylist()[:-1]], pa.int64())
    result.log_bytes += pc.sum(kept.column("batch_size_bytes").take(starts)).as_py() or 0


def _batch_counts(rows: pa.Table) -> dict[int, int]:
    runs = pc.run_end_encode(rows.column("batch_base_offset").combine_chunks())
    ends = runs.run_ends.to_pylist()
    lengths = [end - start for start, end in itertools.pairwise([0, *ends])]
    return dict(zip(runs.values.to_pylist(), lengths, strict=True))


def _resize_thinned(before: pa.Table, after: pa.Table) -> pa.Table:
    """`after` with `batch_size_bytes` of every batch that lost rows set to its rebuilt size."""
    counts_before = _batch_counts(before)
    thinned = [base for base, count in _batch_counts(after).items() if count != counts_before[base]]
    if not thinned:
        return after
    bases = pa.array(thinned, pa.int64())
    sizes = rebuilt_sizes(
        after.filter(pc.is_in(after.column("batch_base_offset"), value_set=bases))
    )
    new_sizes = pa.array([sizes[base] for base in thinned], pa.int32())
    looked_up = pc.take(new_sizes, pc.index_in(after.column("batch_base_offset"), value_set=bases))
    column = pc.coalesce(looked_up, after.column("batch_size_bytes"))
    index = after.schema.get_field_index("batch_size_bytes")
    return after.set_column(index, SCHEMA.field(index), column)


def compacted_segment(
    group: Iterable[RemoteSegment], rewrite: GroupRewrite, key: str, size_bytes: int, epoch: int
) -> RemoteSegment:
    """The manifest entry of a group's new object (COPY_FINISHED): the group's offsets; with no
    row left, the group's newest timestamp as both of its timestamps (retention.ms then treats
    it as it treated what it replaced). Compaction keeps control batches and drops no offset
    range, so the group's transactions are its objects' merged."""
    replaced = list(group)
    newest = max(s.max_timestamp_ms for s in replaced)
    return RemoteSegment(
        key=key,
        base_offset=replaced[0].base_offset,
        last_offset=replaced[-1].last_offset,
        size_bytes=size_bytes,
        log_bytes=rewrite.log_bytes,
        records=rewrite.rows_out,
        min_timestamp_ms=newest if rewrite.min_timestamp_ms is None else rewrite.min_timestamp_ms,
        max_timestamp_ms=newest if rewrite.max_timestamp_ms is None else rewrite.max_timestamp_ms,
        leader_epoch=epoch,
        state=SegmentState.COPY_FINISHED,
        transactions=merged([(s.base_offset, s.transactions) for s in replaced]),
    )
