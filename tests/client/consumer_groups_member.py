"""A Riverbed consumer group member in a process of its own, for tests that SIGKILL a member.

    python tests/client/consumer_groups_member.py BOOTSTRAP GROUP TOPIC SETTINGS_JSON

It subscribes to TOPIC in GROUP and commits after processing: each batch is "processed" by
reporting it, then committed. It reports on stdout, one JSON object a line, flushed at once:

    {"e": "assigned" | "revoked" | "lost", "p": [partition, ...], "t": time.monotonic()}
    {"e": "processed", "p": partition, "o": [offset, ...]}      (always before the commit)

`time.monotonic()` is the system-wide CLOCK_MONOTONIC on Linux, so the test compares these times
with its own. Commits refused because of a rebalance are ignored: the records come again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from typing import Any

from riverbed.client.consumer import Consumer
from riverbed.client.group.listener import RebalanceListener
from riverbed.client.types import TopicPartition
from riverbed.errors import GroupError, KafkaTimeoutError


def report(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class Reporter(RebalanceListener):
    async def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        report(
            {"e": "assigned", "p": sorted(tp.partition for tp in assigned), "t": time.monotonic()}
        )

    async def on_partitions_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        report({"e": "revoked", "p": sorted(tp.partition for tp in revoked), "t": time.monotonic()})

    async def on_partitions_lost(self, lost: frozenset[TopicPartition]) -> None:
        report({"e": "lost", "p": sorted(tp.partition for tp in lost), "t": time.monotonic()})


async def main(bootstrap: str, group: str, topic: str, settings: dict[str, Any]) -> None:
    async with Consumer(bootstrap_servers=bootstrap, group_id=group, **settings) as consumer:
        consumer.subscribe([topic], listener=Reporter())
        while True:
            batches = await consumer.getmany(timeout_ms=100)
            for tp, records in batches.items():
                report({"e": "processed", "p": tp.partition, "o": [r.offset for r in records]})
            if batches:
                with contextlib.suppress(GroupError, KafkaTimeoutError):
                    await consumer.commit()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
