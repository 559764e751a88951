"""SASL PLAIN (RFC 4616): one client message `authzid NUL authcid NUL passwd`, no I/O.

There is one user database for every mechanism: the SCRAM credentials. Passwords are never
stored in plaintext, so PLAIN checks a password by deriving SaltedPassword with the user's stored
salt and iteration count and comparing the resulting StoredKey in constant time
(`scram.password_matches`). When a user has both SCRAM credentials, the SHA-512 one is used.
A user without a credential is checked against a stand-in credential (the same PBKDF2 work), so
neither the answer nor its timing says whether the user exists.

Kafka's PlainSaslServer checks against passwords in its JAAS file instead; the messages a client
sees are Kafka's.
"""

from __future__ import annotations

import enum
from typing import Final

from riverbed.security.scram import (
    PASSWORD_BYTES_MAX,
    USERNAME_BYTES_MAX,
    AuthenticationFailed,
    CredentialLookup,
    ExchangeStateError,
    SaslClientError,
    ScramMechanism,
    password_error,
    password_matches,
    stand_in_credential,
    username_error,
)

PLAIN: Final = "PLAIN"
# authzid and authcid are names, passwd a password; two NUL separators.
PLAIN_MESSAGE_BYTES_MAX: Final = 2 * USERNAME_BYTES_MAX + PASSWORD_BYTES_MAX + 2
# Which stored credential checks a PLAIN password, first found wins: the stronger digest.
VERIFY_MECHANISMS: Final = (ScramMechanism.SCRAM_SHA_512, ScramMechanism.SCRAM_SHA_256)

# Kafka's PlainSaslServer messages, which clients show to their users.
_BAD_CREDENTIALS: Final = "Authentication failed: Invalid username or password"
_NO_USERNAME: Final = "Authentication failed: username not specified"
_NO_PASSWORD: Final = "Authentication failed: password not specified"
_OTHER_AUTHZID: Final = (
    "Authentication failed: Client requested an authorization id that is different from username"
)


class _State(enum.Enum):
    WAITING = "waiting"  # for the one client message
    COMPLETE = "complete"
    FAILED = "failed"


class PlainServer:
    """The broker's side of one PLAIN exchange: one token in, an empty token out.

    Failures raise AuthenticationFailed (with Kafka's client messages) and leave it FAILED.
    `evaluate` runs one PBKDF2 of the user's iteration count (about 2 ms for SHA-512 at 4096
    iterations, 9 ms at 16384, on a 2020s x86 core).
    """

    def __init__(
        self, credentials: CredentialLookup, *, stand_in_secret: bytes | None = None
    ) -> None:
        self._credentials = credentials
        self._stand_in_secret = stand_in_secret
        self._state = _State.WAITING
        self._authorization_id: str | None = None

    @property
    def name(self) -> str:
        return PLAIN

    @property
    def complete(self) -> bool:
        return self._state is _State.COMPLETE

    @property
    def authorization_id(self) -> str:
        if self._authorization_id is None:
            raise ExchangeStateError("the PLAIN exchange has not completed")
        return self._authorization_id

    def evaluate(self, token: bytes) -> bytes:
        if self._state is not _State.WAITING:
            raise ExchangeStateError(f"PLAIN server is {self._state.value}; no token is expected")
        self._state = _State.FAILED  # until the token is accepted
        authzid, username, password = _parse(token)
        if not self._password_ok(username, password):
            raise AuthenticationFailed(f"PLAIN: bad credentials for {username!r}", _BAD_CREDENTIALS)
        if authzid and authzid != username:
            raise AuthenticationFailed(
                f"PLAIN: user {username!r} asked to act as {authzid!r}", _OTHER_AUTHZID
            )
        self._authorization_id = username
        self._state = _State.COMPLETE
        return b""

    def _password_ok(self, username: str, password: str) -> bool:
        for mechanism in VERIFY_MECHANISMS:
            credential = self._credentials.credential(username, mechanism)
            if credential is not None:
                return password_matches(mechanism, credential, password)
        stand_in_mechanism = VERIFY_MECHANISMS[0]
        stand_in = stand_in_credential(stand_in_mechanism, username, self._stand_in_secret)
        password_matches(stand_in_mechanism, stand_in, password)  # the same work, then no
        return False


def _parse(token: bytes) -> tuple[str, str, str]:
    if len(token) > PLAIN_MESSAGE_BYTES_MAX:
        raise AuthenticationFailed(
            f"PLAIN: message is longer than {PLAIN_MESSAGE_BYTES_MAX} bytes", _BAD_CREDENTIALS
        )
    try:
        text = token.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationFailed("PLAIN: message is not UTF-8", _BAD_CREDENTIALS) from None
    parts = text.split("\x00")
    if len(parts) != 3:
        raise AuthenticationFailed(
            f"PLAIN: {len(parts)} NUL-separated parts instead of 3",
            f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}",
        )
    authzid, username, password = parts
    if not username:
        raise AuthenticationFailed("PLAIN: no user name", _NO_USERNAME)
    if not password:
        raise AuthenticationFailed("PLAIN: no password", _NO_PASSWORD)
    problem = username_error(username) or (authzid and username_error(authzid))
    problem = problem or password_error(password)
    if problem:
        raise AuthenticationFailed(f"PLAIN: {problem}", _BAD_CREDENTIALS)
    return authzid, username, password


def plain_message(username: str, password: str, authorization_id: str = "") -> bytes:
    """RFC 4616's message; ValueError for a name or password PLAIN cannot carry."""
    problem = username_error(username) or password_error(password)
    if authorization_id and problem is None:
        problem = username_error(authorization_id)
    if problem is not None:
        raise ValueError(problem)
    return f"{authorization_id}\x00{username}\x00{password}".encode()


class PlainClient:
    """Riverbed's client side: `initial_response()` is the message; the server's (empty) answer
    goes to `evaluate_challenge`, which returns None: the exchange is over."""

    def __init__(self, username: str, password: str, *, authorization_id: str = "") -> None:
        self._message = plain_message(username, password, authorization_id)
        self._sent = False
        self._complete = False

    @property
    def name(self) -> str:
        return PLAIN

    @property
    def complete(self) -> bool:
        return self._complete

    def initial_response(self) -> bytes:
        if self._sent:
            raise ExchangeStateError("the PLAIN message was already sent")
        self._sent = True
        return self._message

    def evaluate_challenge(self, challenge: bytes) -> bytes | None:
        if not self._sent or self._complete:
            raise ExchangeStateError("PLAIN expects one server answer, after its message")
        if challenge:
            raise SaslClientError("the server answered PLAIN with data; PLAIN has none")
        self._complete = True
        return None
