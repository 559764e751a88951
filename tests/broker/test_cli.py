"""The `riverbed` command as a user runs it: topic administration and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broker import BrokerFactory, BrokerProcess
from tests.support.ports import free_port

CLI_TIMEOUT_S = 60


def rows(table: str) -> list[list[str]]:
    """The cells of each line of a table the CLI printed (no cell holds a space)."""
    return [line.split() for line in table.splitlines()]


def riverbed(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "riverbed.cli", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=cwd,
    )


def test_topics_create_list_describe_delete(broker: BrokerProcess) -> None:
    server = ("--bootstrap-server", broker.bootstrap)
    created = riverbed(
        "topics",
        "create",
        "orders",
        "--partitions",
        "3",
        "--config",
        "retention.ms=3600000",
        *server,
    )
    assert created.returncode == 0, created.stderr
    assert riverbed("topics", "list", *server).stdout.split() == ["orders"]

    described = riverbed("topics", "describe", "orders", "--json", *server)
    assert described.returncode == 0, described.stderr
    topic = json.loads(described.stdout)
    assert [p["partition"] for p in topic["partitions"]] == [0, 1, 2]
    assert all(p["leader"] == broker.broker_id for p in topic["partitions"])
    assert topic["configs"]["retention.ms"] == "3600000"
    assert topic["configs"]["cleanup.policy"] == "delete"

    text = riverbed("topics", "describe", "orders", *server).stdout
    assert ["2", "1", "0", "1", "1"] in [row[:5] for row in rows(text)]  # partition 2, leader 1
    assert ["retention.ms", "3600000", "topic"] in rows(text)

    assert all((broker.data_dir / f"orders-{p}").is_dir() for p in range(3))
    assert riverbed("topics", "delete", "orders", *server).returncode == 0
    assert riverbed("topics", "list", *server).stdout.split() == []
    # The answer waits until the broker applied the deletion: the logs are gone.
    assert not any((broker.data_dir / f"orders-{p}").exists() for p in range(3))


def test_topics_alter_sets_and_removes_overrides_and_describe_shows_each_source(
    broker_factory: BrokerFactory,
) -> None:
    broker = broker_factory({"log.segment.bytes": "2097152"})
    server = ("--bootstrap-server", broker.bootstrap)
    assert riverbed("topics", "create", "profiles", *server).returncode == 0
    altered = riverbed(
        "topics",
        "alter",
        "profiles",
        "--set",
        "cleanup.policy=compact",
        "--set",
        "min.cleanable.dirty.ratio=0.1",
        *server,
    )
    assert altered.returncode == 0, altered.stderr
    text = riverbed("topics", "describe", "profiles", *server).stdout
    assert ["cleanup.policy", "compact", "topic"] in rows(text)
    assert ["min.cleanable.dirty.ratio", "0.1", "topic"] in rows(text)
    assert ["segment.bytes", "2097152", "broker"] in rows(text)
    described = json.loads(riverbed("topics", "describe", "profiles", "--json", *server).stdout)
    assert described["config_sources"]["cleanup.policy"] == "topic"
    assert described["config_sources"]["retention.ms"] == "default"

    removed = riverbed("topics", "alter", "profiles", "--delete", "cleanup.policy", *server)
    assert removed.returncode == 0, removed.stderr
    text = riverbed("topics", "describe", "profiles", *server).stdout
    assert ["cleanup.policy", "delete", "default"] in rows(text)
    assert ["min.cleanable.dirty.ratio", "0.1", "topic"] in rows(text)

    bad = riverbed("topics", "alter", "profiles", "--set", "cleanup.policy=shred", *server)
    assert bad.returncode == 1
    assert bad.stderr.strip().count("\n") == 0
    assert "INVALID_CONFIG" in bad.stderr
    assert "cleanup.policy" in bad.stderr
    nothing = riverbed("topics", "alter", "profiles", *server)
    assert nothing.returncode != 0
    assert "nothing to change" in nothing.stderr


def test_topic_errors_are_one_line_and_non_zero(broker: BrokerProcess) -> None:
    server = ("--bootstrap-server", broker.bootstrap)
    assert riverbed("topics", "create", "dup", *server).returncode == 0
    again = riverbed("topics", "create", "dup", *server)
    assert again.returncode == 1
    assert again.stderr.strip().count("\n") == 0
    assert "TOPIC_ALREADY_EXISTS" in again.stderr

    bad_config = riverbed("topics", "create", "x", "--config", "cleanup.policy=shred", *server)
    assert bad_config.returncode == 1
    assert "INVALID_CONFIG" in bad_config.stderr
    assert "cleanup.policy" in bad_config.stderr
    assert bad_config.stderr.strip().count("\n") == 0

    unknown = riverbed("topics", "delete", "nope", *server)
    assert unknown.returncode == 1
    assert "UNKNOWN_TOPIC_OR_PARTITION" in unknown.stderr

    rf = riverbed("topics", "create", "rf", "--replication-factor", "3", *server)
    assert rf.returncode == 1
    assert "INVALID_REPLICATION_FACTOR" in rf.stderr


@pytest.mark.processes
def test_unreachable_bootstrap_is_one_line() -> None:
    result = riverbed("topics", "list", "--bootstrap-server", f"127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert result.stderr.startswith("riverbed: error:")
    assert result.stderr.strip().count("\n") == 0


def test_bad_broker_config_is_one_line(tmp_path: Path, zk_connect: str) -> None:
    base = (
        "broker",
        "--id",
        "1",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--data-dir",
        str(tmp_path / "data"),
        "--zookeeper",
        zk_connect,
    )
    for setting, expected in (
        ("no.such.setting=1", "no.such.setting"),
        ("num.partitions=zero", "num.partitions"),
    ):
        result = riverbed(*base, "--set", setting)
        assert result.returncode == 1, result.stderr
        assert expected in result.stderr
        assert result.stderr.strip().count("\n") == 0, result.stderr


def test_config_file_uses_kafka_names(tmp_path: Path, zk_connect: str) -> None:
    properties = tmp_path / "server.properties"
    properties.write_text(
        "# a Kafka-style file\nnum.partitions=4\nauto.create.topics.enable=true\n"
    )
    broker = BrokerProcess(
        broker_id=1,
        zk_connect=zk_connect,
        data_dir=tmp_path / "data",
        log_dir=tmp_path,
        extra_args=("--config", str(properties)),
    )
    broker.start()
    try:
        broker.wait_ready()
        # Auto-created through Metadata: num.partitions came from the file.
        subprocess.run(
            ["kcat", "-L", "-b", broker.bootstrap, "-t", "auto"],
            capture_output=True,
            timeout=CLI_TIMEOUT_S,
            check=True,
        )
        described = riverbed(
            "topics", "describe", "auto", "--json", "--bootstrap-server", broker.bootstrap
        )
        assert len(json.loads(described.stdout)["partitions"]) == 4
    finally:
        broker.kill()


@pytest.mark.processes
def test_unreachable_zookeeper_is_one_line(tmp_path: Path) -> None:
    result = riverbed(
        "broker", "--id", "1", "--listen", f"127.0.0.1:{free_port()}",
        "--data-dir", str(tmp_path / "data"), "--zookeeper", f"127.0.0.1:{free_port()}",
        "--set", "zookeeper.connection.timeout.ms=2000",
    )  # fmt: skip
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("riverbed: error:")]
    assert errors == [errors[0]], result.stderr
    assert "could not connect to ZooKeeper" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_second_broker_on_the_same_data_dir_is_refused(
    broker: BrokerProcess, zk_connect: str
) -> None:
    result = riverbed(
        "broker", "--id", "2", "--listen", f"127.0.0.1:{free_port()}",
        "--data-dir", str(broker.data_dir), "--zookeeper", zk_connect,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("riverbed: error:")
    assert "Traceback" not in result.stderr
