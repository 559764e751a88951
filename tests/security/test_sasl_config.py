"""`sasl.enabled.mechanisms`: Kafka's name, Riverbed's default, validated against what exists."""

from __future__ import annotations

import pytest
from riverbed.cli.env_config import settings_from_env
from riverbed.configs import BROKER_CONFIGS, BrokerConfig, ConfigError, ConfigType
from riverbed.security.credentials import CredentialCache
from riverbed.security.sasl_server import SUPPORTED_MECHANISMS, SaslServerAuthenticator

ZK = {"zookeeper.connect": "127.0.0.1:2181"}


def test_default_is_scram_only_and_strongest_first() -> None:
    config = BrokerConfig.from_mapping(ZK)
    assert config.sasl_enabled_mechanisms == ("SCRAM-SHA-512", "SCRAM-SHA-256")
    definition = BROKER_CONFIGS["sasl.enabled.mechanisms"]
    assert definition.type is ConfigType.LIST
    # Whatever a broker is configured with builds an authenticator.
    SaslServerAuthenticator(config.sasl_enabled_mechanisms, CredentialCache())


def test_any_supported_list_in_any_order() -> None:
    config = BrokerConfig.from_mapping({**ZK, "sasl.enabled.mechanisms": " PLAIN,SCRAM-SHA-256 "})
    assert config.sasl_enabled_mechanisms == ("PLAIN", "SCRAM-SHA-256")
    every = ",".join(SUPPORTED_MECHANISMS)
    assert (
        BrokerConfig.from_mapping({**ZK, "sasl.enabled.mechanisms": every}).sasl_enabled_mechanisms
        == SUPPORTED_MECHANISMS
    )
    environ = {"RIVERBED_SASL_ENABLED_MECHANISMS": "PLAIN"}
    assert settings_from_env(environ) == {"sasl.enabled.mechanisms": "PLAIN"}


@pytest.mark.parametrize("value", ["GSSAPI", "", "PLAIN,PLAIN", "SCRAM-SHA-1", "OAUTHBEARER,PLAIN"])
def test_unsupported_or_empty_lists_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"sasl\.enabled\.mechanisms") as caught:
        BrokerConfig.from_mapping({**ZK, "sasl.enabled.mechanisms": value})
    assert "SCRAM-SHA-512, SCRAM-SHA-256, PLAIN" in str(caught.value)
