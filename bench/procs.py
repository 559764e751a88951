"""Processes the benchmarks start as a user would: a Riverbed broker, redis-server, ZooKeeper.

Readiness is "the port accepts a TCP connection": the broker binds its listener only once it is
ready to serve, so the time from spawning to the first accepted connection is its startup time.
"""

from __future__ import annotations

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
# Between checks that a crashed broker's ZooKeeper registration is gone.
REGISTRATION_POLL_S = 0.05
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


class Broker:
    """One Riverbed broker started through its command line, restartable on the same port."""

    def __init__(
        self,
        data_dir: Path,
        zookeeper: str,
        settings: Mapping[str, str],
        log_path: Path,
        broker_id: int = 1,
    ) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self._zookeeper = zookeeper
        self._settings = dict(settings)
        self._log_path = log_path
        self._broker_id = broker_id
        self._process: subprocess.Popen[bytes] | None = None
        # One log per broker and run, kept after the run (the data dir is not) for post-mortems.
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_bytes(b"")

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self._running().pid

    def command(self) -> list[str]:
        command = [
            sys.executable, "-m", "riverbed.cli", "broker",
            "--id", str(self._broker_id),
            "--listen", self.bootstrap,
            "--data-dir", str(self.data_dir),
            "--zookeeper", self._zookeeper,
        ]  # fmt: skip
        for key, value in self._settings.items():
            command += ["--set", f"{key}={value}"]
        return command

    def start(self, timeout_s: float) -> float:
        """Spawn the broker; returns seconds from spawn to its port accepting connections."""
        if self._process is not None and self._process.poll() is None:
            raise ProcessFailed("broker already running")
        with self._log_path.open("ab") as log_file:
            started = time.perf_counter()
            # The working directory is the data dir's parent, never the repository: from there
            # `python -m` would put the source tree first on sys.path.
            self._process = subprocess.Popen(
                self.command(),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir.parent,
            )
        wait_until_accepting(self._process, self.port, timeout_s, self._log_path)
        return time.perf_counter() - started

    def terminate(self) -> int:
        """Clean shutdown (SIGTERM); returns the exit code."""
        return stop(self._running(), signal.SIGTERM)

    def kill(self) -> None:
        """Crash (SIGKILL): no shutdown code runs."""
        stop(self._running(), signal.SIGKILL)

    def wait_until_deregistered(self, timeout_s: float) -> float:
        """Wait until ZooKeeper dropped this broker's registration (its session expired after a
        crash); returns the seconds waited. A broker restarted before that waits for it itself."""
        from kazoo.client import KazooClient
        from riverbed.coordination.layout import broker_path

        started = time.perf_counter()
        client = KazooClient(hosts=self._zookeeper)
        client.start(timeout=timeout_s)
        try:
            while client.exists(broker_path(self._broker_id)) is not None:
                if time.perf_counter() - started > timeout_s:
                    raise ProcessFailed(
                        f"broker {self._broker_id} still registered after {timeout_s} s"
                    )
                time.sleep(REGISTRATION_POLL_S)
        finally:
            client.stop()
            client.close()
        return time.perf_counter() - started

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            stop(self._process, signal.SIGKILL)

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            raise ProcessFailed(f"broker is not running\n{log_tail(self._log_path)}")
        return self._process


@contextmanager
def zookeeper(data_dir: Path) -> Iterator[str]:
    """An embedded ZooKeeper for the broker; yields its connect string."""
    from riverbed.coordination.embedded_zk import EmbeddedZooKeeper

    data_dir.mkdir(parents=True, exist_ok=True)
    with EmbeddedZooKeeper(data_dir) as zk:
        yield zk.connect_string
