"""A ZooKeeper ensemble of real Debian ZooKeeper servers (QuorumPeerMain), for fault tests.

Each member is `java ... org.apache.zookeeper.server.quorum.QuorumPeerMain zoo.cfg`, run as
riverbed.coordination.embedded_zk runs its standalone server (same Java, jars, JVM flags, log4j
setup, death signal), with a zoo.cfg listing every member as `server.<sid>=host:peer:election`.
A member binds its client, peer and election ports on its own `host` only
(quorumListenOnAllIPs=false), and its command line starts with a `prefix` of the caller's, so
a network fault helper can run each member in a network namespace of its own:

    Ensemble([MemberSpec("198.18.3.2", ["ip", "netns", "exec", "ns1"]), ...], data_dir)

On loopback, `loopback_members(3)` gives three members on 127.0.0.1 with ports of their own.
The test process must reach every member's client port: the probes (`srvr`) and the
connect strings go there directly.

Members are numbered by their ZooKeeper server id (`sid`, 1..N, the `myid` file). Each has its
files under `data_dir/zk-<sid>/`: zoo.cfg, log4j.properties, zookeeper.log (kept across
restarts) and data/ (myid, snapshots, transaction logs, epochs), which `wipe()` replaces with
a data/ holding only myid: the member comes back with an empty database, as after a disk
replacement, and syncs everything from the leader. A wipe is outside ZooKeeper's fault model: a
wiped member votes with an empty history, and a write is only sure to survive while a member
that holds it is in every quorum. So wipe one member at a time, let it sync (`wait_quorum()`:
a follower serves only once synced) before wiping the next, and fail nothing else meanwhile:
with a second member down or lagging, the wiped one and that one are a quorum without the data.

Lifetime: like embedded_zk, each member is a process group of its own (a Ctrl-C aimed at the
test does not reach it first), the kernel SIGKILLs it when the thread that started it ends
(PR_SET_PDEATHSIG: start members from a long-lived thread), and close() (the context exit, or
an atexit hook at the latest) kills every member still running.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from riverbed.coordination.embedded_zk import (
    CLIENT_CONNECTIONS_MAX,
    LOG_TAIL_LINES,
    SESSION_TIMEOUT_MS_MAX,
    STOP_TIMEOUT_MS,
    TICK_TIME_MS_DEFAULT,
    die_with_parent,
    require_available,
    server_command,
    write_server_files,
)

from tests.support.ports import free_port

MAIN_CLASS: Final = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
STOP_WAIT_S: Final = 5.0
STOP_POLL_S: Final = 0.01
# ZooKeeper's standard ports: members in network namespaces of their own can all use them.
CLIENT_PORT_DEFAULT: Final = 2181
PEER_PORT_DEFAULT: Final = 2888
ELECTION_PORT_DEFAULT: Final = 3888
# initLimit bounds how long a follower may take to connect to a new leader and sync from it: a
# wiped member's snapshot is small, but a cold JVM on a busy 2-core machine is slow (5 s).
INIT_LIMIT_TICKS_DEFAULT: Final = 10
# syncLimit is how long a follower may go unheard before the leader drops it (and the other
# way round): short for quick failovers, above the 0.4-0.6 s stalls CI hosts have (2.5 s).
SYNC_LIMIT_TICKS_DEFAULT: Final = 5
# ZooKeeper waits up to 5 s to open an election connection to a peer, and a member looking for
# a leader backs off up to 60 s between notification rounds: after a long partition it would
# then take a minute to notice the others are back. A LAN (or a veth pair) needs neither.
ELECTION_CONNECT_TIMEOUT_MS: Final = 1_000
NOTIFICATION_INTERVAL_MS_MAX: Final = 2_000
QUORUM_TIMEOUT_S_DEFAULT: Final = 60.0
PROBE_TIMEOUT_S: Final = 1.0
PROBE_INTERVAL_S: Final = 0.1
PROBE_ANSWER_BYTES_MAX: Final = 64 * 1024
MEMBERS_MAX: Final = 9  # more than a fault test can run on two cores
# The transaction log grows by this much at a time (KiB); 64 MiB is for production disks.
PREALLOC_KIB: Final = 4096

_running: set[Member] = set()


class MemberState(enum.Enum):
    STOPPED = "stopped"
    RUNNING = "running"
    PAUSED = "paused"  # SIGSTOPped: alive to the kernel, silent to its peers


class EnsembleError(RuntimeError):
    """A member exited, or the ensemble did not reach the state asked for in time."""


@dataclass(frozen=True)
class MemberSpec:
    """Where a member listens, and what its command line starts with (`ip netns exec NS`)."""

    host: str
    prefix: Sequence[str] = ()
    client_port: int = CLIENT_PORT_DEFAULT
    peer_port: int = PEER_PORT_DEFAULT
    election_port: int = ELECTION_PORT_DEFAULT

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", tuple(self.prefix))  # a list from the caller is fine
        ports = (self.client_port, self.peer_port, self.election_port)
        if not all(0 < port < 65_536 for port in ports) or len(set(ports)) != len(ports):
            raise ValueError(f"{self.host}: ports must be distinct and in 1..65535: {ports}")

    @property
    def endpoints(self) -> tuple[tuple[str, int], ...]:
        return tuple((self.host, port) for port in self.ports)

    @property
    def ports(self) -> tuple[int, int, int]:
        return (self.client_port, self.peer_port, self.election_port)


@dataclass(frozen=True)
class MemberStatus:
    """What a member's `srvr` says about itself while it serves clients."""

    mode: str  # "leader", "follower", "observer" or "standalone"
    zxid: int
    node_count: int

    @property
    def epoch(self) -> int:
        """The leader epoch of the last transaction it has (the zxid's high 32 bits)."""
        return self.zxid >> 32


@dataclass(frozen=True)
class QuorumConfig:
    tick_time_ms: int = TICK_TIME_MS_DEFAULT
    init_limit_ticks: int = INIT_LIMIT_TICKS_DEFAULT
    sync_limit_ticks: int = SYNC_LIMIT_TICKS_DEFAULT
    fsync: bool = True
    servers: tuple[tuple[int, MemberSpec], ...] = field(default=())


def loopback_members(count: int = 3) -> list[MemberSpec]:
    """`count` members on 127.0.0.1, each with three ports of its own."""
    return [
        MemberSpec("127.0.0.1", (), free_port(), free_port(), free_port()) for _ in range(count)
    ]


class Member:
    """One ZooKeeper server of an ensemble. Not thread-safe: drive it from one thread."""

    def __init__(self, sid: int, spec: MemberSpec, directory: Path, config: QuorumConfig) -> None:
        self.sid = sid
        self.spec = spec
        self.directory = directory
        self._config = config
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._paused = False

    def __repr__(self) -> str:
        return f"Member(sid={self.sid}, {self.connect_string}, {self.state.value})"

    @property
    def connect_string(self) -> str:
        return f"{self.spec.host}:{self.spec.client_port}"

    @property
    def data_path(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "zookeeper.log"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def state(self) -> MemberState:
        if self._process is None:
            return MemberState.STOPPED
        return MemberState.PAUSED if self._paused else MemberState.RUNNING

    def start(self) -> None:
        """Start the server; it serves once a quorum has formed (Ensemble.wait_quorum)."""
        require_available()
        if self._process is not None:
            raise RuntimeError(f"{self!r} is already started")
        config_path = self._write_files()
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            [*self.spec.prefix, *self._command(config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.directory,
            start_new_session=True,
            preexec_fn=die_with_parent,  # one pre-resolved syscall: safe with kazoo's threads
        )
        self._paused = False
        _running.add(self)

    def stop(self, timeout_ms: int = STOP_TIMEOUT_MS) -> None:
        """SIGTERM the member (SIGKILL after `timeout_ms`): a clean shutdown. Idempotent."""
        process = self._process
        if process is None:
            return
        self._signal(signal.SIGTERM)
        if self._paused:
            self._signal(signal.SIGCONT)  # a stopped process only handles SIGTERM once running
        try:
            process.wait(timeout=timeout_ms / 1000)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            process.wait()
        self._forget()

    def kill(self) -> None:
        """SIGKILL the member: a crash. Idempotent."""
        process = self._process
        if process is None:
            return
        self._signal(signal.SIGKILL)
        process.wait()
        self._forget()

    def pause(self) -> None:
        """SIGSTOP the member: its connections stay open and nothing answers on them. Returns
        once every thread of it is stopped: the signal is delivered asynchronously, and a JVM
        thread still running for a moment answered a probe right after the kill(2)."""
        self._require_started()
        self._signal(signal.SIGSTOP)
        self._paused = True
        assert self._process is not None
        deadline = time.monotonic() + STOP_WAIT_S
        while not _all_threads_stopped(self._process.pid):
            if time.monotonic() > deadline:
                raise EnsembleError(f"{self!r} not stopped {STOP_WAIT_S} s after SIGSTOP")
            time.sleep(STOP_POLL_S)

    def resume(self) -> None:
        self._require_started()
        self._signal(signal.SIGCONT)
        self._paused = False

    def wipe(self) -> None:
        """Replace the member's database by an empty one (keeping its myid), as after a disk
        replacement. The member must be stopped."""
        if self._process is not None:
            raise RuntimeError(f"stop or kill {self!r} before wiping it")
        shutil.rmtree(self.data_path, ignore_errors=True)
        self._write_myid()

    def restart(self, *, wipe: bool = False) -> None:
        """stop(), wipe() if asked, start()."""
        self.stop()
        if wipe:
            self.wipe()
        self.start()

    def status(self, timeout_s: float = PROBE_TIMEOUT_S) -> MemberStatus | None:
        """The member's own view (`srvr`), or None if it does not serve clients now (not
        running, looking for a leader, syncing, paused, unreachable)."""
        answer = four_letter_word(self.spec.host, self.spec.client_port, "srvr", timeout_s)
        return _parse_srvr(answer) if answer is not None else None

    def check_alive(self) -> None:
        """Raise EnsembleError if the member was started and has exited since."""
        if self._process is not None and self._process.poll() is not None:
            code = self._process.returncode
            raise EnsembleError(f"{self!r} exited with code {code}; log tail: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError as error:
            return f"(no log: {error})"
        messages = [line.strip() for line in lines if not line.strip().startswith(("at ", "..."))]
        return " | ".join(messages[-LOG_TAIL_LINES:]) or "(empty log)"

    def _require_started(self) -> None:
        if self._process is None:
            raise RuntimeError(f"{self!r} is not started")

    def _signal(self, signum: signal.Signals) -> None:
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signum)

    def _forget(self) -> None:
        self._process = None
        self._paused = False
        _running.discard(self)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _command(self, config_path: Path) -> list[str]:
        properties = (
            f"-Dzookeeper.cnxTimeout={ELECTION_CONNECT_TIMEOUT_MS}",
            f"-Dzookeeper.fastleader.maxNotificationInterval={NOTIFICATION_INTERVAL_MS_MAX}",
        )
        return server_command(MAIN_CLASS, config_path, properties)

    def _write_myid(self) -> None:
        self.data_path.mkdir(parents=True, exist_ok=True)
        (self.data_path / "myid").write_text(f"{self.sid}\n")

    def _write_files(self) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        if not (self.data_path / "myid").exists():
            self._write_myid()
        tick_time_ms = self._config.tick_time_ms
        config: dict[str, object] = {
            "tickTime": tick_time_ms,
            "initLimit": self._config.init_limit_ticks,
            "syncLimit": self._config.sync_limit_ticks,
            "dataDir": self.data_path,
            "clientPort": self.spec.client_port,
            "clientPortAddress": self.spec.host,
            "quorumListenOnAllIPs": "false",
            "maxClientCnxns": CLIENT_CONNECTIONS_MAX,
            "minSessionTimeout": 2 * tick_time_ms,
            "maxSessionTimeout": SESSION_TIMEOUT_MS_MAX,
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "*",
            "forceSync": "yes" if self._config.fsync else "no",
            "preAllocSize": PREALLOC_KIB,
        }
        for sid, spec in self._config.servers:
            config[f"server.{sid}"] = f"{spec.host}:{spec.peer_port}:{spec.election_port}"
        return write_server_files(self.directory, config)


class Ensemble:
    """N ZooKeeper members forming one quorum. As a context manager: starts every member,
    waits for a quorum, and kills every member at exit."""

    def __init__(
        self,
        members: Sequence[MemberSpec],
        data_dir: Path,
        *,
        tick_time_ms: int = TICK_TIME_MS_DEFAULT,
        init_limit_ticks: int = INIT_LIMIT_TICKS_DEFAULT,
        sync_limit_ticks: int = SYNC_LIMIT_TICKS_DEFAULT,
        fsync: bool = True,
    ) -> None:
        if not 1 <= len(members) <= MEMBERS_MAX:
            raise ValueError(f"an ensemble has 1..{MEMBERS_MAX} members, not {len(members)}")
        endpoints = [endpoint for spec in members for endpoint in spec.endpoints]
        if len(set(endpoints)) != len(endpoints):
            raise ValueError(f"two members share a host and port: {endpoints}")
        if tick_time_ms <= 0 or 2 * tick_time_ms > SESSION_TIMEOUT_MS_MAX:
            raise ValueError(f"tick_time_ms must be in 1..{SESSION_TIMEOUT_MS_MAX // 2}")
        config = QuorumConfig(
            tick_time_ms,
            init_limit_ticks,
            sync_limit_ticks,
            fsync,
            tuple(enumerate(members, start=1)),
        )
        self.data_dir = data_dir
        self.members: tuple[Member, ...] = tuple(
            Member(sid, spec, data_dir / f"zk-{sid}", config) for sid, spec in config.servers
        )

    @property
    def connect_string(self) -> str:
        """Every member, for clients that should fail over between them."""
        return ",".join(member.connect_string for member in self.members)

    def member(self, sid: int) -> Member:
        if not 1 <= sid <= len(self.members):
            raise KeyError(f"no member with sid {sid}")
        return self.members[sid - 1]

    def start(self) -> None:
        """Start every stopped member (without waiting: see wait_quorum)."""
        for member in self.members:
            if member.state is MemberState.STOPPED:
                member.start()

    def close(self) -> None:
        """Kill every member. Idempotent."""
        for member in self.members:
            member.kill()

    def statuses(self, members: Iterable[Member] | None = None) -> dict[int, MemberStatus | None]:
        chosen = self.members if members is None else tuple(members)
        return {member.sid: member.status() for member in chosen}

    def leader(self) -> Member | None:
        """The running member that says it leads; if a cut-off old leader still says so too,
        the one of the newest epoch."""
        leaders = [
            (status.epoch, member)
            for member in self.members
            if member.state is MemberState.RUNNING
            and (status := member.status()) is not None
            and status.mode in ("leader", "standalone")
        ]
        return max(leaders, key=lambda pair: pair[0])[1] if leaders else None

    def wait_quorum(
        self,
        timeout_s: float = QUORUM_TIMEOUT_S_DEFAULT,
        members: Iterable[Member] | None = None,
    ) -> Member:
        """Wait until one of `members` (by default every running member) leads and all the
        others follow it, i.e. serve clients, synced; return the leader. Raise EnsembleError if
        a member exits or `timeout_s` passes."""
        required = (
            tuple(members)
            if members is not None
            else tuple(m for m in self.members if m.state is MemberState.RUNNING)
        )
        if not required:
            raise ValueError("no running member to wait for")
        deadline = time.monotonic() + timeout_s
        while True:
            for member in required:
                member.check_alive()
            statuses = {member.sid: member.status() for member in required}
            leaders = [
                self.member(sid)
                for sid, status in statuses.items()
                if status is not None and status.mode in ("leader", "standalone")
            ]
            if len(leaders) == 1 and all(status is not None for status in statuses.values()):
                return leaders[0]
            if time.monotonic() > deadline:
                logs = "; ".join(f"sid {m.sid}: {m.log_tail()}" for m in required)
                raise EnsembleError(
                    f"no quorum within {timeout_s} s: {statuses}; log tails: {logs}"
                )
            time.sleep(PROBE_INTERVAL_S)

    def __enter__(self) -> Ensemble:
        try:
            self.start()
            self.wait_quorum()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is in state T (stopped) by /proc."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks]
    except OSError:
        return True  # gone: nothing of it answers either
    return all(state in ("T", "t") for state in states)


def four_letter_word(host: str, port: int, word: str, timeout_s: float) -> str | None:
    """ZooKeeper's answer to `word` (srvr, mntr, ruok...), or None if it could not be asked."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(word.encode("ascii"))
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while len(answer) < PROBE_ANSWER_BYTES_MAX and (chunk := sock.recv(4096)):
                answer += chunk
    except OSError:
        return None
    return answer.decode("utf-8", errors="replace")


def _parse_srvr(answer: str) -> MemberStatus | None:
    """`srvr` answers "This ZooKeeper instance is not currently serving requests" while the
    member has no quorum; once it serves, "Zxid: 0x...", "Mode: follower", "Node count: N"."""
    fields = dict(line.split(": ", 1) for line in answer.splitlines() if ": " in line)
    if "Mode" not in fields or "Zxid" not in fields:
        return None
    return MemberStatus(
        mode=fields["Mode"].strip(),
        zxid=int(fields["Zxid"].strip(), 16),
        node_count=int(fields.get("Node count", "0").strip()),
    )


@atexit.register
def _kill_all() -> None:
    for member in list(_running):
        member.kill()
