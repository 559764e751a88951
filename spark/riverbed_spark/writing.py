"""`df.write.format("riverbed")`: rows produced to a topic with Riverbed's producer.

As with Spark's Kafka sink: columns `value` (required), `key`, `topic`, `partition` and
`headers`; `key` and `value` may be binary or string (strings are sent as UTF-8); the `topic`
option, when set, wins over a `topic` column. Each task produces its rows with acks=all and
returns only once every one of them is acknowledged, so a task that succeeded lost nothing (a
retried task may write its rows twice, as with Spark's Kafka sink).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructType
from riverbed.client.producer import Producer

WRITE_COLUMNS: Final = {"key", "value", "topic", "partition", "headers"}


@dataclass(frozen=True)
class WriteOptions:
    bootstrap_servers: str
    topic: str | None  # None: each row's `topic` column
    linger_ms: int = 5


def parse_write_options(options: Mapping[str, str], schema: StructType) -> WriteOptions:
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    bootstrap = lowered.get("kafka.bootstrap.servers") or lowered.get("bootstrap.servers")
    if not bootstrap:
        raise ValueError("set bootstrap.servers to write to a topic")
    names = set(schema.fieldNames())
    unknown = sorted(names - WRITE_COLUMNS)
    if unknown:
        raise ValueError(
            f"column {unknown[0]!r} cannot be written; the columns are "
            + ", ".join(sorted(WRITE_COLUMNS))
        )
    if "value" not in names:
        raise ValueError("a `value` column is required")
    for field in schema.fields:
        if field.name in ("key", "value", "topic") and not isinstance(
            field.dataType, BinaryType | StringType
        ):
            raise ValueError(f"column {field.name!r} must be binary or string")
        if field.name == "partition" and not isinstance(field.dataType, IntegerType):
            raise ValueError("column 'partition' must be int")
    topic = lowered.get("topic")
    if topic is None and "topic" not in names:
        raise ValueError("set the topic option or give a `topic` column")
    return WriteOptions(bootstrap, topic)


def write_batches(batches: Iterator[pa.RecordBatch], options: WriteOptions) -> int:
    return asyncio.run(_produce(batches, options))


async def _produce(batches: Iterator[pa.RecordBatch], options: WriteOptions) -> int:
    async with Producer(
        bootstrap_servers=options.bootstrap_servers, acks="all", linger_ms=options.linger_ms
    ) as producer:
        return await send_rows(producer, batches, options)


async def send_rows(
    producer: Producer, batches: Iterator[pa.RecordBatch], options: WriteOptions
) -> int:
    """Send every row of `batches` and wait until each one is acknowledged (raises if one was
    not); the number of rows sent. Inside a transaction, acknowledged is not yet committed.

    Spark's iterator blocks while the rows are still being computed: it is read in a thread, so
    that the producer sends what it has meanwhile instead of holding it until the end."""
    futures = []
    while (batch := await asyncio.to_thread(next, batches, None)) is not None:
        for row in batch.to_pylist():
            topic = options.topic or row["topic"]
            if topic is None:
                raise ValueError("a row has no topic (null `topic` and no topic option)")
            futures.append(
                await producer.send(
                    topic,
                    _as_bytes(row["value"]),
                    key=_as_bytes(row.get("key")),
                    headers=[(h["key"], h["value"]) for h in row.get("headers") or ()],
                    partition=row.get("partition"),
                )
            )
    await producer.flush()
    for future in futures:
        await future  # raises if a record was not acknowledged
    return len(futures)


def _as_bytes(value: Any) -> bytes | None:
    return value.encode() if isinstance(value, str) else value
