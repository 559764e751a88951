"""Fixtures for tiering tests: moto's standalone S3 server (tests/support/moto_server.py).

- `moto_server`: one server for the whole test run (started on first use, killed at the end);
  tests share it, each with a fresh bucket (`s3_bucket`).
- `s3_bucket`: a new empty bucket on `moto_server`, named for nothing else.
- `tiered_broker`: a broker process tiering to a file:// store of its own; (broker, store root).
- `moto_server_factory(environment=None)`: a server of this test's own, to stop, restart or
  pause; killed at teardown.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import pytest

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.moto_server import MotoServer


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(moto_server: MotoServer) -> str:
    return moto_server.create_bucket(f"riverbed-{uuid.uuid4().hex[:16]}")


class MotoServerFactory(Protocol):
    def __call__(self, environment: Mapping[str, str] | None = None) -> MotoServer: ...


@pytest.fixture
def moto_server_factory(tmp_path: Path) -> Iterator[MotoServerFactory]:
    servers: list[MotoServer] = []

    def start(environment: Mapping[str, str] | None = None) -> MotoServer:
        server = MotoServer(tmp_path / f"moto-{len(servers)}.log", environment)
        servers.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def tiered_broker(broker_factory: BrokerFactory, tmp_path: Path) -> tuple[BrokerProcess, Path]:
    store = tmp_path / "cold"
    broker = broker_factory(
        {
            "remote.storage.url": f"file://{store}",
            "remote.log.manager.task.interval.ms": "200",
            "offsets.topic.replication.factor": "1",
            "zookeeper.session.timeout.ms": "6000",  # a killed broker re-registers sooner
        }
    )
    return broker, store
