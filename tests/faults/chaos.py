"""`make chaos`: long randomised runs of mixed faults, replayable from a seed.

One cluster in network namespaces (tests/faults/cluster.py; broker 3's data dir on a tmpfs
that can be filled) serves every schedule, each on a topic of its own with the workload going
through it. A schedule is 1-3 faults drawn from FAULT_KINDS with random targets, injected a
random gap apart, held, then healed in reverse order; the checker then judges that topic's
history. The run stops after `--schedules` schedules or `--budget-s` seconds, whichever comes
first, prints the counts (schedules, acknowledged, lost, duplicated, misplaced, changed
meaning, faults per kind) and writes them as JSON to `--out`. The first failed check stops the
run and prints its report: the schedule, and the seed that replays it (`--seed`; schedule i of
a run uses seed + i).

    python -m tests.faults.chaos --seed 7 --schedules 100 --budget-s 2400
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Final

from tests.faults.cluster import fault_cluster
from tests.faults.disks import FullDisk
from tests.faults.scenarios import Faults, Outcome, run_scenario

FAULTS_PER_SCHEDULE: Final = (1, 3)
GAP_S: Final = (0.0, 2.0)
HOLD_S: Final = (2.0, 8.0)
WARMUP_S: Final = 1.0
RECOVER_S: Final = 3.0
DISK_BROKER: Final = 3
DISK_BYTES: Final = 512 * 1024 * 1024
DELAY_MS: Final = (20, 300)
LOSS_PERCENT: Final = (0.0, 10.0)

Heal = Callable[[], Awaitable[None]]


async def _isolate_broker(faults: Faults, rng: random.Random) -> tuple[str, Heal]:
    broker = rng.choice(list(faults.cluster.brokers))
    fault = faults.cluster.net.isolate(
        faults.cluster.broker_host(broker), keep=[faults.cluster.client]
    )
    return f"b{broker} cut from the cluster, not from clients", _sync(fault.heal)


async def _partition_brokers(faults: Faults, rng: random.Random) -> tuple[str, Heal]:
    a, b = rng.sample(list(faults.cluster.brokers), 2)
    one_way = rng.random() < 0.5
    host = faults.cluster.broker_host
    fault = faults.cluster.net.partition([host(a)], [host(b)], one_way=one_way)
    return f"b{a} {'->' if one_way else '|'} b{b}", _sync(fault.heal)


async def _isolate_zookeeper(faults: Faults, rng: random.Random) -> tuple[str, Heal]:
    host = rng.choice(faults.cluster.zookeeper_hosts)
    fault = faults.cluster.net.isolate(host, keep=[])
    return f"{host.name} cut off", _sync(fault.heal)


async def _slow_links(faults: Faults, rng: random.Random) -> tuple[str, Heal]:
    host = rng.choice(faults.cluster.broker_hosts + faults.cluster.zookeeper_hosts)
    delay_ms = rng.randint(*DELAY_MS)
    loss_percent = round(rng.uniform(*LOSS_PERCENT), 1)
    fault = faults.cluster.net.degrade(host, delay_ms=delay_ms, loss_percent=loss_percent)
    return f"{host.name}: {delay_ms} ms, {loss_percent}% loss", _sync(fault.heal)


def _running_broker(faults: Faults, rng: random.Random) -> int:
    return rng.choice([i for i, broker in faults.cluster.brokers.items() if broker.running])


async def _pause_broker(faults: Faults, rng: random.Random) -> tuple[str, Heal]:
    broker_id = _running_broker(faults, rng)
    pid = faults.cluster.brokers[broker_id].pid
    os.kill(pid, signal.SIGSTOP)

    async def heal() -> None:
        with contextlib.suppress(ProcessLookupError):  # killed meanwhile by another fault
            os.kill(pid, signal.SIGCONT)

    return f"b{broker_id} paused (SIGSTOP)", heal


async def _kill_broker(faults: Faults, rng: random.Random) -> tuple[str, Heal]:
    broker_id = _running_broker(faults, rng)
    broker = faults.cluster.brokers[broker_id]
    broker.kill()

    async def heal() -> None:
        broker.start()
        await asyncio.to_thread(broker.wait_ready)

    return f"b{broker_id} killed (SIGKILL)", heal


async def _fill_disk(faults: Faults, rng: random.Random) -> tuple[str, Heal]:
    disk = faults.cluster.disks[DISK_BROKER]
    assert isinstance(disk, FullDisk)
    disk.fill()
    return f"b{DISK_BROKER}'s disk full", _sync(disk.free)


FaultKind = Callable[[Faults, random.Random], Awaitable[tuple[str, Heal]]]
FAULT_KINDS: Final[dict[str, FaultKind]] = {
    "isolate_broker": _isolate_broker,
    "partition_brokers": _partition_brokers,
    "isolate_zookeeper": _isolate_zookeeper,
    "slow_links": _slow_links,
    "pause_broker": _pause_broker,
    "kill_broker": _kill_broker,
    "fill_disk": _fill_disk,
}


def _sync(heal: Callable[[], object]) -> Heal:
    async def run() -> None:
        heal()

    return run


def random_schedule(rng: random.Random) -> Callable[[Faults], Awaitable[None]]:
    """1-3 distinct fault kinds, injected GAP_S apart, held HOLD_S, healed in reverse order."""
    kinds = rng.sample(sorted(FAULT_KINDS), rng.randint(*FAULTS_PER_SCHEDULE))
    hold_s = rng.uniform(*HOLD_S)
    gaps_s = [rng.uniform(*GAP_S) for _ in kinds]

    async def schedule(faults: Faults) -> None:
        heals: list[tuple[str, Heal]] = []
        try:
            for kind, gap_s in zip(kinds, gaps_s, strict=True):
                detail, heal = await FAULT_KINDS[kind](faults, faults.rng)
                faults.record(kind, detail)
                heals.append((kind, heal))
                await asyncio.sleep(gap_s)
            await asyncio.sleep(hold_s)
        finally:
            # Reverse order, but a full disk freed first: a killed broker restarting on it
            # would refuse to start (a full data dir is a one-line startup error).
            for kind, heal in sorted(reversed(heals), key=lambda pair: pair[0] != "fill_disk"):
                faults.record("heal", kind)
                await heal()

    return schedule


async def run(seed: int, schedules: int, budget_s: float, home: Path) -> dict[str, object]:
    started = time.monotonic()
    totals: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    failure: Outcome | None = None
    run_count = 0
    disks = {DISK_BROKER: lambda directory: FullDisk(directory, DISK_BYTES)}
    with fault_cluster(home, disks=disks) as cluster:
        for index in range(schedules):
            if time.monotonic() - started > budget_s:
                break
            schedule_seed = seed + index
            schedule = random_schedule(random.Random(schedule_seed))
            outcome = await run_scenario(
                cluster,
                f"chaos-{index}",
                schedule,
                home,
                schedule_seed,
                topic=f"chaos-{index}",
                warmup_s=WARMUP_S,
                recover_s=RECOVER_S,
            )
            run_count += 1
            verdict = outcome.verdict
            totals.update(
                acknowledged=verdict.acknowledged,
                lost=len(verdict.lost),
                duplicated=len(verdict.duplicated),
                misplaced=len(verdict.misplaced),
                changed_meaning=len(verdict.changed_meaning),
                failed=verdict.failed,
            )
            kinds.update(f.name for f in outcome.schedule if f.name in FAULT_KINDS)
            print(f"schedule {index} (seed {schedule_seed}): {verdict.summary()}", flush=True)
            if not verdict.ok:
                failure = outcome
                print(outcome.report(), flush=True)
                print(cluster.describe_logs(), flush=True)
                break
    return {
        "seed": seed,
        "schedules_run": run_count,
        "seconds": round(time.monotonic() - started, 1),
        "records": dict(totals),
        "faults_per_kind": dict(sorted(kinds.items())),
        "ok": failure is None,
        "failed_schedule_seed": None if failure is None else failure.seed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--schedules", type=int, default=100)
    parser.add_argument("--budget-s", type=float, default=2400.0)
    parser.add_argument("--out", type=Path, default=Path(".chaos") / "latest.json")
    parser.add_argument(
        "--keep", type=Path, help="keep the histories and broker logs in this directory"
    )
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        home = args.keep or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="riverbed-chaos-"))
        )
        home.mkdir(parents=True, exist_ok=True)
        report = asyncio.run(run(args.seed, args.schedules, args.budget_s, home))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
