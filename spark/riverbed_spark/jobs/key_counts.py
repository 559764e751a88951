"""Per-key counts and windowed counts over a topic's whole history, written as Parquet.

    python -m riverbed_spark.jobs.key_counts --bootstrap-servers 127.0.0.1:9092 \
        --object-store file://$PWD/.riverbed/cold --topic demo --out ./key-counts

Reads the cold tier straight from the object store and the hot tail through the brokers (the
`riverbed` data source), then writes two Parquet datasets under --out:
- `keys/`: per key, the record count, value bytes, and the first and last timestamps;
- `windows/`: per tumbling window (--window, a Spark interval such as "1 minute") and key, the
  record count.
Progress goes to stderr: the plan (how many splits read the cold tier and how many the hot
tail), Spark's stage progress bar, and each output as it is written. With `spark-submit`, the
master comes from spark-submit; alone, from --master (default local[*]).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from riverbed_spark.jobs.session import job_session, progress
from riverbed_spark.options import parse_read_options
from riverbed_spark.planning import ColdSplit, Planner, splits_for
from riverbed_spark.source import RiverbedDataSource

_progress = functools.partial(progress, "key_counts")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    options = {"subscribe": args.topic}
    if args.bootstrap_servers:
        options["bootstrap.servers"] = args.bootstrap_servers
    if args.object_store:
        options["remote.storage.url"] = args.object_store
    try:
        plan = _describe_plan(options)
    except ValueError as error:
        print(f"key_counts: {error}", file=sys.stderr)
        return 2
    spark = job_session("riverbed-key-counts", args.master)
    try:
        _progress(plan)
        spark.dataSource.register(RiverbedDataSource)
        records = spark.read.format("riverbed").options(**options).load()
        _write(_per_key(records), f"{args.out}/keys", "per-key counts")
        _write(_per_window(records, args.window), f"{args.out}/windows", "windowed counts")
    finally:
        spark.stop()
    return 0


def _per_key(records: DataFrame) -> DataFrame:
    return records.groupBy("key").agg(
        F.count("*").alias("records"),
        F.sum(F.coalesce(F.length("value"), F.lit(0))).alias("value_bytes"),
        F.min("timestamp").alias("first_timestamp"),
        F.max("timestamp").alias("last_timestamp"),
    )


def _per_window(records: DataFrame, window: str) -> DataFrame:
    return (
        records.groupBy(F.window("timestamp", window).alias("window"), "key")
        .agg(F.count("*").alias("records"))
        .select("window.start", "window.end", "key", "records")
    )


def _write(frame: DataFrame, path: str, what: str) -> None:
    started = time.monotonic()
    frame.write.mode("overwrite").parquet(path)
    _progress(f"wrote {what} to {path} in {time.monotonic() - started:.1f} s")


def _describe_plan(options: dict[str, str]) -> str:
    """What the job will read, from the same planning the data source does."""
    read_options = parse_read_options(options)
    planner = Planner(read_options)
    splits = splits_for(planner.batch_ranges(), read_options, planner.store)
    cold = sum(1 for s in splits if isinstance(s, ColdSplit))
    return (
        f"reading {options['subscribe']}: {cold} splits from the cold tier, "
        f"{len(splits) - cold} from the hot tail"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m riverbed_spark.jobs.key_counts", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument("--bootstrap-servers", help="the cluster (omit to read the store alone)")
    parser.add_argument("--object-store", help="file:///path or s3://bucket/prefix")
    parser.add_argument("--out", required=True, help="directory for the Parquet outputs")
    parser.add_argument("--window", default="1 minute", help="tumbling window (Spark interval)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, or local[*])")
    return parser


if __name__ == "__main__":
    sys.exit(main())
