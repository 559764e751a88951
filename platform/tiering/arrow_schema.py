"""The columns of a tiered segment: one row per Kafka record, as Spark's Kafka source shows it,
plus what rebuilding the original record batches needs.

The first eight columns are those of Spark's Kafka source (`key`, `value`, `topic`,
`partition`, `offset`, `timestamp`, `timestampType`, `headers`, same names and types), so Spark,
DuckDB or Polars read a tiered segment with no translation. `timestamp` is what a consumer sees:
the batch's max timestamp in a LogAppendTime batch, the record's own otherwise.

Then, for rebuilding the batches exactly:
- `record_timestamp_delta`: the record's timestampDelta as written. The record's own timestamp
  is `batch_base_timestamp + record_timestamp_delta`; in a LogAppendTime batch that is the
  producer's timestamp, which `timestamp` no longer shows. (Its offsetDelta is `offset -
  batch_base_offset`.)
- `batch_*`: the batch header's fields (Kafka's names) repeated on each of the batch's rows;
  they cost next to nothing once dictionary- and run-length-encoded. `batch_size_bytes`, the
  batch's size in the log, lets a cold read pick about `max_bytes` of batches before decoding
  a single record.
Control batches (transaction markers) are rows too, flagged by bit 5 of `batch_attributes`
(`batch_attributes & 32 != 0`): analytics that want only data records filter them out, as a
consumer does.

Integers use the width of the Kafka field they hold. Only `key`, `value` and a header's value
may be null, as in Kafka.
"""

from __future__ import annotations

import pyarrow as pa

HEADER_TYPE = pa.struct(
    [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]
)
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE, nullable=False))
TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")

SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),  # null: a tombstone
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
        pa.field("timestampType", pa.int32(), nullable=False),  # 0 CreateTime, 1 LogAppendTime
        pa.field("headers", HEADERS_TYPE, nullable=False),
        pa.field("record_timestamp_delta", pa.int64(), nullable=False),
        pa.field("batch_base_offset", pa.int64(), nullable=False),
        pa.field("batch_last_offset_delta", pa.int32(), nullable=False),
        pa.field("batch_base_timestamp", pa.int64(), nullable=False),
        pa.field("batch_max_timestamp", pa.int64(), nullable=False),
        pa.field("batch_partition_leader_epoch", pa.int32(), nullable=False),
        pa.field("batch_attributes", pa.int16(), nullable=False),
        pa.field("batch_producer_id", pa.int64(), nullable=False),
        pa.field("batch_producer_epoch", pa.int16(), nullable=False),
        pa.field("batch_base_sequence", pa.int32(), nullable=False),
        pa.field("batch_size_bytes", pa.int32(), nullable=False),
    ]
)

# The per-batch columns, in the order batch_rebuild reads them into its batches.
BATCH_COLUMNS = tuple(name for name in SCHEMA.names if name.startswith("batch_"))
# What rebuilding batches reads: everything but the columns derived for analytics.
REBUILD_COLUMNS = ("key", "value", "offset", "headers", "record_timestamp_delta", *BATCH_COLUMNS)
