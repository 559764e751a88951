"""A whole cluster in network namespaces: 3 ZooKeeper members, 3 brokers and a client host.

Every node is a host of one `Network` (tests/faults/network.py), so any link between any two can
be cut or slowed; the brokers are real broker processes (tests/support/broker.py) started with
`ip netns exec`, the ensemble real ZooKeeper servers (tests/faults/ensemble.py). The calling
thread itself enters the client host's namespace for the cluster's life (`entered()`): the test's
own clients, probes and the workload then reach the nodes as any client on that network would,
and the client host can be cut off like any other. Threads the test starts inherit it; the
namespace is left, and everything stopped and deleted, when the block ends, failed or not.

    with fault_cluster(tmp_path) as cluster:
        cluster.net.partition([cluster.broker_host(1)], cluster.zookeeper_hosts)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.faults.delay import CLONE_NEWNET, enter_namespace
from tests.faults.ensemble import Ensemble, MemberSpec
from tests.faults.network import Host, Network
from tests.support.broker import READY_TIMEOUT_S, BrokerProcess

BROKERS: Final = 3
ZOOKEEPERS: Final = 3
# What the scenarios run with: a session timeout that lets a cut-off broker lose its session
# within a scenario, and Kafka's durability settings for acks=all writes.
SESSION_TIMEOUT_MS: Final = 6_000
SETTINGS: Final[Mapping[str, str]] = {
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "replica.lag.time.max.ms": "3000",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "unclean.leader.election.enable": "false",
    "offsets.topic.replication.factor": "3",
}

_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """The calling thread in `namespace` until the block ends, then back where it was."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        enter_namespace(namespace)
        try:
            yield
        finally:
            if _libc.setns(own, CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"setns back to the test's namespace: {os.strerror(errno)}")
    finally:
        os.close(own)


# A broker's data dir on a disk of its own (tests/faults/disks.py), mounted before it starts.
DiskFactory = Callable[[Path], AbstractContextManager[object]]


@dataclass
class FaultCluster:
    net: Network
    ensemble: Ensemble
    brokers: dict[int, BrokerProcess]
    client: Host
    disks: dict[int, object]  # broker id -> its entered disk, for the brokers given one

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.bootstrap for broker in self.brokers.values())

    @property
    def zookeeper_hosts(self) -> list[Host]:
        return [self.host(f"zk{member.sid}") for member in self.ensemble.members]

    @property
    def broker_hosts(self) -> list[Host]:
        return [self.broker_host(broker_id) for broker_id in self.brokers]

    def broker_host(self, broker_id: int) -> Host:
        return self.host(f"b{broker_id}")

    def host(self, name: str) -> Host:
        return next(host for host in self.net.hosts if host.name == name)

    def restart_broker(self, broker_id: int, timeout_s: float = READY_TIMEOUT_S) -> None:
        broker = self.brokers[broker_id]
        broker.kill()
        broker.start()
        broker.wait_ready(timeout_s)

    def describe_logs(self) -> str:
        return "\n".join(broker.describe_log() for broker in self.brokers.values())


@contextlib.contextmanager
def fault_cluster(
    home: Path,
    settings: Mapping[str, str] | None = None,
    disks: Mapping[int, DiskFactory] | None = None,
) -> Iterator[FaultCluster]:
    with Network() as net, contextlib.ExitStack() as mounted:
        zookeeper_hosts = [net.add_host(f"zk{sid}") for sid in range(1, ZOOKEEPERS + 1)]
        broker_hosts = {i: net.add_host(f"b{i}") for i in range(1, BROKERS + 1)}
        client = net.add_host("client")
        specs = [MemberSpec(host.address, net.command(host, [])) for host in zookeeper_hosts]
        with entered(client.namespace), Ensemble(specs, home / "zookeeper") as ensemble:
            brokers = {
                broker_id: BrokerProcess(
                    broker_id=broker_id,
                    zk_connect=ensemble.connect_string,
                    data_dir=home / f"broker-{broker_id}" / "data",
                    log_dir=home / f"broker-{broker_id}",
                    settings={**SETTINGS, **(settings or {})},
                    host=host.address,
                    command_prefix=net.command(host, []),
                )
                for broker_id, host in broker_hosts.items()
            }
            # Unmounted after the brokers are killed (the stack unwinds after the finally).
            entered_disks = {
                broker_id: mounted.enter_context(make(brokers[broker_id].data_dir))
                for broker_id, make in (disks or {}).items()
            }
            try:
                for broker in brokers.values():
                    broker.start()
                for broker in brokers.values():
                    broker.wait_ready()
                yield FaultCluster(net, ensemble, brokers, client, entered_disks)
            finally:
                for broker in brokers.values():
                    broker.kill()
