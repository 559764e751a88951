"""The per-connection SASL authenticator: every (state, request) pair, random request sequences,
and whole exchanges through the real frame codec with our clients, scramp, aiokafka's and
kafka-python's SASL code (no sockets: the codec's two in-memory peers)."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import scramp
from aiokafka.conn import SaslPlainAuthenticator, ScramAuthenticator
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.protocol import messages as m
from riverbed.protocol.codec import encode_response_body
from riverbed.protocol.connection import (
    ClientConnection,
    RequestReceived,
    ResponseReceived,
    ServerConnection,
    encode_response,
    supported_api_versions,
)
from riverbed.protocol.errors import ErrorCode
from riverbed.security.plain import PlainClient
from riverbed.security.sasl_client import client_mechanism
from riverbed.security.sasl_server import (
    AFTER_AUTHENTICATION,
    SUPPORTED_MECHANISMS,
    TRANSITIONS,
    Allow,
    Close,
    Decision,
    Respond,
    RespondAndClose,
    SaslServerAuthenticator,
    SaslState,
    answer_when_not_authenticating,
    mechanisms_error,
)
from riverbed.security.scram import InMemoryCredentials, ScramMechanism, new_credential
from riverbed.security.session import KafkaPrincipal

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.net.sasl.plain import SaslMechanismPlain
    from kafka.net.sasl.scram import SaslMechanismScram

S = SaslState
ENABLED = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
USER, PASSWORD = "alice", "wonderland"
GENERIC_SCRAM_FAILURE = (
    "Authentication failed during authentication due to invalid credentials with SASL "
    "mechanism SCRAM-SHA-256"
)


def credentials() -> InMemoryCredentials:
    store = InMemoryCredentials()
    for mechanism in ScramMechanism:
        store.set(USER, mechanism, new_credential(mechanism, PASSWORD))
    return store


CREDENTIALS = credentials()


def authenticator(enabled: tuple[str, ...] = ENABLED) -> SaslServerAuthenticator:
    return SaslServerAuthenticator(enabled, CREDENTIALS)


# ---- every (state, request) pair --------------------------------------------------------------

REQUESTS: dict[str, tuple[m.RequestBody, int]] = {
    "ApiVersions": (m.ApiVersionsRequest("client", "1.0"), 3),
    "SaslHandshake": (m.SaslHandshakeRequest("SCRAM-SHA-256"), 1),
    "SaslHandshake GSSAPI": (m.SaslHandshakeRequest("GSSAPI"), 1),
    "SaslAuthenticate client-first": (m.SaslAuthenticateRequest(b"n,,n=alice,r=abc"), 2),
    "SaslAuthenticate garbage": (m.SaslAuthenticateRequest(b"\xff"), 2),
    "Metadata": (m.MetadataRequest(), 12),
}


def in_state(state: SaslState) -> SaslServerAuthenticator:
    auth = authenticator()
    if state is S.VERSIONS_SEEN:
        auth.receive(m.ApiVersionsRequest(), 3)
    elif state is S.AUTHENTICATING:
        auth.receive(m.SaslHandshakeRequest("SCRAM-SHA-256"), 1)
    elif state is S.AUTHENTICATED:
        auth.receive(m.SaslHandshakeRequest("PLAIN"), 1)
        auth.receive(m.SaslAuthenticateRequest(b"\x00alice\x00wonderland"), 2)
    elif state is S.FAILED:
        auth.receive(m.MetadataRequest(), 12)
    assert auth.state is state
    return auth


@dataclass(frozen=True)
class Expect:
    state: SaslState
    decision: type[Allow | Respond | RespondAndClose | Close]
    error_code: int | None = None  # of the response body, if any
    body: type[Any] | None = None


_HS, _AU, _AV = m.SaslHandshakeResponse, m.SaslAuthenticateResponse, m.ApiVersionsResponse
_NONE, _ILLEGAL = ErrorCode.NONE, ErrorCode.ILLEGAL_SASL_STATE
_UNSUPPORTED, _FAILED = ErrorCode.UNSUPPORTED_SASL_MECHANISM, ErrorCode.SASL_AUTHENTICATION_FAILED
CLOSE = Expect(S.FAILED, Close)
# Written out by hand from Kafka's SaslServerAuthenticator and KafkaApis, not from TRANSITIONS.
EXPECTED: dict[tuple[SaslState, str], Expect] = {
    (S.START, "ApiVersions"): Expect(S.VERSIONS_SEEN, Allow),
    (S.START, "SaslHandshake"): Expect(S.AUTHENTICATING, Respond, _NONE, _HS),
    (S.START, "SaslHandshake GSSAPI"): Expect(S.FAILED, RespondAndClose, _UNSUPPORTED, _HS),
    (S.START, "SaslAuthenticate client-first"): CLOSE,
    (S.START, "SaslAuthenticate garbage"): CLOSE,
    (S.START, "Metadata"): CLOSE,
    (S.VERSIONS_SEEN, "ApiVersions"): CLOSE,
    (S.VERSIONS_SEEN, "SaslHandshake"): Expect(S.AUTHENTICATING, Respond, _NONE, _HS),
    (S.VERSIONS_SEEN, "SaslHandshake GSSAPI"): Expect(S.FAILED, RespondAndClose, _UNSUPPORTED, _HS),
    (S.VERSIONS_SEEN, "SaslAuthenticate client-first"): CLOSE,
    (S.VERSIONS_SEEN, "SaslAuthenticate garbage"): CLOSE,
    (S.VERSIONS_SEEN, "Metadata"): CLOSE,
    (S.AUTHENTICATING, "ApiVersions"): Expect(S.FAILED, RespondAndClose, _ILLEGAL, _AV),
    (S.AUTHENTICATING, "SaslHandshake"): Expect(S.FAILED, RespondAndClose, _ILLEGAL, _HS),
    (S.AUTHENTICATING, "SaslHandshake GSSAPI"): Expect(S.FAILED, RespondAndClose, _ILLEGAL, _HS),
    (S.AUTHENTICATING, "SaslAuthenticate client-first"): Expect(
        S.AUTHENTICATING, Respond, _NONE, _AU
    ),
    (S.AUTHENTICATING, "SaslAuthenticate garbage"): Expect(S.FAILED, RespondAndClose, _FAILED, _AU),
    (S.AUTHENTICATING, "Metadata"): CLOSE,
    (S.AUTHENTICATED, "ApiVersions"): Expect(S.AUTHENTICATED, Allow),
    (S.AUTHENTICATED, "SaslHandshake"): Expect(S.AUTHENTICATED, Respond, _ILLEGAL, _HS),
    (S.AUTHENTICATED, "SaslHandshake GSSAPI"): Expect(S.AUTHENTICATED, Respond, _ILLEGAL, _HS),
    (S.AUTHENTICATED, "SaslAuthenticate client-first"): Expect(
        S.AUTHENTICATED, Respond, _ILLEGAL, _AU
    ),
    (S.AUTHENTICATED, "SaslAuthenticate garbage"): Expect(S.AUTHENTICATED, Respond, _ILLEGAL, _AU),
    (S.AUTHENTICATED, "Metadata"): Expect(S.AUTHENTICATED, Allow),
    **{(S.FAILED, name): CLOSE for name in REQUESTS},
}


def test_expectations_cover_every_pair() -> None:
    assert set(EXPECTED) == {(state, name) for state in SaslState for name in REQUESTS}


@pytest.mark.parametrize(
    ("state", "name"), list(EXPECTED), ids=[f"{s.value}-{n}" for s, n in EXPECTED]
)
def test_every_state_and_request(state: SaslState, name: str) -> None:
    auth = in_state(state)
    principal_before = auth.principal
    body, version = REQUESTS[name]
    decision = auth.receive(body, version)
    expect = EXPECTED[(state, name)]
    assert type(decision) is expect.decision
    assert auth.state is expect.state
    if isinstance(decision, Respond | RespondAndClose):
        assert type(decision.body) is expect.body
        assert decision.body.error_code == expect.error_code
        encodes_at_every_version(decision.body)
    if isinstance(decision, Close | RespondAndClose):
        assert decision.reason
    # The principal appears with authentication and never changes afterwards.
    assert auth.principal == principal_before
    assert (auth.principal is not None) == (auth.state is S.AUTHENTICATED)


def encodes_at_every_version(body: m.ResponseBody) -> None:
    low, high = supported_api_versions()[body.API_KEY]
    for version in range(low, high + 1):
        assert encode_response_body(body, version)


MOVES = {(before, after) for (before, _), after in TRANSITIONS.items()}


def test_transition_table_shape() -> None:
    """Nothing leaves FAILED; every request served or answered without closing is a move of the
    table (checked pair by pair above); authentication completes only from AUTHENTICATING."""
    assert S.FAILED not in {before for before, _ in MOVES}
    assert {before for before, after in MOVES if after is S.AUTHENTICATED} == {
        S.AUTHENTICATING,
        S.AUTHENTICATED,
    }
    for (state, _), expect in EXPECTED.items():
        if expect.decision in (Allow, Respond):
            assert (state, expect.state) in MOVES


def test_refusals_carry_kafkas_answers() -> None:
    decision = in_state(S.START).receive(m.SaslHandshakeRequest("GSSAPI"), 1)
    assert decision == RespondAndClose(
        m.SaslHandshakeResponse(ErrorCode.UNSUPPORTED_SASL_MECHANISM, list(ENABLED)),
        "the client asked for SASL mechanism 'GSSAPI', which is not enabled",
    )
    auth = in_state(S.AUTHENTICATING)
    decision = auth.receive(m.SaslAuthenticateRequest(b"\xff"), 2)
    assert isinstance(decision, RespondAndClose)
    assert decision.body == m.SaslAuthenticateResponse(
        error_code=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message=GENERIC_SCRAM_FAILURE
    )
    assert "malformed" in decision.reason
    after = in_state(S.AUTHENTICATED).receive(m.SaslAuthenticateRequest(b""), 1)
    assert after == Respond(
        m.SaslAuthenticateResponse(
            error_code=ErrorCode.ILLEGAL_SASL_STATE, error_message=AFTER_AUTHENTICATION
        )
    )


def test_handshake_lists_the_enabled_mechanisms_in_their_order() -> None:
    auth = authenticator(("PLAIN", "SCRAM-SHA-256"))
    assert auth.receive(m.SaslHandshakeRequest("SCRAM-SHA-512"), 1) == RespondAndClose(
        m.SaslHandshakeResponse(ErrorCode.UNSUPPORTED_SASL_MECHANISM, ["PLAIN", "SCRAM-SHA-256"]),
        "the client asked for SASL mechanism 'SCRAM-SHA-512', which is not enabled",
    )
    ok = authenticator(("PLAIN",)).receive(m.SaslHandshakeRequest("PLAIN"), 1)
    assert ok == Respond(m.SaslHandshakeResponse(ErrorCode.NONE, ["PLAIN"]))


def test_handshake_v0_closes() -> None:
    """v0 is advertised (librdkafka needs to see it) but never served: raw tokens would follow
    that the frame codec would take for requests."""
    auth = authenticator()
    assert isinstance(auth.receive(m.SaslHandshakeRequest("PLAIN"), 0), Close)
    assert auth.state is S.FAILED


def test_enabled_mechanisms_are_checked() -> None:
    assert mechanisms_error(SUPPORTED_MECHANISMS) is None
    for enabled, fragment in [
        ((), "at least one"),
        (("GSSAPI",), r"unsupported SASL mechanism\(s\) GSSAPI"),
        (("PLAIN", "OAUTHBEARER"), "OAUTHBEARER"),
        (("PLAIN", "PLAIN"), "twice"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            SaslServerAuthenticator(enabled, CREDENTIALS)


def test_requests_reaching_the_handlers_get_illegal_sasl_state() -> None:
    handshake = answer_when_not_authenticating(m.SaslHandshakeRequest("PLAIN"))
    assert handshake == m.SaslHandshakeResponse(ErrorCode.ILLEGAL_SASL_STATE, [])
    authenticate = answer_when_not_authenticating(m.SaslAuthenticateRequest(b"x"))
    assert isinstance(authenticate, m.SaslAuthenticateResponse)
    assert authenticate.error_code == ErrorCode.ILLEGAL_SASL_STATE
    assert authenticate.error_message == AFTER_AUTHENTICATION


# ---- random request sequences -----------------------------------------------------------------

STEPS = [*REQUESTS, "SaslHandshake PLAIN", "good token"]


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.sampled_from(STEPS), max_size=8))
def test_random_sequences_keep_the_invariants(steps: list[str]) -> None:
    auth = authenticator()
    client: Any = None
    answer: bytes | None = None
    closed = False
    for step in steps:
        before = auth.state
        if step == "SaslHandshake PLAIN":
            body: m.RequestBody = m.SaslHandshakeRequest("PLAIN")
            client = PlainClient(USER, PASSWORD) if before in (S.START, S.VERSIONS_SEEN) else client
            answer = None
            version = 1
        elif step == "good token":
            body, version = m.SaslAuthenticateRequest(_next_token(client, answer)), 2
        else:
            body, version = REQUESTS[step]
            if step == "SaslHandshake" and before in (S.START, S.VERSIONS_SEEN):
                client = client_mechanism("SCRAM-SHA-256", USER, PASSWORD)
                answer = None
        decision = auth.receive(body, version)
        after = auth.state
        if closed:
            assert isinstance(decision, Close)
            assert after is S.FAILED
        if isinstance(decision, Close | RespondAndClose):
            closed = True
            assert after is S.FAILED
        else:
            assert (before, after) in MOVES
        if isinstance(decision, Allow):
            assert isinstance(body, m.ApiVersionsRequest) or after is S.AUTHENTICATED
        if isinstance(decision, Respond) and isinstance(decision.body, m.SaslAuthenticateResponse):
            answer = bytes(decision.body.auth_bytes)
        assert (auth.principal is not None) == (after is S.AUTHENTICATED)
        if auth.principal is not None:
            assert auth.principal == KafkaPrincipal("User", USER)


def _next_token(client: Any, answer: bytes | None) -> bytes:
    """The client's next token if it has one to give, else something a server must refuse."""
    try:
        if client is None:
            return b"n,,n=alice,r=nonce"
        if answer is None:
            return bytes(client.initial_response())
        token = client.evaluate_challenge(answer)
        return b"extra" if token is None else bytes(token)
    except Exception:  # the client was driven out of order by the random walk
        return b"junk"


# ---- whole exchanges through the frame codec --------------------------------------------------


class Wire:
    """A client and a server codec joined back to back, with the authenticator on the server's
    side: requests are framed, decoded, decided on, and the responses travel back."""

    def __init__(self, auth: SaslServerAuthenticator) -> None:
        self.auth = auth
        self.client = ClientConnection("sasl-test")
        self.server = ServerConnection()
        self.decisions: list[Decision] = []

    def call(self, body: m.RequestBody, version: int) -> m.ResponseBody | None:
        _, data = self.client.send_request(body, version)
        self.server.receive_data(data)
        event = self.server.next_event()
        assert isinstance(event, RequestReceived)
        decision = self.auth.receive(event.body, event.header.api_version)
        self.decisions.append(decision)
        if isinstance(decision, Close):
            return None
        # Allow: the server serves the request itself (here: an empty response of its API).
        served = m.RESPONSE_CLASSES[event.header.api_key]()
        answer = served if isinstance(decision, Allow) else decision.body
        for chunk in encode_response(event.header, answer):
            assert isinstance(chunk, bytes)
            self.client.receive_data(chunk)
        received = self.client.next_response()
        assert isinstance(received, ResponseReceived)
        return received.body

    def handshake(self, mechanism: str) -> None:
        assert isinstance(self.call(m.ApiVersionsRequest("test", "1"), 3), m.ApiVersionsResponse)
        assert isinstance(self.decisions[-1], Allow)
        response = self.call(m.SaslHandshakeRequest(mechanism), 1)
        assert isinstance(response, m.SaslHandshakeResponse)
        assert response.error_code == 0
        assert mechanism in response.mechanisms

    def authenticate(self, token: bytes, version: int) -> m.SaslAuthenticateResponse:
        response = self.call(m.SaslAuthenticateRequest(token), version)
        assert isinstance(response, m.SaslAuthenticateResponse)
        return response


def drive(
    wire: Wire, mechanism: str, first: bytes, step: Callable[[bytes], bytes | None], version: int
) -> m.SaslAuthenticateResponse:
    wire.handshake(mechanism)
    token: bytes | None = first
    response = m.SaslAuthenticateResponse()
    while token is not None:
        response = wire.authenticate(token, version)
        if response.error_code:
            return response
        token = step(bytes(response.auth_bytes))
    return response


def assert_authenticated(wire: Wire, response: m.SaslAuthenticateResponse) -> None:
    assert response.error_code == ErrorCode.NONE
    assert response.session_lifetime_ms == 0
    assert wire.auth.state is S.AUTHENTICATED
    assert wire.auth.principal == KafkaPrincipal("User", USER)
    assert isinstance(wire.call(m.MetadataRequest(), 12), m.MetadataResponse)
    assert isinstance(wire.decisions[-1], Allow)


@pytest.mark.parametrize("mechanism", ENABLED)
@pytest.mark.parametrize("version", [0, 1, 2])
def test_our_client_mechanisms(mechanism: str, version: int) -> None:
    wire = Wire(authenticator())
    client = client_mechanism(mechanism, USER, PASSWORD)
    response = drive(wire, mechanism, client.initial_response(), client.evaluate_challenge, version)
    assert_authenticated(wire, response)
    assert client.complete
    assert wire.auth.mechanism == mechanism


@pytest.mark.parametrize("mechanism", ENABLED)
def test_wrong_password_is_refused_and_closes(mechanism: str) -> None:
    wire = Wire(authenticator())
    client = client_mechanism(mechanism, USER, "guess")
    response = drive(wire, mechanism, client.initial_response(), client.evaluate_challenge, 2)
    assert response.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert response.error_message in (
        GENERIC_SCRAM_FAILURE.replace("SCRAM-SHA-256", mechanism),
        "Authentication failed: Invalid username or password",
    )
    assert isinstance(wire.decisions[-1], RespondAndClose)
    assert wire.auth.state is S.FAILED
    assert wire.auth.principal is None


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scramp_client(mechanism: str) -> None:
    wire = Wire(authenticator())
    client = scramp.ScramClient([mechanism], USER, PASSWORD)
    stage = iter(["first", "final"])

    def step(challenge: bytes) -> bytes | None:
        if next(stage) == "first":
            client.set_server_first(challenge.decode())
            return bytes(client.get_client_final().encode())
        client.set_server_final(challenge.decode())
        return None

    response = drive(wire, mechanism, client.get_client_first().encode(), step, 1)
    assert_authenticated(wire, response)


@pytest.mark.parametrize("mechanism", ENABLED)
async def test_aiokafka_sasl_code(mechanism: str) -> None:
    """aiokafka's own SASL automata (what AIOKafkaConnection runs), fed through the codec at the
    version aiokafka picks against our ApiVersions (SaslAuthenticate v1)."""
    loop = asyncio.get_running_loop()
    authenticator_: Any
    if mechanism == "PLAIN":
        authenticator_ = SaslPlainAuthenticator(
            loop=loop, sasl_plain_username=USER, sasl_plain_password=PASSWORD
        )
    else:
        authenticator_ = ScramAuthenticator(
            loop=loop,
            sasl_plain_username=USER,
            sasl_plain_password=PASSWORD,
            sasl_mechanism=mechanism,
        )
    wire = Wire(authenticator())
    wire.handshake(mechanism)
    payload: bytes | None = None
    response = m.SaslAuthenticateResponse()
    while (step := await authenticator_.step(payload)) is not None:
        token, _expect_response = step
        response = wire.authenticate(token, 1)
        assert response.error_code == 0, response.error_message
        payload = bytes(response.auth_bytes)
    assert_authenticated(wire, response)


@pytest.mark.parametrize("mechanism", ENABLED)
def test_kafka_python_sasl_code(mechanism: str) -> None:
    """kafka-python 3's mechanism classes (what its connection runs), at SaslAuthenticate v2,
    the highest it and we share."""
    config = {
        "sasl_mechanism": mechanism,
        "sasl_plain_username": USER,
        "sasl_plain_password": PASSWORD,
        "security_protocol": "SASL_SSL",
    }
    sasl: Any = (
        SaslMechanismPlain(**config) if mechanism == "PLAIN" else SaslMechanismScram(**config)
    )
    wire = Wire(authenticator())
    wire.handshake(mechanism)
    response = m.SaslAuthenticateResponse()
    while not sasl.is_done():
        response = wire.authenticate(sasl.auth_bytes(), 2)
        assert response.error_code == 0, response.error_message
        sasl.receive(bytes(response.auth_bytes))
    assert sasl.is_authenticated()
    assert_authenticated(wire, response)
