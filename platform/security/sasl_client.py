"""The client's side of SASL for Riverbed's own client, without I/O.

The connection drives a `ClientMechanism` like this (SaslHandshake v1, then SaslAuthenticate):

    mechanism = client_mechanism("SCRAM-SHA-512", username, password)
    send SaslHandshake(mechanism.name); an error code or a list without it -> fail
    token = mechanism.initial_response()
    while token is not None:
        response = send SaslAuthenticate(token)
        if response.error_code: fail with response.error_message
        token = mechanism.evaluate_challenge(response.auth_bytes)
    # mechanism.complete is now True; for SCRAM the server has proven it holds the credential

`evaluate_challenge` raises scram.SaslClientError when the server's answer is wrong.
"""

from __future__ import annotations

from typing import Protocol

from riverbed.security.plain import PLAIN, PlainClient
from riverbed.security.sasl_server import SUPPORTED_MECHANISMS
from riverbed.security.scram import ScramClient, ScramMechanism


class ClientMechanism(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def complete(self) -> bool: ...

    def initial_response(self) -> bytes: ...

    def evaluate_challenge(self, challenge: bytes) -> bytes | None:
        """The next token for the server's answer, or None when the exchange is over."""
        ...


def client_mechanism(mechanism: str, username: str, password: str) -> ClientMechanism:
    """A fresh client side of `mechanism` (one per connection); ValueError for a mechanism
    Riverbed does not implement or a name/password the mechanism cannot carry."""
    if mechanism == PLAIN:
        return PlainClient(username, password)
    if mechanism not in SUPPORTED_MECHANISMS:
        raise ValueError(
            f"unsupported SASL mechanism {mechanism!r} "
            f"(supported: {', '.join(SUPPORTED_MECHANISMS)})"
        )
    return ScramClient(ScramMechanism.from_name(mechanism), username, password)
