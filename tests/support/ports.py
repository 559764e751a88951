"""Ports on 127.0.0.1 for the servers tests start (brokers, moto, proxies).

A port is picked now and bound later by another process, so three things can take it meanwhile:

- another server of the same test run, given the same port: bind(0) may hand out a port again
  as soon as its probe socket is closed (seen in CI: two brokers of one cluster got one port);
- the local end of an outgoing connection: clients get their ports from the kernel's ephemeral
  range (`ip_local_port_range`), and a listener cannot bind a port a connection holds;
- a server of another pytest-xdist worker: workers are separate processes that share no state.

So ports come from below the ephemeral range, none is handed out twice in one test run, and each
xdist worker picks from its own slice of that range.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path
from typing import Final

HOST: Final = "127.0.0.1"
EPHEMERAL_RANGE_PATH: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below the ephemeral range, and above the ports daemons usually take.
PICK_LOW: Final = 20_000
PICK_ATTEMPTS_MAX: Final = 1_000

_handed_out: set[int] = set()


def _pick_high() -> int:
    """The first port the kernel may use for outgoing connections (exclusive bound of ours)."""
    try:
        low = int(EPHEMERAL_RANGE_PATH.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768  # Linux's default
    return max(low, PICK_LOW + 1_000)


def _worker_slice(low: int, high: int) -> tuple[int, int]:
    """This process's share of [low, high): all of it, or one slice per pytest-xdist worker
    (PYTEST_XDIST_WORKER is "gw0", "gw1", ...)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count <= 1:
        return low, high
    index = int(worker.removeprefix("gw"))
    width = (high - low) // count
    return low + index * width, low + (index + 1) * width


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now and that this test run has not handed
    out before."""
    return free_port_run(1)


def free_port_run(count: int) -> int:
    """The first of `count` consecutive ports, each as `free_port()` gives them."""
    low, high = _worker_slice(PICK_LOW, _pick_high())
    high -= count - 1
    for _ in range(PICK_ATTEMPTS_MAX):
        base = random.randrange(low, high)
        run = range(base, base + count)
        if _handed_out.isdisjoint(run) and all(port_free(port) for port in run):
            _handed_out.update(run)
            return base
    raise RuntimeError(f"no {count} free consecutive ports on {HOST} in [{low}, {high})")


def port_free(port: int) -> bool:
    """Whether a listener could bind `port` on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True
