"""How the CLI's broker commands connect: `--bootstrap-server`, and `--command-config FILE` for
secured listeners, as Kafka's tools take them.

The file is a .properties file of client settings with Kafka's and librdkafka's names:

    security.protocol=SASL_SSL
    sasl.mechanism=SCRAM-SHA-512
    sasl.username=admin                  # or Kafka's sasl.jaas.config=... username="admin" ...
    sasl.password=...
    ssl.ca.location=/etc/riverbed/ca.pem # or ssl.truststore.location (PEM)

An unknown key is a one-line error naming it, never silently ignored.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Final

from riverbed.configs import parse_properties
from riverbed.security.jaas import JaasError, parse_credentials

# Kafka / librdkafka name -> Riverbed client setting.
_SETTINGS: Final = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "ssl.ca.location": "ssl_ca_location",
    "ssl.truststore.location": "ssl_ca_location",
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.keystore.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "ssl.key.password": "ssl_key_password",
    "ssl.endpoint.identification.algorithm": "ssl_endpoint_identification_algorithm",
}
# Accepted for Kafka's files, with the only value Riverbed reads.
_PEM_ONLY: Final = ("ssl.truststore.type", "ssl.keystore.type")


def add_connection_flags(parser: argparse.ArgumentParser, bootstrap_default: str) -> None:
    parser.add_argument("--bootstrap-server", default=bootstrap_default, metavar="HOST:PORT")
    add_command_config(parser)


def add_command_config(parser: argparse.ArgumentParser | Any) -> None:
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        help="client settings for a secured listener (security.protocol, sasl.*, ssl.*), "
        "a .properties file as Kafka's tools take",
    )


def client_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of Producer / Consumer / Admin for the command's flags."""
    settings: dict[str, Any] = {"bootstrap_servers": args.bootstrap_server}
    if getattr(args, "command_config", None):
        settings.update(command_config(Path(args.command_config)))
    return settings


def command_config(path: Path) -> dict[str, Any]:
    """The client settings of a --command-config file; ValueError names a bad key or value."""
    settings: dict[str, Any] = {}
    for key, value in parse_properties(path.read_text()).items():
        if key in _PEM_ONLY:
            if value.upper() != "PEM":
                raise ValueError(f"{path}: {key}={value}: only PEM files are read")
        elif key == "sasl.jaas.config":
            try:
                credentials = parse_credentials(value)
            except JaasError as error:
                raise ValueError(f"{path}: {error}") from None
            settings["sasl_username"] = credentials.username
            settings["sasl_password"] = credentials.password
        elif key == "ssl.endpoint.identification.algorithm":
            # Kafka's Java clients turn the check off with an empty value, librdkafka with none.
            settings[_SETTINGS[key]] = value.lower() or "none"
        elif key in _SETTINGS:
            settings[_SETTINGS[key]] = value
        else:
            known = ", ".join(sorted([*_SETTINGS, *_PEM_ONLY, "sasl.jaas.config"]))
            raise ValueError(f"{path}: unknown client setting {key!r} (known: {known})")
    return settings
