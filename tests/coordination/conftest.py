from collections.abc import Iterator
from pathlib import Path

import pytest
from riverbed.coordination.embedded_zk import EmbeddedZooKeeper

from tests.support.zookeeper import new_test_server, zk_chroot, zookeeper  # noqa: F401


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[EmbeddedZooKeeper]:
    """A ZooKeeper server of the test's own, to stop and start."""
    with new_test_server(tmp_path) as server:
        yield server
