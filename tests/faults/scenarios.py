"""Named fault schedules, and the run that judges one: workload, faults, heal, final check.

A schedule is a coroutine given the cluster and a `Faults` recorder: it injects its faults
(each written to the history, so a failed check prints the schedule), holds them, and heals
them. `run_scenario` creates a topic (RF=3, min.insync.replicas=2), starts the workload
(tests/faults/workload.py: Riverbed's and confluent-kafka's idempotent acks=all producers and
a consumer), lets it warm up, runs the schedule, heals whatever is left, lets the cluster
recover, waits until every replica is back in sync, reads every partition back and judges the
history (tests/faults/checker.py).
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest
from riverbed import Admin, TopicPartition

from tests.faults.checker import Verdict, check
from tests.faults.cluster import (
    BROKERS,
    SESSION_TIMEOUT_MS,
    DiskFactory,
    FaultCluster,
    fault_cluster,
)
from tests.faults.disks import FailingDisk, FullDisk
from tests.faults.ensemble import Member, MemberStatus
from tests.faults.history import Fault, HistoryWriter, now_ms, of_kind, read_history
from tests.faults.network import Host
from tests.faults.workload import (
    CONFLUENT_PREFIX,
    RIVERBED_PREFIX,
    Summary,
    Workload,
    create_topic,
    read_final_log,
)

PARTITIONS: Final = 3
WARMUP_S: Final = 3.0
RECOVER_S: Final = 4.0
# Long enough for a cut-off broker's ZooKeeper session to expire and its leaderships to move.
SESSION_LOSS_S: Final = SESSION_TIMEOUT_MS / 1000 + 4.0
# How long a fault's effect may take to show: twice the time it needs on a quiet machine, for a
# busy 2-core one (every scenario runs 3 JVMs and 3 brokers beside the other tests' processes).
EFFECT_WITHIN_S: Final = 2 * SESSION_LOSS_S
# A fault is held this long after its effect is seen: the workload writes through the new state.
HOLD_S: Final = 2.0
IN_SYNC_TIMEOUT_S: Final = 90.0
WORKLOAD_STOP_TIMEOUT_S: Final = 60.0
TOPIC: Final = "jepsen"
FIXED_SEED: Final = 20261129  # what `make test` runs with; `make chaos` draws its own
EXPECT_POLL_S: Final = 0.5
PROBE_TIMEOUT_S: Final = 0.5
ADMIN_REQUEST_TIMEOUT_MS: Final = 3_000


class Faults:
    """What a schedule uses: the cluster, a seeded random, and a recorder of every fault."""

    def __init__(
        self,
        cluster: FaultCluster,
        history: HistoryWriter,
        rng: random.Random,
        topic: str = TOPIC,
    ) -> None:
        self.cluster = cluster
        self.rng = rng
        self.topic = topic
        self._history = history

    def record(self, name: str, detail: str) -> None:
        self._history.write(Fault(name, detail, now_ms()))

    async def leader(self, partition: int = 0, *, asking: Iterable[int] | None = None) -> int:
        """Partition `partition`'s leader as the brokers `asking` (default: all) see it."""
        async with self.admin(asking) as admin:
            described = await admin.describe_topic(self.topic)
        return next(p.leader for p in described.partitions if p.partition == partition)

    async def isr(self, partition: int = 0, *, asking: Iterable[int] | None = None) -> set[int]:
        async with self.admin(asking) as admin:
            described = await admin.describe_topic(self.topic)
        return next(set(p.isr) for p in described.partitions if p.partition == partition)

    async def controller(self, *, asking: Iterable[int] | None = None) -> int:
        async with self.admin(asking) as admin:
            return (await admin.describe_cluster()).controller_id

    async def expect(self, what: str, seen: Callable[[], Awaitable[bool]], within_s: float) -> None:
        """The fault must have the effect it is there for (else the scenario tests nothing):
        poll `seen` until it holds, recorded as an `observed` event; AssertionError after
        `within_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        last: object = None
        while loop.time() < deadline:
            try:
                if await seen():
                    self.record("observed", what)
                    return
            except Exception as error:  # a broker cut off or settling: ask again
                last = error
            await asyncio.sleep(EXPECT_POLL_S)
        raise AssertionError(f"no effect within {within_s} s: {what} (last error: {last})")

    async def lead_elsewhere(self, broker_id: int) -> None:
        """Make `broker_id` the last replica of every partition and elect the preferred
        leaders, so that it follows everywhere."""
        async with self.admin(None) as admin:
            described = await admin.describe_topic(self.topic)
            moves = {
                TopicPartition(self.topic, p.partition): [b for b in p.replicas if b != broker_id]
                + [broker_id]
                for p in described.partitions
            }
            await admin.alter_partition_reassignments(moves)
            await admin.elect_leaders(list(moves))

        async def follows_everywhere() -> bool:
            async with self.admin(None) as admin:
                states = (await admin.describe_topic(self.topic)).partitions
            return all(s.leader not in (broker_id, -1) for s in states)

        await self.expect(f"b{broker_id} leads nothing", follows_everywhere, EFFECT_WITHIN_S)

    def reaches(self, source: Host, broker_id: int) -> bool:
        """Whether a TCP connection from `source` to the broker's listener opens now."""
        address = self.cluster.brokers[broker_id]
        target = (address.host, address.port)

        def connect() -> bool:
            try:
                socket.create_connection(target, timeout=PROBE_TIMEOUT_S).close()
            except OSError:
                return False
            return True

        return self.cluster.net.run_in(source, connect)

    def admin(self, asking: Iterable[int] | None) -> Admin:
        brokers = self.cluster.brokers
        chosen = list(brokers) if asking is None else list(asking)
        bootstrap = ",".join(brokers[b].bootstrap for b in chosen)
        return Admin(bootstrap_servers=bootstrap, request_timeout_ms=ADMIN_REQUEST_TIMEOUT_MS)

    def isolate(self, host: Host, *, keep: list[Host]) -> None:
        self.record("isolate", f"{host.name} (keeps {[h.name for h in keep]})")
        self.cluster.net.isolate(host, keep=keep)

    def heal(self) -> None:
        self.record("heal", "every network fault")
        self.cluster.net.heal()


Schedule = Callable[[Faults], Awaitable[None]]


async def leader_cut_from_zookeeper_and_followers(faults: Faults) -> None:
    """The leader keeps its clients but loses ZooKeeper and the other brokers: the controller
    elects another leader; acks=all writes to the old one cannot complete (min.insync.replicas)
    and what it appended alone is truncated when it returns."""
    leader = await faults.leader()
    cluster = faults.cluster
    faults.isolate(cluster.broker_host(leader), keep=[cluster.client])
    others = [b for b in cluster.brokers if b != leader]

    async def moved() -> bool:
        return await faults.leader(asking=others) not in (leader, -1)

    await faults.expect(f"a leader other than b{leader}", moved, EFFECT_WITHIN_S)
    await asyncio.sleep(HOLD_S)
    faults.heal()


async def follower_cut_from_leader(faults: Faults) -> None:
    """A follower hears the controller and ZooKeeper but not its leader: it leaves the ISR."""
    leader = await faults.leader()
    follower = next(b for b in faults.cluster.brokers if b != leader)
    cluster = faults.cluster
    faults.record("partition", f"b{follower} | b{leader}")
    cluster.net.partition([cluster.broker_host(follower)], [cluster.broker_host(leader)])

    async def shrunk() -> bool:
        return follower not in await faults.isr(asking=[leader])

    await faults.expect(f"b{follower} out of the ISR", shrunk, EFFECT_WITHIN_S)
    await asyncio.sleep(HOLD_S)
    faults.heal()


async def controller_isolated(faults: Faults) -> None:
    controller = await faults.controller()
    cluster = faults.cluster
    faults.isolate(cluster.broker_host(controller), keep=[cluster.client])
    others = [b for b in cluster.brokers if b != controller]

    async def elected() -> bool:
        return await faults.controller(asking=others) not in (controller, -1)

    await faults.expect(f"a controller other than b{controller}", elected, EFFECT_WITHIN_S)
    await asyncio.sleep(HOLD_S)
    faults.heal()


async def zookeeper_minority_isolated(faults: Faults) -> None:
    """One member cut off: the other two keep a quorum, and nothing stops."""
    cluster = faults.cluster
    cut = faults.rng.choice(cluster.ensemble.members)
    faults.isolate(cluster.host(f"zk{cut.sid}"), keep=[])
    rest = [m for m in cluster.ensemble.members if m is not cut]

    async def quorum_without_it() -> bool:
        statuses = await asyncio.to_thread(lambda: [m.status() for m in rest])
        return all(s is not None for s in statuses) and any(
            s.mode == "leader" for s in statuses if s
        )

    await faults.expect(
        f"zk{cut.sid} cut off, the others serving", quorum_without_it, EFFECT_WITHIN_S
    )
    await asyncio.sleep(SESSION_LOSS_S)
    faults.heal()


async def zookeeper_majority_isolated(faults: Faults) -> None:
    """Two of three members cut off: no quorum, so no metadata change until it heals."""
    cluster = faults.cluster
    cut = faults.rng.sample(list(cluster.ensemble.members), 2)
    for member in cut:
        faults.isolate(cluster.host(f"zk{member.sid}"), keep=[])
    [left] = [m for m in cluster.ensemble.members if m not in cut]

    async def no_quorum() -> bool:
        return await asyncio.to_thread(left.status) is None  # "not currently serving"

    await faults.expect(f"zk{left.sid} alone, not serving", no_quorum, EFFECT_WITHIN_S)
    await asyncio.sleep(SESSION_LOSS_S)
    faults.heal()


FLAP_PERIOD_S: Final = 0.5
FLAPS: Final = 16


async def flapping_link(faults: Faults) -> None:
    """The link between the leader and a follower goes down and up every half second."""
    leader = await faults.leader()
    follower = next(b for b in faults.cluster.brokers if b != leader)
    net = faults.cluster.net
    a, b = faults.cluster.broker_host(leader), faults.cluster.broker_host(follower)
    for flap in range(FLAPS):
        faults.record("partition", f"{a.name} | {b.name}")
        cut = net.partition([a], [b])
        if flap == 0 and faults.reaches(b, leader):
            raise AssertionError(f"{b.name} still reaches b{leader} through the cut")
        await asyncio.sleep(FLAP_PERIOD_S)
        faults.record("heal", f"{a.name} | {b.name}")
        cut.heal()
        await asyncio.sleep(FLAP_PERIOD_S)


SLOW_LINK_DELAY_MS: Final = 200
SLOW_LINK_LOSS_PERCENT: Final = 5.0
SLOW_LINK_S: Final = 10.0


async def slow_lossy_links(faults: Faults) -> None:
    """200 ms latency and 5% loss on every packet the brokers send."""
    cluster = faults.cluster
    for host in cluster.broker_hosts:
        faults.record("degrade", f"{host.name}: {SLOW_LINK_DELAY_MS} ms, {SLOW_LINK_LOSS_PERCENT}%")
        cluster.net.degrade(host, delay_ms=SLOW_LINK_DELAY_MS, loss_percent=SLOW_LINK_LOSS_PERCENT)
    started = asyncio.get_running_loop().time()
    await faults.controller()  # a Metadata round trip: its answer comes back delayed
    round_trip_s = asyncio.get_running_loop().time() - started
    if round_trip_s < SLOW_LINK_DELAY_MS / 1000:
        raise AssertionError(f"a round trip took {round_trip_s:.3f} s on a slowed link")
    faults.record("observed", f"a Metadata round trip took {round_trip_s:.3f} s")
    await asyncio.sleep(SLOW_LINK_S)
    faults.heal()


FULL_DISK_BROKER: Final = 3
FULL_DISK_BYTES: Final = 256 * 1024 * 1024
FULL_DISK_S: Final = 8.0


async def full_disk_on_a_follower(faults: Faults) -> None:
    """A follower's disk fills up: its appends fail with ENOSPC, it drops out of the ISRs, the
    leaders and the other follower go on (min.insync.replicas=2); freed, it catches up."""
    cluster, full = faults.cluster, FULL_DISK_BROKER
    await faults.lead_elsewhere(full)
    disk = cluster.disks[full]
    assert isinstance(disk, FullDisk)
    faults.record("fill", f"b{full}'s data dir")
    disk.fill()
    others = [b for b in cluster.brokers if b != full]

    async def dropped() -> bool:
        return full not in await faults.isr(asking=others)

    await faults.expect(f"b{full} out of an ISR", dropped, EFFECT_WITHIN_S)
    await asyncio.sleep(FULL_DISK_S)
    faults.record("free", f"b{full}'s data dir")
    disk.free()


async def zookeeper_members_wiped_one_by_one(faults: Faults) -> None:
    """Each member in turn stopped, its data deleted, started empty: it syncs from the other
    two. The brokers keep running through it and must neither lose nor delete anything."""
    cluster = faults.cluster
    for member in faults.rng.sample(list(cluster.ensemble.members), len(cluster.ensemble.members)):
        before = await asyncio.to_thread(member.status)
        faults.record("wipe", f"zk{member.sid} (had {before.node_count if before else '?'} znodes)")
        await asyncio.to_thread(member.restart, wipe=True)
        await asyncio.to_thread(cluster.ensemble.wait_quorum)

        async def synced(member: Member = member, before: MemberStatus | None = before) -> bool:
            status = await asyncio.to_thread(member.status)
            wanted = before.node_count if before is not None else 1
            return status is not None and status.node_count >= wanted * SYNCED_FRACTION

        await faults.expect(f"zk{member.sid} synced back", synced, EFFECT_WITHIN_S)
    for broker_id, broker in cluster.brokers.items():
        output = broker.log_path.read_text(errors="replace")
        for line in ("keeping the log of", "event=partition.deleted"):
            if line in output:
                raise AssertionError(f"b{broker_id} logged {line!r} with ZooKeeper intact")


async def full_disk_on_a_leader(faults: Faults) -> None:
    """A broker's disk fills up while it leads, then it is cut from the cluster (not from its
    clients) and its leaderships move. The replay of a `make chaos` schedule (seed 20261151)
    that duplicated records: the full leader answered the requests pipelined behind a refused
    write with OUT_OF_ORDER_SEQUENCE_NUMBER, librdkafka bumped its producer epoch and sent
    again records of other partitions that were already in their logs (log.py,
    WRITE_REFUSED_BACKOFF_MS)."""
    cluster, full = faults.cluster, FULL_DISK_BROKER
    disk = cluster.disks[full]
    assert isinstance(disk, FullDisk)
    faults.record("fill", f"b{full}'s data dir")
    disk.fill()
    await asyncio.sleep(FULL_LEADER_ALONE_S)
    faults.isolate(cluster.broker_host(full), keep=[cluster.client])
    others = [b for b in cluster.brokers if b != full]

    async def moved() -> bool:
        async with faults.admin(others) as admin:
            states = (await admin.describe_topic(faults.topic)).partitions
        return all(s.leader not in (full, -1) for s in states)

    await faults.expect(f"b{full} leads nothing", moved, EFFECT_WITHIN_S)
    await asyncio.sleep(HOLD_S)
    faults.heal()
    faults.record("free", f"b{full}'s data dir")
    disk.free()


# How long the full broker keeps leading before it is cut off: producers get storage errors.
FULL_LEADER_ALONE_S: Final = 2.0
FAILING_DISK_HOLD_S: Final = 4.0


async def fsync_failure_on_the_leader(faults: Faults) -> None:
    """The leader's disk starts failing writes with EIO: its next fsync fails, its log
    directory goes offline and the broker stops (Kafka's halt); another replica leads, and no
    acknowledged record is lost. Healed and restarted, it recovers as after a crash."""
    cluster = faults.cluster
    leader = await faults.leader()
    disk = cluster.disks[leader]
    assert isinstance(disk, FailingDisk)
    faults.record("fail", f"b{leader}'s disk: writes fail with EIO")
    disk.fail()
    broker = cluster.brokers[leader]
    others = [b for b in cluster.brokers if b != leader]

    async def moved() -> bool:
        return not broker.running and await faults.leader(asking=others) not in (leader, -1)

    await faults.expect(f"b{leader} stopped, another leader", moved, EFFECT_WITHIN_S)
    await asyncio.sleep(FAILING_DISK_HOLD_S)
    faults.record("heal", f"b{leader}'s disk, and b{leader} started again")
    disk.heal()
    await asyncio.to_thread(cluster.restart_broker, leader)


# A wiped member holds at least this share of the znodes it held before (brokers' ephemeral and
# changing znodes come and go meanwhile; an empty database holds 5).
SYNCED_FRACTION: Final = 0.8


@dataclass(frozen=True)
class Scenario:
    schedule: Schedule
    disks: Mapping[int, DiskFactory] = field(default_factory=dict)
    settings: Mapping[str, str] = field(default_factory=dict)  # over cluster.SETTINGS


SCENARIOS: Final[Mapping[str, Scenario]] = {
    "leader_cut_from_zookeeper_and_followers": Scenario(leader_cut_from_zookeeper_and_followers),
    "follower_cut_from_leader": Scenario(follower_cut_from_leader),
    "controller_isolated": Scenario(controller_isolated),
    "zookeeper_minority_isolated": Scenario(zookeeper_minority_isolated),
    "zookeeper_majority_isolated": Scenario(zookeeper_majority_isolated),
    "zookeeper_members_wiped_one_by_one": Scenario(zookeeper_members_wiped_one_by_one),
    "flapping_link": Scenario(flapping_link),
    "slow_lossy_links": Scenario(slow_lossy_links),
    "full_disk_on_a_follower": Scenario(
        full_disk_on_a_follower,
        {FULL_DISK_BROKER: lambda directory: FullDisk(directory, FULL_DISK_BYTES)},
    ),
    "full_disk_on_a_leader": Scenario(
        full_disk_on_a_leader,
        {FULL_DISK_BROKER: lambda directory: FullDisk(directory, FULL_DISK_BYTES)},
    ),
    "fsync_failure_on_the_leader": Scenario(
        fsync_failure_on_the_leader,
        dict.fromkeys(range(1, BROKERS + 1), FailingDisk),
        {"log.flush.interval.ms": "100"},  # an fsync soon after each write
    ),
}


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    summary: Summary
    schedule: list[Fault]
    seed: int

    def report(self) -> str:
        return self.verdict.report(self.schedule, self.seed)


async def run_scenario(
    cluster: FaultCluster,
    name: str,
    schedule: Schedule,
    home: Path,
    seed: int,
    *,
    topic: str = TOPIC,
    warmup_s: float = WARMUP_S,
    recover_s: float = RECOVER_S,
) -> Outcome:
    history_path, faults_path = home / f"{name}.history.jsonl", home / f"{name}.faults.jsonl"
    bootstrap = cluster.bootstrap
    await create_topic(bootstrap, topic, PARTITIONS)
    workload = Workload(bootstrap, topic, history_path, seed=seed, scenario=name)
    running = asyncio.create_task(workload.run(duration_s=3600.0), name=f"workload {name}")
    try:
        await asyncio.sleep(warmup_s)
        with HistoryWriter(faults_path) as history:
            faults = Faults(cluster, history, random.Random(seed), topic)
            try:
                await schedule(faults)
            finally:
                cluster.net.heal()
        await asyncio.sleep(recover_s)
    finally:
        workload.stop()
        async with asyncio.timeout(WORKLOAD_STOP_TIMEOUT_S):
            summary = await running
    await _wait_in_sync(bootstrap, topic)
    final_log = await read_final_log(bootstrap, topic)
    events = read_history(history_path, faults_path)
    return Outcome(check(events, final_log), summary, of_kind(events, Fault), seed)


async def _wait_in_sync(bootstrap: str, topic: str) -> None:
    """Every partition led and fully replicated again: the final read is of a healed cluster."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + IN_SYNC_TIMEOUT_S
    last: object = None
    async with Admin(bootstrap_servers=bootstrap) as admin:
        while loop.time() < deadline:
            try:
                states = (await admin.describe_topic(topic)).partitions
                last = states
                if all(s.leader >= 0 and len(s.isr) == len(s.replicas) for s in states):
                    return
            except Exception as error:  # a cluster still settling answers errors: try again
                last = error
            await asyncio.sleep(0.5)
    raise AssertionError(f"{topic} not back in sync within {IN_SYNC_TIMEOUT_S} s: {last}")


async def assert_scenario_holds(home: Path, name: str, seed: int) -> Outcome:
    """Run the named scenario on a fresh cluster; AssertionError with the replay report (the
    schedule, the seed) and the brokers' logs unless every check holds and both producer
    kinds got acknowledgements."""
    scenario = SCENARIOS[name]
    with fault_cluster(home, scenario.settings, scenario.disks) as cluster:
        outcome = await run_scenario(cluster, name, scenario.schedule, home, seed)
        assert outcome.verdict.ok, f"{outcome.report()}\n{cluster.describe_logs()}"
    for kind in (RIVERBED_PREFIX, CONFLUENT_PREFIX):
        assert outcome.summary.acked(kind) > 0, f"no {kind} acknowledgement: {outcome.report()}"
    return outcome


def scenario_tests(names: Sequence[str]) -> Callable[[Path, str], Awaitable[None]]:
    """A test function parametrized over `names`, each run by assert_scenario_holds with
    FIXED_SEED: what each tests/faults/test_scenarios_*.py module binds to `test_scenario`."""
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        raise ValueError(f"no such scenarios: {sorted(unknown)}")

    @pytest.mark.processes
    @pytest.mark.parametrize("name", list(names))
    async def test_scenario(tmp_path: Path, name: str) -> None:
        await assert_scenario_holds(tmp_path, name, FIXED_SEED)

    return test_scenario
