"""How a client (or a broker dialling another broker) secures its connections.

One `ConnectionSecurity` per client, built once from its settings: the TLS context (files read
and checked up front, so a missing CA file is an error at construction, not at first connect)
and the SASL credentials the connection authenticates with after ApiVersions.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Final

from riverbed.security.session import SecurityProtocol
from riverbed.security.tls import TlsFiles, client_context

SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class SaslCredentials:
    mechanism: str  # one of SASL_MECHANISMS
    username: str
    password: str

    def __post_init__(self) -> None:
        if self.mechanism not in SASL_MECHANISMS:
            raise ValueError(
                f"SASL mechanism {self.mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}"
            )
        if not self.username:
            raise ValueError("a SASL username is required")

    def __repr__(self) -> str:  # never log the password
        return f"SaslCredentials(mechanism={self.mechanism!r}, username={self.username!r})"


@dataclass(frozen=True, slots=True)
class ConnectionSecurity:
    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    ssl_context: ssl.SSLContext | None = None
    sasl: SaslCredentials | None = None

    def __post_init__(self) -> None:
        if self.protocol.uses_tls != (self.ssl_context is not None):
            raise ValueError(f"{self.protocol.value} needs a TLS context exactly when it uses TLS")
        if self.protocol.uses_sasl != (self.sasl is not None):
            raise ValueError(
                f"security protocol {self.protocol.value} "
                + ("needs SASL credentials" if self.protocol.uses_sasl else "takes no SASL")
            )


PLAINTEXT: Final = ConnectionSecurity()


def connection_security(
    protocol: SecurityProtocol,
    tls_files: TlsFiles,
    *,
    check_hostname: bool,
    sasl: SaslCredentials | None,
) -> ConnectionSecurity:
    """The security of `protocol`; TLS settings are ignored without TLS, SASL without SASL."""
    context = (
        client_context(tls_files, check_hostname=check_hostname) if protocol.uses_tls else None
    )
    return ConnectionSecurity(protocol, context, sasl if protocol.uses_sasl else None)
