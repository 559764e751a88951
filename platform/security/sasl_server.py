"""The per-connection SASL authenticator the broker's server drives, without I/O.

The server hands every decoded request of a SASL listener's connection to `receive` until the
connection is authenticated, and acts on the decision:

* `Allow`: serve the request as usual (ApiVersions before authentication; everything after).
* `Respond(body)`: send this SaslHandshake / SaslAuthenticate response instead.
* `RespondAndClose(body, reason)`: send it, then close (a refused mechanism or failed
  authentication; `reason` is for the broker's log and may name an unknown user).
* `Close(reason)`: close without answering (any other API before authentication, or requests
  out of order), as Kafka's broker does.

The exchange is Kafka's with SaslHandshake v1: at most one ApiVersions, then SaslHandshake naming
a mechanism of `sasl.enabled.mechanisms`, then SaslAuthenticate requests carrying the mechanism's
tokens until it completes. `principal` is then `User:<name>`. Re-authentication (KIP-368) is not
offered: SessionLifetimeMs is 0, and a SaslHandshake or SaslAuthenticate on an authenticated
connection is answered ILLEGAL_SASL_STATE and changes nothing, as Kafka's request handlers do.

The states and what moves them are one table, `TRANSITIONS`; a (state, event) pair that is not in
it is a protocol violation and ends the connection.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from riverbed.protocol import messages as m
from riverbed.protocol.errors import ErrorCode
from riverbed.security.plain import PLAIN, PlainServer
from riverbed.security.scram import (
    AuthenticationFailed,
    CredentialLookup,
    ScramMechanism,
    ScramServer,
)
from riverbed.security.session import USER_TYPE, KafkaPrincipal

# What Riverbed implements, in the order a broker lists them by default (strongest first).
SUPPORTED_MECHANISMS: Final = ("SCRAM-SHA-512", "SCRAM-SHA-256", PLAIN)
# Kafka's sasl.server.max.receive.size default: the largest request frame a connection may send
# before it is authenticated (the server should apply it instead of socket.request.max.bytes).
SASL_RECEIVE_BYTES_MAX: Final = 512 * 1024
# KIP-368's SessionLifetimeMs: 0 = the session never needs re-authenticating
# (Kafka's connections.max.reauth.ms default).
SESSION_LIFETIME_MS: Final = 0
# The one SaslHandshake version served: tokens travel in SaslAuthenticate requests (KIP-152).
HANDSHAKE_VERSION: Final = 1

AFTER_AUTHENTICATION: Final = "SaslAuthenticate request received after successful authentication"


class SaslState(enum.Enum):
    START = "start"  # expects ApiVersions or SaslHandshake
    VERSIONS_SEEN = "versions-seen"  # ApiVersions answered: expects SaslHandshake
    AUTHENTICATING = "authenticating"  # mechanism chosen: expects SaslAuthenticate tokens
    AUTHENTICATED = "authenticated"  # every request is served
    FAILED = "failed"  # the connection is being closed


class SaslEvent(enum.Enum):
    """What a request amounts to, given the state: the input alphabet of `TRANSITIONS`."""

    API_VERSIONS = "ApiVersions"
    HANDSHAKE_ENABLED = "SaslHandshake with an enabled mechanism"
    HANDSHAKE_NOT_ENABLED = "SaslHandshake with a mechanism that is not enabled"
    TOKEN_CHALLENGED = "SaslAuthenticate token answered, more expected"
    TOKEN_ACCEPTED = "SaslAuthenticate token completed the authentication"
    TOKEN_REFUSED = "SaslAuthenticate token failed the authentication"
    TOKEN_UNEXPECTED = "SaslAuthenticate with no mechanism waiting for a token"
    OTHER_REQUEST = "a request of another API"


_S, _E = SaslState, SaslEvent
TRANSITIONS: Final[dict[tuple[SaslState, SaslEvent], SaslState]] = {
    (_S.START, _E.API_VERSIONS): _S.VERSIONS_SEEN,
    (_S.START, _E.HANDSHAKE_ENABLED): _S.AUTHENTICATING,
    (_S.START, _E.HANDSHAKE_NOT_ENABLED): _S.FAILED,
    (_S.VERSIONS_SEEN, _E.HANDSHAKE_ENABLED): _S.AUTHENTICATING,
    (_S.VERSIONS_SEEN, _E.HANDSHAKE_NOT_ENABLED): _S.FAILED,
    (_S.AUTHENTICATING, _E.TOKEN_CHALLENGED): _S.AUTHENTICATING,
    (_S.AUTHENTICATING, _E.TOKEN_ACCEPTED): _S.AUTHENTICATED,
    (_S.AUTHENTICATING, _E.TOKEN_REFUSED): _S.FAILED,
    (_S.AUTHENTICATED, _E.API_VERSIONS): _S.AUTHENTICATED,
    (_S.AUTHENTICATED, _E.OTHER_REQUEST): _S.AUTHENTICATED,
    (_S.AUTHENTICATED, _E.HANDSHAKE_ENABLED): _S.AUTHENTICATED,  # ILLEGAL_SASL_STATE
    (_S.AUTHENTICATED, _E.HANDSHAKE_NOT_ENABLED): _S.AUTHENTICATED,  # ILLEGAL_SASL_STATE
    (_S.AUTHENTICATED, _E.TOKEN_UNEXPECTED): _S.AUTHENTICATED,  # ILLEGAL_SASL_STATE
}


@dataclass(frozen=True, slots=True)
class Allow:
    """Serve the request normally."""


@dataclass(frozen=True, slots=True)
class Respond:
    body: m.SaslHandshakeResponse | m.SaslAuthenticateResponse


@dataclass(frozen=True, slots=True)
class RespondAndClose:
    body: m.SaslHandshakeResponse | m.SaslAuthenticateResponse | m.ApiVersionsResponse
    reason: str  # for the broker's log


@dataclass(frozen=True, slots=True)
class Close:
    reason: str  # for the broker's log


Decision = Allow | Respond | RespondAndClose | Close


class ServerMechanism(Protocol):
    """One mechanism's side of one exchange (scram.ScramServer, plain.PlainServer)."""

    @property
    def name(self) -> str: ...

    @property
    def complete(self) -> bool: ...

    @property
    def authorization_id(self) -> str: ...

    def evaluate(self, token: bytes) -> bytes:
        """The reply to a client token; raises scram.AuthenticationFailed."""
        ...


def mechanisms_error(mechanisms: Sequence[str]) -> str | None:
    """Why `mechanisms` cannot be `sasl.enabled.mechanisms`, or None."""
    if not mechanisms:
        return "at least one SASL mechanism must be enabled"
    unknown = [name for name in mechanisms if name not in SUPPORTED_MECHANISMS]
    if unknown:
        return (
            f"unsupported SASL mechanism(s) {', '.join(unknown)} "
            f"(supported: {', '.join(SUPPORTED_MECHANISMS)})"
        )
    if len(set(mechanisms)) != len(mechanisms):
        return "a SASL mechanism is listed twice"
    return None


class SaslServerAuthenticator:
    """One connection's SASL state; see the module docstring for the protocol."""

    def __init__(
        self,
        enabled_mechanisms: Sequence[str],
        credentials: CredentialLookup,
        *,
        stand_in_secret: bytes | None = None,
    ) -> None:
        problem = mechanisms_error(enabled_mechanisms)
        if problem is not None:
            raise ValueError(problem)
        self.enabled_mechanisms = tuple(enabled_mechanisms)
        self._credentials = credentials
        self._stand_in_secret = stand_in_secret
        self._state = SaslState.START
        self._mechanism: ServerMechanism | None = None
        self._principal: KafkaPrincipal | None = None

    @property
    def state(self) -> SaslState:
        return self._state

    @property
    def authenticated(self) -> bool:
        return self._state is SaslState.AUTHENTICATED

    @property
    def principal(self) -> KafkaPrincipal | None:
        """`User:<name>` once authenticated, else None."""
        return self._principal

    @property
    def mechanism(self) -> str | None:
        """The mechanism the client chose, once it has."""
        return None if self._mechanism is None else self._mechanism.name

    def receive(self, body: m.RequestBody, api_version: int) -> Decision:
        """The decision for one decoded request of version `api_version`."""
        state = self._state
        if isinstance(body, m.SaslHandshakeRequest) and api_version != HANDSHAKE_VERSION:
            # v0 is advertised only for librdkafka's feature check: its raw tokens would follow,
            # which the frame codec would read as requests.
            return self._fail(Close(f"SaslHandshake v{api_version} is not supported"))
        event, reply = self._classify(state, body)
        next_state = TRANSITIONS.get((state, event))
        if next_state is None:
            return self._fail(_violation(state, event, body, self.enabled_mechanisms))
        self._state = next_state
        if event is SaslEvent.TOKEN_ACCEPTED and self._mechanism is not None:
            self._principal = KafkaPrincipal(USER_TYPE, self._mechanism.authorization_id)
        return self._decision(state, event, reply)

    def _classify(self, state: SaslState, body: m.RequestBody) -> tuple[SaslEvent, _Reply]:
        """The event `body` is in `state`. Only a token for a waiting mechanism is evaluated
        (the one side effect), since every outcome of it is in the table."""
        match body:
            case m.ApiVersionsRequest():
                return SaslEvent.API_VERSIONS, None
            case m.SaslHandshakeRequest(mechanism=name):
                if name in self.enabled_mechanisms:
                    if state in (SaslState.START, SaslState.VERSIONS_SEEN):
                        self._mechanism = self._new_mechanism(name)
                    return SaslEvent.HANDSHAKE_ENABLED, None
                return SaslEvent.HANDSHAKE_NOT_ENABLED, name
            case m.SaslAuthenticateRequest(auth_bytes=token):
                mechanism = self._mechanism
                if state is not SaslState.AUTHENTICATING or mechanism is None:
                    return SaslEvent.TOKEN_UNEXPECTED, None
                try:
                    answer = mechanism.evaluate(bytes(token))
                except AuthenticationFailed as failure:
                    return SaslEvent.TOKEN_REFUSED, failure
                if mechanism.complete:
                    return SaslEvent.TOKEN_ACCEPTED, answer
                return SaslEvent.TOKEN_CHALLENGED, answer
        return SaslEvent.OTHER_REQUEST, None

    def _decision(self, state: SaslState, event: SaslEvent, reply: _Reply) -> Decision:
        enabled = list(self.enabled_mechanisms)
        if state is SaslState.AUTHENTICATED:
            return _after_authentication(event)
        match event:
            case SaslEvent.API_VERSIONS | SaslEvent.OTHER_REQUEST:
                return Allow()
            case SaslEvent.HANDSHAKE_ENABLED:
                return Respond(m.SaslHandshakeResponse(ErrorCode.NONE, enabled))
            case SaslEvent.HANDSHAKE_NOT_ENABLED:
                return RespondAndClose(
                    m.SaslHandshakeResponse(ErrorCode.UNSUPPORTED_SASL_MECHANISM, enabled),
                    f"the client asked for SASL mechanism {reply!r}, which is not enabled",
                )
        if isinstance(reply, AuthenticationFailed):  # TOKEN_REFUSED
            return RespondAndClose(
                m.SaslAuthenticateResponse(
                    error_code=ErrorCode.SASL_AUTHENTICATION_FAILED,
                    error_message=reply.client_message or _generic_failure(self.mechanism),
                ),
                str(reply),
            )
        if isinstance(reply, bytes):  # TOKEN_CHALLENGED, TOKEN_ACCEPTED
            return Respond(
                m.SaslAuthenticateResponse(
                    error_code=ErrorCode.NONE,
                    auth_bytes=reply,
                    session_lifetime_ms=SESSION_LIFETIME_MS,
                )
            )
        raise RuntimeError(f"no decision for {event} in state {state}")  # a table/code mismatch

    def _new_mechanism(self, name: str) -> ServerMechanism:
        if name == PLAIN:
            return PlainServer(self._credentials, stand_in_secret=self._stand_in_secret)
        return ScramServer(
            ScramMechanism.from_name(name),
            self._credentials,
            stand_in_secret=self._stand_in_secret,
        )

    def _fail(self, decision: Decision) -> Decision:
        self._state = SaslState.FAILED
        self._mechanism = None
        return decision


# A mechanism's answer, its refusal, or the mechanism name a refused handshake asked for.
_Reply = bytes | AuthenticationFailed | str | None


def _generic_failure(mechanism: str | None) -> str:
    """Kafka's message for a failure whose details must not reach the client."""
    return (
        "Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism}"
    )


def _after_authentication(event: SaslEvent) -> Decision:
    """What Kafka's request handlers answer on an authenticated connection."""
    match event:
        case SaslEvent.HANDSHAKE_ENABLED | SaslEvent.HANDSHAKE_NOT_ENABLED:
            return Respond(m.SaslHandshakeResponse(ErrorCode.ILLEGAL_SASL_STATE, []))
        case SaslEvent.TOKEN_UNEXPECTED:
            return Respond(
                m.SaslAuthenticateResponse(
                    error_code=ErrorCode.ILLEGAL_SASL_STATE, error_message=AFTER_AUTHENTICATION
                )
            )
    return Allow()


def answer_when_not_authenticating(
    body: m.SaslHandshakeRequest | m.SaslAuthenticateRequest,
) -> m.SaslHandshakeResponse | m.SaslAuthenticateResponse:
    """The answer to a SASL request that reaches the request handlers: on a listener without
    SASL, or (if the server lets it through) after authentication. ILLEGAL_SASL_STATE, as
    Kafka's KafkaApis answers both."""
    event = (
        SaslEvent.HANDSHAKE_ENABLED
        if isinstance(body, m.SaslHandshakeRequest)
        else SaslEvent.TOKEN_UNEXPECTED
    )
    decision = _after_authentication(event)
    if not isinstance(decision, Respond):
        raise RuntimeError(f"no ILLEGAL_SASL_STATE answer for {event}")
    return decision.body


def _violation(
    state: SaslState, event: SaslEvent, body: m.RequestBody, enabled: Sequence[str]
) -> Decision:
    """A request the state does not allow. Kafka's authenticator answers a SaslHandshake or
    ApiVersions that arrives while tokens are expected with ILLEGAL_SASL_STATE, then closes;
    everything else closes the connection unanswered (Kafka would answer other APIs with their
    own error response, which needs a per-API error body; closing is what the client then sees
    anyway)."""
    reason = f"{event.value} is not allowed in SASL state {state.value}"
    if state is SaslState.AUTHENTICATING:
        if isinstance(body, m.SaslHandshakeRequest):
            response = m.SaslHandshakeResponse(ErrorCode.ILLEGAL_SASL_STATE, list(enabled))
            return RespondAndClose(response, reason)
        if isinstance(body, m.ApiVersionsRequest):
            return RespondAndClose(m.ApiVersionsResponse(ErrorCode.ILLEGAL_SASL_STATE), reason)
    return Close(reason)
