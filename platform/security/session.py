"""Who is on the other end of a connection: the principal a listener authenticated, and where
it connected from. Handlers receive a `Session` with every request; the authorizer decides on
(session, operation, resource)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final


class SecurityProtocol(enum.Enum):
    """Kafka's listener security protocols (`listener.security.protocol.map` values)."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    """A principal as Kafka writes it, `Type:name` (`User:alice`); ACLs name principals so."""

    principal_type: str
    name: str

    def __post_init__(self) -> None:
        if not self.principal_type or ":" in self.principal_type:
            raise ValueError(f"bad principal type {self.principal_type!r}")

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """`User:alice` -> KafkaPrincipal("User", "alice"); a ValueError names a malformed one."""
        principal_type, sep, name = text.partition(":")
        if not sep or not principal_type or not name:
            raise ValueError(f"a principal is written Type:name (User:alice), not {text!r}")
        return cls(principal_type, name)


USER_TYPE: Final = "User"
# Kafka's principal for unauthenticated connections (PLAINTEXT, or SSL without a client
# certificate).
ANONYMOUS: Final = KafkaPrincipal(USER_TYPE, "ANONYMOUS")


@dataclass(frozen=True, slots=True)
class Session:
    """One connection's identity, fixed once it is authenticated."""

    principal: KafkaPrincipal
    client_host: str  # the peer's IP address, as ACL host patterns and group members name it
    listener: str = "PLAINTEXT"  # the listener's name, e.g. SASL_SSL or INTERNAL
    security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT


def anonymous_session(client_host: str) -> Session:
    return Session(ANONYMOUS, client_host)
