"""ZooKeeper access control with a real ZooKeeper and a real broker: with zookeeper.set.acl and
digest credentials, what the broker and the tools create (the chroot, registrations, topics,
SCRAM credentials) is unreadable to a session without the credentials, while the broker and the
tools that have them work as usual."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest
from riverbed import Consumer, Producer, TopicPartition
from riverbed.coordination.zk import AsyncZooKeeper, NoAuthError, ZkDigest

from tests.support.broker import BrokerFactory, BrokerProcess

CREDENTIALS: Final = "riverbed:zk-secret"
PROTECTED: Final = {"zookeeper.set.acl": "true", "zookeeper.auth.digest": CREDENTIALS}


def riverbed(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )  # fmt: skip


async def test_what_the_broker_and_tools_create_needs_the_credentials(
    broker_factory: BrokerFactory, zk_connect: str
) -> None:
    broker = broker_factory(PROTECTED)
    tool_env = {"RIVERBED_ZOOKEEPER_AUTH_DIGEST": CREDENTIALS, "RIVERBED_ZOOKEEPER_SET_ACL": "true"}
    added = riverbed("users", "add", "alice", "--mechanism", "SCRAM-SHA-512", "--password",
                     "alice-secret", "--zookeeper", zk_connect, env=tool_env)  # fmt: skip
    assert added.returncode == 0, added.stderr
    # The broker serves as usual: a topic created, written and read.
    async with Producer(bootstrap_servers=broker.bootstrap, acks="all") as producer:
        await producer.send("guarded", b"v", partition=0)
        await producer.flush()
    async with Consumer(bootstrap_servers=broker.bootstrap) as consumer:
        consumer.assign([TopicPartition("guarded", 0)])
        await consumer.seek_to_beginning()
        batches = await consumer.getmany(timeout_ms=10_000)
        assert [r.value for records in batches.values() for r in records] == [b"v"]

    # Without credentials, nothing under the chroot can be read or changed.
    async with AsyncZooKeeper(zk_connect) as anonymous:
        for path in ("/brokers/ids/1", "/brokers/topics/guarded", "/config/users/alice"):
            with pytest.raises(NoAuthError):
                await anonymous.get(path)
        with pytest.raises(NoAuthError):
            await anonymous.create("/brokers/ids/666", b"{}")
    # Other credentials do no better; the right ones read everything.
    async with AsyncZooKeeper(zk_connect, digest=ZkDigest("mallory", "guess")) as other:
        with pytest.raises(NoAuthError):
            await other.get("/config/users/alice")
    async with AsyncZooKeeper(zk_connect, digest=ZkDigest.parse(CREDENTIALS)) as insider:
        data, _ = await insider.get("/config/users/alice")
        assert b"SCRAM-SHA-512" in data
        assert b"alice-secret" not in data

    # A tool without the credentials fails with one line, and changes nothing.
    refused = riverbed("users", "list", "--zookeeper", zk_connect)
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "NoAuth" in refused.stderr


def test_set_acl_without_credentials_is_a_one_line_error(zk_connect: str, tmp_path: Path) -> None:
    broker = BrokerProcess(
        broker_id=1,
        zk_connect=zk_connect,
        data_dir=tmp_path / "data",
        log_dir=tmp_path,
        settings={"zookeeper.set.acl": "true"},
    )
    broker.start()
    try:
        assert broker._require_process().wait(timeout=60) != 0
        errors = [line for line in broker.log_tail().splitlines() if "riverbed: error:" in line]
        assert len(errors) == 1, broker.log_tail()
        assert "zookeeper.auth.digest" in errors[0], broker.log_tail()
    finally:
        broker.kill()
