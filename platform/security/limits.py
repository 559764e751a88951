"""Connection quotas: how many connections the broker, and each IP address, may hold at once.

Kafka's `max.connections` makes its acceptor wait for a free slot; a Python server that stops
accepting still leaves connections queued in the kernel's backlog, so Riverbed closes a
connection over a quota as soon as it is accepted, which frees its file descriptor at once
and tells the client to back off (every Kafka client reconnects with backoff). No I/O here: the
server asks `admit` for every accepted connection and calls `release` when it ends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int  # max.connections, over every listener
    max_connections_per_ip: int  # max.connections.per.ip
    per_ip_overrides: Mapping[str, int] = field(default_factory=dict)
    idle_ms_max: int = 600_000  # connections.max.idle.ms


class ConnectionQuotas:
    """Counts open connections per IP; shared by every listener of one broker."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._per_ip: Counter[str] = Counter()
        self._total = 0

    @property
    def open_count(self) -> int:
        return self._total

    def admit(self, host: str) -> str | None:
        """Count a new connection from `host`, or say why it must be closed instead."""
        if self._total >= self.limits.max_connections:
            return f"max.connections ({self.limits.max_connections}) reached"
        per_ip_max = self.limits.per_ip_overrides.get(host, self.limits.max_connections_per_ip)
        if self._per_ip[host] >= per_ip_max:
            return f"max.connections.per.ip ({per_ip_max}) reached for {host}"
        self._per_ip[host] += 1
        self._total += 1
        return None

    def release(self, host: str) -> None:
        """An admitted connection from `host` ended."""
        if self._per_ip[host] <= 0:
            raise RuntimeError(f"released a connection from {host} that was never admitted")
        self._per_ip[host] -= 1
        if self._per_ip[host] == 0:
            del self._per_ip[host]
        self._total -= 1
