"""The `riverbed` data source: batch and streaming reads, batch and streaming writes.

    spark.dataSource.register(RiverbedDataSource)
    df = (spark.read.format("riverbed")
          .option("bootstrap.servers", "127.0.0.1:9092")
          .option("remote.storage.url", "s3://bucket/prefix")   # read the cold tier directly
          .option("subscribe", "orders").load())

Options and columns are those of Spark's Kafka source (options.py). Without
`remote.storage.url` every offset is read through the broker, which serves the cold tier
itself; without `bootstrap.servers` only what the store holds is read (the cluster may be down).

Spark 4.3 does not tell a Python data source which columns a query uses; pruning.py's rule
does: `df.select("value")` creates the reader with the schema `value binary`, and only that
column is read from the objects. `register` installs the rule (see `name`).

`df.writeStream.format("riverbed")` writes each micro-batch exactly once (eos_writing.py); it
needs the options `topic` and `transactional.id.prefix`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from riverbed_spark.eos_writing import (
    PREFIX_OPTION,
    ExactlyOnceOptions,
    Outcome,
    TaskIdentity,
    TaskWritten,
    parse_exactly_once_options,
    write_exactly_once,
)
from riverbed_spark.options import EARLIEST, LATEST, ReadOptions, parse_read_options
from riverbed_spark.planning import (
    OffsetDict,
    PartitionRange,
    Planner,
    Split,
    as_offset_dict,
    from_offset_dict,
    splits_for,
)
from riverbed_spark.pruning import SOURCE_NAME, install_on_driver
from riverbed_spark.reading import COLUMN_TYPES, read_split
from riverbed_spark.writing import WriteOptions, parse_write_options, write_batches

SOURCE_COLUMNS = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_COLUMN = "headers array<struct<key:string,value:binary>>"

log = logging.getLogger(__name__)


class RiverbedDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        # spark.dataSource.register(RiverbedDataSource) calls this on the driver, the only code
        # of ours that runs there before queries are planned: it installs column pruning into
        # the session (a no-op in Python workers and on Spark Connect, and when already done).
        install_on_driver()
        return SOURCE_NAME

    def schema(self) -> str:
        include_headers = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return f"{SOURCE_COLUMNS}, {HEADERS_COLUMN}" if include_headers else SOURCE_COLUMNS

    def reader(self, schema: StructType) -> RiverbedReader:
        return RiverbedReader(parse_read_options(self.options), _target(schema))

    def streamReader(self, schema: StructType) -> RiverbedStreamReader:
        options = parse_read_options(self.options, streaming=True)
        return RiverbedStreamReader(options, _target(schema))

    def writer(self, schema: StructType, overwrite: bool) -> RiverbedWriter:
        if overwrite:
            raise ValueError("a topic can only be appended to: use mode('append')")
        if PREFIX_OPTION in {str(k).lower() for k in self.options}:
            # Not silently at-least-once for a user who asked for transactions.
            raise ValueError(
                f"{PREFIX_OPTION} is for streams (writeStream): a batch write is at-least-once"
            )
        return RiverbedWriter(parse_write_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> RiverbedStreamWriter:
        if overwrite:
            raise ValueError("a topic can only be appended to: use outputMode('append')")
        return RiverbedStreamWriter(parse_exactly_once_options(self.options, schema))


class RiverbedReader(DataSourceReader):
    def __init__(self, options: ReadOptions, target: pa.Schema) -> None:
        self.options = options
        self.target = target

    def partitions(self) -> list[Split]:
        planner = Planner(self.options)
        return splits_for(planner.batch_ranges(), self.options, planner.store)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_split(partition, self.options, self.target)


class RiverbedStreamReader(DataSourceStreamReader):
    """Offsets are Spark offset dicts, {"topic": {"partition": next offset}}: Spark keeps them
    in its checkpoint, so a restarted query goes on from the last committed batch's end."""

    def __init__(self, options: ReadOptions, target: pa.Schema) -> None:
        self.options = options
        self.target = target

    def initialOffset(self) -> OffsetDict:
        planner = Planner(self.options)
        partitions = planner.partitions()
        starts = planner.offsets(
            partitions, self.options.starting, self.options.starting_timestamp_ms
        )
        return as_offset_dict(starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: OffsetDict, limit: ReadLimit) -> OffsetDict:
        planner = Planner(self.options)
        partitions = planner.partitions()
        latest = planner.offsets(partitions, LATEST, None)
        begun = _starts(planner, start, partitions)
        ends = {tp: max(latest[tp], begun[tp]) for tp in partitions}
        if isinstance(limit, ReadMaxRows):
            ends = _rate_limited(begun, ends, limit.max_rows)
        return as_offset_dict(ends)

    def reportLatestOffset(self) -> OffsetDict:
        """The partitions' ends now: Spark shows them in the query's progress."""
        planner = Planner(self.options)
        return as_offset_dict(planner.offsets(planner.partitions(), LATEST, None))

    def partitions(self, start: OffsetDict, end: OffsetDict) -> list[Split]:
        planner = Planner(self.options)
        ends = from_offset_dict(end)
        begun = _starts(planner, start, list(ends))
        ranges = [PartitionRange(t, p, begun[(t, p)], stop) for (t, p), stop in ends.items()]
        return splits_for(ranges, self.options, planner.store)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_split(partition, self.options, self.target)

    def commit(self, end: OffsetDict) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in a consumer group."""


@dataclass(frozen=True)
class Written(WriterCommitMessage):
    records: int


class RiverbedWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return Written(write_batches(iterator, self.options))


class RiverbedStreamWriter(DataSourceStreamArrowWriter):
    """Each task's rows in one transaction, skipped when an earlier attempt committed them."""

    def __init__(self, options: ExactlyOnceOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskWritten:
        return write_exactly_once(iterator, self.options, TaskIdentity.of_running_task())

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing left to commit: every task committed its own transaction. Spark records the
        micro-batch as done in its checkpoint after this returns."""
        written = [m for m in messages if isinstance(m, TaskWritten)]
        log.info(
            "batch %d to %s: %d rows committed; %d tasks found their rows committed already",
            batchId,
            self.options.topic,
            sum(m.records for m in written),
            sum(1 for m in written if m.outcome is Outcome.ALREADY_COMMITTED),
        )

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: a task that committed stays committed and is skipped when Spark
        runs the batch again; one that did not is aborted by its next attempt's fencing, or by
        the coordinator after transaction.timeout.ms."""


def _starts(
    planner: Planner, start: OffsetDict, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """Where each partition's micro-batch starts: the offset in `start`, or its beginning for a
    partition that appeared since the query started."""
    begun = from_offset_dict(start)
    new = [tp for tp in partitions if tp not in begun]
    if new:
        begun.update(planner.offsets(new, EARLIEST, None))
    return begun


def _target(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects back, after checking the asked columns exist."""
    for field in schema.fields:
        if field.name not in COLUMN_TYPES:
            raise ValueError(
                f"unknown column {field.name!r}; the columns are {', '.join(COLUMN_TYPES)}"
            )
    target = to_arrow_schema(schema, timezone="UTC")
    for field in target:
        wanted = COLUMN_TYPES[field.name]
        if not _same_shape(field.type, wanted):
            raise ValueError(f"column {field.name!r} must be {wanted}, not {field.type}")
    return target


def _same_shape(given: pa.DataType, wanted: pa.DataType) -> bool:
    # Spark's list field is named "element" here and "item" there; the shape is what counts.
    if pa.types.is_list(given) and pa.types.is_list(wanted):
        return bool(given.value_type.equals(wanted.value_type))
    return bool(given.equals(wanted))


def _rate_limited(
    starts: dict[tuple[str, int], int], ends: dict[tuple[str, int], int], max_rows: int
) -> dict[tuple[str, int], int]:
    """At most `max_rows` offsets in all, shared out in proportion to what each partition has
    waiting (as Spark's Kafka source does); every partition with a backlog moves by >= 1."""
    waiting = {tp: ends[tp] - starts[tp] for tp in ends}
    total = sum(waiting.values())
    if total <= max_rows:
        return ends
    return {
        tp: starts[tp] + (max(1, waiting[tp] * max_rows // total) if waiting[tp] else 0)
        for tp in ends
    }
