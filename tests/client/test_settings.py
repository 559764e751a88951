"""Settings checked at construction, and the typed errors of riverbed.errors."""

from __future__ import annotations

import pytest
from riverbed.client.producer import Producer
from riverbed.client.settings import ConsumerSettings, ProducerSettings
from riverbed.errors import (
    CorruptMessageError,
    KafkaError,
    NotLeaderOrFollowerError,
    RetriableError,
    UnknownTopicOrPartitionError,
    error_for,
)
from riverbed.protocol.errors import ErrorCode

BOOTSTRAP = "127.0.0.1:9092"


def producer_settings(**kwargs: object) -> ProducerSettings:
    settings: ProducerSettings = ProducerSettings.from_kwargs(
        {"bootstrap_servers": BOOTSTRAP, **kwargs}
    )
    return settings


def test_the_issue_example_is_accepted() -> None:
    settings = producer_settings(acks="all", linger_ms=5, compression_type="zstd")
    assert (settings.acks, settings.linger_ms, settings.compression_type) == (-1, 5, "zstd")
    assert settings.bootstrap_servers == (("127.0.0.1", 9092),)


def test_kafka_defaults() -> None:
    settings = producer_settings()
    assert settings.batch_size == 16_384
    assert settings.buffer_memory == 33_554_432
    assert settings.delivery_timeout_ms == 120_000
    assert settings.enable_idempotence is True
    assert settings.max_in_flight_requests_per_connection == 5
    assert settings.explicit == frozenset({"bootstrap_servers"})


@pytest.mark.parametrize(
    ("name", "hint"),
    [("lingr_ms", "linger_ms"), ("linger.ms", "linger_ms"), ("batchsize", "batch_size")],
)
def test_unknown_names_suggest_the_closest(name: str, hint: str) -> None:
    with pytest.raises(TypeError, match=f"{name!r}.*did you mean {hint!r}"):
        Producer(bootstrap_servers=BOOTSTRAP, **{name: 1})


def test_consumer_settings_are_not_producer_settings() -> None:
    with pytest.raises(TypeError, match="fetch_min_bytes"):
        producer_settings(fetch_min_bytes=1)
    consumer = ConsumerSettings.from_kwargs(
        {"bootstrap_servers": BOOTSTRAP, "isolation_level": "read_committed"}
    )
    assert consumer.isolation_level_code == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"acks": "2"}, "acks must be one of"),
        ({"acks": True}, "acks must be one of"),
        ({"linger_ms": -1}, "linger_ms must be an int"),
        ({"linger_ms": 1.5}, "linger_ms must be an int"),
        ({"compression_type": "brotli"}, "none, gzip, snappy, lz4, zstd"),
        ({"enable_idempotence": "yes"}, "True or False"),
        ({"bootstrap_servers": "nohost"}, "HOST:PORT"),
        ({"acks": 1, "enable_idempotence": True}, 'acks must be "all"'),
        ({"max_in_flight_requests_per_connection": 6, "enable_idempotence": True}, "<= 5"),
        ({"delivery_timeout_ms": 100}, "delivery_timeout_ms must be >="),
        ({"batch_size": 100, "buffer_memory": 50}, "must not exceed buffer_memory"),
    ],
)
def test_bad_values_name_the_setting(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        producer_settings(**kwargs)


def test_bootstrap_servers_is_required() -> None:
    with pytest.raises(ValueError, match="bootstrap_servers"):
        Producer()


def test_default_idempotence_gives_way_to_conflicting_settings() -> None:
    assert producer_settings(acks=1).enable_idempotence is False
    assert producer_settings(acks="1").acks == 1
    assert producer_settings(max_in_flight_requests_per_connection=10).enable_idempotence is False
    assert producer_settings(linger_ms=100_000).delivery_timeout_ms == 130_000


def test_every_error_code_maps_to_a_typed_kafka_error() -> None:
    for code in ErrorCode:
        if code == ErrorCode.NONE:
            continue
        error = error_for(code, "m")
        assert isinstance(error, KafkaError)
        assert error.code == code
        assert isinstance(error, RetriableError) == code.retriable, code


def test_error_families() -> None:
    assert isinstance(error_for(3), UnknownTopicOrPartitionError)
    assert isinstance(error_for(6), NotLeaderOrFollowerError)
    assert isinstance(error_for(2), CorruptMessageError)
    with pytest.raises(ValueError, match="NONE is not an error"):
        error_for(0)
