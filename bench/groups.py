"""Consumer-group rebalances: how long partitions go unconsumed when a member dies or leaves.

A 3-broker cluster (`__consumer_offsets` replicated 3 times, as `make run` has it). Members are
separate processes (bench/group_member.py) so that SIGKILL is a real crash. A producer writes one
record to every partition every PRODUCE_INTERVAL_S throughout, so a partition being consumed shows
as records arriving at its owner.

- **kill**: 3 members over a 6-partition topic, settled (every partition assigned and consumed
  since the last assignment). One member gets SIGKILL; the time until every partition it owned
  has delivered a record to another member. Nothing tells the coordinator: it must wait for the
  member's `session.timeout.ms` to pass without a heartbeat, then rebalance. Measured with the
  default session timeout (45 s, Kafka's and librdkafka's) and a short one (6 s,
  `group.min.session.timeout.ms`'s default, the shortest the broker accepts by default).
- **leave**: the same with SIGTERM: the member closes its consumer, which sends LeaveGroup.
- **form10**: 10 fresh members told to subscribe at the same instant; the time until the
  group's first assignment covers every partition of a 20-partition topic and every partition
  delivered a record. Includes the broker's `group.initial.rebalance.delay.ms` (3 s by default,
  KIP-134: a new group waits that long for more members, rather than rebalancing once per join).
- **join10**: an 11th member joins a settled group of 10; the time until every member has its
  new assignment and every partition delivered a record again.

Each round's member replaced, the group settles again and runs for SETTLED_PAUSE_S plus a random
part of a heartbeat interval before the next departure (a departure right after a rebalance
would line up with every member's heartbeat schedule, which restarts at each rebalance). Medians of
ROUNDS rounds. The ratios put the kill times next to the session timeout: a ratio near 1 means
failure detection is all there is; the rest is the rebalance itself.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bench.kafka_clients import create_topic
from bench.options import BenchOptions, BenchResult
from bench.procs import Cluster, ProcessFailed, zookeeper

NAME = "groups"
BROKERS = 3
CLUSTER_SETTINGS = {"offsets.topic.replication.factor": str(BROKERS)}
MEMBER_CLIENT = "confluent"
ASSIGNOR = "range"
SESSION_TIMEOUT_DEFAULT_MS = 45_000
SESSION_TIMEOUT_SHORT_MS = 6_000
SMALL_GROUP = 3
SMALL_TOPIC_PARTITIONS = 6
LARGE_GROUP = 10
LARGE_TOPIC_PARTITIONS = 20
ROUNDS = 10
# librdkafka's heartbeat.interval.ms default (the members do not set it).
HEARTBEAT_INTERVAL_MS = 3000
# Plus a random part of a heartbeat interval: how long a settled group runs before a departure.
SETTLED_PAUSE_S = 3.0
QUICK_ROUNDS = 2
PRODUCE_INTERVAL_S = 0.01
BROKER_START_TIMEOUT_S = 120.0
# A round in which the group does not settle (or recover) this long after the event failed.
SETTLE_TIMEOUT_S = 180.0
READY_TIMEOUT_S = 30.0
WAIT_POLL_S = 0.01


@dataclass
class Member:
    """A member process and everything it reported (read by a thread of its own)."""

    name: str
    process: subprocess.Popen[str]
    events: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start_reading(self) -> None:
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            event = json.loads(line)
            with self.lock:
                self.events.append(event)

    def snapshot(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.events)

    def ready_at(self) -> float | None:
        return next((e["t"] for e in self.snapshot() if e["e"] == "ready"), None)

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def owned(self) -> frozenset[int]:
        """The partitions of its latest assignment (eager protocol: each one is complete)."""
        owned: frozenset[int] = frozenset()
        for event in self.snapshot():
            if event["e"] == "assigned":
                owned = frozenset(event["p"])
        return owned

    def last_assigned_t(self) -> float | None:
        times = [event["t"] for event in self.snapshot() if event["e"] == "assigned"]
        return times[-1] if times else None

    def records_after(self, t: float) -> dict[int, float]:
        """Partition → time of the first record it reported after `t`."""
        first: dict[int, float] = {}
        for event in self.snapshot():
            if event["e"] == "record" and event["t"] > t and event["p"] not in first:
                first[event["p"]] = event["t"]
        return first

    def stop(self, sig: signal.Signals) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        self.process.wait(timeout=READY_TIMEOUT_S)


class Group:
    """Member processes of one group id over one topic."""

    def __init__(self, bootstrap: str, topic: str, session_timeout_ms: int, log_dir: Path) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.group_id = f"{NAME}-{uuid.uuid4().hex[:8]}"
        self.session_timeout_ms = session_timeout_ms
        self.log_dir = log_dir
        self.members: list[Member] = []
        self._spawned = 0

    def spawn(self, count: int) -> list[Member]:
        spawned = []
        for _ in range(count):
            self._spawned += 1
            name = f"{self.group_id}-m{self._spawned}"
            stderr = (self.log_dir / f"{name}.log").open("w")
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.group_member",
                    "--client",
                    MEMBER_CLIENT,
                    "--bootstrap",
                    self.bootstrap,
                    "--group",
                    self.group_id,
                    "--topic",
                    self.topic,
                    "--session-timeout-ms",
                    str(self.session_timeout_ms),
                    "--assignor",
                    ASSIGNOR,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                cwd=Path(__file__).resolve().parents[1],
            )
            stderr.close()
            member = Member(name, process)
            member.start_reading()
            spawned.append(member)
        for member in spawned:
            _wait_value(member.ready_at, READY_TIMEOUT_S, f"{member.name} ready")
        self.members.extend(spawned)
        return spawned

    def live(self) -> list[Member]:
        return [member for member in self.members if member.process.poll() is None]

    def settled_since(self, t: float, partitions: int) -> float | None:
        """When the live members' latest assignments (all made after `t`) cover every partition
        exactly once and each partition delivered a record after its assignment; else None."""
        live = self.live()
        owners: dict[int, Member] = {}
        for member in live:
            for partition in member.owned():
                if partition in owners:
                    return None
                owners[partition] = member
        if len(owners) != partitions:
            return None
        done_at = t
        for member in live:
            assigned_t = member.last_assigned_t()
            if assigned_t is None or assigned_t < t:
                return None
            done_at = max(done_at, assigned_t)
        for partition, member in owners.items():
            first = member.records_after(member.last_assigned_t() or t).get(partition)
            if first is None:
                return None
            done_at = max(done_at, first)
        return done_at

    def close(self) -> None:
        for member in self.members:
            if member.process.poll() is None:
                member.process.kill()
                member.process.wait()


class Production:
    """One record to every partition every PRODUCE_INTERVAL_S, on a thread, until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(bootstrap, topic, partitions), daemon=True
        )

    def __enter__(self) -> Production:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self, bootstrap: str, topic: str, partitions: int) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        while not self._stop.is_set():
            for partition in range(partitions):
                producer.produce(topic, b"x", partition=partition)
            producer.poll(0)
            self._stop.wait(PRODUCE_INTERVAL_S)
        producer.flush(30)


def _wait_value(probe: Any, timeout_s: float, what: str) -> float:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return float(value)
        if time.monotonic() > deadline:
            raise ProcessFailed(f"{what}: not done within {timeout_s} s")
        time.sleep(WAIT_POLL_S)


def wait_settled(
    group: Group, since: float, partitions: int, what: str, newcomer: Member | None = None
) -> float:
    """When the group settled after `since` (see Group.settled_since), with `newcomer`, if
    given, owning partitions."""

    def settled() -> float | None:
        if newcomer is not None and not newcomer.owned():
            return None
        return group.settled_since(since, partitions)

    return _wait_value(settled, SETTLE_TIMEOUT_S, what)


def measure_departures(
    bootstrap: str,
    topic: str,
    session_timeout_ms: int,
    sig: signal.Signals,
    rounds: int,
    log_dir: Path,
) -> dict[str, Any]:
    """Rounds of one member of a settled small group stopping with `sig`."""
    group = Group(bootstrap, topic, session_timeout_ms, log_dir)
    times_s: list[float] = []
    try:
        for member in group.spawn(SMALL_GROUP):
            member.go()
        start = time.monotonic()
        wait_settled(group, start, SMALL_TOPIC_PARTITIONS, "form")
        for _ in range(rounds):
            # Not right after the rebalance that settled the group: the members' heartbeats
            # and the victim's session all restarted then, in step, and a session timeout that
            # is a multiple of the heartbeat interval would hide the heartbeat wait.
            time.sleep(random.uniform(0, HEARTBEAT_INTERVAL_MS / 1000) + SETTLED_PAUSE_S)
            victim = next(member for member in group.live() if member.owned())
            orphaned = victim.owned()
            t0 = time.monotonic()
            victim.process.send_signal(sig)

            def recovered(
                orphaned: frozenset[int] = orphaned, t0: float = t0, victim: Member = victim
            ) -> float | None:
                firsts: dict[int, float] = {}
                for member in group.live():
                    if member is victim:  # after SIGTERM it may poll once more before closing
                        continue
                    for partition, t in member.records_after(t0).items():
                        if partition in orphaned and partition in member.owned():
                            firsts[partition] = min(t, firsts.get(partition, t))
                return max(firsts.values()) if set(firsts) == orphaned else None

            done = _wait_value(recovered, SETTLE_TIMEOUT_S + session_timeout_ms / 1000, "recover")
            times_s.append(done - t0)
            victim.process.wait(timeout=READY_TIMEOUT_S)
            (replacement,) = group.spawn(1)
            t1 = time.monotonic()
            replacement.go()
            wait_settled(group, t1, SMALL_TOPIC_PARTITIONS, "replacement", replacement)
    finally:
        group.close()
    return _summary(times_s, session_timeout_ms=session_timeout_ms, signal=sig.name)


def measure_large_group(bootstrap: str, topic: str, rounds: int, log_dir: Path) -> dict[str, Any]:
    """Rounds of: 10 members form a new group at once (form10), then an 11th joins (join10)."""
    form_s: list[float] = []
    join_s: list[float] = []
    for _ in range(rounds):
        group = Group(bootstrap, topic, SESSION_TIMEOUT_DEFAULT_MS, log_dir)
        try:
            members = group.spawn(LARGE_GROUP)
            t0 = time.monotonic()
            for member in members:
                member.go()
            done = wait_settled(group, t0, LARGE_TOPIC_PARTITIONS, "form10")
            form_s.append(done - t0)
            (newcomer,) = group.spawn(1)
            t1 = time.monotonic()
            newcomer.go()
            done = wait_settled(group, t1, LARGE_TOPIC_PARTITIONS, "join10", newcomer)
            join_s.append(done - t1)
        finally:
            group.close()
    return {"form10": _summary(form_s), "join10": _summary(join_s)}


def _summary(times_s: Iterable[float], **parameters: Any) -> dict[str, Any]:
    values = [round(t, 4) for t in times_s]
    return {
        **parameters,
        "times_s": values,
        "median_s": statistics.median(values),
        "min_s": min(values),
        "max_s": max(values),
    }


def run(options: BenchOptions) -> BenchResult:
    rounds = QUICK_ROUNDS if options.quick else ROUNDS
    settings = {**CLUSTER_SETTINGS, **options.broker_settings}
    log_dir = options.work_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    measured: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix=f"{NAME}-", dir=options.work_dir) as scratch,
        zookeeper(Path(scratch) / "zookeeper") as zk_connect,
    ):
        cluster = Cluster(
            BROKERS, Path(scratch) / "data", f"{zk_connect}/{NAME}", settings, log_dir, NAME
        )
        try:
            cluster.start(BROKER_START_TIMEOUT_S)
            small, large = f"{NAME}-small", f"{NAME}-large"
            create_topic(cluster.bootstrap, small, SMALL_TOPIC_PARTITIONS)
            create_topic(cluster.bootstrap, large, LARGE_TOPIC_PARTITIONS)
            cases = (
                ("kill_default", SESSION_TIMEOUT_DEFAULT_MS, signal.SIGKILL),
                ("kill_short", SESSION_TIMEOUT_SHORT_MS, signal.SIGKILL),
                ("leave", SESSION_TIMEOUT_DEFAULT_MS, signal.SIGTERM),
            )
            with Production(cluster.bootstrap, small, SMALL_TOPIC_PARTITIONS):
                for name, session_timeout_ms, sig in cases:
                    print(f"   {name} ...", flush=True)
                    measured[name] = {
                        "loadavg_1m_before": os.getloadavg()[0],
                        **measure_departures(
                            cluster.bootstrap, small, session_timeout_ms, sig, rounds, log_dir
                        ),
                    }
            print("   form10 / join10 ...", flush=True)
            with Production(cluster.bootstrap, large, LARGE_TOPIC_PARTITIONS):
                measured.update(measure_large_group(cluster.bootstrap, large, rounds, log_dir))
        finally:
            cluster.stop()
            cluster.close()
    return summarize(rounds, settings, measured)


def summarize(rounds: int, settings: dict[str, str], measured: dict[str, Any]) -> BenchResult:
    import confluent_kafka

    def median(name: str) -> float:
        return float(measured[name]["median_s"])

    return {
        "parameters": {
            "brokers": BROKERS,
            "broker_settings": settings,
            "member_client": f"{MEMBER_CLIENT} (librdkafka {confluent_kafka.libversion()[0]})",
            "assignor": ASSIGNOR,
            "rounds": rounds,
            "small_group": {"members": SMALL_GROUP, "partitions": SMALL_TOPIC_PARTITIONS},
            "large_group": {"members": LARGE_GROUP, "partitions": LARGE_TOPIC_PARTITIONS},
            "session_timeout_ms": {
                "default": SESSION_TIMEOUT_DEFAULT_MS,
                "short": SESSION_TIMEOUT_SHORT_MS,
            },
            "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
            "departure_after_settled_s": f"{SETTLED_PAUSE_S} + uniform(0, heartbeat interval)",
            "produce_interval_s": PRODUCE_INTERVAL_S,
        },
        "tools": {"confluent_kafka": confluent_kafka.version()[0]},
        "measurements": measured,
        "headlines": [
            {
                "label": "killed member, 45 s session: partitions consumed again after (median)",
                "value": median("kill_default"),
                "unit": "s",
            },
            {
                "label": "killed member, 6 s session: partitions consumed again after (median)",
                "value": median("kill_short"),
                "unit": "s",
            },
            {
                "label": "member leaving (LeaveGroup): partitions consumed again after (median)",
                "value": median("leave"),
                "unit": "s",
            },
            {
                "label": "10 new members: group formed and consuming after (median)",
                "value": median("form10"),
                "unit": "s",
            },
            {
                "label": "11th member joining 10: rebalanced and consuming after (median)",
                "value": median("join10"),
                "unit": "s",
            },
        ],
        "ratios": [
            {
                "label": "kill recovery / session timeout (45 s)",
                "value": median("kill_default") / (SESSION_TIMEOUT_DEFAULT_MS / 1000),
                "goal": "reported",
                "met": None,
            },
            {
                "label": "kill recovery / session timeout (6 s)",
                "value": median("kill_short") / (SESSION_TIMEOUT_SHORT_MS / 1000),
                "goal": "reported",
                "met": None,
            },
        ],
    }
