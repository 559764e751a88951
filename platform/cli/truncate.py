"""`riverbed topics truncate T --before OFFSET [--partition P ...]`: delete a topic's records
below an offset (DeleteRecords, from both tiers), as Kafka's kafka-delete-records tool does, and
print each partition's new log start (its low watermark)."""

from __future__ import annotations

import argparse

from riverbed.cli.render import plain_table
from riverbed.client.admin import Admin
from riverbed.client.types import TopicPartition

# `--before hw` (or -1, Kafka's DeleteRecordsRequest.HIGH_WATERMARK): every committed record.
HIGH_WATERMARK_NAMES = frozenset({"hw", "-1"})


def before_offset(text: str) -> int:
    """argparse type of --before: an offset >= 0, or `hw` / -1 for the high watermark."""
    if text in HIGH_WATERMARK_NAMES:
        return -1
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an offset (>= 0) nor 'hw'")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name")
    parser.add_argument(
        "--before",
        type=before_offset,
        required=True,
        metavar="OFFSET",
        help="delete the records below OFFSET ('hw': below the high watermark)",
    )
    parser.add_argument(
        "--partition",
        type=int,
        action="append",
        metavar="P",
        help="only this partition (repeatable; default: every partition)",
    )


async def truncate_topic(admin: Admin, args: argparse.Namespace) -> int:
    partitions = args.partition
    if partitions is None:
        description = await admin.describe_topic(args.name)
        partitions = [p.partition for p in description.partitions]
    low_watermarks = await admin.delete_records(
        {TopicPartition(args.name, p): args.before for p in sorted(set(partitions))}
    )
    print(
        plain_table(
            ("TOPIC", "PARTITION", "LOG-START-OFFSET"),
            ((tp.topic, tp.partition, offset) for tp, offset in low_watermarks.items()),
        )
    )
    return 0
