"""The fault tests' workload against three healthy brokers: in this process and as one of its own
(as it runs inside a network namespace), then the checker on what it wrote. Without faults every
record is acknowledged and the verdict is ok; a value dropped from the log is reported lost."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.faults.checker import Lost, Position, check
from tests.faults.history import Ack, Event, Fault, Header, Served, of_kind, read_history
from tests.faults.workload import (
    CONFLUENT_PREFIX,
    FLUSH_TIMEOUT_S,
    RIVERBED_PREFIX,
    Workload,
    client_kind,
    create_topic,
    load_final_log,
    read_final_log,
)
from tests.support.cluster import ClusterFactory

pytestmark = pytest.mark.processes

REPO: Final = Path(__file__).resolve().parents[2]
PARTITIONS: Final = 3
SEED: Final = 20_240_601
IN_PROCESS_RUN_S: Final = 5.0
# The process's own run once its producers are acknowledged, before it is sent SIGTERM.
PROCESS_RUN_S: Final = 3.0
# A cold interpreter importing riverbed and confluent-kafka, then its first acknowledgements.
PROCESS_START_TIMEOUT_S: Final = 30.0
# After SIGTERM: the producers' flush (instant when healthy, bounded anyway) and the drain.
PROCESS_STOP_TIMEOUT_S: Final = FLUSH_TIMEOUT_S + 15.0
FINAL_LOG_TIMEOUT_S: Final = 30.0


def acked_kinds(events: list[Event]) -> set[str]:
    return {client_kind(ack.producer) for ack in of_kind(events, Ack)}


async def test_in_process_every_record_is_acknowledged_served_and_checked_ok(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    cluster = await cluster_factory(3)
    topic = "workload-in-process"
    await create_topic(cluster.bootstrap, topic, PARTITIONS)
    history_path = tmp_path / "history.jsonl"

    workload = Workload(cluster.bootstrap, topic, history_path, seed=SEED, scenario="healthy")
    summary = await workload.run(IN_PROCESS_RUN_S)
    final_log = await read_final_log(cluster.bootstrap, topic, FINAL_LOG_TIMEOUT_S)
    events = read_history(history_path)
    verdict = check(events, final_log)
    print(summary.to_json(), verdict.summary(), sep="\n")

    assert verdict.ok, verdict.report(of_kind(events, Fault), SEED)
    assert events[0] == Header("healthy", SEED, events[0].t_ms)
    assert summary.acked(RIVERBED_PREFIX) > 0
    assert summary.acked(CONFLUENT_PREFIX) > 0
    assert acked_kinds(events) == {RIVERBED_PREFIX, CONFLUENT_PREFIX}
    # No fault: every record sent was acknowledged, and the log holds nothing else.
    sent = sum(counts.sent for counts in summary.producers.values())
    assert (verdict.acknowledged, verdict.failed, verdict.unacknowledged_present) == (sent, 0, 0)
    assert all(final_log[partition] for partition in range(PARTITIONS))
    assert verdict.served > 0
    assert summary.served == {"c-0": verdict.served}

    # The same history against a log that lost one acknowledged record.
    dropped = of_kind(events, Ack)[len(of_kind(events, Ack)) // 2]
    at = Position(dropped.partition, dropped.offset)
    tampered = {
        partition: [(offset, value) for offset, value in records if value != dropped.value]
        for partition, records in final_log.items()
    }
    lost = check(events, tampered)
    assert not lost.ok
    assert lost.lost == (Lost(dropped.value, at),)
    assert (lost.duplicated, lost.misplaced) == ((), ())
    # If the consumer had been served it there, that offset no longer means what it did.
    was_served = any(served.value == dropped.value for served in of_kind(events, Served))
    assert [finding.at for finding in lost.changed_meaning] == ([at] if was_served else [])


async def test_as_a_process_it_runs_until_sigterm_and_exits_0(
    cluster_factory: ClusterFactory, tmp_path: Path
) -> None:
    cluster = await cluster_factory(3)
    topic = "workload-process"
    await create_topic(cluster.bootstrap, topic, PARTITIONS)
    history_path = tmp_path / "history.jsonl"
    arguments = ["--bootstrap", cluster.bootstrap, "--topic", topic]

    process = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "tests.faults.workload", *arguments],
        *["--history", str(history_path), "--duration-s", "600", "--seed", str(SEED)],
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await cluster.wait_for(
            lambda: (
                history_path.exists()
                and acked_kinds(read_history(history_path)) == {RIVERBED_PREFIX, CONFLUENT_PREFIX}
            ),
            PROCESS_START_TIMEOUT_S,
            what="acknowledgements of both kinds of producers in the history",
        )
        await asyncio.sleep(PROCESS_RUN_S)
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(PROCESS_STOP_TIMEOUT_S):
            stdout, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode(errors="replace")
    summary = json.loads(stdout.decode().splitlines()[-1])

    final_log_path = tmp_path / "final-log.json"
    reader = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "tests.faults.workload", *arguments],
        *["--final-log", str(final_log_path), "--timeout-s", str(FINAL_LOG_TIMEOUT_S)],
        cwd=REPO,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(FINAL_LOG_TIMEOUT_S + PROCESS_START_TIMEOUT_S):
        _, reader_stderr = await reader.communicate()
    assert reader.returncode == 0, reader_stderr.decode(errors="replace")

    events = read_history(history_path)
    verdict = check(events, load_final_log(final_log_path))
    print(json.dumps(summary), verdict.summary(), sep="\n")
    assert verdict.ok, verdict.report(of_kind(events, Fault), SEED)
    for name, counts in summary["producers"].items():
        assert counts["acked"] == verdict.acknowledged_by_producer[name] > 0
    assert verdict.served == summary["served"]["c-0"] > 0
