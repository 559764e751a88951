"""Processes the benchmarks start as a user would: Riverbed brokers (alone or as a cluster),
redis-server, ZooKeeper.

Readiness is "the port accepts a TCP connection": the broker binds its listener only once it is
ready to serve, so the time from spawning to the first accepted connection is its startup time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

HOST = "127.0.0.1"
# Between connection attempts while waiting for a port; small next to any startup we measure.
CONNECT_POLL_S = 0.005
# Between checks of registrations: gone from ZooKeeper after a crash, listed by brokers once up.
REGISTRATION_POLL_S = 0.05
# One Metadata request while waiting for brokers to list each other.
METADATA_TIMEOUT_MS = 5_000
# ZooKeeper's tickTime (the embedded server's default, set explicitly because results depend on
# it): the server expires sessions on tick boundaries, so a dead broker's session ends between
# zookeeper.session.timeout.ms and one tick later after its last heartbeat.
ZOOKEEPER_TICK_TIME_MS = 500
# A clean shutdown that takes longer than this is reported as a failure, not waited out.
SHUTDOWN_TIMEOUT_S = 60.0
# Lines of a process's log quoted when it fails to start.
LOG_TAIL_LINES = 40
_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


class ProcessFailed(RuntimeError):
    """A process the benchmark needs exited or did not become ready."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_until_accepting(
    process: subprocess.Popen[bytes], port: int, timeout_s: float, log_path: Path
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise ProcessFailed(
                f"{process.args!r} exited with {process.returncode} before accepting on "
                f"port {port}\n{log_tail(log_path)}"
            )
        try:
            with socket.create_connection((HOST, port), timeout=1.0):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ProcessFailed(
                f"port {port} not accepting after {timeout_s} s\n{log_tail(log_path)}"
            )
        time.sleep(CONNECT_POLL_S)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from /proc (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS_PER_S


def log_tail(log_path: Path) -> str:
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {log_path})"
    return "\n".join(lines[-LOG_TAIL_LINES:])


def stop(process: subprocess.Popen[bytes], sig: signal.Signals) -> int:
    """Send `sig` and wait for the exit; returns the exit code."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout=SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise ProcessFailed(
            f"{process.args!r} ignored {sig.name} for {SHUTDOWN_TIMEOUT_S} s"
        ) from None


class RegistrationWatch:
    """When ZooKeeper deleted a broker's registration: at a clean shutdown, or when the session
    of a crashed broker expired."""

    def __init__(self) -> None:
        self.deleted_at: float | None = None  # time.perf_counter(); None while it exists


class Broker:
    """One Riverbed broker started through its command line, restartable on the same port."""

    def __init__(
        self,
        data_dir: Path,
        zookeeper: str,
        settings: Mapping[str, str],
        log_path: Path,
        broker_id: int = 1,
        listeners: tuple[str, ...] = ("PLAINTEXT",),
    ) -> None:
        self.data_dir = data_dir
        # Listener name -> port; the first is `port` / `bootstrap`.
        self.ports = {name: free_port() for name in listeners}
        self.port = self.ports[listeners[0]]
        self._zookeeper = zookeeper
        self._settings = dict(settings)
        self._log_path = log_path
        self.broker_id = broker_id
        self._process: subprocess.Popen[bytes] | None = None
        self._spawned_at = 0.0
        # One log per broker and run, kept after the run (the data dir is not) for post-mortems.
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_bytes(b"")

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def address(self, listener: str) -> str:
        return f"{HOST}:{self.ports[listener]}"

    @property
    def pid(self) -> int:
        return self._running().pid

    def command(self) -> list[str]:
        command = [
            sys.executable, "-m", "riverbed.cli", "broker",
            "--id", str(self.broker_id),
            *(a for name in self.ports for a in ("--listen", f"{name}://{self.address(name)}")),
            "--data-dir", str(self.data_dir),
            "--zookeeper", self._zookeeper,
        ]  # fmt: skip
        for key, value in self._settings.items():
            command += ["--set", f"{key}={value}"]
        return command

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float) -> float:
        """Spawn the broker; returns seconds from spawn to its port accepting connections."""
        self.spawn()
        return self.wait_ready(timeout_s)

    def spawn(self) -> None:
        """Start the broker process and return at once (several brokers start side by side)."""
        if self.running:
            raise ProcessFailed("broker already running")
        with self._log_path.open("ab") as log_file:
            self._spawned_at = time.perf_counter()
            # The working directory is the data dir's parent, never the repository: from there
            # `python -m` would put the source tree first on sys.path.
            self._process = subprocess.Popen(
                self.command(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir.parent,
            )

    def wait_ready(self, timeout_s: float) -> float:
        """Wait for the spawned broker's port; returns seconds from spawn to accepting."""
        for port in self.ports.values():  # listeners are bound one after another
            wait_until_accepting(self._spawned(), port, timeout_s, self._log_path)
        return time.perf_counter() - self._spawned_at

    def terminate(self) -> int:
        """Clean shutdown (SIGTERM); returns the exit code."""
        return stop(self._running(), signal.SIGTERM)

    def kill(self) -> None:
        """Crash (SIGKILL): no shutdown code runs."""
        stop(self._running(), signal.SIGKILL)

    def send_signal(self, sig: signal.Signals) -> None:
        """Send `sig` and return at once, e.g. to measure what clients see meanwhile; then
        `wait_exit()`."""
        self._running().send_signal(sig)

    def wait_exit(self) -> int:
        """Wait for a signalled broker to exit; returns the exit code."""
        process = self._spawned()
        try:
            return process.wait(timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise ProcessFailed(
                f"broker {self.broker_id} still running {SHUTDOWN_TIMEOUT_S} s after a signal"
            ) from None

    def wait_until_deregistered(self, timeout_s: float) -> float:
        """Wait until ZooKeeper dropped this broker's registration (its session expired after a
        crash); returns the seconds waited. A broker restarted before that waits for it itself."""
        from kazoo.client import KazooClient
        from riverbed.coordination.layout import broker_path

        started = time.perf_counter()
        client = KazooClient(hosts=self._zookeeper)
        client.start(timeout=timeout_s)
        try:
            while client.exists(broker_path(self.broker_id)) is not None:
                if time.perf_counter() - started > timeout_s:
                    raise ProcessFailed(
                        f"broker {self.broker_id} still registered after {timeout_s} s"
                    )
                time.sleep(REGISTRATION_POLL_S)
        finally:
            client.stop()
            client.close()
        return time.perf_counter() - started

    @contextmanager
    def registration_watch(self, timeout_s: float) -> Iterator[RegistrationWatch]:
        """Watch this (registered) broker's ZooKeeper registration while the block runs."""
        from kazoo.client import KazooClient
        from kazoo.protocol.states import EventType, WatchedEvent
        from riverbed.coordination.layout import broker_path

        watch = RegistrationWatch()

        def on_event(event: WatchedEvent) -> None:  # on kazoo's thread; one event at most
            if event.type == EventType.DELETED:
                watch.deleted_at = time.perf_counter()

        client = KazooClient(hosts=self._zookeeper)
        client.start(timeout=timeout_s)
        try:
            if client.exists(broker_path(self.broker_id), watch=on_event) is None:
                raise ProcessFailed(f"broker {self.broker_id} is not registered")
            yield watch
        finally:
            client.stop()
            client.close()

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            stop(self._process, signal.SIGKILL)

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            raise ProcessFailed(f"broker is not running\n{log_tail(self._log_path)}")
        return self._process

    def _spawned(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise ProcessFailed(f"broker {self.broker_id} was never started")
        return self._process


class Cluster:
    """Brokers with ids 1..`size` sharing one ZooKeeper connect string (give each cluster a chroot
    of its own) and `settings`, each its own process with a data dir under `data_dir`."""

    def __init__(
        self,
        size: int,
        data_dir: Path,
        zookeeper: str,
        settings: Mapping[str, str],
        log_dir: Path,
        name: str,
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one broker, got {size}")
        self.brokers: dict[int, Broker] = {}
        for broker_id in range(1, size + 1):
            broker_dir = data_dir / f"broker-{broker_id}"
            broker_dir.mkdir(parents=True)
            log_path = log_dir / f"{name}-broker-{broker_id}.log"
            self.brokers[broker_id] = Broker(broker_dir, zookeeper, settings, log_path, broker_id)

    @property
    def bootstrap(self) -> str:
        """Every broker's address; clients skip the ones that are down."""
        return ",".join(broker.bootstrap for broker in self.brokers.values())

    @property
    def pids(self) -> dict[int, int]:
        return {i: broker.pid for i, broker in self.brokers.items() if broker.running}

    def start(self, timeout_s: float) -> None:
        """Start every broker side by side; return once each one's Metadata lists all of them."""
        for broker in self.brokers.values():
            broker.spawn()
        for broker in self.brokers.values():
            broker.wait_ready(timeout_s)
        self.wait_registered(timeout_s)

    def restart(self, broker_id: int, timeout_s: float) -> float:
        """Start a stopped broker again (same id, port and data dir); returns its startup time,
        after which every running broker lists every running broker."""
        startup_s = self.brokers[broker_id].start(timeout_s)
        self.wait_registered(timeout_s)
        return startup_s

    def wait_registered(self, timeout_s: float) -> None:
        """Wait until every running broker's Metadata lists exactly the running brokers."""
        from riverbed.cli.local_cluster import metadata_broker_ids
        from riverbed.protocol.errors import KafkaError

        running = {i: broker for i, broker in self.brokers.items() if broker.running}
        expected = frozenset(running)
        deadline = time.monotonic() + timeout_s
        listed: dict[int, frozenset[int] | str] = {}
        while True:
            for broker_id, broker in running.items():
                try:
                    listed[broker_id] = asyncio.run(
                        metadata_broker_ids(HOST, broker.port, METADATA_TIMEOUT_MS)
                    )
                except (OSError, TimeoutError, KafkaError) as error:
                    listed[broker_id] = str(error)
            if all(view == expected for view in listed.values()):
                return
            if time.monotonic() > deadline:
                raise ProcessFailed(
                    f"brokers {sorted(expected)} not all listed by each other after {timeout_s} "
                    f"s: {listed}"
                )
            time.sleep(REGISTRATION_POLL_S)

    def stop(self) -> dict[int, int]:
        """SIGTERM every running broker at once (each does a controlled shutdown) and wait;
        returns each one's exit code."""
        running = {i: broker for i, broker in self.brokers.items() if broker.running}
        for broker in running.values():
            broker.send_signal(signal.SIGTERM)
        return {i: broker.wait_exit() for i, broker in running.items()}

    def close(self) -> None:
        """SIGKILL whatever still runs. Idempotent."""
        for broker in self.brokers.values():
            broker.close()


@contextmanager
def zookeeper(data_dir: Path) -> Iterator[str]:
    """An embedded ZooKeeper for the broker; yields its connect string."""
    from riverbed.coordination.embedded_zk import EmbeddedZooKeeper

    data_dir.mkdir(parents=True, exist_ok=True)
    with EmbeddedZooKeeper(data_dir, tick_time_ms=ZOOKEEPER_TICK_TIME_MS) as zk:
        yield zk.connect_string
