"""The authorizer's broker settings: Kafka's names, validated with errors that name the key."""

from __future__ import annotations

import pytest
from riverbed.cli.env_config import settings_from_env
from riverbed.configs import ACL_AUTHORIZER_CLASS_NAMES, BrokerConfig, ConfigError
from riverbed.security.authorizer import AuthorizerSettings

ZK = {"zookeeper.connect": "127.0.0.1:2181"}


def test_off_by_default() -> None:
    config = BrokerConfig.from_mapping(ZK)
    assert not config.authorizer_enabled
    assert config.authorizer_settings == AuthorizerSettings(frozenset(), False)


@pytest.mark.parametrize("name", ACL_AUTHORIZER_CLASS_NAMES)
def test_kafkas_class_names_turn_it_on(name: str) -> None:
    config = BrokerConfig.from_mapping(
        {
            **ZK,
            "authorizer.class.name": name,
            "super.users": "User:admin; User:broker",
            "allow.everyone.if.no.acl.found": "true",
        }
    )
    assert config.authorizer_enabled
    assert config.authorizer_settings == AuthorizerSettings(
        frozenset({"User:admin", "User:broker"}), True
    )


def test_kafka_names_are_the_only_values_accepted() -> None:
    assert ACL_AUTHORIZER_CLASS_NAMES == (
        "kafka.security.authorizer.AclAuthorizer",
        "kafka.security.auth.SimpleAclAuthorizer",
        "riverbed.security.authorizer.AclAuthorizer",
    )


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("authorizer.class.name", "org.example.MyAuthorizer", "empty (no authorizer) or one of"),
        ("super.users", "admin", "Type:name, separated by ';'"),
        ("super.users", "User:admin,User:bob;Group", "Type:name"),
        ("allow.everyone.if.no.acl.found", "yes", "'yes'"),
    ],
)
def test_bad_values_name_the_key(key: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_mapping({**ZK, key: value})
    assert caught.value.key == key
    assert key in str(caught.value)
    assert fragment in str(caught.value)


def test_settable_from_the_environment() -> None:
    settings = settings_from_env(
        {
            "RIVERBED_AUTHORIZER_CLASS_NAME": "kafka.security.authorizer.AclAuthorizer",
            "RIVERBED_SUPER_USERS": "User:admin",
            "RIVERBED_ALLOW_EVERYONE_IF_NO_ACL_FOUND": "false",
        }
    )
    assert settings == {
        "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
        "super.users": "User:admin",
        "allow.everyone.if.no.acl.found": "false",
    }
