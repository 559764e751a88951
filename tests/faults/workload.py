"""The clients of a fault test: producers and consumers that write down everything they were told.

Producers send unique values "<producer>:<seq>" (`rb-0:000123`) round-robin over the topic's
partitions, at RECORDS_PER_S in all: Riverbed's asyncio `Producer`s ("rb-N") on the event loop
and confluent-kafka's ("ck-N", librdkafka) each in a thread of its own, all with acks=all and
idempotence. Consumers ("c-N", Riverbed's `Consumer`) are each assigned every partition from
offset 0 and record every record they are served. Everything goes to a history file
(tests/faults/history.py) that tests/faults/checker.py judges against `read_final_log()`.

It talks only to the bootstrap address it is given, in this process or as one of its own, so a
test can start it inside a network namespace:

    ip netns exec client python -m tests.faults.workload --bootstrap 10.0.0.1:9092 \
        --topic jepsen --history /tmp/h.jsonl --duration-s 60 --seed 7

which runs for --duration-s (or until SIGTERM / SIGINT), stops the producers (each flushes, for
FLUSH_TIMEOUT_S at most), lets the consumers catch up (CONSUMER_DRAIN_S_MAX at most), prints a
JSON summary and exits 0. `--final-log OUT.json` instead reads the topic back (read_final_log)
into OUT.json. In-process: `await Workload(...).run(duration_s)`, `Workload.stop()` from any
thread; or the blocking `run(...)` outside an event loop.

A client that fails for good (send() raises: a fatal idempotence error, a closed producer; a
consumer whose fetching raises) is replaced after RESTART_BACKOFF_S: a fault test wants load
throughout, and the history says what each client was told before it went.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import random
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final, TypeVar

import confluent_kafka
from riverbed import Admin, Consumer, Producer, TopicPartition
from riverbed.client.accumulator import DeliveryFuture
from riverbed.errors import KafkaError, KafkaTimeoutError, RetriableError, TopicError

from tests.faults.history import NO_OFFSET, Ack, Fail, Header, HistoryWriter, Served, now_ms

T = TypeVar("T")

# All producers together: modest, because the machine has 2 cores for 3 brokers, 3 ZooKeepers
# and the test; enough that every fault lands on records in flight.
RECORDS_PER_S: Final = 150
# Each send waits its interval times a factor drawn from this range, so producers do not move in
# lockstep (their batches interleave differently from run to run of different seeds).
SEND_JITTER: Final = (0.5, 1.5)
LINGER_MS: Final = 5
# Short, so that a request to a broker cut off is given up and retried elsewhere soon.
CLIENT_REQUEST_TIMEOUT_MS: Final = 5_000
# A record outlives a fault of this long and is acknowledged after healing; longer, it fails.
DELIVERY_TIMEOUT_MS: Final = 30_000
# send() waits this long at most for metadata or buffer space (Kafka's default: 60 s).
MAX_BLOCK_MS: Final = 10_000
# A producer's final flush: every record's outcome is known by then (its delivery timeout).
FLUSH_TIMEOUT_S: Final = DELIVERY_TIMEOUT_MS / 1000 + 5.0
# Then what is still unanswered is failed (confluent-kafka: purged) and its callbacks run.
CLOSE_TIMEOUT_S: Final = 5.0
RESTART_BACKOFF_S: Final = 1.0
CONSUMER_POLL_MS: Final = 500
RECORDS_PER_POLL_MAX: Final = 1_000
# After the producers stop, consumers read on until they reach every high watermark, or this long.
CONSUMER_DRAIN_S_MAX: Final = 5.0
# Finding the topic's partitions at the start, and each step of read_final_log().
METADATA_TIMEOUT_S: Final = 30.0
POLL_INTERVAL_S: Final = 0.2
TOPIC_READY_TIMEOUT_S: Final = 30.0
FINAL_LOG_TIMEOUT_S: Final = 60.0
# What a retry loop treats as "not yet": a broker unreachable, a partition between leaders.
TRANSIENT_ERRORS: Final = (OSError, TimeoutError, RetriableError, KafkaTimeoutError)

RIVERBED_PREFIX: Final = "rb"
CONFLUENT_PREFIX: Final = "ck"
CONSUMER_PREFIX: Final = "c"

FinalLog = dict[int, list[tuple[int, str]]]


def client_kind(name: str) -> str:
    """RIVERBED_PREFIX, CONFLUENT_PREFIX or CONSUMER_PREFIX, of a name "[tag-]kind-index"."""
    return name.rsplit("-", 2)[-2]


def as_text(value: bytes | None) -> str:
    """A record's value as the history holds it: never empty, whatever a broker serves."""
    if value is None:
        return "<null>"
    return value.decode(errors="replace") or "<empty>"


@dataclass
class ProducerCounts:
    sent: int = 0
    acked: int = 0
    failed: int = 0


@dataclass
class Summary:
    """What the run did, per client: the history has the details."""

    duration_s: float = 0.0
    producers: dict[str, ProducerCounts] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)

    def acked(self, kind: str) -> int:
        """Acknowledgements of the producers of one kind (RIVERBED_PREFIX, CONFLUENT_PREFIX)."""
        return sum(c.acked for name, c in self.producers.items() if client_kind(name) == kind)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


class Workload:
    """Producers and consumers on one topic, recording into one history file (appended)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        history_path: Path | str,
        *,
        seed: int,
        scenario: str = "workload",
        producers_riverbed: int = 1,
        producers_confluent: int = 1,
        consumers: int = 1,
        records_per_s: float = RECORDS_PER_S,
        tag: str = "",
    ) -> None:
        """`tag` prefixes every client name (and so every value): two runs on one topic need
        different tags, or their values repeat and the checker sees duplicates."""
        producers = producers_riverbed + producers_confluent
        if min(producers_riverbed, producers_confluent, consumers) < 0 or producers == 0:
            raise ValueError("at least one producer, and no negative counts")
        if records_per_s <= 0:
            raise ValueError(f"records_per_s must be positive, got {records_per_s}")
        self.bootstrap = bootstrap
        self.topic = topic
        self.history_path = Path(history_path)
        self.seed = seed
        self.scenario = scenario
        prefix = f"{tag}-" if tag else ""
        self._riverbed = [f"{prefix}{RIVERBED_PREFIX}-{i}" for i in range(producers_riverbed)]
        self._confluent = [f"{prefix}{CONFLUENT_PREFIX}-{i}" for i in range(producers_confluent)]
        self._consumers = [f"{prefix}{CONSUMER_PREFIX}-{i}" for i in range(consumers)]
        self._interval_s = producers / records_per_s  # of each producer
        self.summary = Summary(
            producers={name: ProducerCounts() for name in self._riverbed + self._confluent},
            served=dict.fromkeys(self._consumers, 0),
        )
        # Stopping is asked from any thread (or a signal handler): the threading.Event is what
        # the confluent-kafka threads watch, the asyncio.Event what the loop's tasks wait on.
        self._stopping = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Set once the producers are done: consumers then drain until this loop time at most.
        self._drain_deadline: float | None = None
        self._history: HistoryWriter | None = None

    def stop(self) -> None:
        """End the run early, from any thread; it then stops as it would at its duration."""
        self._stopping.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._stopped)

    def _stopped(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def run(self, duration_s: float) -> Summary:
        """Produce and consume for `duration_s` (or until `stop()`), then stop the producers,
        then the consumers; the summary of what they did."""
        if self._loop is not None:
            raise RuntimeError("a Workload runs once: make another")
        loop = self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stopping.is_set():
            self._stop.set()
        started = loop.time()
        rng = random.Random(self.seed)
        executor = ThreadPoolExecutor(
            max_workers=max(len(self._confluent), 1), thread_name_prefix="confluent-producer"
        )
        with HistoryWriter(self.history_path) as history:
            self._history = history
            history.write(Header(self.scenario, self.seed, now_ms()))
            partitions = await partition_count(self.bootstrap, self.topic, METADATA_TIMEOUT_S)
            try:
                async with asyncio.TaskGroup() as tasks:
                    for name in self._consumers:
                        tasks.create_task(self._consume(name, partitions))
                    producing = [
                        tasks.create_task(self._produce_riverbed(name, partitions, rng.random()))
                        for name in self._riverbed
                    ]
                    producing += [
                        tasks.create_task(
                            _in_thread(
                                executor,
                                functools.partial(
                                    self._produce_confluent, name, partitions, rng.random()
                                ),
                            )
                        )
                        for name in self._confluent
                    ]
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(duration_s):
                            await self._stop.wait()
                    self._stopping.set()
                    self._stop.set()
                    await asyncio.gather(*producing)
                    self._drain_deadline = loop.time() + CONSUMER_DRAIN_S_MAX
            finally:
                # Cancelled or failed: the threads stop too (each within its flush bound), and
                # their last callbacks still find the history open.
                self._stopping.set()
                await asyncio.to_thread(executor.shutdown, True)
                await asyncio.sleep(0)  # delivery callbacks already scheduled run now
                self._history = None
        self.summary.duration_s = loop.time() - started
        return self.summary

    # -- recording ------------------------------------------------------------------------
    def _write_ack(self, producer: str, partition: int, offset: int, value: str) -> None:
        self.summary.producers[producer].acked += 1
        self._record(Ack(producer, partition, offset, value, now_ms()))

    def _write_fail(
        self, producer: str, value: str, error: object, partition: int | None = None
    ) -> None:
        self.summary.producers[producer].failed += 1
        self._record(Fail(producer, value, _describe(error), now_ms(), partition))

    def _record(self, event: Ack | Fail | Served) -> None:
        if self._history is None:
            raise RuntimeError("an event after the run ended")
        self._history.write(event)

    def _values(self, producer: str) -> Iterator[str]:
        return (f"{producer}:{sequence:06d}" for sequence in itertools.count())

    # -- Riverbed's producer, on the loop -----------------------------------------------------
    async def _produce_riverbed(self, name: str, partitions: int, seed: float) -> None:
        rng = random.Random(seed)
        values = self._values(name)
        targets = itertools.cycle(_rotated(partitions, rng))
        stop = _present(self._stop)
        while not stop.is_set():
            producer = Producer(
                bootstrap_servers=self.bootstrap,
                client_id=name,
                acks="all",
                enable_idempotence=True,
                linger_ms=LINGER_MS,
                request_timeout_ms=CLIENT_REQUEST_TIMEOUT_MS,
                delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
                max_block_ms=MAX_BLOCK_MS,
            )
            try:
                await self._send_riverbed(producer, name, values, targets, rng)
            finally:
                await _close_riverbed(producer)
            await _sleep_unless(stop, RESTART_BACKOFF_S)

    async def _send_riverbed(
        self,
        producer: Producer,
        name: str,
        values: Iterator[str],
        targets: Iterator[int],
        rng: random.Random,
    ) -> None:
        """Send until stopped, or until send() raises (then the caller makes a new producer)."""
        stop = _present(self._stop)
        counts = self.summary.producers[name]
        while not stop.is_set():
            value, partition = next(values), next(targets)
            counts.sent += 1
            try:
                future = await producer.send(self.topic, value.encode(), partition=partition)
            except Exception as error:  # a fatal producer error, a timeout, ...: see the history
                self._write_fail(name, value, error, partition)
                return
            future.add_done_callback(functools.partial(self._riverbed_delivered, name, value))
            await _sleep_unless(stop, self._interval_s * rng.uniform(*SEND_JITTER))

    def _riverbed_delivered(self, name: str, value: str, future: DeliveryFuture) -> None:
        error = future.exception()
        if error is not None:
            self._write_fail(name, value, error)
            return
        metadata = future.result()
        self._write_ack(name, metadata.partition, metadata.offset, value)

    # -- confluent-kafka's producer, in a thread of its own --------------------------------
    def _produce_confluent(self, name: str, partitions: int, seed: float) -> None:
        rng = random.Random(seed)
        values = self._values(name)
        targets = itertools.cycle(_rotated(partitions, rng))
        while not self._stopping.is_set():
            fatal = threading.Event()

            def on_error(error: confluent_kafka.KafkaError, fatal: threading.Event = fatal) -> None:
                if error.fatal():  # the others (a broker down, ...) librdkafka retries itself
                    fatal.set()

            producer = confluent_kafka.Producer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "client.id": name,
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": LINGER_MS,
                    "request.timeout.ms": CLIENT_REQUEST_TIMEOUT_MS,
                    "message.timeout.ms": DELIVERY_TIMEOUT_MS,
                    "error_cb": on_error,
                }
            )
            try:
                self._send_confluent(producer, name, values, targets, rng, fatal)
            finally:
                self._close_confluent(producer)
            self._stopping.wait(RESTART_BACKOFF_S)

    def _send_confluent(
        self,
        producer: confluent_kafka.Producer,
        name: str,
        values: Iterator[str],
        targets: Iterator[int],
        rng: random.Random,
        fatal: threading.Event,
    ) -> None:
        counts = self.summary.producers[name]
        delivered = functools.partial(self._confluent_delivered, name)
        while not self._stopping.is_set() and not fatal.is_set():
            value, partition = next(values), next(targets)
            counts.sent += 1
            try:
                producer.produce(
                    self.topic, value=value.encode(), partition=partition, on_delivery=delivered
                )
            except (BufferError, confluent_kafka.KafkaException) as error:  # queue full, fatal
                self._write_fail(name, value, error, partition)
            producer.poll(0)  # delivery callbacks run here, in this thread
            self._stopping.wait(self._interval_s * rng.uniform(*SEND_JITTER))

    def _confluent_delivered(
        self, name: str, error: confluent_kafka.KafkaError | None, message: confluent_kafka.Message
    ) -> None:
        raw = message.value()
        value = raw.decode() if isinstance(raw, bytes) else str(raw)
        partition = message.partition()
        if error is not None:
            known = partition if partition is not None and partition >= 0 else None
            self._write_fail(name, value, error, known)
            return
        offset = message.offset()
        if partition is None:
            raise RuntimeError(f"{name}: {value} acknowledged without a partition")
        if offset is None or offset < 0:
            offset = NO_OFFSET  # acknowledged implicitly by librdkafka: see history.Ack
        self._write_ack(name, partition, offset, value)

    @staticmethod
    def _close_confluent(producer: confluent_kafka.Producer) -> None:
        """Flush (FLUSH_TIMEOUT_S at most); purge what is left, whose callbacks then report
        each record failed (its outcome unknown)."""
        if producer.flush(FLUSH_TIMEOUT_S) > 0:
            producer.purge(in_queue=True, in_flight=True, blocking=False)
            producer.flush(CLOSE_TIMEOUT_S)

    # -- consumers ----------------------------------------------------------------------------
    async def _consume(self, name: str, partitions: int) -> None:
        """Serve every partition from offset 0 until drained; a consumer that fails is
        replaced by one starting where it stopped."""
        positions = dict.fromkeys(range(partitions), 0)  # partition -> next offset
        while True:
            consumer = Consumer(
                bootstrap_servers=self.bootstrap,
                client_id=name,
                auto_offset_reset="earliest",  # after a truncation below the position: re-read
                isolation_level="read_uncommitted",
                request_timeout_ms=CLIENT_REQUEST_TIMEOUT_MS,
                fetch_max_wait_ms=CONSUMER_POLL_MS,
            )
            try:
                await consumer.start()
                tps = [TopicPartition(self.topic, p) for p in range(partitions)]
                consumer.assign(tps)
                for tp in tps:
                    consumer.seek(tp, positions[tp.partition])
                if await self._serve(consumer, name, tps, positions):
                    return
            except (KafkaError, *TRANSIENT_ERRORS, RuntimeError) as error:
                print(f"{name}: replacing the consumer after {error!r}", file=sys.stderr)
            finally:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CLOSE_TIMEOUT_S):
                        await consumer.close()
            if self._drain_over():
                return
            await asyncio.sleep(RESTART_BACKOFF_S)

    async def _serve(
        self,
        consumer: Consumer,
        name: str,
        tps: Sequence[TopicPartition],
        positions: dict[int, int],
    ) -> bool:
        """Record what `consumer` is served; True once drained."""
        while True:
            batches = await consumer.getmany(
                max_records=RECORDS_PER_POLL_MAX, timeout_ms=CONSUMER_POLL_MS
            )
            t_ms = now_ms()
            for tp, records in batches.items():
                for record in records:
                    value = as_text(record.value)
                    self._record(Served(name, tp.partition, record.offset, value, t_ms))
                    positions[tp.partition] = record.offset + 1
                self.summary.served[name] += len(records)
            if self._drain_over() or (
                self._drain_deadline is not None and _caught_up(consumer, tps, positions)
            ):
                return True

    def _drain_over(self) -> bool:
        deadline = self._drain_deadline
        return deadline is not None and asyncio.get_running_loop().time() >= deadline


def _caught_up(
    consumer: Consumer, tps: Sequence[TopicPartition], positions: dict[int, int]
) -> bool:
    """At every high watermark of the latest fetches."""
    for tp in tps:
        high_watermark = consumer.highwater(tp)
        if high_watermark is None or positions[tp.partition] < high_watermark:
            return False
    return True


async def _close_riverbed(producer: Producer) -> None:
    """Flush (FLUSH_TIMEOUT_S at most), then close; a close cut short by CLOSE_TIMEOUT_S fails
    every record still unanswered, and their callbacks record it."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(FLUSH_TIMEOUT_S):
            await producer.flush()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await producer.close()


def _rotated(partitions: int, rng: random.Random) -> list[int]:
    """Every partition once, starting at a random one: producers start on different ones."""
    start = rng.randrange(partitions)
    return [(start + i) % partitions for i in range(partitions)]


def _describe(error: object) -> str:
    return repr(error) if isinstance(error, BaseException) else str(error)


def _present(event: asyncio.Event | None) -> asyncio.Event:
    if event is None:
        raise RuntimeError("the workload is not running")
    return event


async def _sleep_unless(event: asyncio.Event, delay_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(delay_s):
            await event.wait()


async def _in_thread(executor: ThreadPoolExecutor, work: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(executor, work)


def run(
    bootstrap: str,
    topic: str,
    history_path: Path | str,
    duration_s: float,
    seed: int,
    producers_riverbed: int = 1,
    producers_confluent: int = 1,
    consumers: int = 1,
    *,
    scenario: str = "workload",
    tag: str = "",
) -> Summary:
    """The workload, blocking (outside any event loop), until `duration_s` or SIGTERM / SIGINT."""
    workload = Workload(
        bootstrap,
        topic,
        history_path,
        seed=seed,
        scenario=scenario,
        producers_riverbed=producers_riverbed,
        producers_confluent=producers_confluent,
        consumers=consumers,
        tag=tag,
    )

    async def main() -> Summary:
        if threading.current_thread() is threading.main_thread():  # signals reach only it
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, workload.stop)
        return await workload.run(duration_s)

    return asyncio.run(main())


# -- topics and the final log -------------------------------------------------------------


async def _retry(attempt: Callable[[], Awaitable[T | None]], timeout_s: float, what: str) -> T:
    """`attempt()` every POLL_INTERVAL_S until it returns something other than None;
    TRANSIENT_ERRORS count as "not yet". TimeoutError naming `what` and the last error."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: object = None
    while True:
        try:
            async with asyncio.timeout(max(deadline - loop.time(), 0.0)):
                result = await attempt()
            if result is not None:
                return result
        except TRANSIENT_ERRORS as error:
            last = error
        if loop.time() + POLL_INTERVAL_S > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s; last: {last!r}")
        await asyncio.sleep(POLL_INTERVAL_S)


def _admin(bootstrap: str) -> Admin:
    return Admin(bootstrap_servers=bootstrap, request_timeout_ms=CLIENT_REQUEST_TIMEOUT_MS)


async def partition_count(bootstrap: str, topic: str, timeout_s: float) -> int:
    async with _admin(bootstrap) as admin:

        async def count() -> int | None:
            return len(await admin.topic_partitions(topic)) or None

        return await _retry(count, timeout_s, f"the partitions of {topic}")


async def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    replication_factor: int = 3,
    min_insync_replicas: int = 2,
    timeout_s: float = TOPIC_READY_TIMEOUT_S,
) -> None:
    """Create the topic and return once every partition has a leader and a full ISR."""
    async with _admin(bootstrap) as admin:

        async def created() -> bool | None:
            try:
                await admin.create_topic(
                    name,
                    partitions=partitions,
                    replication_factor=replication_factor,
                    configs={"min.insync.replicas": str(min_insync_replicas)},
                )
            except TopicError as error:
                if "number of live brokers" not in str(error):
                    raise
                return None  # INVALID_REPLICATION_FACTOR: brokers of a new cluster registering
            return True

        await _retry(
            created, timeout_s, f"{name}: created at replication factor {replication_factor}"
        )

        async def in_sync() -> bool | None:
            states = (await admin.describe_topic(name)).partitions
            ready = len(states) == partitions and all(
                s.leader >= 0 and len(s.isr) == replication_factor for s in states
            )
            return ready or None

        await _retry(in_sync, timeout_s, f"{name}: a leader and a full ISR for every partition")


async def read_final_log(
    bootstrap: str, topic: str, timeout_s: float = FINAL_LOG_TIMEOUT_S
) -> FinalLog:
    """Every partition from offset 0 up to its high watermark (as ListOffsets tells it first):
    partition -> [(offset, value)]. OffsetOutOfRangeError if a log no longer starts at 0;
    TimeoutError after `timeout_s`, naming the partitions not read to the end."""
    log: FinalLog = {}
    ends: dict[TopicPartition, int] = {}
    remaining: set[TopicPartition] = set()
    try:
        async with asyncio.timeout(timeout_s):
            async with _admin(bootstrap) as admin:

                async def list_ends() -> dict[TopicPartition, int]:
                    tps = await admin.topic_partitions(topic)
                    offsets = await admin.list_offsets(dict.fromkeys(tps, "latest"))
                    return {tp: answer.offset for tp, answer in offsets.items()}

                ends = await _retry(list_ends, timeout_s, f"the high watermarks of {topic}")
            log.update({tp.partition: [] for tp in ends})
            remaining.update(tp for tp, end in ends.items() if end > 0)
            async with Consumer(
                bootstrap_servers=bootstrap,
                auto_offset_reset="none",
                request_timeout_ms=CLIENT_REQUEST_TIMEOUT_MS,
            ) as consumer:
                consumer.assign(ends)
                for tp in ends:
                    consumer.seek(tp, 0)
                while remaining:
                    batches = await consumer.getmany(
                        *remaining, max_records=RECORDS_PER_POLL_MAX, timeout_ms=CONSUMER_POLL_MS
                    )
                    for tp, records in batches.items():
                        log[tp.partition].extend(
                            (r.offset, as_text(r.value)) for r in records if r.offset < ends[tp]
                        )
                    for tp in list(remaining):
                        if await consumer.position(tp) >= ends[tp]:
                            remaining.discard(tp)
    except TimeoutError:
        unread = {tp.partition: ends[tp] for tp in remaining}
        raise TimeoutError(
            f"{topic}: not read within {timeout_s} s; partitions short of their high watermark: "
            f"{unread or 'unknown (no high watermarks yet)'}"
        ) from None
    return log


def write_final_log(log: FinalLog, path: Path | str) -> None:
    """As JSON: {"partition": [[offset, value], ...]} (JSON keys are strings)."""
    Path(path).write_text(json.dumps({str(p): records for p, records in sorted(log.items())}))


def load_final_log(path: Path | str) -> FinalLog:
    raw: dict[str, list[list[int | str]]] = json.loads(Path(path).read_text())
    return {
        int(partition): [(int(offset), str(value)) for offset, value in records]
        for partition, records in raw.items()
    }


# -- command line -------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.faults.workload", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--bootstrap", required=True, help="host:port[,host:port...]")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--history", type=Path, help="the history file (appended)")
    parser.add_argument("--duration-s", type=float, help="run this long, unless signalled")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--scenario", default="workload", help="written in the history header")
    parser.add_argument("--producers-riverbed", type=int, default=1)
    parser.add_argument("--producers-confluent", type=int, default=1)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--tag", default="", help="prefix of client names, unique per run")
    parser.add_argument(
        "--final-log", type=Path, help="instead: read the topic back into this JSON file"
    )
    parser.add_argument("--timeout-s", type=float, default=FINAL_LOG_TIMEOUT_S)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.final_log is not None:
        log = asyncio.run(read_final_log(args.bootstrap, args.topic, args.timeout_s))
        write_final_log(log, args.final_log)
        print(json.dumps({"records": sum(len(r) for r in log.values())}))
        return 0
    if args.history is None or args.duration_s is None or args.seed is None:
        parser.error("--history, --duration-s and --seed are required (or --final-log)")
    started = time.monotonic()
    summary = run(
        args.bootstrap,
        args.topic,
        args.history,
        args.duration_s,
        args.seed,
        args.producers_riverbed,
        args.producers_confluent,
        args.consumers,
        scenario=args.scenario,
        tag=args.tag,
    )
    print(summary.to_json())
    print(f"workload: done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
