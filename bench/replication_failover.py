"""How long a partition takes no acks=all writes when its leader is killed or stopped.

One round: with the partition's replicas all in sync, a warm Riverbed `Producer` (connected, the
leader known, one record acknowledged) stands by; the leader gets SIGKILL (a crash) or SIGTERM (a
controlled shutdown). From that signal the producer writes one record at a time to partition 0
(`send_and_wait` in a loop; the producer itself retries with short backoffs and refreshes its
metadata after each failure; a call that still fails is recorded and made again) until a write
sent after the stopped broker's process exited is acknowledged (by a new leader, so the window
covers the handover). The round's unavailability is the longest stretch in that window, counted
from the signal, with no acknowledged write. A stopped broker still running EXIT_WAIT_S after
the signal ends the window there; it is then SIGKILLed, and the round says so.

After SIGKILL the first acknowledged write is the new leader's, so this is simply the time from
the signal to the first acknowledgement. After SIGTERM the old leader keeps acknowledging writes
while it asks the controller to move its leaderships, so the time to the first acknowledgement
(also recorded, `first_ack_s`) says nothing; the longest stretch covers the handover.

After SIGKILL nothing tells ZooKeeper: the dead leader's session, and with it its registration,
ends zookeeper.session.timeout.ms after its last heartbeat (rounded up to ZooKeeper's tick); only
then does the controller elect another leader.

Between rounds the stopped broker is restarted (same id, port and data dir) and the round waits
until it is back in the partition's ISR, so every round starts from a fully replicated partition.
The next round stops whichever broker leads then.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from riverbed import Producer
from riverbed.errors import KafkaError

from bench.procs import Broker, Cluster, ProcessFailed
from bench.replication_topics import partition_state, wait_for_isr

# The probing producer: acks=all, no lingering, and short waits between its retries and metadata
# refreshes (Kafka's defaults, 100 ms growing to 1 s, would add up to a second to what is seen).
PROBE_PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": "all",
    "linger_ms": 0,
    "retry_backoff_ms": 10,
    "retry_backoff_max_ms": 100,
}
PROBE_VALUE = b"probe"
# A round whose partition takes no write for this long failed; that is not a number to report.
ROUND_TIMEOUT_S = 120.0
# A stopped leader still running this long after the signal hangs; it is then SIGKILLed.
EXIT_WAIT_S = 30.0
# A restarted broker: its startup, then catching up and rejoining the ISR.
REJOIN_TIMEOUT_S = 120.0
# Failed send_and_wait calls kept per round; more would only repeat themselves.
ROUND_ERRORS_MAX = 10
# How often the stopped broker's process is checked for its exit.
EXIT_POLL_S = 0.001
# Connecting to ZooKeeper to watch the stopped broker's registration.
ZOOKEEPER_TIMEOUT_S = 30.0
# Before calling again after a call failed (the producer already waited between its retries).
CALL_RETRY_BACKOFF_S = 0.01


def measure_rounds(
    cluster: Cluster, topic: str, sig: signal.Signals, rounds: int
) -> list[dict[str, Any]]:
    """`rounds` rounds of stopping the leader with `sig` (see the module docstring)."""
    replicas = len(cluster.brokers)
    results = []
    for _ in range(rounds):
        before = wait_for_isr(cluster.bootstrap, topic, replicas, REJOIN_TIMEOUT_S)
        probe = asyncio.run(_probe(cluster, topic, before.leader, sig))
        stopped = cluster.brokers[before.leader]
        hung = stopped.running
        if hung:
            stopped.kill()
        exit_code = stopped.wait_exit()
        after = partition_state(cluster.bootstrap, topic)
        startup_s = cluster.restart(before.leader, REJOIN_TIMEOUT_S)
        restarted = time.perf_counter()
        wait_for_isr(cluster.bootstrap, topic, replicas, REJOIN_TIMEOUT_S)
        results.append(
            {
                **probe,
                "stopped_leader": before.leader,
                "stopped_broker_was_controller": before.controller == before.leader,
                "exit_code": exit_code,
                f"sigkilled_after_{EXIT_WAIT_S:g}_s_still_running": hung,
                "leader_after": after.leader,
                "isr_after": list(after.isr),
                "restart_startup_s": startup_s,
                "restart_to_back_in_isr_s": time.perf_counter() - restarted,
            }
        )
    return results


async def _probe(cluster: Cluster, topic: str, leader: int, sig: signal.Signals) -> dict[str, Any]:
    """Signal the leader, then write until the partition has moved (see the module docstring)."""
    broker = cluster.brokers[leader]
    with broker.registration_watch(ZOOKEEPER_TIMEOUT_S) as registration:
        async with Producer(
            bootstrap_servers=cluster.bootstrap, **PROBE_PRODUCER_SETTINGS
        ) as producer:
            await producer.send_and_wait(topic, PROBE_VALUE, partition=0)  # connected, warm
            writes = _Writes(signalled=time.perf_counter())
            broker.send_signal(sig)
            exit_watch = asyncio.create_task(writes.watch_exit(broker))
            try:
                await writes.until_handed_over(producer, topic)
            finally:
                exit_watch.cancel()
    deleted_at = registration.deleted_at
    return {
        "unavailable_s": writes.gap_s_max,
        "registration_deleted_s": None if deleted_at is None else deleted_at - writes.signalled,
        "stopped_broker_exited_s": writes.exited_s,
        "first_ack_s": writes.acks_s[0] if writes.acks_s else None,
        "last_ack_s": writes.last_ack_s,
        "acknowledged_writes": len(writes.acks_s),
        "failed_calls": writes.errors,
    }


@dataclass(slots=True)
class _Writes:
    """Acknowledged writes after the signal, in seconds since it (`signalled`, perf_counter)."""

    signalled: float
    acks_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    exited_s: float | None = None
    last_ack_s: float = 0.0  # the stretch without an ack starts at the signal
    gap_s_max: float = 0.0

    def since_signal_s(self) -> float:
        return time.perf_counter() - self.signalled

    async def watch_exit(self, broker: Broker) -> None:
        # The broker is another process: nothing in this one can set an Event when it exits.
        while broker.running:  # noqa: ASYNC110
            await asyncio.sleep(EXIT_POLL_S)
        self.exited_s = self.since_signal_s()

    async def until_handed_over(self, producer: Producer, topic: str) -> None:
        """Write one record at a time until a write sent after the broker's exit is
        acknowledged, or until EXIT_WAIT_S passed without an exit."""
        while True:
            sent_s = self.since_signal_s()
            if self.exited_s is None and sent_s > EXIT_WAIT_S:
                return  # a stop that hangs: reported by the caller
            sent_after_exit = self.exited_s is not None
            try:
                async with asyncio.timeout(ROUND_TIMEOUT_S - self.since_signal_s()):
                    await producer.send_and_wait(topic, PROBE_VALUE, partition=0)
            except TimeoutError:
                raise ProcessFailed(
                    f"a write to {topic}-0 still unacknowledged {ROUND_TIMEOUT_S} s after the "
                    f"signal; errors: {self.errors}"
                ) from None
            except KafkaError as error:
                if len(self.errors) < ROUND_ERRORS_MAX:
                    self.errors.append(f"{self.since_signal_s():.3f} s: {error!r}")
                await asyncio.sleep(CALL_RETRY_BACKOFF_S)
                continue
            ack_s = self.since_signal_s()
            self.gap_s_max = max(self.gap_s_max, ack_s - self.last_ack_s)
            self.last_ack_s = ack_s
            self.acks_s.append(ack_s)
            if sent_after_exit:
                return
