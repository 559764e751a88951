"""riverbed.configs: topic/broker config parsing, validation and effective values."""

import re
from pathlib import Path

import pytest
from riverbed.configs import (
    TOPIC_CONFIG_DEFS,
    TOPIC_CONFIGS,
    BrokerConfig,
    ConfigError,
    ConfigSource,
    ConfigType,
    effective_broker_config,
    effective_topic_config,
    topic_config,
    validate_topic_configs,
)
from riverbed.protocol.errors import ErrorCode, KafkaError

from tests.support.kafka_topic_configs import KAFKA_TOPIC_CONFIGS

BROKER = {"zookeeper.connect": "127.0.0.1:2181"}


def test_valid_overrides_are_canonicalised() -> None:
    assert validate_topic_configs(
        {"cleanup.policy": "compact, delete", "unclean.leader.election.enable": "TRUE"}
    ) == {"cleanup.policy": "compact,delete", "unclean.leader.election.enable": "true"}


@pytest.mark.parametrize(
    ("configs", "key", "fragment"),
    [
        ({"retention.msec": "1"}, "retention.msec", "unknown topic config 'retention.msec'"),
        ({"cleanup.policy": "shred"}, "cleanup.policy", "compact, delete"),
        ({"segment.jitter.ms": "-1"}, "segment.jitter.ms", ">= 0"),
        ({"compression.gzip.level": "0"}, "compression.gzip.level", "[1, 9] or -1"),
        ({"compression.type": "brotli"}, "compression.type", "zstd"),
        ({"message.timestamp.type": "Now"}, "message.timestamp.type", "LogAppendTime"),
        ({"segment.bytes": "13"}, "segment.bytes", ">= 14"),
        ({"segment.bytes": "4294967296"}, "segment.bytes", "'4294967296'"),
        ({"retention.ms": "soon"}, "retention.ms", "'soon'"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio", "[0, 1]"),
        ({"remote.storage.enable": "yes"}, "remote.storage.enable", "'yes'"),
        ({"min.insync.replicas": None}, "min.insync.replicas", "null"),
    ],
)
def test_invalid_topic_config_names_the_key(
    configs: dict[str, str | None], key: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_topic_configs(configs)
    assert caught.value.key == key
    assert key in str(caught.value)
    assert fragment in str(caught.value)
    assert isinstance(caught.value, KafkaError)
    assert caught.value.code is ErrorCode.INVALID_CONFIG


def test_effective_config_sources() -> None:
    broker = BrokerConfig.from_mapping({**BROKER, "log.segment.bytes": "1048576"})
    effective = effective_topic_config(broker, {"retention.ms": "1000"})
    assert effective["retention.ms"].value == "1000"
    assert effective["retention.ms"].source is ConfigSource.TOPIC
    assert effective["segment.bytes"].value == "1048576"
    assert effective["segment.bytes"].source is ConfigSource.BROKER
    assert effective["cleanup.policy"].value == "delete"
    assert effective["cleanup.policy"].source is ConfigSource.DEFAULT
    assert [(s.name, s.source) for s in effective["segment.bytes"].synonyms] == [
        ("log.segment.bytes", ConfigSource.BROKER),
        ("log.segment.bytes", ConfigSource.DEFAULT),
    ]
    assert effective["retention.ms"].type is ConfigType.LONG
    assert effective["retention.ms"].documentation
    described = effective_broker_config(broker)
    assert described["log.segment.bytes"].source is ConfigSource.BROKER
    assert described["num.partitions"].source is ConfigSource.DEFAULT
    assert described["num.partitions"].read_only
    typed = topic_config(broker, {"retention.ms": "1000", "cleanup.policy": "compact"})
    assert (typed.retention_ms, typed.segment_bytes, typed.compact) == (1000, 1048576, True)
    assert typed.max_message_bytes == broker.message_max_bytes == 1048588


def test_broker_config_defaults_and_errors(tmp_path: Path) -> None:
    broker = BrokerConfig.from_mapping(BROKER)
    assert (broker.broker_id, broker.num_partitions, broker.default_replication_factor) == (0, 1, 1)
    assert broker.auto_create_topics_enable
    assert broker.socket_request_max_bytes == 104857600
    assert broker.advertised_host_port == ("127.0.0.1", 9092)
    assert (broker.host, broker.port, broker.advertised_host) == ("127.0.0.1", 9092, "127.0.0.1")
    assert broker.log_dir == "/tmp/riverbed-logs"
    assert broker.zookeeper_connect_timeout_ms == broker.zookeeper_session_timeout_ms == 18000
    with pytest.raises(ConfigError, match=r"'zookeeper\.connect' is required"):
        BrokerConfig.from_mapping({})
    with pytest.raises(ConfigError, match="'listeners'") as caught:
        BrokerConfig.from_mapping({**BROKER, "listeners": "localhost:9092"})
    assert caught.value.key == "listeners"
    with pytest.raises(ConfigError, match=r"unknown broker config 'num\.io\.threads'"):
        BrokerConfig.from_mapping({**BROKER, "num.io.threads": "8"})
    assert BrokerConfig.from_mapping({**BROKER, "num.io.threads": "8"}, allow_unknown=True)

    properties = tmp_path / "server.properties"
    properties.write_text(
        "# a Kafka-style file\nbroker.id=7\n! old-style comment\n"
        "listeners = PLAINTEXT://127.0.0.1:19092\nzookeeper.connect: 127.0.0.1:2181/rb\n"
    )
    loaded = BrokerConfig.load_properties(properties)
    assert (loaded.broker_id, loaded.zookeeper_connect) == (7, "127.0.0.1:2181/rb")
    assert loaded.advertised_host_port == ("127.0.0.1", 19092)


def test_every_topic_config_kafka_documents_is_known_and_no_other() -> None:
    assert sorted(TOPIC_CONFIGS) == sorted(KAFKA_TOPIC_CONFIGS)


@pytest.mark.parametrize("name", sorted(KAFKA_TOPIC_CONFIGS))
def test_each_kafka_topic_config_is_validated_stored_and_described(name: str) -> None:
    valid, invalid = KAFKA_TOPIC_CONFIGS[name]
    stored = validate_topic_configs({name: valid})
    assert list(stored) == [name]
    described = effective_topic_config(BrokerConfig.from_mapping(BROKER), stored)[name]
    assert (described.value, described.source) == (stored[name], ConfigSource.TOPIC)
    assert described.documentation
    with pytest.raises(ConfigError) as caught:
        validate_topic_configs({name: invalid})
    assert caught.value.key == name
    assert repr(invalid) in str(caught.value)


def test_an_empty_cleanup_policy_is_neither_delete_nor_compact() -> None:
    """Kafka 4: an empty list is valid, and means infinite retention without compaction."""
    assert validate_topic_configs({"cleanup.policy": " "}) == {"cleanup.policy": ""}
    typed = topic_config(BrokerConfig.from_mapping(BROKER), {"cleanup.policy": ""})
    assert (typed.cleanup_policy, typed.delete, typed.compact) == ((), False, False)
    described = effective_topic_config(BrokerConfig.from_mapping(BROKER), {"cleanup.policy": ""})
    assert described["cleanup.policy"].value == ""


def test_configs_without_effect_say_why_and_are_listed_in_the_status_page() -> None:
    status = (Path(__file__).parents[2] / "docs" / "status.md").read_text()
    section = status.split("## Topic configs accepted without effect", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z0-9.]+)` \|", section, flags=re.MULTILINE))
    inert = {d.name for d in TOPIC_CONFIG_DEFS if d.without_effect is not None}
    assert {"preallocate", "segment.jitter.ms", "file.delete.delay.ms"} <= inert
    assert listed == inert
    # The log layer's typed config holds only what Riverbed acts on.
    typed = topic_config(BrokerConfig.from_mapping(BROKER), {"preallocate": "true"})
    assert not hasattr(typed, "preallocate")
