"""One consumer-group member for the groups benchmark, as its own process (so SIGKILL is real).

    python -m bench.group_member --client confluent|riverbed --bootstrap B --group G --topic T
        [--session-timeout-ms N] [--assignor NAME]

It starts, prints `ready`, and subscribes only when a line arrives on stdin, so the benchmark's
clock starts when the group work starts, not when Python finished importing. Then it prints one
JSON object per line on stdout, each with `t`, a `time.monotonic()` reading (the same clock in
every process on Linux): `assigned` / `revoked` with the partitions, and `record` for the first
record of each partition after each assignment (enough to see when a partition is consumed again
without flooding the pipe). SIGTERM closes the consumer, which leaves the group (LeaveGroup), and
prints `closed`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from typing import Any

POLL_TIMEOUT_S = 0.05


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"e": event, "t": time.monotonic(), **fields}), flush=True)


class FirstRecords:
    """Which partitions already reported a record since their last assignment."""

    def __init__(self) -> None:
        self._reported: set[int] = set()

    def assigned(self, partitions: list[int]) -> None:
        self._reported -= set(partitions)
        emit("assigned", p=sorted(partitions))

    def revoked(self, partitions: list[int]) -> None:
        emit("revoked", p=sorted(partitions))

    def record(self, partition: int, offset: int) -> None:
        if partition not in self._reported:
            self._reported.add(partition)
            emit("record", p=partition, o=offset)


def run_confluent(args: argparse.Namespace, stop: threading.Event) -> None:
    from confluent_kafka import Consumer

    first = FirstRecords()
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "session.timeout.ms": args.session_timeout_ms,
            "partition.assignment.strategy": args.assignor,
            "auto.offset.reset": "latest",
        }
    )
    consumer.subscribe(
        [args.topic],
        on_assign=lambda _c, tps: first.assigned([tp.partition for tp in tps]),
        on_revoke=lambda _c, tps: first.revoked([tp.partition for tp in tps]),
    )
    while not stop.is_set():
        message = consumer.poll(POLL_TIMEOUT_S)
        if message is not None and message.error() is None:
            partition, offset = message.partition(), message.offset()
            assert partition is not None
            assert offset is not None
            first.record(partition, offset)
    consumer.close()  # leaves the group


async def run_riverbed(args: argparse.Namespace, stop: threading.Event) -> None:
    from riverbed import Consumer, RebalanceListener, TopicPartition

    first = FirstRecords()

    class Listener(RebalanceListener):
        async def on_partitions_revoked(self, partitions: frozenset[TopicPartition]) -> None:
            first.revoked([tp.partition for tp in partitions])

        async def on_partitions_assigned(self, partitions: frozenset[TopicPartition]) -> None:
            first.assigned([tp.partition for tp in partitions])

        async def on_partitions_lost(self, partitions: frozenset[TopicPartition]) -> None:
            first.revoked([tp.partition for tp in partitions])

    async with Consumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        session_timeout_ms=args.session_timeout_ms,
        partition_assignment_strategy=[args.assignor],
        auto_offset_reset="latest",
    ) as consumer:
        consumer.subscribe([args.topic], listener=Listener())
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=int(POLL_TIMEOUT_S * 1000))
            for records in batches.values():
                for record in records:
                    first.record(record.partition, record.offset)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.group_member")
    parser.add_argument("--client", choices=("confluent", "riverbed"), required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--session-timeout-ms", type=int, default=45_000)
    parser.add_argument("--assignor", default="range")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    emit("ready")
    if not sys.stdin.readline():
        return  # the benchmark went away before starting us
    if args.client == "confluent":
        run_confluent(args, stop)
    else:
        asyncio.run(run_riverbed(args, stop))
    emit("closed")


if __name__ == "__main__":
    main()
