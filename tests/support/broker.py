"""Riverbed brokers for end-to-end tests, started the way a user starts one.

A `BrokerProcess` runs `python -m riverbed.cli broker ...` as a child process (the interpreter and
environment of the test run, so `PYTHONPATH=/work/devpath` tests the working tree). The broker binds
its listener only after it has registered in ZooKeeper and loaded its logs, so a TCP connect that
succeeds is the readiness signal. Its stdout and stderr go to one file per start in the test's tmp
dir, and the tail of that file is part of every failure message.

Fixtures (they need a `zk_connect` fixture: "127.0.0.1:port/chroot", one chroot per test):
- `broker_factory(settings=None, *, broker_id=1, listeners=("PLAINTEXT",)) -> BrokerProcess`:
  start a ready broker with extra `--set key=value` settings (Kafka's config names), one
  `--listen NAME://127.0.0.1:port` per listener name (`address(name)` tells its address);
- `broker`: one fresh broker per test with default settings.
Every process a fixture started is SIGKILLed at teardown, whatever the test's outcome.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Final, Protocol

import pytest

from tests.support.ports import free_port

HOST: Final = "127.0.0.1"
# A cold interpreter on a busy 2-core machine needs a few seconds; after a SIGKILL the restarted
# broker must also wait for its old ZooKeeper session to expire before it can re-register (Kafka's
# default zookeeper.session.timeout.ms is 18 s).
READY_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 20.0
PROBE_INTERVAL_S: Final = 0.05
PROBE_TIMEOUT_S: Final = 0.5
LOG_TAIL_LINES: Final = 40
PAGE_BYTES: Final = 1024  # /proc/PID/status reports VmRSS in kB


class BrokerStartError(RuntimeError):
    """The broker exited, or did not accept connections in time."""


class BrokerStopError(RuntimeError):
    """The broker did not exit within the stop timeout after SIGTERM."""


class BrokerProcess:
    """One broker process; `restart()` keeps its id, port and data dir, as an operator would."""

    def __init__(
        self,
        *,
        broker_id: int,
        zk_connect: str,
        data_dir: Path,
        log_dir: Path,
        settings: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
        listeners: Sequence[str] = ("PLAINTEXT",),
        host: str = HOST,
        command_prefix: Sequence[str] = (),
    ) -> None:
        """`host` is the address it listens on and `command_prefix` goes before its command
        line: tests/faults runs each broker in a network namespace of its own that way."""
        self.broker_id = broker_id
        self.host = host
        self.command_prefix = tuple(command_prefix)
        self.extra_args = tuple(extra_args)
        self.zk_connect = zk_connect
        self.data_dir = data_dir
        self.log_dir = log_dir
        self.settings = dict(settings or {})
        # Listener name -> port; the first listener is `port` / `bootstrap`.
        self.ports = {name: free_port() for name in listeners}
        self.port = self.ports[listeners[0]]
        self.starts = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def address(self, listener: str) -> str:
        """host:port of the listener named `listener`."""
        return f"{self.host}:{self.ports[listener]}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"broker {self.broker_id} is not started")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path:
        """Output of the current (or last) start; earlier starts keep their own files."""
        return self.log_dir / f"broker-{self.broker_id}.{self.starts}.log"

    def command(self) -> list[str]:
        settings = [
            arg for key, value in self.settings.items() for arg in ("--set", f"{key}={value}")
        ]
        return [
            *self.command_prefix,
            sys.executable,
            "-m",
            "riverbed.cli",
            "broker",
            "--id",
            str(self.broker_id),
            *(arg for name in self.ports for arg in ("--listen", f"{name}://{self.address(name)}")),
            "--data-dir",
            str(self.data_dir),
            "--zookeeper",
            self.zk_connect,
            *settings,
            *self.extra_args,
        ]

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"broker {self.broker_id} is already running")
        self._close_log()
        self.starts += 1
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self._process = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Return once the broker accepts connections; raise BrokerStartError if it never will."""
        process = self._process
        if process is None:
            raise RuntimeError(f"broker {self.broker_id} is not started")
        deadline = time.monotonic() + timeout_s
        while True:
            exit_code = process.poll()
            if exit_code is not None:
                raise BrokerStartError(
                    f"broker {self.broker_id} exited with code {exit_code} before listening on "
                    f"{self.bootstrap}\n{self.describe_log()}"
                )
            try:
                # Listeners are bound one after another: ready once every one accepts.
                for port in self.ports.values():
                    with socket.create_connection((self.host, port), timeout=PROBE_TIMEOUT_S):
                        pass
                return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"broker {self.broker_id} did not listen on {self.bootstrap} within "
                    f"{timeout_s:.0f} s\n{self.describe_log()}"
                )
            time.sleep(PROBE_INTERVAL_S)

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (clean shutdown) and wait; return the exit code. Kills it if it hangs."""
        process = self._require_process()
        process.send_signal(signal.SIGTERM)
        try:
            exit_code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BrokerStopError(
                f"broker {self.broker_id} ignored SIGTERM for {timeout_s:.0f} s (killed it)\n"
                f"{self.describe_log()}"
            ) from None
        self._close_log()
        return exit_code

    def wait_exit(self, timeout_s: float) -> int:
        """Wait for the broker to exit on its own; its exit code. BrokerStopError if it is still
        running after `timeout_s` (it is left running)."""
        process = self._require_process()
        try:
            exit_code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BrokerStopError(
                f"broker {self.broker_id} did not exit within {timeout_s:.0f} s\n"
                f"{self.describe_log()}"
            ) from None
        self._close_log()
        return exit_code

    def kill(self) -> None:
        """SIGKILL (a crash) and reap the process. Idempotent."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        self._close_log()

    def restart(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Start again on the same data dir and port (stopping cleanly first if still running)."""
        if self.running:
            self.terminate()
        self.start()
        self.wait_ready(timeout_s)

    def rss_bytes(self) -> int:
        """Resident set size of the broker process, from /proc/PID/status."""
        status = Path(f"/proc/{self.pid}/status").read_text()
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * PAGE_BYTES
        raise RuntimeError(f"no VmRSS line in /proc/{self.pid}/status")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the broker process (all its threads), from /proc."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        # After the command name: state is field 3, so utime (14) and stime (15) are at 11, 12.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def partition_dir(self, topic: str, partition: int) -> Path:
        """The directory holding one partition's segments (Kafka's `<topic>-<partition>`)."""
        name = f"{topic}-{partition}"
        # os.walk, not rglob: the broker creates and removes scratch directories (tiering's
        # work dirs, hidden) while this looks, and walk skips what vanished; hidden ones are
        # not searched at all.
        found = []
        for parent, directories, _ in os.walk(self.data_dir):
            directories[:] = [d for d in directories if not d.startswith(".")]
            if name in directories:
                found.append(Path(parent) / name)
        found.sort()
        if len(found) != 1:
            raise FileNotFoundError(
                f"expected one directory {name!r} under {self.data_dir}, found {found}"
            )
        return found[0]

    def segment_files(self, topic: str, partition: int) -> list[Path]:
        """The partition's `.log` segment files, oldest first (names are 20-digit base offsets)."""
        return sorted(self.partition_dir(topic, partition).glob("*.log"))

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as error:
            return f"(no log: {error})"
        return "\n".join(text.splitlines()[-lines:])

    def describe_log(self) -> str:
        return f"--- {self.log_path} (last {LOG_TAIL_LINES} lines) ---\n{self.log_tail()}"

    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError(f"broker {self.broker_id} is not started")
        return self._process

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class BrokerFactory(Protocol):
    def __call__(
        self,
        settings: Mapping[str, str] | None = None,
        *,
        broker_id: int = 1,
        listeners: Sequence[str] = ("PLAINTEXT",),
    ) -> BrokerProcess: ...


@pytest.fixture
def broker_factory(zk_connect: str, tmp_path: Path) -> Iterator[BrokerFactory]:
    """Start ready brokers in this test's ZooKeeper chroot; all are SIGKILLed at teardown."""
    brokers: dict[int, BrokerProcess] = {}

    def start_broker(
        settings: Mapping[str, str] | None = None,
        *,
        broker_id: int = 1,
        listeners: Sequence[str] = ("PLAINTEXT",),
    ) -> BrokerProcess:
        if broker_id in brokers:
            raise ValueError(f"broker {broker_id} already started in this test; restart() it")
        home = tmp_path / f"broker-{broker_id}"
        broker = BrokerProcess(
            broker_id=broker_id,
            zk_connect=zk_connect,
            data_dir=home / "data",
            log_dir=home,
            settings=settings,
            listeners=listeners,
        )
        brokers[broker_id] = broker
        broker.start()
        broker.wait_ready()
        return broker

    try:
        yield start_broker
    finally:
        for broker in brokers.values():
            broker.kill()
            # Shown by pytest only when the test fails ("Captured stdout teardown").
            print(broker.describe_log())


@pytest.fixture
def broker(broker_factory: BrokerFactory) -> BrokerProcess:
    """One fresh broker with default settings, its own data dir and ZooKeeper chroot."""
    return broker_factory()
