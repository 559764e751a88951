"""Broker settings from RIVERBED_* environment variables (riverbed.cli.env_config), their place in
the precedence order of `riverbed broker`, and a broker process configured by them alone."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from riverbed.cli import main as cli
from riverbed.cli.env_config import NOT_SETTINGS, setting_name, settings_from_env
from riverbed.client.admin import Admin
from riverbed.configs import BROKER_CONFIGS, BrokerConfig, ConfigError

from tests.support.broker import HOST, BrokerProcess

ZK = "127.0.0.1:2181"


def broker_config(argv: list[str], environ: dict[str, str]) -> BrokerConfig:
    args = cli._parser().parse_args(["broker", *argv])
    return cli.broker_config_from_args(args, environ)


@pytest.mark.parametrize(
    ("variable", "name"),
    [
        ("RIVERBED_ZOOKEEPER_CONNECT", "zookeeper.connect"),
        ("RIVERBED_LOG_RETENTION_MS", "log.retention.ms"),
        ("RIVERBED_REMOTE_STORAGE_URL", "remote.storage.url"),
        ("RIVERBED_REMOTE_STORAGE_S3_PATH_STYLE_ACCESS", "remote.storage.s3.path.style.access"),
        ("RIVERBED_A__B___C_D", "a_b-c.d"),
        ("RIVERBED_broker_ID", "broker.id"),
    ],
)
def test_variable_names_map_like_confluents_images(variable: str, name: str) -> None:
    assert setting_name(variable) == name


def test_every_broker_setting_has_a_variable_that_maps_back_to_it() -> None:
    for name in BROKER_CONFIGS:
        variable = "RIVERBED_" + name.replace(".", "_").upper()
        assert setting_name(variable) == name


def test_settings_come_from_riverbed_variables_only() -> None:
    environ = {
        "RIVERBED_ZOOKEEPER_CONNECT": ZK,
        "RIVERBED_DEFAULT_REPLICATION_FACTOR": "3",
        "RIVERBED_REMOTE_STORAGE_S3_ENDPOINT": "http://minio:9000",
        "RIVERBED_LOG_LEVEL": "DEBUG",  # the CLI's, not a broker setting
        "AWS_REGION": "us-east-1",  # the S3 store's
        "PATH": "/usr/bin",
        "XRIVERBED_NUM_PARTITIONS": "2",
    }
    assert settings_from_env(environ) == {
        "zookeeper.connect": ZK,
        "default.replication.factor": "3",
        "remote.storage.s3.endpoint": "http://minio:9000",
    }
    assert frozenset({"RIVERBED_LOG_LEVEL", "RIVERBED_LOG_FORMAT"}) == NOT_SETTINGS


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        ("RIVERBED_LOG_RETENTON_MS", "RIVERBED_LOG_RETENTION_MS"),
        ("RIVERBED_ZOOKEEPER_CONECT", "RIVERBED_ZOOKEEPER_CONNECT"),
        ("RIVERBED_REMOTE_STORAGE_S3_ENDPIONT", "RIVERBED_REMOTE_STORAGE_S3_ENDPOINT"),
        ("RIVERBED_LOG_LEVELS", None),
    ],
)
def test_a_variable_naming_no_setting_is_a_one_line_error_naming_it(
    variable: str, suggestion: str | None
) -> None:
    with pytest.raises(ConfigError) as raised:
        settings_from_env({"RIVERBED_ZOOKEEPER_CONNECT": ZK, variable: "1"})
    message = str(raised.value)
    assert variable in message
    assert "\n" not in message
    if suggestion is not None:
        assert f"did you mean {suggestion}?" in message


def test_a_bad_value_is_reported_with_its_variable() -> None:
    with pytest.raises(ConfigError) as raised:
        settings_from_env({"RIVERBED_NUM_PARTITIONS": "zero"})
    message = str(raised.value)
    assert "RIVERBED_NUM_PARTITIONS" in message
    assert "num.partitions" in message
    assert message.count("INVALID_CONFIG") == 1, message


def test_precedence_defaults_file_environment_set_flags(tmp_path: Path) -> None:
    properties = tmp_path / "server.properties"
    properties.write_text(
        f"zookeeper.connect={ZK}\nnum.partitions=2\nlog.retention.ms=1000\nbroker.id=5\n"
        "log.roll.ms=600000\n"
    )
    environ = {
        "RIVERBED_NUM_PARTITIONS": "3",  # over the file
        "RIVERBED_LOG_RETENTION_MS": "2000",  # over the file, under --set
        "RIVERBED_BROKER_ID": "6",  # under --id
        "RIVERBED_LISTENERS": "PLAINTEXT://0.0.0.0:19092",  # under --listen
    }
    config = broker_config(
        [
            "--config",
            str(properties),
            "--set",
            "log.retention.ms=3000",
            "--id",
            "7",
            "--listen",
            "127.0.0.1:9093",
        ],
        environ,
    )
    assert config.log_roll_ms == 600000  # file only
    assert config.num_partitions == 3
    assert config.log_retention_ms == 3000
    assert config.broker_id == 7
    assert config.listeners == ("PLAINTEXT://127.0.0.1:9093",)
    assert config.log_segment_bytes == BROKER_CONFIGS["log.segment.bytes"].default


def test_environment_alone_configures_a_broker() -> None:
    config = broker_config(
        [],
        {
            "RIVERBED_ZOOKEEPER_CONNECT": "zookeeper:2181",
            "RIVERBED_BROKER_ID": "2",
            "RIVERBED_MIN_INSYNC_REPLICAS": "2",
            "RIVERBED_REMOTE_STORAGE_URL": "s3://riverbed/cold",
            "RIVERBED_REMOTE_STORAGE_S3_REGION": "us-east-1",
        },
    )
    assert config.zookeeper_connect == "zookeeper:2181"
    assert config.broker_id == 2
    assert config.min_insync_replicas == 2
    assert config.remote_storage_url == "s3://riverbed/cold"
    assert config.remote_storage_s3 == {"remote.storage.s3.region": "us-east-1"}
    assert "min.insync.replicas" in config.explicit


def test_broker_config_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIVERBED_ZOOKEEPER_CONNECT", ZK)
    monkeypatch.setenv("RIVERBED_NUM_PARTITIONS", "4")
    args = cli._parser().parse_args(["broker"])
    assert cli.broker_config_from_args(args).num_partitions == 4


class EnvConfiguredBroker(BrokerProcess):
    """`riverbed broker` with no flags at all: everything comes from the environment."""

    def command(self) -> list[str]:
        return super().command()[:4]  # python -m riverbed.cli broker


def test_broker_process_configured_by_environment_only_serves(
    tmp_path: Path, zk_connect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in list(os.environ):
        if variable.startswith("RIVERBED_"):
            monkeypatch.delenv(variable)
    broker = EnvConfiguredBroker(
        broker_id=7, zk_connect=zk_connect, data_dir=tmp_path / "data", log_dir=tmp_path
    )
    listener = f"PLAINTEXT://{broker.bootstrap}"
    environment = {
        "RIVERBED_BROKER_ID": "7",
        "RIVERBED_ZOOKEEPER_CONNECT": zk_connect,
        "RIVERBED_LISTENERS": listener,
        "RIVERBED_ADVERTISED_LISTENERS": listener,
        "RIVERBED_LOG_DIRS": str(broker.data_dir),
        "RIVERBED_NUM_PARTITIONS": "3",
        "RIVERBED_LOG_LEVEL": "INFO",
    }
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    assert broker.command()[-1] == "broker"
    broker.start()
    try:
        broker.wait_ready()

        async def create_and_describe() -> tuple[int, set[int]]:
            async with Admin(bootstrap_servers=broker.bootstrap) as admin:
                await admin.create_topic("from-env")  # -1 partitions: num.partitions
                topic = await admin.describe_topic("from-env")
                return len(topic.partitions), {p.leader for p in topic.partitions}

        partitions, leaders = asyncio.run(create_and_describe())
        assert partitions == 3
        assert leaders == {7}
        assert (broker.data_dir / "from-env-0").is_dir()
        assert broker.bootstrap.startswith(HOST)
    finally:
        broker.kill()
