"""A throwaway PKI for tests, benchmarks and trying TLS locally: a CA, a broker certificate for
127.0.0.1 and localhost, and a client certificate, written as the PEM files a user gives Riverbed
(`ssl.keystore.location` = certificate chain plus key in one file, `ssl.truststore.location` =
the CA). Certificates expire after VALID_DAYS; never use them for anything real.

    python -m tools.pki DIR      # writes DIR/ca.pem, DIR/broker.pem, DIR/client.pem, ...
"""

from __future__ import annotations

import datetime
import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 2


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate (truststore for both sides)
    broker: Path  # broker certificate chain + unencrypted key
    broker_encrypted: Path  # the same, key encrypted with BROKER_KEY_PASSWORD
    client_cert: Path  # client certificate (CN=alice,OU=payments,O=Riverbed Test)
    client_key: Path
    rogue_ca: Path  # a CA that signed nothing here: trusting only it must fail


BROKER_KEY_PASSWORD = "broker-key-secret"
CLIENT_SUBJECT = "CN=alice,OU=payments,O=Riverbed Test"


def _name(common_name: str, unit: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Riverbed Test")]
    if unit is not None:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _certificate(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    sans: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("Riverbed Test CA")
    ca = _certificate(ca_name, ca_key, ca_name, ca_key, ca=True)

    broker_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    broker = _certificate(_name("broker"), broker_key, ca_name, ca_key, ca=False, sans=sans)

    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate(_name("alice", "payments"), client_key, ca_name, ca_key, ca=False)

    rogue_key = ec.generate_private_key(ec.SECP256R1())
    rogue_name = _name("Rogue CA")
    rogue = _certificate(rogue_name, rogue_key, rogue_name, rogue_key, ca=True)

    pki = Pki(
        ca=directory / "ca.pem",
        broker=directory / "broker.pem",
        broker_encrypted=directory / "broker-encrypted.pem",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        rogue_ca=directory / "rogue-ca.pem",
    )
    pki.ca.write_bytes(_pem(ca))
    pki.broker.write_bytes(_pem(broker) + _pem(ca) + _key_pem(broker_key))
    pki.broker_encrypted.write_bytes(
        _pem(broker) + _pem(ca) + _key_pem(broker_key, BROKER_KEY_PASSWORD)
    )
    pki.client_cert.write_bytes(_pem(client))
    pki.client_key.write_bytes(_key_pem(client_key))
    pki.rogue_ca.write_bytes(_pem(rogue))
    return pki


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tools.pki DIR")
    made = make_pki(Path(sys.argv[1]))
    for path in (made.ca, made.broker, made.client_cert, made.client_key):
        print(path)
