"""One sealed segment's batches as one Parquet file, and Kafka batches read back from it.

The file: rows of arrow_schema.SCHEMA (Spark's Kafka source columns, then what a rebuild needs)
sorted by offset, zstd-compressed, in row groups of WHOLE batches (a batch never spans two row
groups, so one row group rebuilds into whole batches) that end at the first batch boundary at
or past ROW_GROUP_BYTES_MAX of uncompressed records or ROW_GROUP_ROWS_MAX rows. Statistics on
the columns readers filter by and a page index let readers (this one, Spark, DuckDB) skip the
row groups and pages that cannot hold an offset or a timestamp; page checksums catch a damaged
object when read back.

Rebuild contract (batch_rebuild): the batches covering an offset come back with their original
offsets (gaps included), timestamps, keys, values, headers, producer fields, leader epoch and
attributes (codec, timestamp type, transactional, control) and a valid CRC; an uncompressed
batch byte for byte, a compressed one recompressed with its codec.

Everything here blocks on CPU and I/O: call it from a worker thread, never the event loop.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from riverbed.protocol.control_records import read_marker
from riverbed.protocol.errors import ErrorCode
from riverbed.protocol.records_header import (
    BatchHeader,
    Bytes,
    CorruptRecordError,
    batch_crc_ok,
    parse_batch_header,
)
from riverbed.tiering.arrow_schema import REBUILD_COLUMNS, SCHEMA
from riverbed.tiering.batch_rebuild import RowGroupBatches
from riverbed.tiering.segment_rows import RowGroupRows
from riverbed.tiering.txn_ranges import NO_TRANSACTIONS, ObjectTransactions, TxnScanner

# A cold read decodes whole row groups: this bounds its work and memory (consumers fetch 1 MiB
# a partition by default: max.partition.fetch.bytes), while a 1 GiB segment's footer describes
# ~128 row groups (~300 KB, parsed in ~1.5 ms).
ROW_GROUP_BYTES_MAX = 8 * 1024 * 1024
# Bounds the Python objects a row group of tiny records holds while it is built.
ROW_GROUP_ROWS_MAX = 128 * 1024
# zstd level 1, not 3 (zstd's default): measured on the JSON events of bench/tiering.py, level 1
# compresses a row group 25% faster and its objects came out no larger (Parquet pages are
# compressed one by one, where the higher levels' larger search windows buy little).
ZSTD_LEVEL = 1

# Rows the writer hands each column's encoder at a time (Arrow's default: 1024). A page ends
# only between two such batches, and an encoder's buffer grows by copying as a page fills; with
# big batches a row group's value column goes in as one or two pieces, each in a buffer sized
# once. On the JSON events of bench/tiering.py this took 9.5% of a conversion's instructions
# (callgrind; nearly all of it memcpy) and left the objects the same size. The pages of the
# small columns were one per row group before as after (their bytes never reach a page's
# 1 MiB), so a page index prunes as finely as it did.
WRITE_BATCH_ROWS = 32 * 1024

# Dictionary encoding only where readers gain from it: `topic` (one string per object, not one
# per row) and `partition` (Spark reads it when a query needs no column). The batch columns
# repeat run after run too, but zstd shrinks their plain pages as much (the objects of
# bench/tiering.py came out the same size) and building dictionaries cost ~6% of a conversion.
_DICTIONARY_COLUMNS = ["topic", "partition"]
# Statistics where a reader prunes by them: offsets and timestamps (which row groups and pages
# can hold an offset or a time), partition and timestamp type (Spark's filters), and batch
# attributes (Spark's reader skips the control-batch check of row groups without one). The
# others would cost ~3% of a conversion and footer bytes for no pruning.
_STATISTICS_COLUMNS = ["partition", "offset", "timestamp", "timestampType", "batch_attributes"]
_WRITE_OPTIONS: dict[str, Any] = {
    "version": "2.6",
    "data_page_version": "1.0",  # what every Parquet reader reads, Spark 2 and Hive included
    "compression": "zstd",
    "compression_level": ZSTD_LEVEL,
    "use_dictionary": _DICTIONARY_COLUMNS,
    "write_statistics": _STATISTICS_COLUMNS,
    "write_page_index": True,
    "write_page_checksum": True,
    "write_batch_size": WRITE_BATCH_ROWS,
    # `offset` is the fifth leaf column too: nothing nested comes before it.
    "sorting_columns": [pq.SortingColumn(SCHEMA.get_field_index("offset"))],
    "store_schema": True,
    "use_compliant_nested_type": True,
}

_INT64_MAX = 2**63 - 1

# A segment's batches: their bytes, or the path of the segment's .log file.
Segment: TypeAlias = Bytes | str | Path
# A Parquet object: a path, its bytes, a seekable binary file, or one already opened.
Source: TypeAlias = str | Path | bytes | BinaryIO | io.RawIOBase | pq.ParquetFile


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    """What a converted segment holds, for the manifest."""

    base_offset: int  # of the first batch
    last_offset: int  # of the last batch (above its last record if compaction removed that)
    records: int
    batches: int
    min_timestamp_ms: int  # of the `timestamp` column: what consumers see
    max_timestamp_ms: int
    size_bytes: int  # of the Parquet file
    row_groups: int
    transactions: ObjectTransactions = NO_TRANSACTIONS


def segment_to_parquet(
    batches: Segment,
    topic: str,
    partition: int,
    out_path: str | Path,
    *,
    row_group_bytes_max: int = ROW_GROUP_BYTES_MAX,
    row_group_rows_max: int = ROW_GROUP_ROWS_MAX,
) -> SegmentSummary:
    """Write the batches of one segment (its bytes, or the path of its .log file) to
    `out_path` as Parquet. Every batch is checked first (whole, CRC, records well-formed,
    offsets increasing): a bad one raises CorruptRecordError naming its offset and position,
    nothing is skipped, and no file is left at `out_path`."""
    out_path = Path(out_path)
    try:
        with _segment_view(batches) as view:
            return _write(view, topic, partition, out_path, row_group_bytes_max, row_group_rows_max)
    except BaseException:
        # Closing the writer on the way out wrote a valid footer under the rows so far: a
        # file that looks whole and is not.
        out_path.unlink(missing_ok=True)
        raise


@contextmanager
def _segment_view(batches: Segment) -> Iterator[memoryview]:
    if isinstance(batches, str | Path):
        # Mapped, not read: a segment is up to segment.bytes (1 GiB) and pages in as it goes.
        with pa.memory_map(str(batches), "r") as mapped:
            yield memoryview(mapped.read_buffer())
    else:
        yield memoryview(batches)


@dataclass(slots=True)
class _Written:
    """What the row groups written so far add up to."""

    row_groups: int = 0
    records: int = 0
    min_timestamp_ms: int = _INT64_MAX
    max_timestamp_ms: int = -_INT64_MAX - 1

    def add(self, table: pa.Table) -> None:
        extremes = pc.min_max(table.column("timestamp").cast(pa.int64()))
        self.row_groups += 1
        self.records += table.num_rows
        self.min_timestamp_ms = min(self.min_timestamp_ms, extremes["min"].as_py())
        self.max_timestamp_ms = max(self.max_timestamp_ms, extremes["max"].as_py())


def _write(
    view: memoryview,
    topic: str,
    partition: int,
    out_path: Path,
    bytes_max: int,
    rows_max: int,
) -> SegmentSummary:
    where = f"{topic}-{partition}"
    written = _Written()
    first: BatchHeader | None = None
    last: BatchHeader | None = None
    batches = 0
    txns = TxnScanner()
    with _PipelinedWriter(out_path) as writer:
        group = RowGroupRows(topic, partition, bytes_max)
        for position, header in _intact_batches(view, where):
            try:
                group.add(view, position, header)
                _scan_transactions(txns, view, position, header)
            except CorruptRecordError as error:
                raise _corrupt(where, header, position, error.message) from error
            first = first or header
            last = header
            batches += 1
            if group.section_bytes >= bytes_max or group.rows >= rows_max:
                written.add(writer.write(_table(group, where)))
                group = RowGroupRows(topic, partition, bytes_max)
        if group.rows:
            written.add(writer.write(_table(group, where)))
    if first is None or last is None:
        raise ValueError(f"{where}: no batches to tier")
    return SegmentSummary(
        base_offset=first.base_offset,
        last_offset=last.last_offset,
        records=written.records,
        batches=batches,
        min_timestamp_ms=written.min_timestamp_ms,
        max_timestamp_ms=written.max_timestamp_ms,
        size_bytes=out_path.stat().st_size,
        row_groups=written.row_groups,
        transactions=txns.result(),
    )


def _scan_transactions(
    txns: TxnScanner, view: memoryview, position: int, header: BatchHeader
) -> None:
    if not header.is_transactional:
        return
    if header.is_control:
        control_type, _ = read_marker(view, position, header)
        txns.marker(header.producer_id, header.base_offset, control_type)
    else:
        txns.data(header.producer_id, header.base_offset)


def _table(group: RowGroupRows, where: str) -> pa.Table:
    try:
        return group.table()
    except CorruptRecordError as error:
        raise CorruptRecordError(error.code, f"{where}: {error.message}") from error


def open_writer(out_path: str | Path) -> pq.ParquetWriter:
    """A writer of SCHEMA rows with the options every tiered object is written with (cold
    compaction writes its objects through it too)."""
    return pq.ParquetWriter(out_path, SCHEMA, **_WRITE_OPTIONS)


class _PipelinedWriter:
    """A ParquetWriter whose row groups are encoded and compressed on a thread of its own
    while the caller decodes the next one: Arrow releases the GIL while it writes, so the two
    stages overlap on two cores (one row group in flight: memory stays at two row groups)."""

    def __init__(self, out_path: Path) -> None:
        self._writer = open_writer(out_path)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet-write")
        self._in_flight: Future[None] | None = None

    def __enter__(self) -> _PipelinedWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._wait()
        finally:
            self._thread.shutdown()
            self._writer.close()

    def write(self, table: pa.Table) -> pa.Table:
        """Queue `table` as the next row group (after the one in flight is written)."""
        self._wait()
        self._in_flight = self._thread.submit(
            self._writer.write_table, table, row_group_size=table.num_rows
        )
        return table

    def _wait(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()


def _intact_batches(view: memoryview, where: str) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each batch, checked to be whole with a valid CRC, to hold records
    and to start above the batch before. Raises CorruptRecordError naming the first bad one."""
    position = 0
    last_offset: int | None = None
    while position < len(view):
        try:
            header = parse_batch_header(view, position)
        except CorruptRecordError as error:
            raise CorruptRecordError(
                error.code, f"{where}: after offset {last_offset}, byte {position}: {error.message}"
            ) from error
        problem = None
        if not batch_crc_ok(view, position, header):
            problem = "is truncated or fails its CRC"
        elif header.records_count <= 0:
            # Compaction keeps such batches for their producer state; not tiered until it exists.
            problem = f"holds {header.records_count} records"
        elif last_offset is not None and header.base_offset <= last_offset:
            problem = f"does not follow the batch ending at offset {last_offset}"
        if problem is not None:
            raise _corrupt(where, header, position, problem)
        yield position, header
        last_offset = header.last_offset
        position += header.size_bytes


def _corrupt(where: str, header: BatchHeader, position: int, problem: str) -> CorruptRecordError:
    return CorruptRecordError(
        ErrorCode.CORRUPT_MESSAGE,
        f"{where}: batch at offset {header.base_offset} (byte {position}) {problem}",
    )


def open_segment(source: Source) -> pq.ParquetFile:
    """The Parquet file of a tiered segment, footer read; pass it on to read it again."""
    if isinstance(source, bytes):
        source = pa.BufferReader(source)
    elif isinstance(source, Path):
        source = str(source)
    elif isinstance(source, pq.ParquetFile):
        return source
    # pre_buffer: a row group's column chunks are fetched in a few coalesced reads (range GETs).
    return pq.ParquetFile(source, pre_buffer=True, page_checksum_verification=True)


def row_groups_for_offset(metadata: pq.FileMetaData, offset: int) -> range:
    """The row groups a read from `offset` may need, in order: from the first holding a record
    at or above it (rows are sorted by offset) to the end."""
    column = _leaf_index(metadata, "offset")
    for group in range(metadata.num_row_groups):
        if _max(metadata, group, column) >= offset:
            return range(group, metadata.num_row_groups)
    return range(0)


def row_groups_for_timestamp(
    metadata: pq.FileMetaData, timestamp_ms: int, min_offset: int = 0
) -> list[int]:
    """The row groups that may hold a record at or above `min_offset` whose timestamp is at
    least `timestamp_ms`, in order (timestamps need not increase with offsets)."""
    offset = _leaf_index(metadata, "offset")
    timestamp = _leaf_index(metadata, "timestamp")
    return [
        group
        for group in range(metadata.num_row_groups)
        if _max(metadata, group, timestamp) >= timestamp_ms
        and _max(metadata, group, offset) >= min_offset
    ]


class SegmentReader:
    """One tiered segment open for reads: its footer parsed once, and the row group read last
    kept decoded, since a sequential consumer's next fetch mostly falls in it (a row group
    holds ~8 fetches of 1 MiB). One thread at a time; close it (or use it as a context
    manager) to close a file it opened from a path."""

    def __init__(self, source: Source) -> None:
        self._owns_file = not isinstance(source, pq.ParquetFile)
        self._parquet = open_segment(source)
        self._last_group: tuple[int, RowGroupBatches] | None = None

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the decoded row group; close the file if this reader opened it from a path
        (a file object passed in stays open: its owner closes it)."""
        self._last_group = None
        if self._owns_file:
            self._parquet.close()

    def read_batches(self, start_offset: int, max_bytes: int) -> bytes:
        """The rebuilt batches holding records at or above `start_offset`, oldest first, at
        most `max_bytes` of them but always at least one whole batch (KIP-74) if the file
        holds any; b"" if it holds none. Reads only the row groups needed, and of them only
        the columns a rebuild needs."""
        out = bytearray()
        for group in row_groups_for_offset(self._parquet.metadata, start_offset):
            if self._batches(group).append_to(out, start_offset, max_bytes):
                break
        return bytes(out)

    def first_offset_at_or_after(
        self, timestamp_ms: int, min_offset: int = 0
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or above `min_offset` whose timestamp
        (as consumers see it) is >= `timestamp_ms` (ListOffsets by timestamp), or None."""
        metadata = self._parquet.metadata
        for group in row_groups_for_timestamp(metadata, timestamp_ms, min_offset):
            rows = self._parquet.read_row_group(
                group, columns=["offset", "timestamp"], use_threads=False
            )
            offsets = rows.column("offset")
            timestamps = rows.column("timestamp").cast(pa.int64())
            wanted = pc.and_(
                pc.greater_equal(timestamps, timestamp_ms), pc.greater_equal(offsets, min_offset)
            )
            found = pc.index(wanted, True).as_py()
            if found >= 0:
                return offsets[found].as_py(), timestamps[found].as_py()
        return None

    def _batches(self, group: int) -> RowGroupBatches:
        if self._last_group is None or self._last_group[0] != group:
            # One thread: cold reads run in the tiering executor, which bounds their CPU.
            rows = self._parquet.read_row_group(
                group, columns=list(REBUILD_COLUMNS), use_threads=False
            )
            self._last_group = (group, RowGroupBatches(rows))
        return self._last_group[1]


def read_batches(source: Source, start_offset: int, max_bytes: int) -> bytes:
    """SegmentReader.read_batches, for one read."""
    with SegmentReader(source) as reader:
        return reader.read_batches(start_offset, max_bytes)


def first_offset_at_or_after(
    source: Source, timestamp_ms: int, min_offset: int = 0
) -> tuple[int, int] | None:
    """SegmentReader.first_offset_at_or_after, for one search."""
    with SegmentReader(source) as reader:
        return reader.first_offset_at_or_after(timestamp_ms, min_offset)


def _leaf_index(metadata: pq.FileMetaData, name: str) -> int:
    """The Parquet column index of the top-level scalar column `name` (nested columns such as
    `headers` have several leaves, so it may differ from the Arrow field index)."""
    for index in range(metadata.num_columns):
        if metadata.schema.column(index).path == name:
            return index
    raise KeyError(f"no column {name!r} in this Parquet file")


def _max(metadata: pq.FileMetaData, group: int, column: int) -> int:
    """The largest value of an integer or timestamp column in a row group; without statistics,
    the largest possible (the row group is never skipped)."""
    statistics = metadata.row_group(group).column(column).statistics
    if statistics is None or not statistics.has_min_max:
        return _INT64_MAX
    maximum: int = statistics.max_raw
    return maximum
