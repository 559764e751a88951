"""A 3-member ZooKeeper ensemble of real servers on loopback: it elects a leader, survives
losing it, and keeps every acknowledged write while its members are wiped one at a time under a
client that goes on writing."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError
from kazoo.handlers.threading import KazooTimeoutError

from tests.faults.ensemble import Ensemble, Member, MemberState, loopback_members

pytestmark = pytest.mark.processes

SESSION_TIMEOUT_S: Final = 10.0
CONNECT_TIMEOUT_S: Final = 15.0
WRITE_INTERVAL_S: Final = 0.02
RETRY_INTERVAL_S: Final = 0.05
# Writes a client must get acknowledged while a member is down, to show it is writing then.
WRITES_WHILE_DOWN: Final = 5
WRITES_TIMEOUT_S: Final = 20.0


@contextmanager
def connected(hosts: str) -> Iterator[KazooClient]:
    client = KazooClient(
        hosts=hosts,
        timeout=SESSION_TIMEOUT_S,
        connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0},
    )
    try:
        client.start(timeout=CONNECT_TIMEOUT_S)
        yield client
    finally:
        client.stop()
        client.close()


def children_via(member: Member, path: str) -> set[str]:
    """`path`'s children as `member` alone serves them, after catching up with the leader."""
    with connected(member.connect_string) as client:
        client.sync(path)
        return set(client.get_children(path))


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[Ensemble]:
    members = loopback_members(3)
    # As a network helper would with `ip netns exec NS`: the member runs behind a prefix.
    members[2] = dataclasses.replace(members[2], prefix=["env", "RBF_MEMBER=3"])
    with Ensemble(members, tmp_path / "ensemble") as started:
        yield started
    assert all(member.state is MemberState.STOPPED for member in started.members)


def test_a_quorum_serves_and_survives_losing_its_leader(ensemble: Ensemble) -> None:
    first, second, prefixed = ensemble.members
    environment = Path(f"/proc/{prefixed.pid}/environ").read_bytes().split(b"\0")
    assert b"RBF_MEMBER=3" in environment  # the prefix ran, and exec'd the server
    with connected(first.connect_string) as client:
        client.create("/kept", b"value")
    with connected(second.connect_string) as client:
        assert client.get("/kept")[0] == b"value"

    old_leader = ensemble.leader()
    assert old_leader is not None
    statuses = ensemble.statuses()
    assert sorted(s.mode for s in statuses.values() if s is not None) == [
        "follower",
        "follower",
        "leader",
    ]
    old_leader.kill()
    new_leader = ensemble.wait_quorum()
    assert new_leader is not old_leader
    survivor = next(m for m in ensemble.members if m.state is MemberState.RUNNING)
    with connected(survivor.connect_string) as client:
        assert client.get("/kept")[0] == b"value"
        client.create("/while-down", b"")

    old_leader.start()
    assert ensemble.wait_quorum() is new_leader  # it rejoins as a follower
    assert "while-down" in children_via(old_leader, "/")

    # A paused follower: the other two are a quorum and take writes; resumed, it catches up.
    follower = next(m for m in ensemble.members if m is not new_leader)
    follower.pause()
    assert follower.status() is None
    with connected(new_leader.connect_string) as client:
        client.create("/while-paused", b"")
    follower.resume()
    ensemble.wait_quorum()
    assert "while-paused" in children_via(follower, "/")


class Writer(threading.Thread):
    """A client writing /log/000000, /log/000001... through the whole ensemble, each until it
    knows the write happened; `acknowledged` lists those it knows of."""

    def __init__(self, hosts: str) -> None:
        super().__init__(name="zk-writer", daemon=True)
        self.hosts = hosts
        self.acknowledged: list[str] = []
        self.error: BaseException | None = None
        self._stopping = threading.Event()

    def run(self) -> None:
        try:
            with connected(self.hosts) as client:
                client.ensure_path("/log")
                while not self._stopping.is_set():
                    name = f"{len(self.acknowledged):06d}"
                    if self._write(client, f"/log/{name}"):
                        self.acknowledged.append(name)
                    time.sleep(WRITE_INTERVAL_S)
        except BaseException as error:  # reported by stop()
            self.error = error

    def _write(self, client: KazooClient, path: str) -> bool:
        while not self._stopping.is_set():
            try:
                client.create(path, b"")
                return True
            except NodeExistsError:
                return True  # an attempt whose answer was lost went through
            except (KazooException, KazooTimeoutError):
                time.sleep(RETRY_INTERVAL_S)  # failing over to another member
        return False

    def wait_for_more(self, count: int) -> None:
        target = len(self.acknowledged) + count
        deadline = time.monotonic() + WRITES_TIMEOUT_S
        while len(self.acknowledged) < target:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"writes stalled at {len(self.acknowledged)}"
            time.sleep(WRITE_INTERVAL_S)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=CONNECT_TIMEOUT_S)
        assert self.error is None, self.error


def test_wiping_one_member_at_a_time_keeps_every_acknowledged_write(ensemble: Ensemble) -> None:
    writer = Writer(ensemble.connect_string)
    writer.start()
    try:
        writer.wait_for_more(WRITES_WHILE_DOWN)
        for member in ensemble.members:
            member.stop()
            member.wipe()
            assert [path.name for path in member.data_path.iterdir()] == ["myid"]
            writer.wait_for_more(WRITES_WHILE_DOWN)  # the other two are a quorum
            written = set(writer.acknowledged)
            member.start()
            ensemble.wait_quorum()
            # Synced from the others before it served: everything written so far is on it.
            assert written <= children_via(member, "/log")
        writer.wait_for_more(WRITES_WHILE_DOWN)
    finally:
        writer.stop()
    every_write = set(writer.acknowledged)
    for member in ensemble.members:
        assert every_write <= children_via(member, "/log"), f"sid {member.sid} lost writes"
