"""`riverbed cluster up`: local broker processes and a ZooKeeper under one supervisor.

Everything lives under the data dir:

    .lock              flock()ed while a supervisor runs on this directory
    zookeeper/         the embedded ZooKeeper (none when `zookeeper_connect` names a server)
    broker-<id>/       the broker's log.dirs
    broker-<id>.log    the broker's output, appended to across starts

Broker `id` (1..N) listens on 127.0.0.1:<port_base + id - 1>.

Lifetime: this process starts every child and reaps every child. Brokers get a session of their
own, so a terminal's Ctrl-C reaches only the supervisor, which then stops them in order: SIGTERM to
every broker at once (each does a controlled shutdown), SIGKILL to any still running after
BROKER_STOP_TIMEOUT_S, ZooKeeper last (brokers need it to shut down cleanly). If the supervisor
itself dies without cleaning up, the kernel kills its children (PR_SET_PDEATHSIG).

A broker that exits on its own is reported (one line naming it and its log file) and started
again on the same port and data dir, so it rejoins as the same broker: killing one is how a user
watches leaders fail over and the ISR shrink and grow back. A broker that keeps exiting soon
after its start (QUICK_EXITS_MAX in a row) is a crash loop, not a fault to ride out: the
supervisor stops the cluster and exits with status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from riverbed.client.admin import Admin
from riverbed.client.connection import BrokerConnection
from riverbed.configs import BrokerConfig
from riverbed.coordination.embedded_zk import EmbeddedZooKeeper, die_with_parent
from riverbed.coordination.zk import AsyncZooKeeper, ZkConnectionError, ZkDigest, ZkError
from riverbed.protocol import messages as m
from riverbed.protocol.errors import KafkaError

log = logging.getLogger(__name__)

HOST: Final = "127.0.0.1"
DEFAULT_PORT_BASE: Final = 9092
PORT_MAX: Final = 65_535
LOCK_FILE: Final = ".lock"
# A cold start of N interpreters on a busy 2-core machine, plus brokers of a killed previous run
# waiting for their old ZooKeeper sessions to expire (zookeeper.session.timeout.ms, 18 s).
BROKERS_READY_TIMEOUT_S: Final = 90.0
READY_POLL_INTERVAL_S: Final = 0.2
METADATA_TIMEOUT_MS: Final = 5_000
# A controlled shutdown retries while the controller cannot move its leaderships yet.
BROKER_STOP_TIMEOUT_S: Final = 60.0
# A broker exiting sooner than this after its start counts towards a crash loop.
BROKER_UPTIME_STABLE_S: Final = 30.0
QUICK_EXITS_MAX: Final = 3
# The supervisor sets these per broker; a shared `--set` of one would be silently overridden.
PER_BROKER_SETTINGS: Final = frozenset({"broker.id", "listeners", "log.dirs", "zookeeper.connect"})
EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1


class ClusterError(Exception):
    """A cluster that cannot start or keep running; the message is one line for the user."""


# Where `cluster up` keeps the tiered segments unless --set remote.storage.url says otherwise.
COLD_TIER_DIR = "cold"
# `--demo-topic` (what `make run` creates): tiered, and replicated as widely as Kafka usually is.
DEMO_PARTITIONS: Final = 3
DEMO_REPLICATION_FACTOR_MAX: Final = 3
# 1 MiB segments: a demo fills one in seconds, so tiering shows up right away.
DEMO_TOPIC_CONFIGS: Final = {"remote.storage.enable": "true", "segment.bytes": "1048576"}
DEMO_TOPIC_TIMEOUT_MS: Final = 60_000


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to run: `broker_count` brokers on ports `port_base`.., state under `data_dir`, with a
    ZooKeeper of their own unless `zookeeper_connect` names one; `settings` go to every broker."""

    broker_count: int
    data_dir: Path
    port_base: int = DEFAULT_PORT_BASE
    zookeeper_connect: str | None = None
    settings: Mapping[str, str] = field(default_factory=dict)
    demo_topic: str | None = None  # created (tiered) once the brokers are up, if missing

    def __post_init__(self) -> None:
        if self.broker_count < 1:
            raise ClusterError(f"--brokers must be at least 1, got {self.broker_count}")
        if self.port_base < 1 or self.port_base + self.broker_count - 1 > PORT_MAX:
            raise ClusterError(
                f"ports {self.port_base}..{self.port_base + self.broker_count - 1} are not all "
                f"in 1..{PORT_MAX}"
            )
        reserved = sorted(PER_BROKER_SETTINGS & self.settings.keys())
        if reserved:
            raise ClusterError(
                f"{', '.join(reserved)} is chosen per broker by `cluster up`; do not --set it"
            )

    @property
    def broker_ids(self) -> range:
        return range(1, self.broker_count + 1)

    def port(self, broker_id: int) -> int:
        return self.port_base + broker_id - 1

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{HOST}:{self.port(broker_id)}" for broker_id in self.broker_ids)


async def metadata_broker_ids(host: str, port: int, timeout_ms: int) -> frozenset[int]:
    """The ids of the brokers that the broker at host:port reports as registered (Metadata)."""
    connection = await BrokerConnection.open(
        host, port, client_id="riverbed-cluster", timeout_ms=timeout_ms
    )
    try:
        request = m.MetadataRequest(topics=[], allow_auto_topic_creation=False)
        response = await connection.call(request, m.MetadataResponse, timeout_ms=timeout_ms)
    finally:
        await connection.close()
    return frozenset(broker.node_id for broker in response.brokers)


def run(spec: ClusterSpec, on_ready: Callable[[str], None]) -> int:
    """Run the cluster until SIGINT or SIGTERM; `on_ready(zookeeper_connect)` once every broker
    is registered. Returns 0 if every broker then stopped cleanly, else 1. Raises ClusterError
    (nothing left running) if the cluster cannot start."""
    return asyncio.run(_Supervisor(spec).run(on_ready))


class _BrokerChild:
    """One broker process; restarts keep its id, port, data dir and (open) log file."""

    def __init__(self, broker_id: int, command: list[str], log_file: IO[bytes]) -> None:
        self.broker_id = broker_id
        self.command = command
        self.log_file = log_file
        self.process: asyncio.subprocess.Process | None = None
        self.started_at = 0.0
        self.quick_exits = 0

    @property
    def log_path(self) -> str:
        return self.log_file.name

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C is for the supervisor, which stops brokers in order
            preexec_fn=die_with_parent,
        )
        self.started_at = asyncio.get_running_loop().time()

    async def wait(self) -> int:
        if self.process is None:
            raise RuntimeError(f"broker {self.broker_id} was never started")
        return await self.process.wait()

    async def stop(self, timeout_s: float) -> bool:
        """SIGTERM, then SIGKILL after `timeout_s`; True if it exited cleanly on SIGTERM."""
        process = self.process
        if process is None or process.returncode is not None:
            return True
        with contextlib.suppress(ProcessLookupError):  # it exited just now
            process.terminate()
        try:
            async with asyncio.timeout(timeout_s):
                exit_code = await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            log.warning(
                "broker %d did not stop within %.0f s of SIGTERM; killed it (log: %s)",
                self.broker_id,
                timeout_s,
                self.log_path,
            )
            return False
        # -SIGTERM: stopped before it installed its handler (still starting up).
        clean = exit_code in (EXIT_OK, -signal.SIGTERM)
        if not clean:
            log.warning(
                "broker %d exited with status %d on SIGTERM (log: %s)",
                self.broker_id,
                exit_code,
                self.log_path,
            )
        return clean


class _Supervisor:
    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.data_dir = spec.data_dir.resolve()
        self._stop = asyncio.Event()
        self._brokers: list[_BrokerChild] = []

    async def run(self, on_ready: Callable[[str], None]) -> int:
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)
        for signum in signals:
            loop.add_signal_handler(signum, self._stop.set)
        try:
            async with contextlib.AsyncExitStack() as stack:
                stack.enter_context(self._lock_data_dir())
                _check_ports_free([self.spec.port(i) for i in self.spec.broker_ids])
                zookeeper_connect = await self._start_zookeeper(stack)
                for broker_id in self.spec.broker_ids:
                    settings = self._broker_settings(broker_id, zookeeper_connect)
                    log_file = stack.enter_context(self._open_log(broker_id))
                    self._brokers.append(_BrokerChild(broker_id, _command(settings), log_file))
                stack.push_async_callback(self._stop_brokers)
                for broker in self._brokers:
                    await broker.start()
                if not await self._wait_registered():
                    return EXIT_OK  # stopped during startup
                if self.spec.demo_topic is not None:
                    await self._ensure_demo_topic(self.spec.demo_topic)
                on_ready(zookeeper_connect)
                status = await self._supervise()
                stopped_cleanly = await self._stop_brokers()
                return status if stopped_cleanly else EXIT_FAILURE
        finally:
            for signum in signals:
                loop.remove_signal_handler(signum)

    # -- starting -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _lock_data_dir(self) -> Iterator[None]:
        """Hold the data dir's lock: a second supervisor would share ZooKeeper's files."""
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise ClusterError(
                f"data dir {self.data_dir} is not usable: {_reason(error)}"
            ) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ClusterError(
                    f"data dir {self.data_dir} is in use by another `riverbed cluster up`"
                ) from None
            yield
        finally:
            os.close(fd)

    def _open_log(self, broker_id: int) -> IO[bytes]:
        path = self.data_dir / f"broker-{broker_id}.log"
        try:
            return path.open("ab")
        except OSError as error:
            raise ClusterError(f"cannot write {path}: {_reason(error)}") from None

    def _broker_settings(self, broker_id: int, zookeeper_connect: str) -> dict[str, str]:
        return {
            # Kafka refuses to create __consumer_offsets with fewer brokers than its replication
            # factor (3); a local cluster of one or two brokers would have no consumer groups.
            # Like Kafka's single-broker sample config, size it to the cluster unless --set.
            "offsets.topic.replication.factor": str(min(3, self.spec.broker_count)),
            # The same for __transaction_state, whose min.insync.replicas (2) must fit it too.
            "transaction.state.log.replication.factor": str(min(3, self.spec.broker_count)),
            "transaction.state.log.min.isr": str(min(2, self.spec.broker_count)),
            # The embedded cold tier: one directory every broker shares, under the data dir.
            "remote.storage.url": f"file://{self.data_dir / COLD_TIER_DIR}",
            **self.spec.settings,
            "broker.id": str(broker_id),
            "listeners": f"PLAINTEXT://{HOST}:{self.spec.port(broker_id)}",
            "log.dirs": str(self.data_dir / f"broker-{broker_id}"),
            "zookeeper.connect": zookeeper_connect,
        }

    async def _start_zookeeper(self, stack: contextlib.AsyncExitStack) -> str:
        """Check the brokers' settings, then reach or start ZooKeeper; its connect string."""
        embedded = None
        zookeeper_connect = self.spec.zookeeper_connect
        if zookeeper_connect is None:
            embedded = EmbeddedZooKeeper(self.data_dir / "zookeeper")  # picks its port
            zookeeper_connect = embedded.connect_string
        # A bad --set is one error now rather than N brokers failing to start.
        config = BrokerConfig.from_mapping(self._broker_settings(1, zookeeper_connect))
        if embedded is None:
            await _check_zookeeper(
                zookeeper_connect, config.zookeeper_connect_timeout_ms, config.zookeeper_digest
            )
        else:
            # Blocking, on the main thread on purpose: the server's death signal follows the
            # thread that started it. A signal meanwhile is handled once this returns.
            embedded.start()
            stack.callback(embedded.stop)
        return zookeeper_connect

    async def _wait_registered(self) -> bool:
        """Wait until every broker's Metadata lists every broker; False if stopped first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BROKERS_READY_TIMEOUT_S
        while not self._stop.is_set():
            for broker in self._brokers:
                if not broker.running:
                    raise ClusterError(
                        f"broker {broker.broker_id} {_exit_description(broker)} during startup: "
                        f"{_last_line(broker.log_path)} (log: {broker.log_path})"
                    )
            if await self._all_registered():
                return True
            if loop.time() > deadline:
                raise ClusterError(
                    f"the brokers did not all register within {BROKERS_READY_TIMEOUT_S:.0f} s "
                    f"(logs: {self.data_dir}/broker-<id>.log)"
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(READY_POLL_INTERVAL_S):
                    await self._stop.wait()
        return False

    async def _all_registered(self) -> bool:
        expected = frozenset(self.spec.broker_ids)
        for broker_id in self.spec.broker_ids:
            try:
                listed = await metadata_broker_ids(
                    HOST, self.spec.port(broker_id), METADATA_TIMEOUT_MS
                )
            except (OSError, TimeoutError, KafkaError):  # not listening yet
                return False
            if not expected <= listed:
                return False
        return True

    # -- running and stopping -----------------------------------------------------------------
    async def _ensure_demo_topic(self, name: str) -> None:
        """Create the demo topic, tiered, unless it exists (a second `make run` keeps it)."""
        async with Admin(
            bootstrap_servers=self.spec.bootstrap, request_timeout_ms=DEMO_TOPIC_TIMEOUT_MS
        ) as admin:
            try:
                if name in await admin.list_topics():
                    return
                await admin.create_topic(
                    name,
                    partitions=DEMO_PARTITIONS,
                    replication_factor=min(self.spec.broker_count, DEMO_REPLICATION_FACTOR_MAX),
                    configs=DEMO_TOPIC_CONFIGS,
                )
            except KafkaError as error:
                raise ClusterError(f"cannot create the demo topic {name!r}: {error}") from error

    async def _supervise(self) -> int:
        """Until asked to stop: restart brokers that exit. 0, or 1 after a crash loop."""
        stop = asyncio.create_task(self._stop.wait(), name="cluster-stop")
        exits = {self._watch(broker): broker for broker in self._brokers}
        try:
            while True:
                done, _ = await asyncio.wait({stop, *exits}, return_when=asyncio.FIRST_COMPLETED)
                if stop in done:
                    return EXIT_OK
                for task in done:
                    broker = exits.pop(task)
                    if not await self._restart(broker):
                        return EXIT_FAILURE
                    exits[self._watch(broker)] = broker
        finally:
            for task in (stop, *exits):
                task.cancel()
            await asyncio.gather(stop, *exits, return_exceptions=True)

    def _watch(self, broker: _BrokerChild) -> asyncio.Task[int]:
        return asyncio.create_task(broker.wait(), name=f"cluster-broker-{broker.broker_id}")

    async def _restart(self, broker: _BrokerChild) -> bool:
        uptime_s = asyncio.get_running_loop().time() - broker.started_at
        broker.quick_exits = broker.quick_exits + 1 if uptime_s < BROKER_UPTIME_STABLE_S else 0
        if broker.quick_exits >= QUICK_EXITS_MAX:
            log.error(
                "broker %d %s, %d times in a row within %.0f s of starting; stopping the "
                "cluster (log: %s)",
                broker.broker_id,
                _exit_description(broker),
                broker.quick_exits,
                BROKER_UPTIME_STABLE_S,
                broker.log_path,
            )
            return False
        log.warning(
            "broker %d %s; restarting it (log: %s)",
            broker.broker_id,
            _exit_description(broker),
            broker.log_path,
        )
        await broker.start()
        return True

    async def _stop_brokers(self) -> bool:
        """SIGTERM every broker at once; True if all exited cleanly in time. Idempotent."""
        stopped = await asyncio.gather(
            *(broker.stop(BROKER_STOP_TIMEOUT_S) for broker in self._brokers)
        )
        return all(stopped)


async def _check_zookeeper(connect: str, timeout_ms: int, digest: ZkDigest | None) -> None:
    """Connect once (creating the chroot if missing, with the brokers' ACL if they set one), so
    that a wrong address is one error now."""
    try:
        zookeeper = AsyncZooKeeper(connect, connect_timeout_ms=timeout_ms, digest=digest)
        await zookeeper.start()
    except ZkConnectionError as error:  # its message names the address and the timeout
        raise ClusterError(str(error)) from None
    except (ZkError, ValueError) as error:
        raise ClusterError(f"cannot use ZooKeeper at {connect}: {error}") from None
    await zookeeper.stop()


def _check_ports_free(ports: Sequence[int]) -> None:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As the broker's listener will: a port held only by TIME_WAIT connections is free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise ClusterError(
                        f"port {port} on {HOST} is already in use; choose another --port-base"
                    ) from None
                raise ClusterError(f"cannot listen on {HOST}:{port}: {_reason(error)}") from None


def _command(settings: Mapping[str, str]) -> list[str]:
    """`riverbed broker` on this interpreter, every setting given with Kafka's name."""
    pairs = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    return [sys.executable, "-m", "riverbed.cli", "broker", *pairs]


def _exit_description(broker: _BrokerChild) -> str:
    code = broker.process.returncode if broker.process is not None else None
    if code is None:
        return "is running"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _last_line(path: str) -> str:
    """The broker's last words, e.g. its `riverbed: error: ...` line."""
    try:
        lines = Path(path).read_text(errors="replace").strip().splitlines()
    except OSError as error:
        return f"(no log: {_reason(error)})"
    return lines[-1] if lines else "(empty log)"


def _reason(error: OSError) -> str:
    return error.strerror or str(error)
