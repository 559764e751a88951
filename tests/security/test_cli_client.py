"""--command-config: Kafka's and librdkafka's client setting names to Riverbed's."""

from __future__ import annotations

from pathlib import Path

import pytest
from riverbed.cli.connect import command_config


def test_kafka_and_librdkafka_names_map_to_riverbed_settings(tmp_path: Path) -> None:
    java = tmp_path / "java.properties"
    java.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="admin" password="p\\"w";\n'
        "ssl.truststore.type=PEM\nssl.truststore.location=/ca.pem\n"
        "ssl.endpoint.identification.algorithm=\n"
    )
    assert command_config(java) == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_username": "admin",
        "sasl_password": 'p"w',
        "ssl_ca_location": "/ca.pem",
        "ssl_endpoint_identification_algorithm": "none",
    }
    librdkafka = tmp_path / "librdkafka.properties"
    librdkafka.write_text("sasl.username=u\nsasl.password=p\nssl.key.location=/k.pem\n")
    assert command_config(librdkafka) == {
        "sasl_username": "u",
        "sasl_password": "p",
        "ssl_key_location": "/k.pem",
    }


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("sasl.kerberos.service.name=kafka", "sasl.kerberos.service.name"),
        ("ssl.truststore.type=JKS", "only PEM"),
        ("sasl.jaas.config=nonsense", "login module"),
    ],
)
def test_what_cannot_be_used_is_named(tmp_path: Path, line: str, named: str) -> None:
    path = tmp_path / "client.properties"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=named):
        command_config(path)
