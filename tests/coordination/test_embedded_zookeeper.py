"""EmbeddedZooKeeper: start, restart on the same data, clean stop, clear startup errors."""

import os
import socket
from pathlib import Path

import pytest
from riverbed.coordination.embedded_zk import EmbeddedZooKeeper, ZooKeeperStartError, ruok
from riverbed.coordination.zk import AsyncZooKeeper

from tests.support.zookeeper import new_test_server

# Each test starts ZooKeeper (a JVM) itself.
pytestmark = pytest.mark.processes


async def test_restart_keeps_data_and_leaves_no_process(tmp_path: Path) -> None:
    server = new_test_server(tmp_path)
    with server:
        pid = server._process.pid if server._process else 0
        async with AsyncZooKeeper(server.connect_string) as zk:
            await zk.create("/kept", b"yes")
    assert not ruok(server.host, server.port)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped: no orphan, no zombie

    server.start()
    try:
        async with AsyncZooKeeper(server.connect_string) as zk:
            assert (await zk.get("/kept"))[0] == b"yes"
    finally:
        server.stop()
    server.stop()  # idempotent
    assert (tmp_path / "zoo.cfg").read_text().count("admin.enableServer=false") == 1


def test_failed_start_reports_the_log_tail(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = EmbeddedZooKeeper(tmp_path, port=taken.getsockname()[1], tick_time_ms=100)
        with pytest.raises(ZooKeeperStartError) as caught:
            server.start(timeout_ms=15_000)
    message = str(caught.value)
    assert "\n" not in message
    assert "log tail:" in message
    assert "Address already in use" in message
    assert not server.running
