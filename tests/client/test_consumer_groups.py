"""Riverbed's Consumer in consumer groups, against a real broker.

Members run in this test's event loop (so `assignment()` snapshots of all of them are taken at
one instant) or, to be SIGKILLed, in a process of their own (consumer_groups_member.py), which
reports what it owns and processes on a pipe. Every member commits after processing.

Sessions are short (the broker accepts 500 ms and up here) so that a killed member is noticed in
about a second and a half.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from riverbed.client.admin import Admin
from riverbed.client.consumer import Consumer
from riverbed.client.group.listener import RebalanceListener
from riverbed.client.group.member import MemberState
from riverbed.client.producer import Producer
from riverbed.client.types import OffsetAndMetadata, TopicPartition
from riverbed.errors import GroupError, KafkaTimeoutError, OffsetOutOfRangeError
from riverbed.protocol.errors import ErrorCode

from tests.support.broker import BrokerFactory, BrokerProcess

GROUP_BROKER_SETTINGS = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "3",
    "offsets.topic.replication.factor": "1",
    "group.min.session.timeout.ms": "500",
}
# A member is noticed gone after SESSION_TIMEOUT_MS; it heartbeats every HEARTBEAT_INTERVAL_MS.
# The timeout is well above the heartbeat: a loaded machine may stop a process for a second, and
# a live member must not be taken for gone.
SESSION_TIMEOUT_MS = 3_000
HEARTBEAT_INTERVAL_MS = 200
FAST_MEMBER: dict[str, Any] = {
    "session_timeout_ms": SESSION_TIMEOUT_MS,
    "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
    "max_poll_interval_ms": 10_000,
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
    "fetch_max_wait_ms": 100,
}
WAIT_TIMEOUT_S = 30.0
MEMBER_SCRIPT = Path(__file__).with_name("consumer_groups_member.py")


@pytest.fixture
def group_broker(broker_factory: BrokerFactory) -> BrokerProcess:
    return broker_factory(GROUP_BROKER_SETTINGS)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def create_topic(broker: BrokerProcess, partitions: int) -> str:
    name = unique("groups")
    async with Admin(bootstrap_servers=broker.bootstrap) as admin:
        await admin.create_topic(name, partitions=partitions)
    return name


async def wait_until(
    predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)


def partitions(topic: str, numbers: Iterable[int]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic, p) for p in numbers)


# -- what members did ------------------------------------------------------------------------
@dataclass
class Ledger:
    """Every record processed, by partition, and who owned which partition when."""

    processed: dict[int, list[int]] = field(default_factory=dict)
    # member -> [(time.monotonic(), "assigned" | "revoked" | "lost" | "gone", partitions)]
    events: dict[str, list[tuple[float, str, frozenset[int]]]] = field(default_factory=dict)

    def process(self, partition: int, offsets: Iterable[int]) -> None:
        self.processed.setdefault(partition, []).extend(offsets)

    def event(self, member: str, kind: str, owned: Iterable[int]) -> None:
        self.events.setdefault(member, []).append((time.monotonic(), kind, frozenset(owned)))

    def overlaps(self) -> list[str]:
        """Times two members owned one partition at once (by their hooks' times; a member's
        ownership ends when its revoke / lost hook runs, or when it stopped)."""
        intervals: dict[int, list[tuple[float, float, str]]] = {}
        for member, events in self.events.items():
            since: dict[int, float] = {}
            for t, kind, owned in events:
                if kind == "assigned":
                    since.update(dict.fromkeys(owned, t))
                    continue
                ended = set(since) if kind == "gone" else owned
                for p in ended & set(since):
                    intervals.setdefault(p, []).append((since.pop(p), t, member))
            for p, start in since.items():
                intervals.setdefault(p, []).append((start, float("inf"), member))
        found = []
        for p, spans in intervals.items():
            for x, y in itertools.combinations(sorted(spans), 2):
                if x[2] != y[2] and y[0] < x[1]:
                    found.append(f"partition {p}: {x[2]} until {x[1]:.3f}, {y[2]} from {y[0]:.3f}")
        return found


class Recorder(RebalanceListener):
    def __init__(self, name: str, ledger: Ledger) -> None:
        self.name = name
        self.ledger = ledger
        self.calls: list[tuple[str, frozenset[int]]] = []

    def _record(self, kind: str, tps: frozenset[TopicPartition]) -> None:
        owned = frozenset(tp.partition for tp in tps)
        self.calls.append((kind, owned))
        self.ledger.event(self.name, kind, owned)

    async def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        self._record("assigned", assigned)

    async def on_partitions_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        self._record("revoked", revoked)

    async def on_partitions_lost(self, lost: frozenset[TopicPartition]) -> None:
        self._record("lost", lost)


class Member:
    """An in-process member: getmany, process (into the ledger), commit, again."""

    def __init__(
        self,
        name: str,
        broker: BrokerProcess,
        group: str,
        topic: str,
        ledger: Ledger,
        **settings: Any,
    ) -> None:
        self.name = name
        self.topic = topic
        self.ledger = ledger
        self.consumer = Consumer(
            bootstrap_servers=broker.bootstrap,
            group_id=group,
            client_id=name,
            **{**FAST_MEMBER, **settings},
        )
        self.listener = Recorder(name, ledger)
        # (member state when getmany returned, partitions it returned records of)
        self.batches: list[tuple[MemberState, frozenset[int]]] = []
        self.pause_s = 0.0  # time spent "processing" each batch
        self.stall_once_s = 0.0  # one long "processing" of the next batch
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Member:
        await self.consumer.start()
        self.consumer.subscribe([self.topic], listener=self.listener)
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def owned(self) -> frozenset[int]:
        return frozenset(tp.partition for tp in self.consumer.assignment())

    async def _run(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=100)
            state = self.consumer.member_state
            self.batches.append((state, frozenset(tp.partition for tp in batches)))
            for tp, records in batches.items():
                self.ledger.process(tp.partition, (r.offset for r in records))
            stall_s, self.stall_once_s = self.stall_once_s, 0.0
            if self.pause_s or stall_s:
                await asyncio.sleep(self.pause_s + stall_s)
            if batches:
                with contextlib.suppress(GroupError, KafkaTimeoutError):
                    await self.consumer.commit()

    async def stop(self) -> None:
        """Stop processing, then close (commit, revoke, LeaveGroup)."""
        if self._task is not None:
            self._task.cancel()
            # A processing error surfaces here; the cancellation we asked for does not.
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.consumer.close()
        self.ledger.event(self.name, "gone", ())


class ProcessMember:
    """A member in a process of its own (consumer_groups_member.py), to be SIGKILLed."""

    def __init__(self, name: str, ledger: Ledger) -> None:
        self.name = name
        self.ledger = ledger
        self._owned: frozenset[int] = frozenset()
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(
        self, broker: BrokerProcess, group: str, topic: str, log: Path, **settings: Any
    ) -> ProcessMember:
        with log.open("wb") as stderr:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(MEMBER_SCRIPT),
                broker.bootstrap,
                group,
                topic,
                json.dumps({**FAST_MEMBER, "client_id": self.name, **settings}),
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
        self._reader = asyncio.get_running_loop().create_task(self._read())
        return self

    def owned(self) -> frozenset[int]:
        return self._owned

    async def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        async for line in self._process.stdout:
            event = json.loads(line)
            if event["e"] == "processed":
                self.ledger.process(event["p"], event["o"])
                continue
            owned = frozenset(event["p"])
            self._owned = owned if event["e"] == "assigned" else self._owned - owned
            self.ledger.events.setdefault(self.name, []).append((event["t"], event["e"], owned))

    async def kill(self) -> None:
        assert self._process is not None
        assert self._reader is not None
        self._process.kill()
        await self._process.wait()
        await self._reader  # everything it reported before dying
        self.ledger.event(self.name, "gone", ())
        self._owned = frozenset()


class Production:
    """One record to every partition every PERIOD_S until stopped; remembers each offset."""

    PERIOD_S = 0.02

    def __init__(self, broker: BrokerProcess, topic: str, partition_count: int) -> None:
        self.broker = broker
        self.topic = topic
        self.partition_count = partition_count
        self.offsets: dict[int, list[int]] = {p: [] for p in range(partition_count)}
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Production:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.stop()

    def produced(self) -> int:
        """Records acknowledged so far, over every partition."""
        return sum(len(offsets) for offsets in self.offsets.values())

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        async with Producer(bootstrap_servers=self.broker.bootstrap, linger_ms=0) as producer:
            while True:
                futures = [
                    await producer.send(self.topic, b"x", partition=p)
                    for p in range(self.partition_count)
                ]
                for future in futures:
                    metadata = await future
                    self.offsets[metadata.partition].append(metadata.offset)
                await asyncio.sleep(self.PERIOD_S)


class OwnershipWatcher:
    """Takes snapshots of every in-process member's `assignment()`, all at one instant of the
    event loop, every 5 ms, and notes any partition two members hold at once."""

    def __init__(self) -> None:
        self.members: list[Member] = []
        self.snapshots = 0
        self.overlaps: list[str] = []
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def add(self, member: Member) -> Member:
        await member.start()
        self.members.append(member)
        return member

    async def stop(self, member: Member) -> None:
        await member.stop()
        self.members.remove(member)

    async def close(self) -> None:
        """Stop watching, then stop the members still running."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for member in list(self.members):
            await self.stop(member)

    async def _watch(self) -> None:
        while True:
            seen: dict[TopicPartition, str] = {}
            for member in self.members:
                for tp in member.consumer.assignment():
                    if tp in seen:
                        self.overlaps.append(f"{tp} held by {seen[tp]} and {member.name}")
                    seen[tp] = member.name
            self.snapshots += 1
            await asyncio.sleep(0.005)


async def wait_drained(ledger: Ledger, production: Production) -> None:
    """Until every record produced so far was processed by some member."""
    await wait_until(
        lambda: all(
            set(offsets) <= set(ledger.processed.get(p, []))
            for p, offsets in production.offsets.items()
        ),
        "every produced record processed",
    )


def assert_processed_at_least_once(ledger: Ledger, production: Production) -> None:
    for partition, produced in production.offsets.items():
        missing = sorted(set(produced) - set(ledger.processed.get(partition, [])))
        assert not missing, f"partition {partition}: never processed {missing[:20]}"


def stable_split(members: list[Any], total: int) -> Callable[[], bool]:
    """Each member owns total / len(members) partitions, none twice."""

    def check() -> bool:
        owned = [member.owned() for member in members]
        union = frozenset().union(*owned)
        return len(union) == total and all(len(o) == total // len(members) for o in owned)

    return check


# -- the scenario -----------------------------------------------------------------------
async def test_members_joining_leaving_and_killed_share_partitions_and_lose_no_record(
    group_broker: BrokerProcess, tmp_path: Path
) -> None:
    topic = await create_topic(group_broker, 6)
    group = unique("g")
    ledger = Ledger()
    watcher = OwnershipWatcher()
    try:
        async with Production(group_broker, topic, 6) as production:
            a = await watcher.add(Member("a", group_broker, group, topic, ledger))
            await wait_until(stable_split([a], 6), "a owns every partition")
            produced = [production.produced()]

            killed = await ProcessMember("k", ledger).start(
                group_broker, group, topic, tmp_path / "member-k.log"
            )
            await wait_until(stable_split([a, killed], 6), "a and k own 3 each")

            b = await watcher.add(Member("b", group_broker, group, topic, ledger))
            await wait_until(stable_split([a, b, killed], 6), "a, b and k own 2 each")

            produced.append(production.produced())
            await killed.kill()
            await wait_until(stable_split([a, b], 6), "a and b took over k's partitions")
            produced.append(production.produced())

            await watcher.stop(b)  # graceful: LeaveGroup
            await wait_until(stable_split([a], 6), "a took over b's partitions")

            c = await watcher.add(Member("c", group_broker, group, topic, ledger))
            await wait_until(stable_split([a, c], 6), "a and c own 3 each")

            await production.stop()
            produced.append(production.produced())
            await wait_drained(ledger, production)
        assert_processed_at_least_once(ledger, production)
        # Produced throughout: across each stretch of rebalances (k's loss alone takes its
        # session timeout), and after the last.
        assert produced[0] < produced[1] < produced[2] < produced[3], produced
        assert not watcher.overlaps, watcher.overlaps[:5]
        assert watcher.snapshots > 100
        assert not ledger.overlaps(), ledger.overlaps()[:5]
        assert {a.consumer.member_state, c.consumer.member_state} == {MemberState.STABLE}
        assert a.consumer.generation_id == c.consumer.generation_id > 0
        assert a.consumer.member_id != c.consumer.member_id
    finally:
        await watcher.close()


# -- cooperative rebalancing ------------------------------------------------------------------
async def test_cooperative_sticky_keeps_consuming_partitions_that_stay_during_a_rebalance(
    group_broker: BrokerProcess,
) -> None:
    topic = await create_topic(group_broker, 6)
    group = unique("g")
    ledger = Ledger()
    cooperative = {"partition_assignment_strategy": "cooperative-sticky"}
    async with Production(group_broker, topic, 6) as production:
        a = await Member("a", group_broker, group, topic, ledger, **cooperative).start()
        await wait_until(stable_split([a], 6), "a owns every partition")
        slow = await Member("slow", group_broker, group, topic, ledger, **cooperative).start()
        await wait_until(stable_split([a, slow], 6), "a and slow own 3 each")
        # `slow` now polls every 2 s: each rebalance waits that long for it to rejoin. Its next
        # poll starts the first pause.
        slow.pause_s = 2.0
        polls = len(slow.batches)
        await wait_until(lambda: len(slow.batches) > polls, "slow pausing")
        before, calls_before, batches_before = a.owned(), len(a.listener.calls), len(a.batches)
        c = await Member("c", group_broker, group, topic, ledger, **cooperative).start()
        await wait_until(stable_split([a, slow, c], 6), "a, slow and c own 2 each")
        kept = before & a.owned()
        calls_after = len(a.listener.calls)  # closing revokes the rest: not part of the rebalance
        await production.stop()
        slow.pause_s = 0.0
        await wait_drained(ledger, production)
        for member in (a, slow, c):
            await member.stop()
    assert len(kept) == 2
    revoked = frozenset().union(
        *(owned for kind, owned in a.listener.calls[calls_before:calls_after] if kind == "revoked")
    )
    assert revoked == before - kept  # only the partition that moved was revoked
    during_rebalance = frozenset().union(
        *(
            returned
            for state, returned in a.batches[batches_before:]
            if state in (MemberState.JOINING, MemberState.SYNCING)
        )
    )
    assert kept <= during_rebalance, (kept, during_rebalance)
    assert not ledger.overlaps(), ledger.overlaps()[:5]
    assert_processed_at_least_once(ledger, production)


# -- listener --------------------------------------------------------------------------------
async def test_eager_hooks_revoke_everything_before_any_member_is_assigned(
    group_broker: BrokerProcess,
) -> None:
    topic = await create_topic(group_broker, 4)
    group = unique("g")
    ledger = Ledger()
    everything = frozenset(range(4))
    a = await Member("a", group_broker, group, topic, ledger).start()
    await wait_until(stable_split([a], 4), "a owns every partition")
    b = await Member("b", group_broker, group, topic, ledger).start()
    await wait_until(stable_split([a, b], 4), "a and b own 2 each")
    a_half, b_half = a.owned(), b.owned()
    await b.stop()
    await wait_until(stable_split([a], 4), "a owns every partition again")
    await a.stop()
    assert a.listener.calls == [
        ("assigned", everything),
        ("revoked", everything),
        ("assigned", a_half),
        ("revoked", a_half),
        ("assigned", everything),
        ("revoked", everything),  # close()
    ]
    assert b.listener.calls == [("assigned", b_half), ("revoked", b_half)]
    # Every revocation of a rebalance comes before every assignment of it.
    a_events, b_events = ledger.events["a"], ledger.events["b"]
    assert a_events[1][0] < b_events[0][0]  # a revoked everything before b got its half
    assert b_events[1][0] < a_events[4][0]  # b revoked its half before a got everything


# -- commits and positions --------------------------------------------------------------------
async def produce(
    broker: BrokerProcess, topic: str, per_partition: int, partition_count: int
) -> None:
    async with Producer(bootstrap_servers=broker.bootstrap) as producer:
        futures = [
            await producer.send(topic, b"v%d" % i, partition=p)
            for p in range(partition_count)
            for i in range(per_partition)
        ]
        for future in futures:
            await future


async def read(consumer: Consumer, count: int) -> list[tuple[int, int]]:
    """(partition, offset) of the next `count` records."""
    out: list[tuple[int, int]] = []
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while len(out) < count:
        assert time.monotonic() < deadline, f"read {len(out)} of {count} records"
        for tp, records in (await consumer.getmany(timeout_ms=200)).items():
            out += [(tp.partition, r.offset) for r in records]
    return out


def group_consumer(broker: BrokerProcess, group: str, **settings: Any) -> Consumer:
    return Consumer(
        bootstrap_servers=broker.bootstrap, group_id=group, **{**FAST_MEMBER, **settings}
    )


async def test_auto_commit_runs_on_its_interval_before_revocation_and_on_close(
    group_broker: BrokerProcess,
) -> None:
    topic = await create_topic(group_broker, 2)
    tps = sorted(partitions(topic, range(2)))
    await produce(group_broker, topic, 10, 2)

    # On its interval: positions are committed while the application keeps polling.
    periodic = group_consumer(
        group_broker, unique("g"), enable_auto_commit=True, auto_commit_interval_ms=200
    )
    async with periodic:
        periodic.subscribe([topic])
        assert len(await read(periodic, 20)) == 20
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while await periodic.committed(tps) != dict.fromkeys(tps, OffsetAndMetadata(10)):
            assert time.monotonic() < deadline, await periodic.committed(tps)
            await periodic.getmany(timeout_ms=100)

    # Before revocation: the interval never passes, yet a joining member starts where the first
    # one stopped, because the first committed before giving its partitions up.
    group = unique("g")
    first = group_consumer(
        group_broker, group, enable_auto_commit=True, auto_commit_interval_ms=600_000
    )
    second = group_consumer(
        group_broker, group, enable_auto_commit=True, auto_commit_interval_ms=600_000
    )
    async with first, second:
        first.subscribe([topic])
        assert len(await read(first, 20)) == 20
        assert await first.committed(tps) == dict.fromkeys(tps)  # nothing committed yet
        second.subscribe([topic])
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while len(first.assignment()) != 1 or len(second.assignment()) != 1:
            assert time.monotonic() < deadline, "no rebalance"
            await asyncio.gather(first.getmany(timeout_ms=100), second.getmany(timeout_ms=100))
        assert await second.committed(tps) == dict.fromkeys(tps, OffsetAndMetadata(10))
        assert await second.getmany(timeout_ms=500) == {}  # nothing read twice
        await produce(group_broker, topic, 3, 2)
        got = await read(first, 3)
        (mine,) = first.assignment()
        assert got == [(mine.partition, 10), (mine.partition, 11), (mine.partition, 12)]
    # On close: the last positions are committed.
    async with group_consumer(group_broker, group) as after:
        committed = await after.committed(tps)
    assert committed[mine] == OffsetAndMetadata(13)


async def test_a_partition_starts_at_its_committed_offset_or_fails_with_reset_none(
    group_broker: BrokerProcess,
) -> None:
    topic = await create_topic(group_broker, 1)
    tp = TopicPartition(topic, 0)
    group = unique("g")
    await produce(group_broker, topic, 10, 1)
    async with group_consumer(group_broker, group, auto_offset_reset="none") as nothing_committed:
        nothing_committed.subscribe([topic])
        with pytest.raises(OffsetOutOfRangeError, match="committed"):
            await read(nothing_committed, 1)
        assert nothing_committed.assignment() == {tp}
    # A consumer of the group that assigns its partitions commits outside any generation.
    async with group_consumer(group_broker, group) as manual:
        manual.assign([tp])
        await manual.commit({tp: OffsetAndMetadata(4, "by hand")})
        assert await manual.committed([tp]) == {tp: OffsetAndMetadata(4, "by hand")}
    async with group_consumer(group_broker, group, auto_offset_reset="none") as resumed:
        resumed.subscribe([topic])
        assert await read(resumed, 6) == [(0, offset) for offset in range(4, 10)]
        await resumed.commit()  # the current position
        assert await resumed.committed([tp]) == {tp: OffsetAndMetadata(10)}
        assert resumed.member_state is MemberState.STABLE
        member_id = resumed.member_id
        assert member_id is not None
        assert member_id.startswith("riverbed-")  # <client.id>-<uuid>


# -- the poll interval and the session ---------------------------------------------------------
async def test_a_member_not_polling_for_max_poll_interval_leaves_and_others_take_over(
    group_broker: BrokerProcess,
) -> None:
    topic = await create_topic(group_broker, 6)
    group = unique("g")
    ledger = Ledger()
    settings = {"max_poll_interval_ms": 1_000, "session_timeout_ms": 6_000}
    watcher = OwnershipWatcher()
    try:
        a = await watcher.add(Member("a", group_broker, group, topic, ledger, **settings))
        b = await watcher.add(Member("b", group_broker, group, topic, ledger, **settings))
        async with Production(group_broker, topic, 6) as production:
            await wait_until(stable_split([a, b], 6), "a and b own 3 each")
            a_owned = a.owned()
            a.stall_once_s = 4.0
            stalled_at = time.monotonic()
            await wait_until(stable_split([b], 6), "b took over a's partitions")
            # Well before a's session could have expired: a left because it stopped polling,
            # and its partitions left its assignment then (the hook runs at its next poll).
            assert time.monotonic() - stalled_at < 6.0
            assert a.consumer.member_state is MemberState.UNJOINED
            assert a.consumer.assignment() == frozenset()
            assert a.consumer.member_id is None
            with pytest.raises(GroupError) as refused:
                await a.consumer.commit({TopicPartition(topic, 0): 0})
            assert refused.value.code == ErrorCode.UNKNOWN_MEMBER_ID
            # Back from its stall, a announces the loss and rejoins.
            await wait_until(stable_split([a, b], 6), "a rejoined")
            await production.stop()
            await wait_drained(ledger, production)
    finally:
        await watcher.close()
    assert ("lost", a_owned) in a.listener.calls
    assert not watcher.overlaps, watcher.overlaps[:5]
    assert watcher.snapshots > 100
    # Eager members hand out no record between giving their partitions up and the new ones.
    for member in (a, b):
        assert all(
            not returned for state, returned in member.batches if state is not MemberState.STABLE
        )
    assert_processed_at_least_once(ledger, production)


async def test_slow_processing_keeps_the_member_while_heartbeats_run(
    group_broker: BrokerProcess,
) -> None:
    topic = await create_topic(group_broker, 4)
    group = unique("g")
    ledger = Ledger()
    settings = {"session_timeout_ms": 2_000, "max_poll_interval_ms": 20_000}
    a = await Member("a", group_broker, group, topic, ledger, **settings).start()
    b = await Member("b", group_broker, group, topic, ledger, **settings).start()
    async with Production(group_broker, topic, 4):
        await wait_until(stable_split([a, b], 4), "a and b own 2 each")
        generation, owned = b.consumer.generation_id, (a.owned(), b.owned())
        calls = list(a.listener.calls)
        a.stall_once_s = 6.0  # three session timeouts without a poll
        polls = len(a.batches)
        # The poll after the one that started the stall: `a` is back from it.
        await wait_until(lambda: len(a.batches) > polls + 1, "a back from its stall")
        assert (a.owned(), b.owned()) == owned
        assert a.consumer.generation_id == b.consumer.generation_id == generation
        assert a.consumer.member_state is MemberState.STABLE
    await a.stop()
    await b.stop()
    assert a.listener.calls == [*calls, ("revoked", owned[0])]  # only close() revoked


# -- pattern subscriptions -------------------------------------------------------------------
async def test_a_pattern_subscription_picks_up_new_topics(group_broker: BrokerProcess) -> None:
    prefix = unique("pat")
    async with Admin(bootstrap_servers=group_broker.bootstrap) as admin:
        await admin.create_topic(f"{prefix}-one", partitions=2)
        consumer = group_consumer(group_broker, unique("g"), metadata_max_age_ms=300)
        async with consumer:
            consumer.subscribe(pattern=f"{prefix}-.*")
            await wait_polling(
                consumer, lambda: consumer.assignment() == partitions(f"{prefix}-one", range(2))
            )
            await admin.create_topic(f"{prefix}-two", partitions=1)
            await admin.create_topic(f"other-{prefix}-two", partitions=1)
            wanted = partitions(f"{prefix}-one", range(2)) | partitions(f"{prefix}-two", [0])
            await wait_polling(consumer, lambda: consumer.assignment() == wanted)
            assert consumer.subscription() == {f"{prefix}-one", f"{prefix}-two"}


async def wait_polling(consumer: Consumer, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, consumer.assignment()
        await consumer.getmany(timeout_ms=100)
