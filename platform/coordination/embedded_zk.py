"""A real standalone ZooKeeper server, run as a child process from Debian's `zookeeper` package.

Used by `riverbed cluster up` and the test fixtures. The command line is the one
Debian's `zkServer.sh start-foreground` builds (java -cp zookeeper.jar, whose manifest Class-Path
pulls in the rest of /usr/share/java), minus JMX, plus a log4j binding so the server's log is
readable when startup fails. `ZooKeeperServerMain` is what `QuorumPeerMain` falls back to for a
config without peers, so we start it directly.

Lifetime safety: the server gets its own session (process group) so a Ctrl-C aimed at the broker
does not kill ZooKeeper before the broker has deregistered; `PR_SET_PDEATHSIG` makes the kernel
SIGKILL it if the parent dies without cleaning up, and an atexit hook stops any server still
running at a normal interpreter exit. Start servers from a long-lived thread: the death signal
follows the *thread* that forked.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Final

JAVA: Final = Path("/usr/bin/java")
ZOOKEEPER_JAR: Final = Path("/usr/share/java/zookeeper.jar")
# Optional: without a binding slf4j drops every log line, and a failed start would say nothing.
LOG4J_JARS: Final = (
    Path("/usr/share/java/slf4j-log4j12.jar"),
    Path("/usr/share/java/log4j-1.2.jar"),
)
MAIN_CLASS: Final = "org.apache.zookeeper.server.ZooKeeperServerMain"
LOG4J_FILE: Final = "log4j.properties"

START_TIMEOUT_MS: Final = 30_000  # a cold JVM on a busy 2-core machine takes a few seconds
STOP_TIMEOUT_MS: Final = 10_000
PROBE_INTERVAL_MS: Final = 50
PROBE_TIMEOUT_MS: Final = 1_000
# ZooKeeper expires sessions on tick boundaries, so a dead broker is noticed up to one tick after
# its session timeout: ZooKeeper's own default tick (2 s) would add up to 2 s to every failover.
# 500 ms costs nothing measurable on a local server.
TICK_TIME_MS_DEFAULT = 500
# Kafka's default zookeeper.session.timeout.ms is 18 s; the server must allow it whatever tickTime.
SESSION_TIMEOUT_MS_MAX: Final = 60_000
# Tests open many sessions from 127.0.0.1; ZooKeeper's default limit per client IP is 60.
CLIENT_CONNECTIONS_MAX: Final = 1_000
LOG_TAIL_LINES: Final = 8
JVM_FLAGS: Final = ("-Xms16m", "-Xmx256m", "-XX:+UseSerialGC", "-Djava.net.preferIPv4Stack=true")

_PR_SET_PDEATHSIG: Final = 1
_running: set[EmbeddedZooKeeper] = set()


class ZooKeeperNotInstalledError(RuntimeError):
    """Debian's zookeeper package (or Java) is missing on this machine."""


class ZooKeeperStartError(RuntimeError):
    """The server process exited or was not serving clients in time."""


def is_available() -> bool:
    """True if Java and Debian's ZooKeeper jars are installed."""
    return JAVA.exists() and ZOOKEEPER_JAR.exists()


def require_available() -> None:
    if not is_available():
        raise ZooKeeperNotInstalledError(
            f"ZooKeeper is not installed (need {JAVA} and {ZOOKEEPER_JAR} from Debian's "
            "`zookeeper` package): run `make setup`"
        )


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def ruok(host: str, port: int, timeout_ms: int = PROBE_TIMEOUT_MS) -> bool:
    """ZooKeeper's four-letter health probe: True once the server answers `imok`."""
    try:
        with socket.create_connection((host, port), timeout=timeout_ms / 1000) as sock:
            sock.sendall(b"ruok")
            sock.shutdown(socket.SHUT_WR)
            return sock.recv(16) == b"imok"
    except OSError:
        return False


def serving(host: str, port: int, timeout_ms: int = PROBE_TIMEOUT_MS) -> bool:
    """True once the server serves clients. `ruok` answers `imok` as soon as the process
    listens, before it has loaded its data; a client connecting then is dropped, and one
    whose retries run out meanwhile fails. `srvr` says "not currently serving" until then."""
    try:
        with socket.create_connection((host, port), timeout=timeout_ms / 1000) as sock:
            sock.sendall(b"srvr")
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
            return answer.startswith(b"Zookeeper version:")
    except OSError:
        return False


def _death_signal_setter() -> Callable[[int, int], int] | None:
    # Resolved before fork: the child must only make the one syscall between fork and exec.
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    prctl: Callable[[int, int], int] = ctypes.CDLL(name, use_errno=True).prctl
    return prctl


_prctl = _death_signal_setter()


def die_with_parent() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class EmbeddedZooKeeper:
    """One standalone ZooKeeper server whose files all live under `data_dir`.

    `data_dir/zoo.cfg` and `data_dir/log4j.properties` are rewritten on each start;
    `data_dir/data/` holds snapshots and the transaction log, so stop() then start() keeps every
    znode (sessions expire while it is down, as with a real outage); `data_dir/zookeeper.log`
    collects the server's output across restarts. The port is chosen once, so `connect_string`
    stays valid across restarts.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        tick_time_ms: int = TICK_TIME_MS_DEFAULT,
        fsync: bool = True,
    ) -> None:
        if tick_time_ms <= 0 or 2 * tick_time_ms > SESSION_TIMEOUT_MS_MAX:
            raise ValueError(f"tick_time_ms must be in 1..{SESSION_TIMEOUT_MS_MAX // 2}")
        self.data_dir = data_dir
        self.host = host
        self.port = port if port is not None else free_port(host)
        self.tick_time_ms = tick_time_ms
        self.fsync = fsync
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "zookeeper.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_ms: int = START_TIMEOUT_MS) -> None:
        """Start the server and return once it serves clients; raise ZooKeeperStartError if
        not."""
        require_available()
        if self._process is not None:
            raise RuntimeError(f"ZooKeeper on {self.connect_string} is already started")
        config_path = self._write_config()
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            self._command(config_path),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.data_dir,
            start_new_session=True,
            preexec_fn=die_with_parent,  # one pre-resolved syscall: safe despite kazoo's threads
        )
        _running.add(self)
        try:
            self._wait_until_ready(timeout_ms)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout_ms: int = STOP_TIMEOUT_MS) -> None:
        """SIGTERM the server's process group, SIGKILL it after `timeout_ms`. Idempotent."""
        process, self._process = self._process, None
        _running.discard(self)
        if process is not None:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=timeout_ms / 1000)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> EmbeddedZooKeeper:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _command(self, config_path: Path) -> list[str]:
        return server_command(MAIN_CLASS, config_path)

    def _write_config(self) -> Path:
        snapshot_dir = self.data_dir / "data"
        snapshot_dir.mkdir(parents=True, exist_ok=True)
        config = {
            "tickTime": self.tick_time_ms,
            "dataDir": snapshot_dir,
            "clientPort": self.port,
            "clientPortAddress": self.host,
            "maxClientCnxns": CLIENT_CONNECTIONS_MAX,
            "minSessionTimeout": 2 * self.tick_time_ms,
            "maxSessionTimeout": SESSION_TIMEOUT_MS_MAX,
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "ruok,srvr,stat,mntr,cons",
            "forceSync": "yes" if self.fsync else "no",
            "preAllocSize": 4096,  # KiB; the 64 MiB default is for production transaction logs
        }
        return write_server_files(self.data_dir, config)

    def _wait_until_ready(self, timeout_ms: int) -> None:
        process = self._process
        if process is None:
            raise RuntimeError("ZooKeeper process is not started")
        deadline = time.monotonic() + timeout_ms / 1000
        while not serving(self.host, self.port):
            exit_code = process.poll()
            if exit_code is not None:
                raise ZooKeeperStartError(
                    f"ZooKeeper on {self.connect_string} exited with code {exit_code}; "
                    f"log tail: {self._log_tail()}"
                )
            if time.monotonic() > deadline:
                raise ZooKeeperStartError(
                    f"ZooKeeper on {self.connect_string} was not serving within "
                    f"{timeout_ms} ms; log tail: {self._log_tail()}"
                )
            time.sleep(PROBE_INTERVAL_MS / 1000)

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError as error:
            return f"(no log: {error})"
        # Java stack frames ("at ...", "... 5 more") crowd out the lines that say what went wrong.
        messages = [line.strip() for line in lines if not line.strip().startswith(("at ", "..."))]
        return " | ".join(messages[-LOG_TAIL_LINES:]) or "(empty log)"


def server_command(
    main_class: str, config_path: Path, jvm_properties: Sequence[str] = ()
) -> list[str]:
    """The java command line of a ZooKeeper server whose zoo.cfg and log4j.properties
    `write_server_files` wrote into `config_path`'s directory."""
    jars = [ZOOKEEPER_JAR, *(jar for jar in LOG4J_JARS if jar.exists())]
    return [
        str(JAVA),
        *JVM_FLAGS,
        f"-Dlog4j.configuration=file:{config_path.parent / LOG4J_FILE}",
        "-Dzookeeper.jmx.log4j.disable=true",
        *jvm_properties,
        "-cp",
        os.pathsep.join(str(jar) for jar in jars),
        main_class,
        str(config_path),
    ]


def write_server_files(directory: Path, config: Mapping[str, object]) -> Path:
    """Write zoo.cfg (`config`) and a log4j.properties that logs to the console into
    `directory`; returns zoo.cfg's path."""
    config_path = directory / "zoo.cfg"
    config_path.write_text("".join(f"{key}={value}\n" for key, value in config.items()))
    (directory / LOG4J_FILE).write_text(
        "log4j.rootLogger=INFO, CONSOLE\n"
        "log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n"
        "log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n"
        "log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1} - %m%n\n"
    )
    return config_path


def _signal_group(process: subprocess.Popen[bytes], signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


@atexit.register
def _stop_all() -> None:
    for server in list(_running):
        server.stop()
