"""A network of Linux network namespaces whose links a test can cut and slow (Jepsen-style).

Each host (a ZooKeeper server, a broker, a client) gets a network namespace of its own, with one
interface, `eth0`, holding one IPv4 address. Its veth peer is a port of a bridge that lives in a
"switch" namespace of the Network's own, so nothing is added to, or sent through, the root
namespace: the hosts reach each other and nothing else (they have no default route, and the
switch has no uplink). Addresses come from 198.18.0.0/15 (RFC 2544's benchmarking range), one /24
per Network, claimed across processes (pytest-xdist workers) by a file under RUN_DIR.

    with Network() as net:
        zk = net.add_host("zk1")                       # Host(name, namespace, address)
        broker = net.add_host("b1")
        subprocess.Popen(net.command(zk, ["zookeeper-server", ...]))  # runs inside zk1
        sock = net.run_in(broker, lambda: socket.create_connection((zk.address, 2181)))
        cut = net.partition([zk], [broker])            # both directions
        cut.heal()                                     # each fault can be healed alone...
        net.partition([zk], [broker], one_way=True)    # zk -> broker dropped, broker -> zk passes
        net.isolate(zk, keep=[broker])                 # zk cut from everyone but broker
        net.degrade(broker, zk, delay_ms=100, jitter_ms=20, loss_percent=5.0)
        net.heal()                                     # ...or all at once
    # leaving the block heals, stops the delayers and deletes every namespace it made

API (see each method): `Network(tag=None)`, `add_host(name) -> Host`, `hosts`,
`command(host, argv) -> list[str]`, `run_in(host, fn) -> T`, `partition(a, b, one_way=False)`,
`isolate(host, keep=())`, `degrade(a, b=None, delay_ms=, jitter_ms=, loss_percent=)` (each of the
three returns a `Fault` whose `heal()` undoes it alone), `heal()`, `close()`; and the module's
`sweep_stale()`.

How faults are made:
- Each host's namespace has an nft table `inet rbf` with two base chains at the input hook, made
  with the host and kept until it goes: `cut` (priority -10: partitions and loss) and `delay`
  (priority 0: the delayers' queue rules, so a packet is dropped before it is ever held). A fault
  is a set of rules in them, which its heal() deletes by handle. Chains are never deleted while
  the network lives: unregistering a hook makes the kernel drop every packet queued in that
  namespace, so healing one fault would drop the packets another one delays.
- A fault covers the hosts that exist when it is made; a host added later is not in it.
- Every fault acts at the *receiving* hosts' input hook, where a real network's loss and latency
  would show: a drop at the sender's output hook would fail its send() with EPERM, which no
  network does, and a packet held there still counts against its sending socket. Rules match
  IPv4 source addresses; the hosts have no IPv6 addresses (addrgenmode none), so every packet
  between two hosts is an IPv4 one. Established TCP connections stall like new ones: every
  packet is dropped, not only SYNs.
- Loss: `numgen random mod 10000 < N drop`, so loss_percent has a resolution of 0.01 %.
- Latency: this kernel has no sch_netem (nor nft's `queue`), so the packets from `a` go, at each
  target's input hook, to an NFQUEUE served by one delayer process per fault
  (tests/faults/delay.py, whose netlink sockets live in the targets' namespaces) that holds each
  packet delay_ms ± jitter_ms (uniform per packet; like netem's jitter it may reorder a flow) and
  then accepts it. It is never early and typically 0.1-1 ms late. The queue is bounded and
  fail-open: past QUEUE_PACKETS_MAX held packets, or with the delayer gone, packets pass
  undelayed rather than being dropped. Packets a delayer holds when a partition starts are
  still delivered, as packets in flight would be; heal() releases the held ones at once.

Cleanup: namespaces are named `rbf-<pid>-<tag>[-<host>]`. Leaving the `with` block (or close())
stops the delayers and deletes every namespace (which deletes its veths, and the switch's deletion
cuts every link even if a process still holds a host's namespace open); an atexit hook closes any
Network left open. A Network whose process was killed leaves namespaces behind:
`sweep_stale()`, which every new Network calls first, deletes the `rbf-*` namespaces and subnet
claims whose pid is no longer alive, and the orphaned delayers exit on their own. Interface names
need no prefix: they only ever exist inside the Network's own namespaces (the host end is created
in the host's namespace, the switch end in the switch's), where no other instance can see them.

Needs root (network namespaces, nftables), `ip` (iproute2) and `nft` (Debian's nftables); a
machine without them gets NetworkUnavailable, with what is missing.
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, TypeVar

from tests.faults import delay

T = TypeVar("T")

PREFIX: Final = "rbf"
RUN_DIR: Final = Path("/run/rbf")  # subnet claims: one file per /24 in use, naming its owner
NETNS_DIR: Final = delay.NETNS_DIR
REPO: Final = Path(__file__).resolve().parents[2]
# 198.18.0.0/15 holds 512 /24s: subnet i is 198.(18 + i // 256).(i % 256).0/24.
SUBNETS: Final = 512
HOSTS_MAX: Final = 254  # .1 to .254 of the /24
BRIDGE: Final = "br0"
HOST_INTERFACE: Final = "eth0"
TABLE: Final = "rbf"  # the harness's nft table (family inet) in each host's namespace
CUT_CHAIN: Final = "cut"  # partitions' and loss's drops
CUT_PRIORITY: Final = -10  # before the delay chain: a packet to drop is never held first
DELAY_CHAIN: Final = "delay"  # the delayers' NFQUEUE rules
DELAY_PRIORITY: Final = 0
HANDLE_PATTERN: Final = re.compile(r"^add rule .* # handle (\d+)$", re.MULTILINE)
LOSS_RESOLUTION: Final = 10_000  # numgen's modulus: loss_percent in steps of 0.01
TAG_PATTERN: Final = re.compile(r"[a-z0-9]{1,8}")
HOST_NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
COMMAND_TIMEOUT_S: Final = 30.0  # one ip or nft command: milliseconds, unless the host stalls
RUN_IN_TIMEOUT_S: Final = 60.0
# A delayer is a Python process: its start is mostly the interpreter's, ~50 ms, more on a busy
# two-core machine.
DELAYER_READY_TIMEOUT_S: Final = 30.0
DELAYER_STOP_TIMEOUT_S: Final = 10.0


class NetworkUnavailable(RuntimeError):
    """This machine or user cannot make network namespaces (not root, no ip, no nft)."""


class NetworkError(RuntimeError):
    """An ip or nft command, or a delayer, failed."""


@dataclass(frozen=True)
class Host:
    name: str  # logical name, e.g. "zk1", "b2", "client"
    namespace: str  # the netns name, under /run/netns
    address: str  # its IPv4 address on the bridge


def check_usable() -> None:
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    problems = [f"`{tool}` is not on PATH" for tool in missing]
    if os.geteuid() != 0:
        problems.append(f"it runs as uid {os.geteuid()}, and namespaces and nftables need root")
    if not Path("/proc/self/ns/net").exists():
        problems.append("the kernel has no network namespaces (/proc/self/ns/net)")
    if problems:
        raise NetworkUnavailable(
            "tests/faults needs root, iproute2 and nftables (Debian packages iproute2, "
            "nftables): " + "; ".join(problems)
        )


def run(argv: Sequence[str], script: str | None = None) -> str:
    result = subprocess.run(
        argv,
        input=script,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        shown = f"{' '.join(argv)}" + (f" <<{script!r}" if script else "")
        raise NetworkError(f"{shown} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def nft(namespace: str, script: str) -> None:
    run(["ip", "netns", "exec", namespace, "nft", "-f", "-"], script)


def nft_add_rules(namespace: str, chain: str, rules: Sequence[str]) -> list[int]:
    """Append rules to a chain of table inet rbf; their handles, in order (nft --echo)."""
    script = "".join(f"add rule inet {TABLE} {chain} {rule}\n" for rule in rules)
    argv = ["ip", "netns", "exec", namespace, "nft", "--echo", "--handle", "-f", "-"]
    handles = [int(h) for h in HANDLE_PATTERN.findall(run(argv, script))]
    if len(handles) != len(rules):
        raise NetworkError(f"nft echoed {len(handles)} handles for {len(rules)} rules")
    return handles


def alive(pid: int) -> bool:
    """Whether pid runs: a zombie (exited, not yet reaped by its parent or init) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rpartition(")")[2].split()[0]  # after the command name, which may hold ")"
    return state not in ("Z", "X")


def owner_pid(namespace: str) -> int | None:
    """The pid encoded in an `rbf-<pid>-...` name, or None for a name of another shape."""
    parts = namespace.split("-", 2)
    if len(parts) < 3 or parts[0] != PREFIX or not parts[1].isdigit():
        return None
    return int(parts[1])


def namespaces() -> list[str]:
    return sorted(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else []


def sweep_stale() -> list[str]:
    """Delete the `rbf-*` namespaces and subnet claims of processes no longer alive.

    A pid that was reused since keeps its leftovers (they are swept once that process is gone
    too); a live process's namespaces are never touched. Returns the namespaces deleted.
    """
    stale = [n for n in namespaces() if (pid := owner_pid(n)) is not None and not alive(pid)]
    if stale:
        # -force: go on past a namespace another sweeping process deleted first.
        script = "".join(f"netns delete {name}\n" for name in stale)
        subprocess.run(
            ["ip", "-force", "-batch", "-"],
            input=script,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    # subnet-NNN: a claim; .draft-PID-*: one being written when its process was killed.
    for claim in RUN_DIR.glob("*") if RUN_DIR.is_dir() else ():
        pid = claim_pid(claim) if claim.name.startswith("subnet-") else draft_pid(claim)
        if pid is not None and not alive(pid):
            claim.unlink(missing_ok=True)
    return stale


def claim_pid(claim: Path) -> int | None:
    try:
        return int(claim.read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def draft_pid(draft: Path) -> int | None:
    parts = draft.name.split("-")
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def claim_subnet(owner: str) -> tuple[int, Path]:
    """The first free /24 of 198.18.0.0/15, claimed atomically: link(2) fails if it exists."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    draft = RUN_DIR / f".draft-{os.getpid()}-{secrets.token_hex(4)}"
    draft.write_text(f"{os.getpid()} {owner}\n")
    try:
        for index in range(SUBNETS):
            claim = RUN_DIR / f"subnet-{index:03d}"
            try:
                os.link(draft, claim)
            except FileExistsError:
                continue
            return index, claim
    finally:
        draft.unlink()
    raise NetworkError(f"all {SUBNETS} subnets of 198.18.0.0/15 are claimed (see {RUN_DIR})")


def run_in_namespace(namespace: str, fn: Callable[[], T], timeout_s: float) -> T:
    outcome: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            delay.enter_namespace(namespace)
            outcome.append(fn())
        except BaseException as error:  # handed to the caller's thread below
            failure.append(error)

    thread = threading.Thread(target=body, name=f"in-{namespace}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"run_in({namespace}) still running after {timeout_s} s")
    if failure:
        raise failure[0]
    return outcome[0]


class Delayer:
    """One delayer process (tests/faults/delay.py): it serves a queue in each receiver's
    namespace; it is started in the root namespace and enters theirs itself."""

    def __init__(self, argv: Sequence[str]) -> None:
        # A file, not a pipe: a delayer reporting much must never block on it. Closed in stop().
        self.errors: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self.rules: list[tuple[str, str, int]] = []  # as Fault.rules
        self.process = subprocess.Popen(
            argv,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.errors,
        )
        try:
            self.await_ready()
        except BaseException:
            self.stop()
            raise

    def await_ready(self) -> None:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(DELAYER_READY_TIMEOUT_S):
                raise NetworkError(f"delayer not ready after {DELAYER_READY_TIMEOUT_S} s")
        words = self.process.stdout.readline().decode().split()
        if words[:1] != [delay.READY_LINE]:
            self.process.wait(DELAYER_STOP_TIMEOUT_S)
            raise NetworkError(f"delayer failed to start: {self.stderr()}")
        for word in words[1:]:  # namespace=handle of the rule it added there
            namespace, handle = word.rsplit("=", 1)
            self.rules.append((namespace, DELAY_CHAIN, int(handle)))

    def stderr(self) -> str:
        self.errors.seek(0)
        return self.errors.read().decode(errors="replace").strip()

    def stop(self) -> None:
        """SIGTERM: it accepts every packet it holds and exits. Raises if it had failed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(DELAYER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        shown = self.stderr()
        self.errors.close()
        if code not in (0, -signal.SIGTERM):
            raise NetworkError(f"delayer exited with {code}: {shown}")


class Fault:
    """One partition or degradation: its nft rules and delayers, removable on their own."""

    def __init__(self, network: Network, fault_id: int, description: str) -> None:
        self.network = network
        self.fault_id = fault_id
        self.description = description
        self.rules: list[tuple[str, str, int]] = []  # (namespace, chain, handle) in inet rbf
        self.delayers: list[Delayer] = []
        self.healed = False

    def __repr__(self) -> str:
        return f"Fault({self.fault_id}: {self.description}, healed={self.healed})"

    def heal(self) -> None:
        """Delete the rules first, so no packet is queued to a delayer as it stops."""
        if self.healed:
            return
        self.healed = True
        self.network._faults.remove(self)
        errors: list[Exception] = []
        scripts: dict[str, str] = {}
        for namespace, chain, handle in self.rules:
            line = f"delete rule inet {TABLE} {chain} handle {handle}\n"
            scripts[namespace] = scripts.get(namespace, "") + line
        for namespace, script in scripts.items():
            try:
                nft(namespace, script)
            except NetworkError as error:
                errors.append(error)
        errors += self.stop_delayers()
        if errors:
            raise NetworkError(f"healing {self!r}: {errors}")

    def stop_delayers(self) -> list[Exception]:
        errors: list[Exception] = []
        for delayer in self.delayers:
            try:
                delayer.stop()
            except NetworkError as error:
                errors.append(error)
        self.delayers.clear()
        return errors


@contextmanager
def undone_on_error(fault: Fault) -> Iterator[None]:
    """Heals a fault whose making failed halfway, then lets the error through."""
    try:
        yield
    except BaseException:
        with suppress(NetworkError):  # the error being raised says more
            fault.heal()
        raise


_open_networks: weakref.WeakSet[Network] = weakref.WeakSet()


@atexit.register
def _close_open_networks() -> None:
    for network in list(_open_networks):
        network.close()


class Network:
    """Hosts on one bridge, each in its own namespace; see the module docstring."""

    def __init__(self, tag: str | None = None) -> None:
        check_usable()
        sweep_stale()
        self.tag = tag if tag is not None else secrets.token_hex(3)
        if not TAG_PATTERN.fullmatch(self.tag):
            raise ValueError(f"tag {self.tag!r} must match {TAG_PATTERN.pattern}")
        self.prefix = f"{PREFIX}-{os.getpid()}-{self.tag}"  # every namespace name starts so
        self.switch = self.prefix
        self._hosts: dict[str, Host] = {}
        self._faults: list[Fault] = []
        self._fault_ids = itertools.count(1)  # also the NFQUEUE number of a delaying fault
        self._namespaces: list[str] = []
        self._closed = False
        index, self._claim = claim_subnet(self.prefix)
        self.subnet = f"198.{18 + index // 256}.{index % 256}"  # the /24's first three octets
        _open_networks.add(self)
        try:
            self._add_namespace(self.switch)
            run(
                ["ip", "-n", self.switch, "-batch", "-"],
                f"link add {BRIDGE} type bridge\nlink set {BRIDGE} up\n",
            )
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def hosts(self) -> list[Host]:
        return list(self._hosts.values())

    def _add_namespace(self, namespace: str) -> None:
        run(["ip", "netns", "add", namespace])
        self._namespaces.append(namespace)

    def add_host(self, name: str) -> Host:
        """A namespace with lo up and eth0 on the bridge at the subnet's next address."""
        self._check_open()
        if not HOST_NAME_PATTERN.fullmatch(name):
            raise ValueError(f"host name {name!r} must match {HOST_NAME_PATTERN.pattern}")
        if name in self._hosts:
            raise ValueError(f"host {name!r} exists")
        if len(self._hosts) >= HOSTS_MAX:
            raise NetworkError(f"a Network holds at most {HOSTS_MAX} hosts")
        index = len(self._hosts) + 1
        host = Host(name, f"{self.prefix}-{name}", f"{self.subnet}.{index}")
        self._add_namespace(host.namespace)
        port = f"p{index}"
        run(
            ["ip", "-n", self.switch, "-batch", "-"],
            f"link add {port} type veth peer name {HOST_INTERFACE} netns {host.namespace}\n"
            f"link set {port} master {BRIDGE} up\n",
        )
        # addrgenmode none before the link is up: no IPv6 link-local address, so every packet
        # between hosts is IPv4 and the faults' rules see them all.
        run(
            ["ip", "-n", host.namespace, "-batch", "-"],
            "link set lo up\n"
            f"link set {HOST_INTERFACE} addrgenmode none\n"
            f"address add {host.address}/24 dev {HOST_INTERFACE}\n"
            f"link set {HOST_INTERFACE} up\n",
        )
        nft(
            host.namespace,
            f"add table inet {TABLE}\n"
            f"add chain inet {TABLE} {CUT_CHAIN} "
            f"{{ type filter hook input priority {CUT_PRIORITY} ; policy accept ; }}\n"
            f"add chain inet {TABLE} {DELAY_CHAIN} "
            f"{{ type filter hook input priority {DELAY_PRIORITY} ; policy accept ; }}\n",
        )
        self._hosts[name] = host
        return host

    def command(self, host: Host, argv: Sequence[str]) -> list[str]:
        """argv run inside host's namespace; `ip netns exec` execs it, so the pid is argv's."""
        return ["ip", "netns", "exec", self._member(host).namespace, *argv]

    def run_in(self, host: Host, fn: Callable[[], T], *, timeout_s: float = RUN_IN_TIMEOUT_S) -> T:
        """fn's result, called in a fresh thread inside host's namespace: the sockets it opens
        live there (and may then be used from any thread). Re-raises what fn raised."""
        return run_in_namespace(self._member(host).namespace, fn, timeout_s)

    def partition(self, a: Iterable[Host], b: Iterable[Host], *, one_way: bool = False) -> Fault:
        """No packet between a host of `a` and one of `b`; with one_way, only a -> b is cut."""
        left, right = self._members_of(a), self._members_of(b)
        if not left or not right or set(left) & set(right):
            raise ValueError(f"partition needs two disjoint non-empty sets: {left} / {right}")
        cut = {h: left for h in right}  # receiver -> the senders it no longer hears
        if not one_way:
            cut |= {h: right for h in left}
        names = ",".join(h.name for h in left), ",".join(h.name for h in right)
        fault = self._fault(f"{names[0]} {'->' if one_way else '<->'} {names[1]}")
        with undone_on_error(fault):
            for receiver, senders in cut.items():
                addresses = ", ".join(h.address for h in senders)
                self._add_rules(fault, receiver, [f"ip saddr {{ {addresses} }} drop"])
        return fault

    def isolate(self, host: Host, *, keep: Iterable[Host] = ()) -> Fault:
        """Cut host from every other host of now, in both directions, except those in `keep`."""
        kept = {self._member(h) for h in keep} | {self._member(host)}
        others = [h for h in self._hosts.values() if h not in kept]
        if not others:
            raise ValueError(
                f"isolating {host.name} keeping {sorted(h.name for h in kept)} cuts nothing"
            )
        return self.partition([host], others)

    def degrade(
        self,
        a: Host,
        b: Host | None = None,
        *,
        delay_ms: int = 0,
        jitter_ms: int = 0,
        loss_percent: float = 0.0,
    ) -> Fault:
        """Latency (delay_ms ± jitter_ms) and loss on the packets from `a` to `b`, or to every
        other host of now; both at the receivers' input hooks."""
        sender = self._member(a)
        targets = [self._member(b)] if b is not None else [h for h in self.hosts if h != sender]
        if not 0 <= jitter_ms <= delay_ms <= delay.DELAY_MS_MAX:
            raise ValueError(f"need 0 <= jitter_ms <= delay_ms <= {delay.DELAY_MS_MAX}")
        if not 0.0 <= loss_percent <= 100.0:
            raise ValueError(f"loss_percent {loss_percent} is not in [0, 100]")
        if sender in targets or not targets or (delay_ms == 0 and loss_percent == 0.0):
            raise ValueError("degrade needs another host and some delay or loss")
        names = ",".join(h.name for h in targets)
        fault = self._fault(f"{sender.name} -> {names}: {delay_ms}±{jitter_ms} ms, {loss_percent}%")
        threshold = round(loss_percent * LOSS_RESOLUTION / 100)
        drawn = f"numgen random mod {LOSS_RESOLUTION} < {threshold}"
        with undone_on_error(fault):
            if threshold:
                for receiver in targets:
                    self._add_rules(fault, receiver, [f"ip saddr {sender.address} {drawn} drop"])
            if delay_ms:
                argv = [sys.executable, "-m", "tests.faults.delay", "--saddr", sender.address]
                argv += [arg for h in targets for arg in ("--namespace", h.namespace)]
                argv += ["--queue", str(fault.fault_id), "--table", TABLE, "--chain", DELAY_CHAIN]
                argv += ["--delay-ms", str(delay_ms), "--jitter-ms", str(jitter_ms)]
                delayer = Delayer(argv)
                fault.delayers.append(delayer)
                fault.rules += delayer.rules
        return fault

    def heal(self) -> None:
        """Undo every fault: delete their rules and stop their delayers."""
        errors: list[Exception] = []
        for fault in reversed(list(self._faults)):
            try:
                fault.heal()
            except NetworkError as error:
                errors.append(error)
        if not errors:
            return
        for host in self._hosts.values():  # whatever a failed heal left: every rule
            with suppress(NetworkError):
                nft(
                    host.namespace,
                    f"flush chain inet {TABLE} {CUT_CHAIN}\n"
                    f"flush chain inet {TABLE} {DELAY_CHAIN}\n",
                )
        raise NetworkError(f"heal: {errors}")

    def close(self) -> None:
        """Stop the delayers and delete every namespace made (their rules and veths go too)."""
        if self._closed:
            return
        self._closed = True
        _open_networks.discard(self)
        errors: list[Exception] = []
        for fault in reversed(list(self._faults)):
            fault.healed = True
            errors += fault.stop_delayers()
        self._faults.clear()
        if self._namespaces:
            # Hosts first, the switch last; -force: delete the others past one that fails.
            script = "".join(f"netns delete {n}\n" for n in reversed(self._namespaces))
            try:
                run(["ip", "-force", "-batch", "-"], script)
            except NetworkError as error:
                errors.append(error)
        self._claim.unlink(missing_ok=True)
        if errors:
            raise NetworkError(f"close: {errors}")

    def _check_open(self) -> None:
        if self._closed:
            raise NetworkError(f"Network {self.prefix} is closed")

    def _member(self, host: Host) -> Host:
        if self._hosts.get(host.name) != host:
            raise ValueError(f"{host} is not a host of Network {self.prefix}")
        return host

    def _members_of(self, hosts: Iterable[Host]) -> list[Host]:
        return list(dict.fromkeys(self._member(h) for h in hosts))

    def _fault(self, description: str) -> Fault:
        self._check_open()
        fault = Fault(self, next(self._fault_ids), description)
        self._faults.append(fault)
        return fault

    def _add_rules(self, fault: Fault, host: Host, rules: Sequence[str]) -> None:
        """Rules of the fault's, appended to host's cut chain."""
        handles = nft_add_rules(host.namespace, CUT_CHAIN, rules)
        fault.rules += [(host.namespace, CUT_CHAIN, handle) for handle in handles]
