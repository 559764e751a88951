"""A streaming query in a process of its own, for tests/spark/test_exactly_once_sink.py to kill.

    python -m tests.spark.eos_query BOOTSTRAP SOURCE SINK CHECKPOINT PREFIX END [STALL_VALUE]

Reads topic SOURCE through the broker (maxOffsetsPerTrigger, so several micro-batches) and
writes its values to SINK with the exactly-once sink. With STALL_VALUE, the row of that value
never gets through (a UDF waits on it): its task has sent the rows before it in an open transaction
and waits there until the process is killed. Without it, the query runs until every partition
of SOURCE is read up to END, then exits 0.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Final

from pyspark.sql import functions as F
from pyspark.sql.streaming.listener import StreamingQueryProgress
from riverbed_spark.local import local_session

MAX_OFFSETS_PER_TRIGGER: Final = 400
QUERY_TIMEOUT_S: Final = 300.0
STALL_S: Final = 3600.0
# Small batches and buffers between Spark's JVM and its Python workers: a task's first rows
# reach the sink (and the topic) while the rows after them are still in the UDF.
SMALL_BATCHES: Final = {
    "spark.sql.execution.python.udf.maxRecordsPerBatch": "10",
    "spark.sql.execution.python.udf.buffer.size": "256",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10",
    "spark.buffer.size": "256",
}


def main(
    bootstrap: str, source: str, sink: str, checkpoint: str, prefix: str, end: int, stall: str
) -> None:
    spark = local_session("riverbed-eos-query", 2, **SMALL_BATCHES)
    stall_value = stall.encode() if stall else None

    def passed_on(value: bytes) -> bytes:
        if value == stall_value:
            time.sleep(STALL_S)
        return value

    through = F.udf(passed_on, "binary")
    query = (
        spark.readStream.format("riverbed")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(MAX_OFFSETS_PER_TRIGGER))
        .load()
        .select(through("value").alias("value"))
        .writeStream.format("riverbed")
        .option("bootstrap.servers", bootstrap)
        .option("topic", sink)
        .option("transactional.id.prefix", prefix)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    reported = -1
    while not _read_up_to(query.recentProgress, source, end):
        for progress in query.recentProgress:
            if progress.batchId > reported:  # what the test shows when it fails
                reported = progress.batchId
                print("batch", reported, progress.numInputRows, progress.sources[0].endOffset)
        if query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done: {query.recentProgress[-1:]}")
        sys.stdout.flush()
        time.sleep(0.2)
    query.stop()
    spark.stop()


def _read_up_to(progress: Sequence[StreamingQueryProgress], source: str, end: int) -> bool:
    for batch in progress:
        ends = json.loads(batch.sources[0].endOffset or "{}").get(source, {})
        if ends and all(offset >= end for offset in ends.values()):
            return True
    return False


if __name__ == "__main__":
    bootstrap, source, sink, checkpoint, prefix, end = sys.argv[1:7]
    main(bootstrap, source, sink, checkpoint, prefix, int(end), "".join(sys.argv[7:8]))
