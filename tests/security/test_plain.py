"""SASL PLAIN, checked against stored SCRAM credentials: passwords are never stored."""

from __future__ import annotations

import statistics
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.security.plain import (
    PLAIN_MESSAGE_BYTES_MAX,
    PlainClient,
    PlainServer,
    plain_message,
)
from riverbed.security.scram import (
    ITERATIONS_MAX,
    USERNAME_BYTES_MAX,
    AuthenticationFailed,
    ExchangeStateError,
    InMemoryCredentials,
    SaslClientError,
    ScramCredential,
    ScramMechanism,
    new_credential,
)

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
BAD_CREDENTIALS = "Authentication failed: Invalid username or password"


def users(**passwords_by_mechanism: dict[ScramMechanism, str]) -> InMemoryCredentials:
    credentials = InMemoryCredentials()
    for user, passwords in passwords_by_mechanism.items():
        for mechanism, password in passwords.items():
            credentials.set(user, mechanism, new_credential(mechanism, password))
    return credentials


def login(credentials: InMemoryCredentials, message: bytes) -> PlainServer:
    server = PlainServer(credentials)
    assert server.evaluate(message) == b""
    return server


@pytest.mark.parametrize("mechanism", [SHA256, SHA512], ids=lambda m: m.value)
def test_password_checked_against_a_scram_credential(mechanism: ScramMechanism) -> None:
    credentials = users(alice={mechanism: "wonderland"})
    server = login(credentials, b"\x00alice\x00wonderland")
    assert server.complete
    assert server.authorization_id == "alice"
    with pytest.raises(AuthenticationFailed) as caught:
        PlainServer(credentials).evaluate(b"\x00alice\x00rabbit-hole")
    assert caught.value.client_message == BAD_CREDENTIALS


def test_sha512_is_preferred_when_both_exist() -> None:
    credentials = users(alice={SHA256: "old", SHA512: "new"})
    login(credentials, b"\x00alice\x00new")
    with pytest.raises(AuthenticationFailed):
        PlainServer(credentials).evaluate(b"\x00alice\x00old")


def test_unknown_user_gets_the_wrong_password_answer() -> None:
    credentials = users(alice={SHA512: "wonderland"})
    with pytest.raises(AuthenticationFailed, match="bad credentials for 'mallory'") as caught:
        PlainServer(credentials).evaluate(b"\x00mallory\x00wonderland")
    assert caught.value.client_message == BAD_CREDENTIALS


def test_unknown_user_costs_the_same_pbkdf2_work() -> None:
    """No timing shortcut for a missing user: both paths run PBKDF2 (SHA-512, 4096 rounds,
    about 2 ms) while a skipped derivation costs microseconds; medians over interleaved runs
    keep the comparison robust on a busy machine."""
    credentials = users(alice={SHA512: "wonderland"})
    known: list[float] = []
    unknown: list[float] = []
    for _ in range(15):
        for message, samples in ((b"\x00alice\x00x", known), (b"\x00nobody\x00x", unknown)):
            started = time.perf_counter()
            with pytest.raises(AuthenticationFailed):
                PlainServer(credentials).evaluate(message)
            samples.append(time.perf_counter() - started)
    assert statistics.median(unknown) > 0.3 * statistics.median(known)


def test_authorization_id_must_be_empty_or_the_user() -> None:
    credentials = users(alice={SHA256: "pw"})
    assert login(credentials, b"alice\x00alice\x00pw").authorization_id == "alice"
    with pytest.raises(AuthenticationFailed) as caught:
        PlainServer(credentials).evaluate(b"admin\x00alice\x00pw")
    assert caught.value.client_message == (
        "Authentication failed: Client requested an authorization id that is different from "
        "username"
    )


def test_credentials_outside_the_iteration_bounds_never_match() -> None:
    good = new_credential(SHA512, "pw", ITERATIONS_MAX)
    credentials = InMemoryCredentials()
    credentials.set(
        "big", SHA512, ScramCredential(good.salt, good.stored_key, good.server_key, 10**6)
    )
    with pytest.raises(AuthenticationFailed):
        PlainServer(credentials).evaluate(b"\x00big\x00pw")


@pytest.mark.parametrize(
    ("message", "client_message"),
    [
        (b"", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (b"alice\x00pw", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
        (b"\x00alice\x00pw\x00", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
        (b"\x00\x00pw", "Authentication failed: username not specified"),
        (b"\x00alice\x00", "Authentication failed: password not specified"),
        (b"\x00al\xffice\x00pw", BAD_CREDENTIALS),
        (b"\x00" + b"n" * (USERNAME_BYTES_MAX + 1) + b"\x00pw", BAD_CREDENTIALS),
        (b"a" * (USERNAME_BYTES_MAX + 1) + b"\x00alice\x00pw", BAD_CREDENTIALS),
        (b"\x00alice\x00" + b"p" * PLAIN_MESSAGE_BYTES_MAX, BAD_CREDENTIALS),
    ],
)
def test_malformed_messages_are_clean_failures(message: bytes, client_message: str) -> None:
    server = PlainServer(users(alice={SHA256: "pw"}))
    with pytest.raises(AuthenticationFailed) as caught:
        server.evaluate(message)
    assert caught.value.client_message == client_message
    assert not server.complete
    with pytest.raises(ExchangeStateError):
        server.evaluate(b"\x00alice\x00pw")


def test_one_message_only() -> None:
    server = login(users(alice={SHA256: "pw"}), b"\x00alice\x00pw")
    with pytest.raises(ExchangeStateError):
        server.evaluate(b"\x00alice\x00pw")
    with pytest.raises(ExchangeStateError):
        PlainServer(InMemoryCredentials()).authorization_id  # noqa: B018


@settings(max_examples=200, deadline=None)
@given(garbage=st.binary(max_size=64))
def test_garbage_only_ever_fails_authentication(garbage: bytes) -> None:
    server = PlainServer(users(alice={SHA256: "pw"}))
    if garbage.endswith(b"alice\x00pw"):
        return  # the one valid message (with or without the authorization id)
    with pytest.raises(AuthenticationFailed):
        server.evaluate(garbage)


def test_client_side() -> None:
    client = PlainClient("alice", "pw")
    message = client.initial_response()
    assert message == b"\x00alice\x00pw" == plain_message("alice", "pw")
    server = PlainServer(users(alice={SHA512: "pw"}))
    assert client.evaluate_challenge(server.evaluate(message)) is None
    assert client.complete
    assert server.complete
    assert plain_message("alice", "pw", "alice") == b"alice\x00alice\x00pw"
    with pytest.raises(ExchangeStateError):
        client.initial_response()


def test_client_refuses_what_plain_cannot_carry_or_a_chatty_server() -> None:
    for user, password, problem in [
        ("", "pw", "user name is empty"),
        ("a", "", "password is empty"),
        ("a\x00b", "pw", "user name contains a NUL"),
        ("a", "p\x00w", "password contains a NUL"),
    ]:
        with pytest.raises(ValueError, match=problem):
            PlainClient(user, password)
    client = PlainClient("alice", "pw")
    with pytest.raises(ExchangeStateError):
        client.evaluate_challenge(b"")
    client.initial_response()
    with pytest.raises(SaslClientError):
        client.evaluate_challenge(b"unexpected")
