"""What the end-to-end group tests share: broker settings for fast rebalances, member processes
and what they report, the checks on those reports, a steady producer, and a raw Kafka connection.

Members (tests/groups/group_member.py) are OS processes, one per member, so that SIGKILL is a real
crash. Each reports its own assignment changes (from its client's rebalance callbacks), the
offsets it processed and its commits, stamped with CLOCK_MONOTONIC; `MemberProcess` collects them.
From those reports alone the checks decide:

- ownership: per partition, the intervals during which each member owned it (assigned → revoked,
  or → the member stopped / was killed) never overlap, and every record a member processed was
  processed inside one of its own intervals of that partition;
- completeness: per partition, the offsets processed by all members together cover 0..end;
- handovers: a member that gets a partition starts reading it at the newest commit acknowledged
  before (never below: the coordinator lost nothing);
- settling: the live members' assignments partition the topic, balanced.

Raw requests go through `KafkaWire`, which encodes with kafka-python's protocol classes
(generated from Kafka's JSON message schemas), independent of Riverbed's own codec.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import pytest
from kafka.protocol.admin.groups import DescribeGroupsRequest
from kafka.protocol.consumer.group import OffsetFetchRequest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest
from kafka.protocol.parser import KafkaProtocol
from riverbed import Admin, Producer
from riverbed.protocol.errors import ErrorCode

from tests.groups.group_member import KCAT_FORMAT, MAX_POLL_INTERVAL_MS
from tests.support.broker import HOST
from tests.support.cluster import wait_for

REPO: Final = Path(__file__).resolve().parents[2]
KCAT: Final = "/usr/bin/kcat"

# Members notice a rebalance at their next heartbeat and a killed member is dropped after its
# session timeout: both short, so that each step of a test takes a second or two.
SESSION_TIMEOUT_MS: Final = 2_000
HEARTBEAT_INTERVAL_MS: Final = 300
BROKER_SETTINGS: Final[Mapping[str, str]] = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "500",
    "offsets.topic.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
}
PARTITIONS: Final = 6
# Waits: generous for a busy 2-core machine, bounded so a broken group fails in a minute at most.
START_TIMEOUT_S: Final = 30.0
# How late a kcat member's events may be stamped (by the process reading kcat's output).
KCAT_STAMP_SLACK_S: Final = 0.05
SETTLE_TIMEOUT_S: Final = 45.0
STOP_TIMEOUT_S: Final = 30.0
REQUEST_TIMEOUT_S: Final = 10.0
OFFSET_FETCH_VERSION_MAX: Final = 7
PRODUCE_INTERVAL_S: Final = 0.01  # one record every 10 ms, round robin over the partitions
LOG_TAIL_LINES: Final = 30
EVENT_TAIL: Final = 8

T = TypeVar("T")


def group_name(prefix: str = "group") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- member processes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    kind: str
    t: float  # CLOCK_MONOTONIC, seconds
    fields: dict[str, Any]


@dataclass(frozen=True)
class Interval:
    """A member owned `partition` from `start` to `end` (seconds, CLOCK_MONOTONIC)."""

    member: str
    partition: int
    start: float
    end: float


class MemberProcess:
    """One member: its process(es) and everything it reported so far.

    For kcat, two processes: kcat itself (the consumer, which gets the signals) writing into a
    `group_member kcat-events` process that turns its lines into events.
    """

    def __init__(self, name: str, client: str, log_path: Path) -> None:
        self.name = name
        self.client = client
        self.log_path = log_path
        self.events: list[Event] = []
        # When the member stopped owning anything, seen from outside: killed, or exited.
        self.ended_at: float | None = None
        self.processes: list[asyncio.subprocess.Process] = []
        self._reader: asyncio.Task[None] | None = None

    @property
    def consumer(self) -> asyncio.subprocess.Process:
        """The process that consumes: the one to signal."""
        return self.processes[0]

    @property
    def alive(self) -> bool:
        return self.ended_at is None and self.consumer.returncode is None

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, command: Sequence[str], kcat: Sequence[str] | None = None) -> None:
        """Start `command` (a group_member process); for kcat, `command` is the kcat-events filter
        and `kcat` the consumer, started once the filter is ready so that no line waits."""
        log = self.log_path.open("ab")
        try:
            if kcat is None:
                process = await asyncio.create_subprocess_exec(
                    *command, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=log
                )
                self.processes = [process]
            else:
                read_end, write_end = os.pipe()
                try:
                    stamper = await asyncio.create_subprocess_exec(
                        *command,
                        cwd=REPO,
                        stdin=read_end,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=log,
                    )
                    self.processes = [stamper]
                    self._read(stamper)
                    await self.wait_for_event("ready", START_TIMEOUT_S)
                    consumer = await asyncio.create_subprocess_exec(
                        *kcat,
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=write_end,
                        stderr=write_end,
                    )
                    self.processes = [consumer, stamper]
                finally:
                    os.close(read_end)
                    os.close(write_end)
        finally:
            log.close()
        if self._reader is None:
            self._read(self.processes[0])
        await self.wait_for_event("ready", START_TIMEOUT_S)

    def _read(self, process: asyncio.subprocess.Process) -> None:
        stdout = process.stdout
        if stdout is None:
            raise RuntimeError("the member's stdout is not a pipe")
        self._reader = asyncio.create_task(self._read_events(stdout), name=f"member-{self.name}")

    async def _read_events(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            if not line.endswith(b"\n"):
                return  # cut short by a SIGKILL: nothing after it was committed either
            try:
                data = json.loads(line)
                event = Event(data.pop("event"), data.pop("t"), data)
            except (ValueError, KeyError):
                event = Event("log", time.monotonic(), {"line": line.decode(errors="replace")})
            self.events.append(event)

    async def wait_for_event(self, kind: str, timeout_s: float) -> Event:
        def found() -> Event | None:
            if self.processes and self.consumer.returncode is not None:
                raise AssertionError(f"member {self.name} exited\n{self.describe()}")
            return next((e for e in self.events if e.kind == kind), None)

        return await wait_for(found, timeout_s, what=f"{self.name}: {kind}", context=self.describe)

    async def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (the member closes its consumer: LeaveGroup) and wait for every process to
        exit; return the consumer's exit code."""
        self.consumer.send_signal(signal.SIGTERM)
        return await self._wait_exit(timeout_s)

    async def kill(self) -> None:
        """SIGKILL the consumer (a crash: no LeaveGroup, no commit) and reap it."""
        self.consumer.kill()
        await self._wait_exit(STOP_TIMEOUT_S)

    async def pause(self) -> None:
        """SIGSTOP, and wait until every thread of the member stopped: from then on it sends
        nothing (no heartbeat, no commit) and writes no event, but keeps its sockets."""
        self.consumer.send_signal(signal.SIGSTOP)
        tasks = Path(f"/proc/{self.consumer.pid}/task")

        def stopped() -> bool:
            # /proc/PID/task/TID/stat: "tid (comm) STATE ..."; comm may hold spaces.
            states = [
                path.read_text().rpartition(")")[2].split()[0] for path in tasks.glob("*/stat")
            ]
            return all(state == "T" for state in states)

        await wait_for(stopped, STOP_TIMEOUT_S, what=f"{self.name} to stop", interval_s=0.01)

    def resume(self) -> None:
        self.consumer.send_signal(signal.SIGCONT)

    async def _wait_exit(self, timeout_s: float) -> int:
        async with asyncio.timeout(timeout_s):
            codes = [await process.wait() for process in self.processes]
            if self._reader is not None:
                await self._reader  # every line it wrote before it died
        self.ended_at = time.monotonic()
        return codes[0]

    async def close(self) -> None:
        """Teardown: SIGKILL whatever still runs. Idempotent."""
        for process in self.processes:
            if process.returncode is None:
                process.kill()
                await process.wait()
        if self._reader is not None:
            self._reader.cancel()

    # -- what it reported -----------------------------------------------------------------------
    def owned(self) -> frozenset[int]:
        """The partitions this member owns now, by its own reports (none once it stopped)."""
        if not self.alive or any(e.kind == "stopping" for e in self.events):
            return frozenset()
        owned: set[int] = set()
        for event in self.events:
            if event.kind == "assigned":
                owned.update(event.fields["partitions"])
            elif event.kind == "revoked":
                owned.difference_update(event.fields["partitions"])
        return frozenset(owned)

    def ownership_history(self) -> list[int]:
        """How many partitions it owned after each assignment change."""
        owned: set[int] = set()
        history = []
        for event in self.events:
            if event.kind == "assigned":
                owned.update(event.fields["partitions"])
            elif event.kind == "revoked":
                owned.difference_update(event.fields["partitions"])
            else:
                continue
            history.append(len(owned))
        return history

    def intervals(self) -> list[Interval]:
        """When it owned which partition. Ownership ends at the first of: revoked, "stopping",
        and the moment the test saw the member end (killed or exited)."""
        final = self.ended_at if self.ended_at is not None else time.monotonic()
        started: dict[int, float] = {}
        out: list[Interval] = []

        def close(partition: int, end: float) -> None:
            out.append(Interval(self.name, partition, started.pop(partition), end))

        for event in self.events:
            if event.kind == "assigned":
                for partition in event.fields["partitions"]:
                    started.setdefault(partition, event.t)
            elif event.kind == "revoked":
                for partition in event.fields["partitions"]:
                    if partition in started:
                        close(partition, event.t)
            elif event.kind == "stopping":
                final = min(final, event.t)
        for partition in list(started):
            close(partition, final)
        return out

    def processed(self) -> list[tuple[float, int, int]]:
        """(time, partition, offset) of every record it processed."""
        return [
            (event.t, event.fields["partition"], offset)
            for event in self.events
            if event.kind == "processed"
            for offset in event.fields["offsets"]
        ]

    def processed_since(self, t: float) -> int:
        return sum(1 for when, _, _ in self.processed() if when >= t)

    def commits(self, kind: str = "committed") -> list[tuple[float, dict[int, int]]]:
        """(time, {partition: offset}) of each commit sent ("committing") or acknowledged."""
        return [
            (event.t, {int(p): o for p, o in event.fields["offsets"].items()})
            for event in self.events
            if event.kind == kind
        ]

    def describe(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        except OSError as error:
            lines = [f"(no log: {error})"]
        tail = [f"  {e.kind} {e.t:.3f} {e.fields}" for e in self.events[-EVENT_TAIL:]]
        return "\n".join(
            [f"--- member {self.name} ({self.client}), last events:", *tail, "--- its log:", *lines]
        )


class GroupMembers:
    """Starts members of one test's groups; every process is SIGKILLed at teardown."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.members: list[MemberProcess] = []

    async def start(
        self,
        name: str,
        client: str,
        *,
        bootstrap: str,
        group: str,
        topic: str,
        assignor: str = "range",
    ) -> MemberProcess:
        """A member named `name` (also its client.id) of `group`, subscribed to `topic`."""
        member = MemberProcess(name, client, self.home / f"member-{name}.log")
        self.members.append(member)
        module = [sys.executable, "-m", "tests.groups.group_member"]
        if client == "kcat":
            await member.start(
                [*module, "kcat-events"], kcat_command(bootstrap, group, topic, name, assignor)
            )
        else:
            await member.start(
                [
                    *module,
                    "consume",
                    client,
                    f"--bootstrap={bootstrap}",
                    f"--group={group}",
                    f"--topic={topic}",
                    f"--client-id={name}",
                    f"--assignor={assignor}",
                    f"--session-timeout-ms={SESSION_TIMEOUT_MS}",
                    f"--heartbeat-interval-ms={HEARTBEAT_INTERVAL_MS}",
                ]
            )
        return member

    def describe(self) -> str:
        return "\n".join(member.describe() for member in self.members)

    async def close(self) -> None:
        for member in self.members:
            await member.close()


def kcat_command(bootstrap: str, group: str, topic: str, name: str, assignor: str) -> list[str]:
    """kcat's balanced consumer with the same timeouts as the other members; it commits what it
    handed over every 100 ms (librdkafka's auto commit) and when it closes."""
    settings = {
        "client.id": name,
        "partition.assignment.strategy": assignor,
        "session.timeout.ms": SESSION_TIMEOUT_MS,
        "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        "max.poll.interval.ms": MAX_POLL_INTERVAL_MS,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": "true",
        "auto.commit.interval.ms": 100,
        "fetch.wait.max.ms": 100,
    }
    options = [arg for key, value in settings.items() for arg in ("-X", f"{key}={value}")]
    return [KCAT, "-b", bootstrap, "-G", group, *options, "-u", "-f", KCAT_FORMAT, topic]


@pytest.fixture
async def group_members(tmp_path: Path) -> AsyncIterator[GroupMembers]:
    members = GroupMembers(tmp_path)
    try:
        yield members
    finally:
        await members.close()
        # Shown by pytest only when the test failed ("Captured stdout teardown").
        print(members.describe())


# -- checks on the members' reports -------------------------------------------------------------


def overlapping_ownership(members: Iterable[MemberProcess]) -> list[str]:
    """Every pair of intervals in which two members owned the same partition at once.

    A kcat member's revocation is stamped by its `kcat-events` process when that process reads
    the line, which can come after the next owner (stamping itself) reported the partition:
    a clean-clone run saw 0.5 ms. Its ends count KCAT_STAMP_SLACK_S early; an owner that kept a
    partition through a rebalance would overlap for a whole rebalance, still far longer."""
    everyone = list(members)
    slack_s = {m.name: KCAT_STAMP_SLACK_S if m.client == "kcat" else 0.0 for m in everyone}
    by_partition: dict[int, list[Interval]] = {}
    for member in everyone:
        for interval in member.intervals():
            by_partition.setdefault(interval.partition, []).append(interval)
    overlaps = []
    for partition, intervals in sorted(by_partition.items()):
        intervals.sort(key=lambda i: i.start)
        for i, earlier in enumerate(intervals):
            for later in intervals[i + 1 :]:
                end = earlier.end - slack_s[earlier.member]
                if later.start < end and later.member != earlier.member:
                    overlaps.append(f"partition {partition}: {earlier} overlaps {later}")
    return overlaps


def processed_without_ownership(members: Iterable[MemberProcess]) -> list[str]:
    """Records a member processed while it did not own their partition (by its own reports)."""
    found = []
    for member in members:
        intervals = member.intervals()
        for when, partition, offset in member.processed():
            if not any(i.partition == partition and i.start <= when <= i.end for i in intervals):
                found.append(f"{member.name} processed {partition}@{offset} at {when:.3f}")
    return found


def resumed_below_acknowledged(members: Collection[MemberProcess]) -> list[str]:
    """Ownerships that started reading a partition below an offset whose commit some member had
    seen acknowledged before the partition was assigned: the coordinator answered an older
    commit than the newest acknowledged one. (A new owner looks its offsets up after its
    assignment callback, so every commit acknowledged before that must be visible.)"""
    acknowledged = [
        (when, partition, offset)
        for member in members
        for when, offsets in member.commits("committed")
        for partition, offset in offsets.items()
    ]
    found = []
    for member in members:
        processed = member.processed()
        for interval in member.intervals():
            read = [
                offset
                for when, partition, offset in processed
                if partition == interval.partition and interval.start <= when <= interval.end
            ]
            floor = max(
                (
                    o
                    for when, p, o in acknowledged
                    if p == interval.partition and when < interval.start
                ),
                default=0,
            )
            if read and min(read) < floor:
                found.append(f"{interval} started at {min(read)}, below the acknowledged {floor}")
    return found


def unprocessed(
    members: Iterable[MemberProcess], end_offsets: Mapping[int, int]
) -> dict[int, list[int]]:
    """Per partition, the offsets below its end offset that no member processed."""
    seen: dict[int, set[int]] = {partition: set() for partition in end_offsets}
    for member in members:
        for _, partition, offset in member.processed():
            seen.setdefault(partition, set()).add(offset)
    missing = {
        partition: sorted(set(range(end)) - seen[partition])
        for partition, end in end_offsets.items()
    }
    return {partition: offsets for partition, offsets in missing.items() if offsets}


def settled(members: Sequence[MemberProcess], partitions: int) -> dict[str, frozenset[int]] | None:
    """The live members' assignments if they partition 0..partitions-1, balanced; else None."""
    owned = {member.name: member.owned() for member in members}
    counts = [len(o) for o in owned.values()]
    union = sorted(p for o in owned.values() for p in o)
    if union != list(range(partitions)) or max(counts) - min(counts) > 1:
        return None
    return owned


async def wait_settled(
    members: Sequence[MemberProcess], everyone: GroupMembers, partitions: int = PARTITIONS
) -> dict[str, frozenset[int]]:
    """Wait until `members` (alive) share the partitions, balanced, each processing again."""
    names = ", ".join(member.name for member in members)
    assignment = await wait_for(
        lambda: settled(members, partitions),
        SETTLE_TIMEOUT_S,
        what=f"members {names} to share {partitions} partitions",
        context=everyone.describe,
    )
    since = time.monotonic()
    await wait_for(
        lambda: all(member.processed_since(since) > 0 for member in members),
        SETTLE_TIMEOUT_S,
        what=f"members {names} to process records after the rebalance",
        context=everyone.describe,
    )
    return assignment


async def wait_drained(
    everyone: GroupMembers,
    end_offsets: Mapping[int, int],
    *,
    may_skip: Collection[tuple[int, int]] = (),
) -> None:
    """Wait until the members processed every record below `end_offsets`, except at most one of
    `may_skip` ((partition, offset) pairs a client is known to skip)."""

    def done() -> bool:
        missing = unprocessed(everyone.members, end_offsets)
        skipped = [(p, o) for p, offsets in missing.items() for o in offsets]
        return not skipped or (len(skipped) == 1 and skipped[0] in may_skip)

    def context() -> str:
        return f"unprocessed: {unprocessed(everyone.members, end_offsets)}\n{everyone.describe()}"

    await wait_for(done, SETTLE_TIMEOUT_S, what="every record processed", context=context)


def contains_in_order(history: Sequence[int], expected: Sequence[int]) -> bool:
    """Whether `expected` is a subsequence of `history`."""
    remaining = iter(history)
    return all(any(value == wanted for value in remaining) for wanted in expected)


# -- producing throughout -----------------------------------------------------------------------


class SteadyProducer:
    """Sends one record every PRODUCE_INTERVAL_S (acks=all) to the topic's partitions in turn,
    from its own task, until `stop()`; then every record is acknowledged and `stop()` returns
    each partition's end offset (last acknowledged offset + 1)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
        self.topic = topic
        self.partitions = partitions
        self._producer = Producer(
            bootstrap_servers=bootstrap, acks="all", linger_ms=5, delivery_timeout_ms=120_000
        )
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[list[Any]] | None = None
        self.end_offsets: dict[int, int] | None = None

    async def __aenter__(self) -> SteadyProducer:
        await self._producer.start()
        self._task = asyncio.create_task(self._produce(), name=f"produce-{self.topic}")
        return self

    async def __aexit__(self, *_: object) -> None:
        self._stopping.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        await self._producer.close()

    async def _produce(self) -> list[Any]:
        sent = []
        sequence = 0
        while not self._stopping.is_set():
            partition = sequence % self.partitions
            value = f"{partition}:{sequence}".encode()
            sent.append(await self._producer.send(self.topic, value, partition=partition))
            sequence += 1
            await asyncio.sleep(PRODUCE_INTERVAL_S)
        return sent

    async def stop(self) -> dict[int, int]:
        if self._task is None:
            raise RuntimeError("the producer is not started")
        self._stopping.set()
        sent = await self._task
        delivered = await asyncio.gather(*sent)
        end_offsets = dict.fromkeys(range(self.partitions), 0)
        for metadata in delivered:
            end_offsets[metadata.partition] = max(
                end_offsets[metadata.partition], metadata.offset + 1
            )
        self.end_offsets = end_offsets
        return end_offsets


async def create_topic(
    bootstrap: str, topic: str, partitions: int = PARTITIONS, replication_factor: int = 1
) -> None:
    async with Admin(bootstrap_servers=bootstrap) as admin:
        await admin.create_topic(
            topic, partitions=partitions, replication_factor=replication_factor
        )


# -- raw requests --------------------------------------------------------------------------------


class KafkaWire:
    """One connection to one broker, one request at a time, encoded by kafka-python's protocol
    classes (generated from Kafka's JSON schemas). Requests of another version than the highest
    both sides support are built with `version=`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._protocol = KafkaProtocol(client_id="riverbed-group-tests")
        self._lock = asyncio.Lock()
        self.broker_versions: dict[int, tuple[int, int]] = {}

    @classmethod
    async def open(cls, address: str) -> KafkaWire:
        host, _, port = address.rpartition(":")
        if host != HOST:
            raise ValueError(f"tests only talk to {HOST}, not {host}")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, int(port)), REQUEST_TIMEOUT_S
        )
        wire = cls(reader, writer)
        try:
            versions = await wire.send(ApiVersionsRequest(version=0))
            wire.broker_versions = {
                k.api_key: (k.min_version, k.max_version) for k in versions.api_keys
            }
        except BaseException:
            await wire.close()
            raise
        return wire

    def version(self, request_class: Any) -> int:
        """The highest version of this request both kafka-python and the broker know."""
        low, high = self.broker_versions[request_class.API_KEY]
        version: int = min(high, request_class.max_version)
        if version < max(low, request_class.min_version):
            raise AssertionError(f"no common version of {request_class.__name__}")
        return version

    async def call(self, request_class: Any, *, version: int | None = None, **fields: Any) -> Any:
        """Build `request_class(**fields)` at `version` (default: the highest common one), send
        it and return the decoded response."""
        chosen = self.version(request_class) if version is None else version
        return await self.send(request_class(version=chosen, **fields))

    async def send(self, request: Any) -> Any:
        async with self._lock, asyncio.timeout(REQUEST_TIMEOUT_S):
            self._protocol.send_request(request)
            self._writer.write(self._protocol.send_bytes())
            await self._writer.drain()
            while True:
                data = await self._reader.read(65536)
                if not data:
                    raise ConnectionError("the broker closed the connection")
                responses = self._protocol.receive_bytes(data)
                if responses:
                    (_, response), *_ = responses
                    return response

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


@dataclass(frozen=True)
class Coordinator:
    node_id: int
    address: str


async def find_coordinator(bootstrap: str, group: str) -> Coordinator:
    """FindCoordinator (v3, one key) at the first of `bootstrap` ("h:p,h:p") that answers."""
    last: BaseException | None = None
    for address in bootstrap.split(","):
        try:
            wire = await KafkaWire.open(address)
        except OSError as error:
            last = error
            continue
        try:
            response = await wire.call(FindCoordinatorRequest, version=3, key=group, key_type=0)
        finally:
            await wire.close()
        if response.error_code != 0:
            raise CoordinatorError(response.error_code, response.error_message)
        return Coordinator(response.node_id, f"{response.host}:{response.port}")
    raise ConnectionError(f"no broker of {bootstrap} answered: {last}")


class CoordinatorError(Exception):
    """A coordinator request answered an error (e.g. COORDINATOR_NOT_AVAILABLE while electing)."""

    def __init__(self, code: int, message: str | None) -> None:
        super().__init__(f"error {code}: {message}")
        self.code = code


# What a coordinator answers while it is elected, loading its partition, or just moved away.
COORDINATOR_MOVING: Final = frozenset(
    {
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
    }
)


async def unless_moving(request: Awaitable[T]) -> T | None:
    """The answer, or None while the group's coordinator is moving (for `wait_for`)."""
    try:
        return await request
    except CoordinatorError as error:
        if error.code in COORDINATOR_MOVING:
            return None
        raise


async def wait_for_coordinator(
    bootstrap: str, group: str, *, other_than: int | None = None
) -> Coordinator:
    """FindCoordinator until it names a broker (other than `other_than`)."""

    async def found() -> Coordinator | None:
        coordinator = await unless_moving(find_coordinator(bootstrap, group))
        return None if coordinator is None or coordinator.node_id == other_than else coordinator

    return await wait_for(found, SETTLE_TIMEOUT_S, what=f"a coordinator for {group}")


def offsets_partition(group: str, partitions: int) -> int:
    """The __consumer_offsets partition of a group: Kafka's `Utils.abs(groupId.hashCode) % n`,
    with Java's String.hashCode over UTF-16 code units and Utils.abs = Math.abs, except that
    Integer.MIN_VALUE gives 0."""
    hash_code = 0
    for (unit,) in struct.iter_unpack(">H", group.encode("utf-16-be")):
        hash_code = (31 * hash_code + unit) & 0xFFFFFFFF
    signed = hash_code - (1 << 32) if hash_code & 0x80000000 else hash_code
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


@dataclass(frozen=True)
class DescribedGroup:
    state: str
    protocol_type: str
    protocol: str
    # client.id -> the partitions (of any topic) the leader assigned to that member
    assignments: dict[str, frozenset[int]] = field(default_factory=dict)


async def describe_group(bootstrap: str, group: str) -> DescribedGroup:
    """DescribeGroups at the group's coordinator; assignments decoded as the consumer protocol."""
    coordinator = await find_coordinator(bootstrap, group)
    wire = await KafkaWire.open(coordinator.address)
    try:
        response = await wire.call(DescribeGroupsRequest, groups=[group])
    finally:
        await wire.close()
    (described,) = response.groups
    if described.error_code != 0:
        raise AssertionError(f"DescribeGroups({group}): error {described.error_code}")
    assignments = {}
    for member in described.members:
        assignment = ConsumerProtocolAssignment.decode(bytes(member.member_assignment))
        assignments[member.client_id] = frozenset(
            p for tp in assignment.assigned_partitions for p in tp.partitions
        )
    return DescribedGroup(
        described.group_state, described.protocol_type, described.protocol_data, assignments
    )


async def fetch_committed(
    wire: KafkaWire, group: str, topic: str, partitions: Iterable[int]
) -> dict[int, int]:
    """OffsetFetch (at most v7: v8 batches groups, another layout): {partition: offset or -1}.
    An error code raises CoordinatorError."""
    version = min(wire.version(OffsetFetchRequest), OFFSET_FETCH_VERSION_MAX)
    response = await wire.call(
        OffsetFetchRequest,
        version=version,
        group_id=group,
        topics=[
            OffsetFetchRequest.OffsetFetchRequestTopic(
                name=topic, partition_indexes=list(partitions)
            )
        ],
    )
    if version >= 2 and response.error_code != ErrorCode.NONE:
        raise CoordinatorError(response.error_code, "OffsetFetch")
    out = {}
    for answered in response.topics:
        for partition in answered.partitions:
            if partition.error_code != ErrorCode.NONE:
                raise CoordinatorError(partition.error_code, f"OffsetFetch {partition}")
            out[partition.partition_index] = partition.committed_offset
    return out


async def committed_offsets(
    address: str, group: str, topic: str, partitions: int
) -> dict[int, int]:
    """OffsetFetch of partitions 0..partitions-1 from the broker at `address`."""
    wire = await KafkaWire.open(address)
    try:
        return await fetch_committed(wire, group, topic, range(partitions))
    finally:
        await wire.close()


async def group_committed(
    bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS
) -> dict[int, int] | None:
    """The group's committed offsets from its coordinator; None while the coordinator moves."""
    coordinator = await unless_moving(find_coordinator(bootstrap, group))
    if coordinator is None:
        return None
    return await unless_moving(committed_offsets(coordinator.address, group, topic, partitions))
