"""Packet latency without netem: NFQUEUE rules and the userspace delayer that serves them.

This kernel has neither sch_netem nor nft's `queue` expression (CONFIG_NFT_QUEUE is off), but it
has nfnetlink_queue and the xtables NFQUEUE target, which nf_tables runs through nft_compat. nft(8)
cannot write a rule with an xtables target, so this module speaks netlink itself, stdlib only.

One delayer process delays the packets of one sender to one or more receivers. In each
receiver's network namespace (entered with setns(2), one after the other: a netlink socket stays
in the namespace it was made in) it

- binds NFQUEUE queue Q: the kernel holds each queued packet and hands this process only its id
  (copy mode META); the queue's length is bounded (QUEUE_PACKETS_MAX) and *fail-open*, so a
  packet beyond the bound, or one the kernel cannot hand over, is accepted at once, undelayed,
  never dropped;
- appends to an existing chain at the input hook the rule
  `meta nfproto ipv4 ip saddr <sender> -> NFQUEUE num Q bypass`: *bypass* lets packets pass
  untouched whenever nobody serves the queue (delayer not started yet, stopped, or killed);

and then holds every queued packet `delay_ms` ± `jitter_ms` (uniform, drawn per packet) before it
accepts it. Like netem's jitter, that may reorder the packets of one flow.

Why at the receiver's input and not the sender's output: until a packet crosses the veth it is
still charged to its sending socket, and TCP Small Queues then lets only about two packets of a
flow wait in the queue at once: 100 ms of delay at the sender's output held one TCP flow to
~30 KB/s. At the receiver the packet is orphaned already, as netem orphans it.

`main()`: `python -m tests.faults.delay --namespace NS ... --saddr S --queue Q --table T --chain C
--delay-ms D [--jitter-ms J]`, started by tests/faults/network.py. Once every queue is bound and
every rule is in, it prints `ready NS=HANDLE ...`: the handle of the rule it added in each
namespace (nf_tables echoes it). On SIGTERM or SIGINT, or when its parent dies, it accepts every
packet it still holds and exits. The owner deletes those rules *before* stopping it, so that no
packet is queued between that last release and the sockets' close, which would drop it; and it
deletes rules, never a base chain: unregistering any netfilter hook makes the kernel drop every
packet queued in that namespace (nfqnl_nf_hook_drop), which a heal would turn into loss.

Time: a packet's hold starts when its id reaches this process (tens of microseconds after the
kernel queued it) and ends at the first wake-up after its due time (epoll's millisecond ceiling
plus scheduling), so the delay is never shorter than asked and typically 0.1-1 ms longer.
"""

from __future__ import annotations

import argparse
import ctypes
import heapq
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

# --- netlink framing (linux/netlink.h, linux/netfilter/nfnetlink.h) ---------------------------

NETLINK_NETFILTER: Final = 12
SOL_NETLINK: Final = 270
NETLINK_NO_ENOBUFS: Final = 5
SO_RCVBUFFORCE: Final = 33

NLM_F_REQUEST: Final = 0x001
NLM_F_ACK: Final = 0x004
NLM_F_ECHO: Final = 0x008
NLM_F_CREATE: Final = 0x400
NLM_F_APPEND: Final = 0x800
NLMSG_ERROR: Final = 2
NLMSG_DONE: Final = 3
NLA_F_NESTED: Final = 0x8000

NLMSG_HEADER: Final = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
NLA_HEADER: Final = struct.Struct("=HH")  # length, type
NFGEN_HEADER: Final = struct.Struct("!BBH")  # family, version, resource id (big-endian)
NLMSG_ERROR_CODE: Final = struct.Struct("=i")

AF_UNSPEC: Final = 0
NFPROTO_INET: Final = 1
NFPROTO_IPV4: Final = 2
NFNETLINK_V0: Final = 0

# --- nfnetlink_queue (linux/netfilter/nfnetlink_queue.h) --------------------------------------

NFNL_SUBSYS_QUEUE: Final = 3
NFQNL_MSG_PACKET: Final = 0
NFQNL_MSG_VERDICT: Final = 1
NFQNL_MSG_CONFIG: Final = 2
NFQA_PACKET_HDR: Final = 1
NFQA_VERDICT_HDR: Final = 2
NFQA_CFG_CMD: Final = 1
NFQA_CFG_PARAMS: Final = 2
NFQA_CFG_QUEUE_MAXLEN: Final = 3
NFQA_CFG_MASK: Final = 4
NFQA_CFG_FLAGS: Final = 5
NFQNL_CFG_CMD_BIND: Final = 1
NFQNL_COPY_META: Final = 1
NFQA_CFG_F_FAIL_OPEN: Final = 0x1
NFQA_CFG_F_GSO: Final = 0x4  # hold a GSO super-packet whole instead of segmenting it first
NF_ACCEPT: Final = 1

# --- nf_tables (linux/netfilter/nf_tables.h) --------------------------------------------------

NFNL_SUBSYS_NFTABLES: Final = 10
NFNL_MSG_BATCH_BEGIN: Final = 0x10
NFNL_MSG_BATCH_END: Final = 0x11
NFT_MSG_NEWRULE: Final = 6
NFTA_RULE_TABLE: Final = 1
NFTA_RULE_CHAIN: Final = 2
NFTA_RULE_HANDLE: Final = 3
NFTA_RULE_EXPRESSIONS: Final = 4
NFTA_LIST_ELEM: Final = 1
NFTA_EXPR_NAME: Final = 1
NFTA_EXPR_DATA: Final = 2
NFTA_DATA_VALUE: Final = 1
NFT_REG_1: Final = 1
NFTA_META_DREG: Final = 1
NFTA_META_KEY: Final = 2
NFT_META_NFPROTO: Final = 15
NFTA_CMP_SREG: Final = 1
NFTA_CMP_OP: Final = 2
NFTA_CMP_DATA: Final = 3
NFT_CMP_EQ: Final = 0
NFTA_PAYLOAD_DREG: Final = 1
NFTA_PAYLOAD_BASE: Final = 2
NFTA_PAYLOAD_OFFSET: Final = 3
NFTA_PAYLOAD_LEN: Final = 4
NFT_PAYLOAD_NETWORK_HEADER: Final = 1
IPV4_SADDR_OFFSET: Final = 12
IPV4_ADDRESS_BYTES: Final = 4
NFTA_TARGET_NAME: Final = 1
NFTA_TARGET_REV: Final = 2
NFTA_TARGET_INFO: Final = 3
# struct xt_NFQ_info_v3 {u16 queuenum; u16 queues_total; u16 flags;}, host order, padded to 8
# bytes (XT_ALIGN) as nft_compat checks the size against the target's aligned size.
NFQUEUE_TARGET_REVISION: Final = 3
NFQUEUE_INFO_V3: Final = struct.Struct("=HHH2x")
NFQ_FLAG_BYPASS: Final = 0x01

# --- bounds ----------------------------------------------------------------------------------

# Packets the kernel holds for one delayer. Beyond it the queue is fail-open: packets pass
# undelayed. 100 ms of a saturated gigabit link in 1500-byte packets is ~8,300.
QUEUE_PACKETS_MAX: Final = 8192
# The socket buffer that carries packet ids to us. Each id costs ~1 KiB of skb truesize at
# copy mode META; if it fills anyway, fail-open accepts the packet rather than dropping it.
RECEIVE_BUFFER_BYTES: Final = 16 * 1024 * 1024
RECEIVE_BYTES_MAX: Final = 65536  # one recv(); packet messages are ~100 bytes each
VERDICTS_PER_SEND_MAX: Final = 256  # 32 bytes each: one send stays far below the socket buffer
DELAY_MS_MAX: Final = 60_000
# The longest wait between checks that the parent is still alive: an orphaned delayer releases
# its packets and exits within this.
PARENT_CHECK_INTERVAL_S: Final = 0.2
ACK_TIMEOUT_S: Final = 5.0
READY_LINE: Final = "ready"
NETNS_DIR: Final = Path("/run/netns")  # where `ip netns add` mounts named namespaces
CLONE_NEWNET: Final = 0x40000000


class NetlinkError(OSError):
    """The kernel refused a netlink request (errno and what was asked)."""


def attribute(kind: int, payload: bytes) -> bytes:
    length = NLA_HEADER.size + len(payload)
    return NLA_HEADER.pack(length, kind) + payload + b"\0" * (-length % 4)


def nested(kind: int, *attributes: bytes) -> bytes:
    return attribute(kind | NLA_F_NESTED, b"".join(attributes))


def be32(value: int) -> bytes:
    return struct.pack("!I", value)


def strz(text: str) -> bytes:
    return text.encode() + b"\0"


def message(kind: int, flags: int, family: int, resource: int, body: bytes, seq: int = 0) -> bytes:
    """One nfnetlink message: netlink header, nfgenmsg, attributes."""
    payload = NFGEN_HEADER.pack(family, NFNETLINK_V0, resource) + body
    return NLMSG_HEADER.pack(NLMSG_HEADER.size + len(payload), kind, flags, seq, 0) + payload


@dataclass(frozen=True)
class Message:
    kind: int
    seq: int
    payload: bytes  # after the netlink header


def messages(data: bytes) -> Iterator[Message]:
    offset = 0
    while offset + NLMSG_HEADER.size <= len(data):
        length, kind, _flags, seq, _port = NLMSG_HEADER.unpack_from(data, offset)
        if length < NLMSG_HEADER.size or offset + length > len(data):
            raise ValueError(f"torn netlink message at byte {offset} of {len(data)}")
        yield Message(kind, seq, data[offset + NLMSG_HEADER.size : offset + length])
        offset += (length + 3) & ~3


def attributes(data: bytes) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    offset = 0
    while offset + NLA_HEADER.size <= len(data):
        length, kind = NLA_HEADER.unpack_from(data, offset)
        if length < NLA_HEADER.size:
            raise ValueError(f"netlink attribute of length {length}")
        found[kind & ~NLA_F_NESTED] = data[offset + NLA_HEADER.size : offset + length]
        offset += (length + 3) & ~3
    return found


def error_code(found: Message) -> int:
    """An NLMSG_ERROR's errno, positive (0 for an acknowledgement)."""
    (code,) = NLMSG_ERROR_CODE.unpack_from(found.payload)
    return int(-code)


def netfilter_socket() -> socket.socket:
    """A NETLINK_NETFILTER socket in the calling thread's network namespace."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER_BYTES)
        sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        sock.bind((0, 0))
    except BaseException:
        sock.close()
        raise
    return sock


def await_acks(sock: socket.socket, seqs: set[int], what: str) -> list[Message]:
    """Read until every request in `seqs` is acknowledged; raise on the first refusal. Returns
    the other messages read meanwhile (echoes)."""
    deadline = time.monotonic() + ACK_TIMEOUT_S
    pending = set(seqs)
    others: list[Message] = []
    while pending:
        sock.settimeout(max(0.0, deadline - time.monotonic()))
        try:
            data = sock.recv(RECEIVE_BYTES_MAX)
        except TimeoutError:
            raise TimeoutError(f"no netlink acknowledgement for {what}") from None
        for found in messages(data):
            if found.kind == NLMSG_ERROR and found.seq in pending:
                code = error_code(found)
                if code:
                    raise NetlinkError(code, f"{what}: {os.strerror(code)}")
                pending.discard(found.seq)
            elif found.kind != NLMSG_ERROR:
                others.append(found)
    return others


# --- the NFQUEUE rule -------------------------------------------------------------------------


def expression(name: str, *data: bytes) -> bytes:
    return nested(
        NFTA_LIST_ELEM, attribute(NFTA_EXPR_NAME, strz(name)), nested(NFTA_EXPR_DATA, *data)
    )


def equals(value: bytes) -> bytes:
    return expression(
        "cmp",
        attribute(NFTA_CMP_SREG, be32(NFT_REG_1)),
        attribute(NFTA_CMP_OP, be32(NFT_CMP_EQ)),
        nested(NFTA_CMP_DATA, attribute(NFTA_DATA_VALUE, value)),
    )


def queue_rule(table: str, chain: str, saddr: str, queue: int, seq: int) -> bytes:
    """`meta nfproto ipv4 ip saddr <saddr> NFQUEUE num <queue> bypass`, appended to an inet
    table's chain."""
    rule = (
        expression(
            "meta",
            attribute(NFTA_META_DREG, be32(NFT_REG_1)),
            attribute(NFTA_META_KEY, be32(NFT_META_NFPROTO)),
        )
        + equals(bytes([NFPROTO_IPV4]))
        + expression(
            "payload",
            attribute(NFTA_PAYLOAD_DREG, be32(NFT_REG_1)),
            attribute(NFTA_PAYLOAD_BASE, be32(NFT_PAYLOAD_NETWORK_HEADER)),
            attribute(NFTA_PAYLOAD_OFFSET, be32(IPV4_SADDR_OFFSET)),
            attribute(NFTA_PAYLOAD_LEN, be32(IPV4_ADDRESS_BYTES)),
        )
        + equals(socket.inet_aton(saddr))
        + expression(
            "target",
            attribute(NFTA_TARGET_NAME, strz("NFQUEUE")),
            attribute(NFTA_TARGET_REV, be32(NFQUEUE_TARGET_REVISION)),
            attribute(NFTA_TARGET_INFO, NFQUEUE_INFO_V3.pack(queue, 1, NFQ_FLAG_BYPASS)),
        )
    )
    body = (
        attribute(NFTA_RULE_TABLE, strz(table))
        + attribute(NFTA_RULE_CHAIN, strz(chain))
        + nested(NFTA_RULE_EXPRESSIONS, rule)
    )
    # ECHO: the kernel sends the rule back as committed, with the handle that deletes it.
    flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK | NLM_F_ECHO
    kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE
    return message(kind, flags, NFPROTO_INET, 0, body, seq)


def add_queue_rule(table: str, chain: str, saddr: str, queue: int) -> int:
    """Append the queue rule to inet `table`'s `chain`, in the calling thread's namespace, as one
    nf_tables transaction (batch begin, the rule, batch end); return the rule's handle."""
    begin = message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, AF_UNSPEC, NFNL_SUBSYS_NFTABLES, b"")
    end = message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, AF_UNSPEC, NFNL_SUBSYS_NFTABLES, b"")
    what = f"NFQUEUE rule in inet {table} {chain}"
    with netfilter_socket() as sock:
        sock.send(begin + queue_rule(table, chain, saddr, queue, seq=1) + end)
        echoes = await_acks(sock, {1}, what)
    rule_kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE
    for echo in echoes:
        found = attributes(echo.payload[NFGEN_HEADER.size :])
        if echo.kind == rule_kind and NFTA_RULE_HANDLE in found:
            return int(struct.unpack("!Q", found[NFTA_RULE_HANDLE])[0])
    raise NetlinkError(0, f"{what}: added, but no echo told its handle")


# --- the queue --------------------------------------------------------------------------------


def queue_config(queue: int, seq: int) -> bytes:
    body = (
        attribute(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, AF_UNSPEC))
        + attribute(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
        + attribute(NFQA_CFG_QUEUE_MAXLEN, be32(QUEUE_PACKETS_MAX))
        + attribute(NFQA_CFG_MASK, be32(NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO))
        + attribute(NFQA_CFG_FLAGS, be32(NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO))
    )
    kind = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_CONFIG
    return message(kind, NLM_F_REQUEST | NLM_F_ACK, AF_UNSPEC, queue, body, seq)


def verdict(queue: int, packet_id: int) -> bytes:
    body = attribute(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
    kind = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_VERDICT
    return message(kind, NLM_F_REQUEST, AF_UNSPEC, queue, body)


def packet_ids(data: bytes) -> tuple[list[int], list[int]]:
    """The ids of the queued packets in a datagram, and the errnos of any refusals in it."""
    ids: list[int] = []
    errors: list[int] = []
    for found in messages(data):
        if found.kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            header = attributes(found.payload[NFGEN_HEADER.size :])[NFQA_PACKET_HDR]
            ids.append(struct.unpack_from("!I", header)[0])
        elif found.kind == NLMSG_ERROR and error_code(found):
            errors.append(error_code(found))
    return ids, errors


@dataclass
class Schedule:
    """Held packet ids by due time (sans-IO: the caller says what time it is)."""

    delay_ms: int
    jitter_ms: int
    rng: random.Random = field(default_factory=random.Random)
    _heap: list[tuple[float, int, int]] = field(default_factory=list)
    _arrivals: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.jitter_ms <= self.delay_ms <= DELAY_MS_MAX:
            raise ValueError(f"need 0 <= jitter_ms <= delay_ms <= {DELAY_MS_MAX}")

    def hold(self, packet_id: int, now_s: float) -> None:
        hold_ms = self.delay_ms + self.rng.uniform(-self.jitter_ms, self.jitter_ms)
        # The arrival count breaks ties so packets due at once leave in arrival order.
        heapq.heappush(self._heap, (now_s + hold_ms / 1000, self._arrivals, packet_id))
        self._arrivals += 1

    def due(self, now_s: float) -> list[int]:
        released: list[int] = []
        while self._heap and self._heap[0][0] <= now_s:
            released.append(heapq.heappop(self._heap)[2])
        return released

    def next_due_s(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def drain(self) -> list[int]:
        released = [entry[2] for entry in sorted(self._heap)]
        self._heap.clear()
        return released

    def __len__(self) -> int:
        return len(self._heap)


class Delayer:
    """Serves one queue in the calling thread's namespace: holds each packet, then accepts it."""

    def __init__(self, queue: int, schedule: Schedule) -> None:
        self.queue = queue
        self.schedule = schedule
        self.sock = netfilter_socket()
        try:
            self.sock.send(queue_config(queue, seq=1))
            await_acks(self.sock, {1}, f"binding NFQUEUE {queue}")
        except BaseException:
            self.sock.close()
            raise
        self.sock.setblocking(False)

    def receive(self) -> None:
        """Hold every packet the kernel has handed over so far."""
        while True:
            try:
                data = self.sock.recv(RECEIVE_BYTES_MAX)
            except BlockingIOError:
                return
            ids, errors = packet_ids(data)
            now_s = time.monotonic()
            for packet_id in ids:
                self.schedule.hold(packet_id, now_s)
            for code in errors:  # a verdict for a packet the kernel no longer holds: report it
                print(f"delayer {self.queue}: {os.strerror(code)}", file=sys.stderr)

    def accept(self, ids: list[int]) -> None:
        self.sock.setblocking(True)
        try:
            for start in range(0, len(ids), VERDICTS_PER_SEND_MAX):
                chunk = ids[start : start + VERDICTS_PER_SEND_MAX]
                self.sock.sendall(b"".join(verdict(self.queue, i) for i in chunk))
        finally:
            self.sock.setblocking(False)

    def release_due(self) -> None:
        self.accept(self.schedule.due(time.monotonic()))

    def release_all(self) -> None:
        """Accept everything held, and whatever was queued meanwhile."""
        self.receive()
        self.accept(self.schedule.drain())

    def close(self) -> None:
        self.sock.close()


_libc = ctypes.CDLL(None, use_errno=True)
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.setns.restype = ctypes.c_int


def enter_namespace(namespace: str) -> None:
    """Move the calling thread (only it) into the network namespace named in NETNS_DIR: Python
    3.11 has no os.setns."""
    fd = os.open(NETNS_DIR / namespace, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({namespace}): {os.strerror(errno)}")
    finally:
        os.close(fd)


def serve(delayers: Sequence[Delayer], wakeup: int, parent_pid: int, stopping: list[bool]) -> None:
    """Hold and release until told to stop or orphaned; then release everything."""
    poller = select.epoll()
    try:
        for delayer in delayers:
            poller.register(delayer.sock.fileno(), select.EPOLLIN)
        poller.register(wakeup, select.EPOLLIN)
        while not stopping and os.getppid() == parent_pid:
            dues_s = [d for delayer in delayers if (d := delayer.schedule.next_due_s()) is not None]
            wait_s = PARENT_CHECK_INTERVAL_S
            if dues_s:
                wait_s = min(wait_s, max(0.0, min(dues_s) - time.monotonic()))
            poller.poll(wait_s)
            for delayer in delayers:
                delayer.receive()
                delayer.release_due()
    finally:
        poller.close()
        for delayer in delayers:
            delayer.release_all()


def arguments(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.delay", description=__doc__)
    parser.add_argument("--namespace", action="append", required=True, help="a receiver's netns")
    parser.add_argument("--saddr", required=True, help="the sender's IPv4 address")
    parser.add_argument("--queue", type=int, required=True, help="NFQUEUE number, 0-65535")
    parser.add_argument("--table", required=True, help="inet table of the chain, in each netns")
    parser.add_argument("--chain", required=True, help="existing input chain to add the rule to")
    parser.add_argument("--delay-ms", type=int, required=True)
    parser.add_argument("--jitter-ms", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None, help="for the jitter's generator")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(sys.argv[1:] if argv is None else argv)
    parent_pid = os.getppid()
    stopping: list[bool] = []
    read_end, write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(write_end)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.append(True))
    rng = random.Random(args.seed)
    delayers: list[Delayer] = []
    handles: list[str] = []
    try:
        for namespace in args.namespace:
            enter_namespace(namespace)
            schedule = Schedule(args.delay_ms, args.jitter_ms, random.Random(rng.random()))
            delayers.append(Delayer(args.queue, schedule))
            handle = add_queue_rule(args.table, args.chain, args.saddr, args.queue)
            handles.append(f"{namespace}={handle}")
        print(READY_LINE, *handles, flush=True)
        serve(delayers, read_end, parent_pid, stopping)
    finally:
        for delayer in delayers:
            delayer.release_all()  # (serve did, unless setting up failed halfway)
            delayer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
