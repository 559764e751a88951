"""TLS contexts from Kafka's `ssl.*` settings (PEM files only) and the principal of a client
certificate.

`ssl.keystore.location` is one PEM file holding the certificate chain and its private key
(`ssl.keystore.type=PEM`, encrypted with `ssl.key.password` if set); `ssl.truststore.location`
holds the CA certificates used to check peers: client certificates on a listener, the other
brokers' certificates on inter-broker connections. Building a context reads the files once; a
`TlsConfigError` names the setting and the file at fault, so a broker with a bad keystore stops
with one line instead of failing every handshake later.
"""

from __future__ import annotations

import enum
import ssl
from dataclasses import dataclass
from typing import Any, Final

from riverbed.security.session import ANONYMOUS, USER_TYPE, KafkaPrincipal

# TLS 1.0 and 1.1 are deprecated (RFC 8996); Kafka's default ssl.enabled.protocols is 1.2 and 1.3.
TLS_VERSION_MIN: Final = ssl.TLSVersion.TLSv1_2
# Short names OpenSSL and Java's X500Principal agree on, for the principal of a certificate.
_RDN_KEYS: Final = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "countryName": "C",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


class TlsConfigError(ValueError):
    """A TLS setting cannot be used; `key` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


class ClientAuth(enum.Enum):
    """`ssl.client.auth`: whether a listener asks clients for certificates."""

    NONE = "none"
    REQUESTED = "requested"
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The PEM files of one side of a connection."""

    keystore_location: str | None = None  # certificate chain (+ private key, unless key_location)
    key_password: str | None = None
    truststore_location: str | None = None  # CA certificates that sign the peer's
    key_location: str | None = None  # the private key, when not in keystore_location

    def __repr__(self) -> str:  # never log the key password
        return (
            f"TlsFiles(keystore_location={self.keystore_location!r}, "
            f"truststore_location={self.truststore_location!r})"
        )


def server_context(files: TlsFiles, client_auth: ClientAuth) -> ssl.SSLContext:
    """The context of a TLS listener."""
    if files.keystore_location is None:
        raise TlsConfigError(
            "ssl.keystore.location",
            "an SSL or SASL_SSL listener needs ssl.keystore.location (a PEM file holding the "
            "broker's certificate and private key)",
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSION_MIN
    _load_keystore(context, files)
    if client_auth is not ClientAuth.NONE:
        if files.truststore_location is None:
            raise TlsConfigError(
                "ssl.truststore.location",
                f"ssl.client.auth={client_auth.value} needs ssl.truststore.location (the CA "
                "certificates that sign client certificates)",
            )
        _load_truststore(context, files.truststore_location)
        verify = {ClientAuth.REQUESTED: ssl.CERT_OPTIONAL, ClientAuth.REQUIRED: ssl.CERT_REQUIRED}
        context.verify_mode = verify[client_auth]
    return context


def client_context(files: TlsFiles, *, check_hostname: bool) -> ssl.SSLContext:
    """The context of a client (or of a broker dialling another broker): the server's certificate
    is always verified, against the truststore or else the system's CAs; the keystore, if set,
    is presented for client authentication."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = TLS_VERSION_MIN
    context.check_hostname = check_hostname
    if files.truststore_location is None:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        _load_truststore(context, files.truststore_location)
    if files.keystore_location is not None:
        _load_keystore(context, files)
    return context


def certificate_principal(peer_certificate: dict[str, Any] | None) -> KafkaPrincipal:
    """Kafka's default SSL principal: `User:` + the subject's distinguished name in RFC 2253
    order (most specific first, `CN=alice,OU=eng,O=acme`), or ANONYMOUS without a certificate."""
    if not peer_certificate or not peer_certificate.get("subject"):
        return ANONYMOUS
    parts = []
    for rdn in reversed(peer_certificate["subject"]):
        parts.append("+".join(f"{_RDN_KEYS.get(key, key)}={_escape(value)}" for key, value in rdn))
    return KafkaPrincipal(USER_TYPE, ",".join(parts))


def _escape(value: str) -> str:
    """RFC 2253 escaping of an attribute value."""
    escaped = "".join(f"\\{char}" if char in ',+"\\<>;=' else char for char in value)
    if escaped.startswith((" ", "#")):
        escaped = "\\" + escaped
    if escaped.endswith(" ") and not escaped.endswith("\\ "):
        escaped = escaped[:-1] + "\\ "
    return escaped


def _load_keystore(context: ssl.SSLContext, files: TlsFiles) -> None:
    assert files.keystore_location is not None
    try:
        context.load_cert_chain(
            files.keystore_location, files.key_location, password=files.key_password
        )
    except (OSError, ssl.SSLError) as error:
        raise TlsConfigError(
            "ssl.keystore.location",
            f"cannot load the certificate and key in ssl.keystore.location "
            f"{files.keystore_location!r}: {_reason(error)}",
        ) from None


def _load_truststore(context: ssl.SSLContext, location: str) -> None:
    try:
        context.load_verify_locations(cafile=location)
    except (OSError, ssl.SSLError) as error:
        raise TlsConfigError(
            "ssl.truststore.location",
            f"cannot load the CA certificates in ssl.truststore.location {location!r}: "
            f"{_reason(error)}",
        ) from None


def _reason(error: BaseException) -> str:
    if isinstance(error, ssl.SSLError) and error.reason:
        return str(error.reason)
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)
