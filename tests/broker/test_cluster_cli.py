"""`riverbed cluster up` as a user runs it, and the TestCluster support the fault tests build on.

The CLI runs as a subprocess on free ports (never 9092); what it started is found through
/proc (the supervisor's children) and must all be gone once it exits.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Final

import pytest
from riverbed.cli.local_cluster import BROKER_STOP_TIMEOUT_S
from riverbed.client.admin import Admin
from riverbed.client.producer import Producer

from tests.support.broker import HOST
from tests.support.cluster import (
    ClusterFactory,
    partition_state,
    registered_brokers,
    wait_for,
)
from tests.support.ports import free_port, free_port_run

# A cold start of ZooKeeper (a JVM) and three interpreters on a busy 2-core machine.
CLUSTER_READY_TIMEOUT_S: Final = 90.0
# SIGINT to exit: the brokers' controlled shutdowns (the supervisor SIGKILLs a broker after
# BROKER_STOP_TIMEOUT_S and then exits 1, which the test must see), then ZooKeeper's.
CLUSTER_STOP_TIMEOUT_S: Final = BROKER_STOP_TIMEOUT_S + 30.0
CLI_TIMEOUT_S: Final = 60.0
POLL_INTERVAL_S: Final = 0.1
BOOTSTRAP_LINE: Final = re.compile(r"bootstrap servers: (\S+)")
# The embedded ZooKeeper's tickTime is 2 s and a session must last at least two ticks.
SHORT_SESSION_TIMEOUT_MS: Final = 4_000

# Each test runs `riverbed cluster up` or the `riverbed` command, or a TestCluster.
pytestmark = pytest.mark.processes


def child_pids(pid: int) -> set[int]:
    """The live children of `pid`, from /proc/<pid>/stat's parent field."""
    children = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            children.add(int(entry.name))
    return children


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (e.g. a data dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                line = command_line(int(entry.name))
            except OSError:
                continue
            if text in line and alive(int(entry.name)):
                found.append(line)
    return found


class RunningCluster:
    """A `riverbed cluster up` subprocess whose stdout and stderr go to files."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.stdout_path = tmp_path / "cluster-up.out"
        self.stderr_path = tmp_path / "cluster-up.err"
        self._stdout: IO[bytes] = self.stdout_path.open("wb")
        self._stderr: IO[bytes] = self.stderr_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "riverbed.cli", "cluster", "up", *args],
            stdin=subprocess.DEVNULL,
            stdout=self._stdout,
            stderr=self._stderr,
        )

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def errors(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_for_bootstrap(self, timeout_s: float = CLUSTER_READY_TIMEOUT_S) -> str:
        """The bootstrap servers from the banner, once printed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = BOOTSTRAP_LINE.search(self.output())
            if found:
                return found.group(1)
            assert self.process.poll() is None, f"cluster up exited early:\n{self.errors()}"
            time.sleep(POLL_INTERVAL_S)
        raise AssertionError(f"no bootstrap line in {timeout_s:.0f} s:\n{self.errors()}")

    def wait_for_error_line(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            lines = [line for line in self.errors().splitlines() if text in line]
            if lines:
                return lines[0]
            time.sleep(POLL_INTERVAL_S)
        raise AssertionError(f"no stderr line with {text!r} in {timeout_s:.0f} s:\n{self.errors()}")

    def interrupt(self, timeout_s: float = CLUSTER_STOP_TIMEOUT_S) -> int:
        """SIGINT (Ctrl-C) and wait; the exit code."""
        self.process.send_signal(signal.SIGINT)
        started = time.monotonic()
        exit_code = self.process.wait(timeout=timeout_s)
        assert time.monotonic() - started < timeout_s
        return exit_code

    def kill_everything(self) -> None:
        """Teardown: SIGKILL the supervisor's children, then the supervisor."""
        if self.process.poll() is None:
            for pid in child_pids(self.process.pid):
                os.kill(pid, signal.SIGKILL)
            self.process.kill()
            self.process.wait()
        self._stdout.close()
        self._stderr.close()


@contextlib.contextmanager
def cluster_up(tmp_path: Path, *args: str) -> Iterator[RunningCluster]:
    running = RunningCluster(tmp_path, *args)
    try:
        yield running
    finally:
        running.kill_everything()


def riverbed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )


async def test_cluster_up_runs_brokers_and_stops_them_all_on_sigint(tmp_path: Path) -> None:
    base = free_port_run(3)
    data_dir = tmp_path / "cluster"
    with cluster_up(tmp_path, "--brokers", "3", "--data-dir", str(data_dir),
                    "--port-base", str(base)) as cluster:  # fmt: skip
        bootstrap = cluster.wait_for_bootstrap()
        addresses = [f"{HOST}:{base + i}" for i in range(3)]
        assert bootstrap.split(",") == addresses

        # Every broker is registered, and knows the others.
        for address in addresses:
            assert await registered_brokers(address) == {1, 2, 3}
        # A topic replicated 3 ways has every broker as a replica of every partition.
        async with Admin(bootstrap_servers=bootstrap) as admin:
            await admin.create_topic("replicated", partitions=3, replication_factor=3)
        for partition in range(3):
            state = await partition_state(bootstrap, "replicated", partition)
            assert sorted(state.replicas) == [1, 2, 3]

        # The supervisor's children: ZooKeeper and the three brokers, each with its own log.
        children = child_pids(cluster.process.pid)
        commands = [command_line(pid) for pid in children]
        assert sum("riverbed.cli broker" in c for c in commands) == 3, commands
        assert sum("ZooKeeperServerMain" in c for c in commands) == 1, commands
        assert all((data_dir / f"broker-{i}.log").stat().st_size > 0 for i in (1, 2, 3))

        # A second supervisor on the same data dir is refused (it would share ZooKeeper's files).
        second = riverbed("cluster", "up", "--brokers", "1", "--data-dir", str(data_dir),
                          "--port-base", str(free_port_run(1)))  # fmt: skip
        assert second.returncode == 1
        assert second.stderr.strip().splitlines() == [
            f"riverbed: error: data dir {data_dir} is in use by another `riverbed cluster up`"
        ]

        assert cluster.interrupt() == 0, cluster.errors()
        assert not [pid for pid in children if alive(pid)]
        assert processes_mentioning(str(data_dir)) == []
        assert "Traceback" not in cluster.errors()
        assert cluster.errors().strip().endswith("riverbed: stopped")


async def test_cluster_up_restarts_a_broker_that_died(tmp_path: Path) -> None:
    base = free_port_run(2)
    data_dir = tmp_path / "cluster"
    session = f"zookeeper.session.timeout.ms={SHORT_SESSION_TIMEOUT_MS}"
    with cluster_up(tmp_path, "--brokers", "2", "--data-dir", str(data_dir),
                    "--port-base", str(base), "--set", session) as cluster:  # fmt: skip
        cluster.wait_for_bootstrap()
        (broker_2,) = [
            pid for pid in child_pids(cluster.process.pid) if "broker.id=2" in command_line(pid)
        ]
        os.kill(broker_2, signal.SIGKILL)

        reported = cluster.wait_for_error_line("broker 2", CLI_TIMEOUT_S)
        assert reported.endswith(
            f'msg="broker 2 was killed by SIGKILL; restarting it (log: {data_dir}/broker-2.log)"'
        )
        # The new process registers as broker 2 once its old session expired.
        await wait_for(
            lambda: _listed_by(f"{HOST}:{base + 1}", {1, 2}),
            CLUSTER_READY_TIMEOUT_S,
            what="the restarted broker 2 to register",
            context=cluster.errors,
        )
        (restarted,) = [
            pid for pid in child_pids(cluster.process.pid) if "broker.id=2" in command_line(pid)
        ]
        assert restarted != broker_2

        assert cluster.interrupt() == 0, cluster.errors()
        assert processes_mentioning(str(data_dir)) == []


def test_cluster_up_bad_input_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind((HOST, 0))
        busy.listen()
        busy_port = busy.getsockname()[1]
        cases = [
            (["--brokers", "0"], "--brokers must be at least 1, got 0"),
            (["--brokers", "2", "--port-base", str(busy_port)],
             f"port {busy_port} on {HOST} is already in use"),
            (["--brokers", "1", "--data-dir", str(not_a_dir / "sub")],
             f"data dir {not_a_dir / 'sub'} is not usable"),
            (["--brokers", "1", "--zookeeper", f"{HOST}:{free_port()}",
              "--set", "zookeeper.connection.timeout.ms=2000"], "could not connect to ZooKeeper"),
            (["--brokers", "1", "--set", "num.partitions=zero"], "num.partitions"),
            (["--brokers", "1", "--set", "broker.id=7"], "broker.id is chosen per broker"),
        ]  # fmt: skip
        for number, (args, expected) in enumerate(cases):
            data_dir = tmp_path / f"case-{number}"
            if "--data-dir" not in args:
                args = [*args, "--data-dir", str(data_dir)]
            if "--port-base" not in args:
                args = [*args, "--port-base", str(free_port_run(2))]
            result = riverbed("cluster", "up", *args)
            assert result.returncode == 1, (args, result.stderr)
            # One error line; kazoo may log its reconnect attempts before it.
            lines = [line for line in result.stderr.splitlines() if " level=" not in line]
            assert len(lines) == 1, result.stderr
            assert lines[0].startswith("riverbed: error:"), result.stderr
            assert expected in lines[0], (args, lines[0])
            assert processes_mentioning(str(data_dir)) == [], args


async def test_test_cluster_kill_pause_and_restart_show_in_metadata(
    cluster_factory: ClusterFactory,
) -> None:
    cluster = await cluster_factory(3, {"zookeeper.session.timeout.ms": "2000"})
    assert await cluster.registered(1) == {1, 2, 3}

    async with Admin(bootstrap_servers=cluster.bootstrap) as admin:
        await admin.create_topic("spread", partitions=3, replication_factor=1)
    states = [await partition_state(cluster.bootstrap, "spread", p) for p in range(3)]
    assert sorted(state.leader for state in states) == [1, 2, 3]
    assert all(state.replicas == state.isr == (state.leader,) for state in states)

    # A crash: once its ZooKeeper session expires, no broker lists it.
    cluster.kill(2)
    assert cluster.running_ids == {1, 3}
    assert cluster.brokers[2].bootstrap not in cluster.bootstrap.split(",")
    await cluster.wait_registered({1, 3}, timeout_s=30)

    # Frozen: the process lives, its session expires, the others stop listing it.
    cluster.pause(3)
    await cluster.wait_for(
        lambda: _listed_by(cluster.brokers[1].bootstrap, {1}), 30, what="broker 3 to drop out"
    )
    cluster.resume(3)
    await cluster.restart(2)
    await cluster.wait_registered({1, 2, 3}, timeout_s=60)

    # A clean stop (SIGTERM: controlled shutdown) exits 0 and leaves the others' Metadata.
    assert await cluster.terminate(1) == 0
    await cluster.wait_registered({2, 3}, timeout_s=10)


async def _listed_by(address: str, expected: set[int]) -> bool:
    return await registered_brokers(address) == expected


async def test_cluster_up_tiers_its_demo_topic_to_a_directory_under_its_data_dir(
    tmp_path: Path,
) -> None:
    """What `make run` runs: the demo topic is created tiered, to the embedded cold tier."""
    data_dir = tmp_path / "cluster"
    with cluster_up(tmp_path, "--brokers", "1", "--data-dir", str(data_dir),
                    "--port-base", str(free_port_run(1)), "--demo-topic", "demo",
                    "--set", "remote.log.manager.task.interval.ms=200") as cluster:  # fmt: skip
        bootstrap = cluster.wait_for_bootstrap()
        assert f"cold tier:         file://{data_dir.resolve()}/cold" in cluster.output()
        assert "demo topic:        demo (tiered to the cold tier)" in cluster.output()
        async with Admin(bootstrap_servers=bootstrap) as admin:
            assert (await admin.describe_configs("demo"))["remote.storage.enable"].value == "true"
            assert len((await admin.describe_topic("demo")).partitions) == 3
            # Small segments, none kept locally once uploaded: it tiers within the test.
            await admin.alter_configs(
                "demo", set={"segment.bytes": "16384", "local.retention.bytes": "1"}
            )
        async with Producer(bootstrap_servers=bootstrap, linger_ms=5) as producer:
            for i in range(2_000):
                await producer.send("demo", b"%d" % i * 20, partition=0)
            await producer.flush()
        manifests = data_dir / "cold" / "demo" / "0" / "manifest"
        await wait_for(lambda: list(manifests.glob("*.json")), 30, what="a tiered segment")
        assert cluster.interrupt() == 0, cluster.errors()
