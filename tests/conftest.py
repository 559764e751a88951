"""Fixtures shared by every test directory: a real ZooKeeper and real broker processes.

- `zookeeper`: one Debian ZooKeeper server per test process (tests/support/zookeeper.py).
- `zk_chroot` / `zk_connect`: a fresh chroot on it per test, so tests never see each other.
- `broker`, `broker_factory`: broker processes started as a user would (`python -m riverbed.cli
  broker ...`) on 127.0.0.1, killed at teardown (tests/support/broker.py).
- `cluster_factory`: N such brokers as one cluster, with fault injection (kill, terminate,
  restart, pause) and Metadata polling helpers (tests/support/cluster.py).
"""

from __future__ import annotations

import pytest

from tests.support.broker import broker, broker_factory  # noqa: F401
from tests.support.cluster import cluster_factory  # noqa: F401
from tests.support.zookeeper import own_zookeeper, zk_chroot, zookeeper  # noqa: F401


@pytest.fixture
def zk_connect(zk_chroot: str) -> str:  # noqa: F811 - the fixture, by its name
    return zk_chroot
