"""One consumer-group member in its own OS process, for tests/groups (so SIGKILL is a real crash).

    python -m tests.groups.group_member consume CLIENT --bootstrap B --group G --topic T \
        --client-id A --assignor range --session-timeout-ms 2000 --heartbeat-interval-ms 300
    kcat -b B -G G ... 2>&1 | python -m tests.groups.group_member kcat-events

CLIENT is confluent-kafka, aiokafka, kafka-python or riverbed. Either command writes the member's
story to stdout, one JSON object per line: "event", "t" (CLOCK_MONOTONIC in seconds: one clock for
every process of the machine, so the events of different members and the test's own actions can
be ordered against each other) and the event's fields:

    ready         -                                  the process is up (kcat-events: before kcat)
    assigned      partitions: [int]                  partitions this member now owns
    revoked       partitions: [int]                  partitions given up or lost
    processed     partition, offsets: [int]          written before those offsets are committed
    committing    offsets: {partition: next offset}  a commit is sent
    committed     offsets: {partition: next offset}  the coordinator acknowledged it
    commit_failed error                              it did not
    stopping      -                                  nothing is processed after this
    closed        -                                  close() returned: the member left the group
    log           line                               anything else (kcat's other lines)

`consume` commits after processing: it reports a batch as processed, then commits the offsets
after it, synchronously. kcat stores each offset as librdkafka hands the record over and commits
every auto.commit.interval.ms; its rebalance lines come from its stderr, and `kcat-events` stamps
each line as it arrives. SIGTERM stops a member cleanly (it closes its consumer: LeaveGroup).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TextIO

RECORDS_PER_POLL_MAX: Final = 100  # keeps every "processed" line well under PIPE_BUF
POLL_TIMEOUT_MS: Final = 100
FETCH_WAIT_MAX_MS: Final = 100
# A member that stops polling is dropped after this; it also bounds a rebalance (the broker waits
# this long for members to rejoin), so a wedged member costs the test seconds, not minutes.
MAX_POLL_INTERVAL_MS: Final = 10_000
CLIENTS: Final = ("confluent-kafka", "aiokafka", "kafka-python", "riverbed")


class Reporter:
    """Writes events to stdout, a whole line per write (the harness reads them as they come;
    after a SIGKILL every line written so far is in the pipe)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._lock = threading.Lock()  # kafka-python runs listeners on its own I/O thread

    def event(self, event: str, **fields: object) -> None:
        line = json.dumps({"event": event, "t": time.monotonic(), **fields}) + "\n"
        with self._lock:
            self._out.write(line)
            self._out.flush()

    def assigned(self, partitions: Iterable[int]) -> None:
        self.event("assigned", partitions=sorted(partitions))

    def revoked(self, partitions: Iterable[int]) -> None:
        self.event("revoked", partitions=sorted(partitions))

    def processed(self, batch: Mapping[int, list[int]]) -> dict[int, int]:
        """Report a polled batch as processed; return the offsets to commit after it."""
        for partition, offsets in sorted(batch.items()):
            self.event("processed", partition=partition, offsets=offsets)
        return {partition: max(offsets) + 1 for partition, offsets in batch.items()}

    def committing(self, offsets: Mapping[int, int]) -> None:
        self.event("committing", offsets=offsets)

    def committed(self, offsets: Mapping[int, int]) -> None:
        self.event("committed", offsets=offsets)

    def commit_failed(self, error: object) -> None:
        self.event("commit_failed", error=repr(error))


# -- the clients ---------------------------------------------------------------------------------
# Each builds its consumer, subscribes with a listener reporting assignment changes, and hands
# `serve` two closures: poll (a batch: {partition: [offsets]}) and commit ({partition: offset}).

Batch = dict[int, list[int]]
Offsets = dict[int, int]


def serve(
    poll: Callable[[], Batch],
    commit: Callable[[Offsets], object],
    failures: tuple[type[BaseException], ...],
    out: Reporter,
    stop: threading.Event,
) -> None:
    """Poll, process (report), commit, until SIGTERM."""
    while not stop.is_set():
        batch = poll()
        if batch:
            offsets = out.processed(batch)
            out.committing(offsets)
            try:
                commit(offsets)
            except failures as error:
                out.commit_failed(error)
            else:
                out.committed(offsets)
    out.event("stopping")


async def serve_getmany(
    consumer: Any,
    topic_partition: Callable[[str, int], object],
    failures: tuple[type[BaseException], ...],
    topic: str,
    out: Reporter,
    stop: asyncio.Event,
) -> None:
    """`serve` for the asyncio clients (aiokafka, Riverbed): the same getmany() and commit()."""
    while not stop.is_set():
        polled = await consumer.getmany(
            timeout_ms=POLL_TIMEOUT_MS, max_records=RECORDS_PER_POLL_MAX
        )
        batch = {tp.partition: [r.offset for r in records] for tp, records in polled.items()}
        if batch:
            offsets = out.processed(batch)
            out.committing(offsets)
            try:
                await consumer.commit({topic_partition(topic, p): o for p, o in offsets.items()})
            except failures as error:
                out.commit_failed(error)
            else:
                out.committed(offsets)
    out.event("stopping")


def run_confluent(args: argparse.Namespace, out: Reporter, stop: threading.Event) -> None:
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "client.id": args.client_id,
            "partition.assignment.strategy": args.assignor,
            "session.timeout.ms": args.session_timeout_ms,
            "heartbeat.interval.ms": args.heartbeat_interval_ms,
            "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": FETCH_WAIT_MAX_MS,
        }
    )

    def on_assign(_: object, partitions: list[confluent_kafka.TopicPartition]) -> None:
        out.assigned(tp.partition for tp in partitions)

    def on_revoke(_: object, partitions: list[confluent_kafka.TopicPartition]) -> None:
        out.revoked(tp.partition for tp in partitions)

    def poll() -> Batch:
        batch: Batch = {}
        for record in consumer.consume(RECORDS_PER_POLL_MAX, POLL_TIMEOUT_MS / 1000):
            offset, partition = record.offset(), record.partition()
            if record.error() is not None or offset is None or partition is None:
                out.event("log", line=f"consume error: {record.error()}")
            else:
                batch.setdefault(partition, []).append(offset)
        return batch

    def commit(offsets: Offsets) -> None:
        wanted = [confluent_kafka.TopicPartition(args.topic, p, o) for p, o in offsets.items()]
        answered = consumer.commit(offsets=wanted, asynchronous=False) or []
        errors = [tp.error for tp in answered if tp.error is not None]
        if errors:
            raise confluent_kafka.KafkaException(errors[0])

    # librdkafka assigns (incrementally, for cooperative-sticky) by itself after on_assign.
    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    serve(poll, commit, (confluent_kafka.KafkaException,), out, stop)
    consumer.close()


def run_kafka_python(args: argparse.Namespace, out: Reporter, stop: threading.Event) -> None:
    import kafka
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata

    assignors = {"range": RangePartitionAssignor, "cooperative-sticky": CooperativeStickyAssignor}

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: list[kafka.TopicPartition]) -> None:
            out.revoked(tp.partition for tp in revoked)

        def on_partitions_assigned(self, assigned: list[kafka.TopicPartition]) -> None:
            out.assigned(tp.partition for tp in assigned)

        def on_partitions_lost(self, lost: list[kafka.TopicPartition]) -> None:
            out.revoked(tp.partition for tp in lost)

    consumer = kafka.KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        client_id=args.client_id,
        partition_assignment_strategy=(assignors[args.assignor],),
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=FETCH_WAIT_MAX_MS,
        max_poll_records=RECORDS_PER_POLL_MAX,
    )

    def poll() -> Batch:
        polled = consumer.poll(timeout_ms=POLL_TIMEOUT_MS)
        return {tp.partition: [r.offset for r in records] for tp, records in polled.items()}

    def commit(offsets: Offsets) -> None:
        consumer.commit(
            {
                kafka.TopicPartition(args.topic, p): OffsetAndMetadata(o, "", -1)
                for p, o in offsets.items()
            }
        )

    finish_joins_left_running(consumer)
    consumer.subscribe(topics=[args.topic], listener=Listener())
    serve(poll, commit, (KafkaError,), out, stop)
    consumer.close()


def finish_joins_left_running(consumer: Any) -> None:
    """Works around a kafka-python 3.0.12 race: when poll()'s time runs out during a rebalance,
    the JoinGroup + SyncGroup task is left running, and it is picked up by the next poll only if
    the coordinator still needs a rejoin. The task itself clears that need (it records the
    metadata snapshot it assigned), so its result is never read: heartbeats stay off, the
    session expires and the member never rejoins (kafka/coordinator/base.py,
    ensure_active_group; seen here once in ~12 runs under load, and in 1 of 3 runs with 2 ms
    polls, which with this passed 6 runs of 6).
    A join task in flight counts as a rejoin needed, so the next poll reads it."""
    coordinator = consumer._coordinator  # kafka-python's own; no public handle
    need_rejoin = coordinator.need_rejoin
    coordinator.need_rejoin = lambda: need_rejoin() or coordinator._join_task is not None


async def run_aiokafka(args: argparse.Namespace, out: Reporter, stop: asyncio.Event) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.errors import KafkaError

    if args.assignor != "range":
        raise SystemExit(f"this test runs aiokafka with range only, not {args.assignor}")

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
            out.revoked(tp.partition for tp in revoked)

        def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
            out.assigned(tp.partition for tp in assigned)

    consumer = AIOKafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        client_id=args.client_id,
        partition_assignment_strategy=(RangePartitionAssignor,),
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=FETCH_WAIT_MAX_MS,
    )

    await consumer.start()
    consumer.subscribe([args.topic], listener=Listener())
    await serve_getmany(consumer, TopicPartition, (KafkaError,), args.topic, out, stop)
    await consumer.stop()


async def run_riverbed(args: argparse.Namespace, out: Reporter, stop: asyncio.Event) -> None:
    from riverbed import Consumer, TopicPartition
    from riverbed.client.group.listener import RebalanceListener
    from riverbed.errors import KafkaError

    class Listener(RebalanceListener):
        async def on_partitions_revoked(self, revoked: frozenset[TopicPartition]) -> None:
            out.revoked(tp.partition for tp in revoked)

        async def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
            out.assigned(tp.partition for tp in assigned)

    consumer = Consumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        client_id=args.client_id,
        partition_assignment_strategy=args.assignor,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=FETCH_WAIT_MAX_MS,
    )

    await consumer.start()
    consumer.subscribe([args.topic], listener=Listener())
    await serve_getmany(consumer, TopicPartition, (KafkaError,), args.topic, out, stop)
    await consumer.close()


def consume(args: argparse.Namespace) -> None:
    out = Reporter(sys.stdout)
    out.event("ready")
    if args.client in ("confluent-kafka", "kafka-python"):
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        run = run_confluent if args.client == "confluent-kafka" else run_kafka_python
        run(args, out, stop)
    else:

        async def main() -> None:
            stopping = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
            run = run_aiokafka if args.client == "aiokafka" else run_riverbed
            await run(args, out, stopping)

        asyncio.run(main())
    out.event("closed")


# -- kcat ----------------------------------------------------------------------------------------

# kcat -f 'M %p %o\n': one line per record handed over.
KCAT_FORMAT: Final = r"M %p %o\n"
_KCAT_RECORD = re.compile(r"^M (\d+) (\d+)$")
# Its rebalance callback (kcat.c rebalance_cb / incremental_rebalance_cb), at verbosity 1:
#   % Group G rebalanced (memberid M): assigned: T [0], T [1]
#   % Group G rebalanced (memberid M): revoked: T [0]
#   % Group G rebalanced: incremental assignment of 2 partition(s) (memberid M, ...): T [0], T [1]
#   % Group G rebalanced: incremental revoke of 1 partition(s) (memberid M, ...): T [0]
_KCAT_EAGER = re.compile(r"^% Group .* rebalanced \(memberid [^)]*\): (assigned|revoked): (.*)$")
_KCAT_INCREMENTAL = re.compile(
    r"^% Group .* rebalanced: incremental (assignment|revoke) of \d+ partition\(s\) "
    r"\(memberid [^)]*\): (.*)$"
)
_KCAT_PARTITION = re.compile(r"\[(\d+)\]")


def kcat_event(line: str, out: Reporter) -> None:
    """Translate one line of kcat's merged stdout/stderr into an event."""
    if record := _KCAT_RECORD.match(line):
        partition, offset = int(record[1]), int(record[2])
        out.event("processed", partition=partition, offsets=[offset])
    elif rebalance := _KCAT_EAGER.match(line) or _KCAT_INCREMENTAL.match(line):
        partitions = [int(p) for p in _KCAT_PARTITION.findall(rebalance[2])]
        if rebalance[1] in ("assigned", "assignment"):
            out.assigned(partitions)
        else:
            out.revoked(partitions)
    else:
        out.event("log", line=line)


def kcat_events(_: argparse.Namespace) -> None:
    out = Reporter(sys.stdout)
    out.event("ready")
    # Line by line as it arrives: each line's time is when kcat wrote it, to a pipe read at once.
    for line in sys.stdin:
        kcat_event(line.rstrip("\n"), out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.groups.group_member")
    commands = parser.add_subparsers(dest="command", required=True)
    member = commands.add_parser("consume", help="one member: consume, process, commit")
    member.add_argument("client", choices=CLIENTS)
    member.add_argument("--bootstrap", required=True)
    member.add_argument("--group", required=True)
    member.add_argument("--topic", required=True)
    member.add_argument("--client-id", required=True)
    member.add_argument("--assignor", required=True)
    member.add_argument("--session-timeout-ms", type=int, required=True)
    member.add_argument("--heartbeat-interval-ms", type=int, required=True)
    member.set_defaults(run=consume)
    stamp = commands.add_parser("kcat-events", help="turn kcat -G output into events")
    stamp.set_defaults(run=kcat_events)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
