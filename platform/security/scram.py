"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka uses them, without any I/O.

Three parts:

* Credentials. A user's password is never stored: `new_credential` derives
  SaltedPassword = PBKDF2-HMAC(password, salt, iterations) and keeps only
  StoredKey = H(HMAC(SaltedPassword, "Client Key")) and ServerKey = HMAC(SaltedPassword,
  "Server Key") with the salt and the iteration count, in Kafka's ZooKeeper string format
  `salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=<n>`.
* `ScramServer`, the broker's side of one exchange: client-first -> server-first, client-final ->
  server-final. Only the gs2 header `n` (no channel binding) is accepted, as Kafka does. An unknown
  user gets a made-up credential and fails at the proof, exactly where a wrong password fails, so
  the exchange does not tell whether a user exists.
* `ScramClient`, the client's side, for Riverbed's own client: it also checks the server's
  signature, so a server that does not hold the credential is detected.

Passwords are used as their UTF-8 bytes, without RFC 4013 SASLprep: Kafka's Java client, broker
and tools do the same, so credentials made by either side work with the other. ASCII passwords,
and any password already in NFKC form without mapped characters, are unaffected by the
difference.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

# Kafka's bounds (ScramMechanism.minIterations / maxIterations). The minimum is RFC 7677's
# advice; the maximum bounds the PBKDF2 work one credential can demand: of the broker for every
# PLAIN login verified against it, of a client for every server-first message it receives.
ITERATIONS_MIN: Final = 4096
ITERATIONS_MAX: Final = 16384
ITERATIONS_DEFAULT: Final = 4096  # kafka-configs' default when no iterations are given
SALT_BYTES: Final = 32
# Nonces are random bytes in URL-safe base64: printable and free of ',' as RFC 5802 requires.
NONCE_BYTES: Final = 24
# A client's nonce longer than this is refused: it is echoed in every later message.
CLIENT_NONCE_CHARS_MAX: Final = 256
# RFC 4616 asks servers to accept names and passwords of up to 255 octets; the same name limit
# holds for every mechanism and for `riverbed users`, so every stored user can log in.
USERNAME_BYTES_MAX: Final = 255
PASSWORD_BYTES_MAX: Final = 1024
# One SCRAM message: an escaped name (<= 3 x 255), two nonces, a proof (88 chars for SHA-512)
# and extensions fit with room to spare; anything longer is refused before it is parsed.
SCRAM_MESSAGE_BYTES_MAX: Final = 4096

_CLIENT_KEY: Final = b"Client Key"
_SERVER_KEY: Final = b"Server Key"
_EXTENSION: Final = re.compile(r"[A-Za-z]+=[^,]+")
_GENERIC_FAILURE: Final = None  # AuthenticationFailed.client_message: the broker's generic text


class ScramMechanism(enum.Enum):
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"

    @property
    def hash_name(self) -> str:
        return "sha256" if self is ScramMechanism.SCRAM_SHA_256 else "sha512"

    @property
    def digest_bytes(self) -> int:
        return 32 if self is ScramMechanism.SCRAM_SHA_256 else 64

    @classmethod
    def from_name(cls, name: str) -> ScramMechanism:
        """`"SCRAM-SHA-512"` -> SCRAM_SHA_512; a ValueError lists the supported names."""
        for mechanism in cls:
            if mechanism.value == name:
                return mechanism
        supported = ", ".join(m.value for m in cls)
        raise ValueError(f"unknown SCRAM mechanism {name!r} (supported: {supported})")


class AuthenticationFailed(Exception):
    """A client failed to authenticate (a server-side outcome, the client's fault).

    `str(error)` is the reason, for the broker's log only: it may say that a user is unknown.
    `client_message` is what the client may be told; None means the broker's generic message,
    which names nothing.
    """

    def __init__(self, reason: str, client_message: str | None = _GENERIC_FAILURE) -> None:
        super().__init__(reason)
        self.client_message = client_message


class SaslClientError(Exception):
    """The server's side of an exchange is wrong (a client-side outcome, the server's fault): a
    malformed message, or a final signature showing it does not hold the user's credential."""


class ExchangeStateError(RuntimeError):
    """A mechanism object was driven out of order: a bug in the caller, not a peer's fault."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server stores for one user and mechanism; the password cannot be recovered.

    Invariants: a non-empty salt, stored_key and server_key of one digest's length (32 bytes
    for SHA-256, 64 for SHA-512), iterations >= 1 (the bounds are checked where a credential is
    made and where one is used, so a credential Kafka wrote can still be read and listed).
    """

    salt: bytes
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int

    def __post_init__(self) -> None:
        if not self.salt:
            raise ValueError("a SCRAM credential needs a salt")
        if len(self.stored_key) not in (32, 64) or len(self.server_key) != len(self.stored_key):
            raise ValueError(
                "stored_key and server_key must both be 32 (SHA-256) or 64 (SHA-512) bytes, "
                f"got {len(self.stored_key)} and {len(self.server_key)}"
            )
        if self.iterations < 1:
            raise ValueError(f"iterations must be positive, got {self.iterations}")

    def fits(self, mechanism: ScramMechanism) -> bool:
        """True if the keys have this mechanism's digest length."""
        return len(self.stored_key) == mechanism.digest_bytes

    def to_kafka_string(self) -> str:
        """Kafka's ScramCredentialUtils format, as stored in /config/users/<user>."""
        return (
            f"salt={_b64(self.salt)},stored_key={_b64(self.stored_key)},"
            f"server_key={_b64(self.server_key)},iterations={self.iterations}"
        )

    @classmethod
    def from_kafka_string(cls, text: str) -> ScramCredential:
        """Parse `to_kafka_string`'s format (keys in any order, as Kafka reads them); a
        ValueError says what is wrong without repeating the keys."""
        values: dict[str, str] = {}
        for token in text.split(","):
            key, sep, value = token.partition("=")
            if not sep or not key:
                raise ValueError(f"a SCRAM credential is key=value pairs, found {key!r}")
            if key in values:
                raise ValueError(f"SCRAM credential repeats {key!r}")
            values[key] = value
        expected = {"salt", "stored_key", "server_key", "iterations"}
        if set(values) != expected:
            raise ValueError(
                f"a SCRAM credential has exactly {', '.join(sorted(expected))}; "
                f"got {', '.join(sorted(values))}"
            )
        if not values["iterations"].isascii() or not values["iterations"].isdigit():
            raise ValueError(
                f"SCRAM credential iterations {values['iterations']!r} is not a number"
            )
        return cls(
            salt=_unb64(values["salt"], "salt"),
            stored_key=_unb64(values["stored_key"], "stored_key"),
            server_key=_unb64(values["server_key"], "server_key"),
            iterations=int(values["iterations"]),
        )


class CredentialLookup(Protocol):
    """Where mechanisms find credentials: the broker's ZooKeeper-fed cache
    (`riverbed.security.credentials.CredentialCache`) or `InMemoryCredentials`. It must answer
    at once, without I/O: authentications never wait on ZooKeeper."""

    def credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None: ...


class InMemoryCredentials:
    """A `CredentialLookup` held in a dict: for tests and for embedding."""

    def __init__(self) -> None:
        self._credentials: dict[tuple[str, ScramMechanism], ScramCredential] = {}

    def set(self, user: str, mechanism: ScramMechanism, credential: ScramCredential) -> None:
        self._credentials[(user, mechanism)] = credential

    def remove(self, user: str, mechanism: ScramMechanism) -> None:
        self._credentials.pop((user, mechanism), None)

    def credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self._credentials.get((user, mechanism))


# ---- names and passwords ------------------------------------------------------------------------


def username_error(name: str) -> str | None:
    """Why `name` cannot be a SASL user name, or None if it can."""
    if not name:
        return "the user name is empty"
    encoded = _utf8(name)
    if encoded is None:
        return "the user name is not valid Unicode text"
    if len(encoded) > USERNAME_BYTES_MAX:
        return f"the user name is {len(encoded)} bytes long; the maximum is {USERNAME_BYTES_MAX}"
    if "\x00" in name:
        return "the user name contains a NUL character"
    return None


def password_error(password: str) -> str | None:
    """Why `password` cannot be a password, or None if it can."""
    if not password:
        return "the password is empty"
    encoded = _utf8(password)
    if encoded is None:
        return "the password is not valid Unicode text"
    if len(encoded) > PASSWORD_BYTES_MAX:
        return f"the password is {len(encoded)} bytes long; the maximum is {PASSWORD_BYTES_MAX}"
    if "\x00" in password:
        return "the password contains a NUL character"  # PLAIN could not carry it
    return None


def iterations_error(iterations: int) -> str | None:
    if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        return f"iterations must be in [{ITERATIONS_MIN}, {ITERATIONS_MAX}], got {iterations}"
    return None


def escape_saslname(name: str) -> str:
    """RFC 5802 saslname: ',' and '=' cannot appear literally in a SCRAM attribute."""
    return name.replace("=", "=3D").replace(",", "=2C")


def unescape_saslname(saslname: str) -> str:
    """The inverse of `escape_saslname`; a ValueError for a '=' not starting =2C or =3D."""
    out: list[str] = []
    index = 0
    while index < len(saslname):
        char = saslname[index]
        if char != "=":
            out.append(char)
            index += 1
            continue
        code = saslname[index + 1 : index + 3]
        if code == "2C":
            out.append(",")
        elif code == "3D":
            out.append("=")
        else:
            raise ValueError("'=' in a SCRAM name must start =2C or =3D")
        index += 3
    return "".join(out)


# ---- key derivation -----------------------------------------------------------------------------


def salted_password(
    mechanism: ScramMechanism, password: str, salt: bytes, iterations: int
) -> bytes:
    """RFC 5802 Hi(): PBKDF2-HMAC over the password's UTF-8 bytes (CPU-bound: hashlib releases
    the GIL while it runs, so a caller may run it in a thread)."""
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode("utf-8"), salt, iterations)


def credential_from_salted_password(
    mechanism: ScramMechanism, salted: bytes, salt: bytes, iterations: int
) -> ScramCredential:
    client_key = _hmac(mechanism, salted, _CLIENT_KEY)
    return ScramCredential(
        salt=salt,
        stored_key=_hash(mechanism, client_key),
        server_key=_hmac(mechanism, salted, _SERVER_KEY),
        iterations=iterations,
    )


def derive_credential(
    mechanism: ScramMechanism, password: str, salt: bytes, iterations: int
) -> ScramCredential:
    """The credential of `password` with this salt; ValueError for an unusable password, salt
    or iteration count."""
    problem = password_error(password) or iterations_error(iterations)
    if problem is None and not salt:
        problem = "the salt is empty"
    if problem is not None:
        raise ValueError(problem)
    salted = salted_password(mechanism, password, salt, iterations)
    return credential_from_salted_password(mechanism, salted, salt, iterations)


def new_credential(
    mechanism: ScramMechanism, password: str, iterations: int = ITERATIONS_DEFAULT
) -> ScramCredential:
    """A credential with a fresh random salt (`secrets`)."""
    return derive_credential(mechanism, password, secrets.token_bytes(SALT_BYTES), iterations)


def password_matches(mechanism: ScramMechanism, credential: ScramCredential, password: str) -> bool:
    """Whether `password` is the one `credential` was made from: StoredKey recomputed with the
    credential's salt and iterations, compared in constant time. A credential outside the
    iteration bounds or of another digest never matches (and costs no PBKDF2 work)."""
    if not credential.fits(mechanism) or iterations_error(credential.iterations):
        return False
    salted = salted_password(mechanism, password, credential.salt, credential.iterations)
    candidate = credential_from_salted_password(
        mechanism, salted, credential.salt, credential.iterations
    )
    return hmac.compare_digest(candidate.stored_key, credential.stored_key)


# A process-wide secret for the stand-in credentials of unknown users: the same unknown name gets
# the same salt every time (a fresh salt per attempt would give the name away), and nobody can
# compute a proof for it.
_STAND_IN_SECRET: Final = secrets.token_bytes(32)


def stand_in_credential(
    mechanism: ScramMechanism, user: str, secret: bytes | None = None
) -> ScramCredential:
    """A credential for a user that does not exist: indistinguishable from a real one without
    `secret` (default: this process's), and no password matches it."""
    seed = hmac.new(
        secret or _STAND_IN_SECRET, f"{mechanism.value}\x00{user}".encode(), hashlib.sha256
    ).digest()
    return ScramCredential(
        salt=hmac.new(seed, b"salt", hashlib.sha256).digest()[:SALT_BYTES],
        stored_key=_hmac(mechanism, seed, b"stored key"),
        server_key=_hmac(mechanism, seed, b"server key"),
        iterations=ITERATIONS_DEFAULT,
    )


# ---- the server side of an exchange -------------------------------------------------------------


class _ServerState(enum.Enum):
    CLIENT_FIRST = "client-first"  # waiting for client-first-message
    CLIENT_FINAL = "client-final"  # server-first sent, waiting for client-final-message
    COMPLETE = "complete"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class _ClientFirst:
    gs2_header: str  # "n,," or "n,a=<saslname>,": client-final's c= must repeat it
    username: str
    nonce: str
    bare: str  # client-first-message-bare, part of the AuthMessage


class ScramServer:
    """The broker's side of one SCRAM exchange; feed each client token to `evaluate`.

    Every failure raises AuthenticationFailed and leaves the object FAILED. A user that is
    unknown, or whose stored credential is unusable (another digest, fewer than ITERATIONS_MIN
    iterations), is given `stand_in_credential` and fails at the proof, like a wrong password.
    """

    def __init__(
        self,
        mechanism: ScramMechanism,
        credentials: CredentialLookup,
        *,
        server_nonce: str | None = None,
        stand_in_secret: bytes | None = None,
    ) -> None:
        self.mechanism = mechanism
        self._credentials = credentials
        self._server_nonce = server_nonce or secrets.token_urlsafe(NONCE_BYTES)
        self._stand_in_secret = stand_in_secret
        self._state = _ServerState.CLIENT_FIRST
        self._first: _ClientFirst | None = None
        self._server_first = ""
        self._credential: ScramCredential | None = None
        self._unusable_reason: str | None = None  # why the proof must fail, for the log
        self._authorization_id: str | None = None

    @property
    def name(self) -> str:
        return self.mechanism.value

    @property
    def complete(self) -> bool:
        return self._state is _ServerState.COMPLETE

    @property
    def authorization_id(self) -> str:
        """The authenticated user name, once `complete`."""
        if self._authorization_id is None:
            raise ExchangeStateError("the SCRAM exchange has not completed")
        return self._authorization_id

    def evaluate(self, token: bytes) -> bytes:
        """The reply to one client token: server-first to client-first, server-final to
        client-final (after which `complete` is True)."""
        state = self._state
        if state not in (_ServerState.CLIENT_FIRST, _ServerState.CLIENT_FINAL):
            raise ExchangeStateError(f"SCRAM server is {state.value}; no token is expected")
        self._state = _ServerState.FAILED  # until this token is accepted
        if state is _ServerState.CLIENT_FIRST:
            reply = self._on_client_first(token)
            self._state = _ServerState.CLIENT_FINAL
        else:
            reply = self._on_client_final(token)
            self._state = _ServerState.COMPLETE
        return reply

    def _on_client_first(self, token: bytes) -> bytes:
        first = _parse_client_first(_decode_message(token, "client-first"))
        self._first = first
        credential = self._credentials.credential(first.username, self.mechanism)
        if credential is None:
            self._unusable_reason = f"unknown user {first.username!r}"
        elif not credential.fits(self.mechanism):
            self._unusable_reason = f"the stored credential of {first.username!r} is another digest"
        elif credential.iterations < ITERATIONS_MIN:
            # Kafka's bound too. No maximum here: the client does the PBKDF2 work, and Kafka's
            # kafka-configs --zookeeper stores any count above the minimum.
            self._unusable_reason = (
                f"the stored credential of {first.username!r} has {credential.iterations} "
                f"iterations, fewer than {ITERATIONS_MIN}"
            )
        if self._unusable_reason is not None or credential is None:
            credential = stand_in_credential(self.mechanism, first.username, self._stand_in_secret)
        self._credential = credential
        self._server_first = (
            f"r={first.nonce}{self._server_nonce},s={_b64(credential.salt)},"
            f"i={credential.iterations}"
        )
        return self._server_first.encode("ascii")

    def _on_client_final(self, token: bytes) -> bytes:
        first, credential = self._first, self._credential
        if first is None or credential is None:  # guarded by the state in evaluate()
            raise ExchangeStateError("client-final before client-first")
        message = _decode_message(token, "client-final")
        without_proof, proof = _split_client_final(message, self.mechanism)
        attributes = without_proof.split(",")
        binding = _attribute(attributes, 0, "c", "client-final")
        nonce = _attribute(attributes, 1, "r", "client-final")
        _check_extensions(attributes[2:], "client-final")
        if _unb64_or_fail(binding, "channel binding") != first.gs2_header.encode("utf-8"):
            raise _malformed("client-final's channel binding does not repeat the gs2 header")
        # RFC 5802 wants exactly the server-first nonce back. librdkafka (at least to 2.0)
        # sends the client nonce once more in front of it, and Kafka's ScramSaslServer accepts
        # that by checking only the end: so does Riverbed, or kcat could not log in. The
        # proof still covers the message as sent, so nothing else is weakened.
        if not nonce.endswith(first.nonce + self._server_nonce):
            raise _malformed("client-final's nonce does not end with the server-first nonce")
        auth_message = f"{first.bare},{self._server_first},{without_proof}".encode()
        client_signature = _hmac(self.mechanism, credential.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        proof_ok = hmac.compare_digest(_hash(self.mechanism, client_key), credential.stored_key)
        if self._unusable_reason is not None:
            raise AuthenticationFailed(f"SCRAM: {self._unusable_reason}")
        if not proof_ok:
            raise AuthenticationFailed(f"SCRAM: wrong password for user {first.username!r}")
        self._authorization_id = first.username
        signature = _hmac(self.mechanism, credential.server_key, auth_message)
        return f"v={_b64(signature)}".encode("ascii")


def _parse_client_first(message: str) -> _ClientFirst:
    flag, comma, rest = message.partition(",")
    authzid_part, comma2, bare = rest.partition(",")
    if not comma or not comma2:
        raise _malformed("client-first lacks a gs2 header")
    if flag in ("y", "p") or flag.startswith("p="):
        raise _malformed("channel binding is not supported (gs2 header must start 'n,')")
    if flag != "n":
        raise _malformed(f"client-first has an unknown gs2 flag {flag!r}")
    authzid = None
    if authzid_part:
        if not authzid_part.startswith("a=") or len(authzid_part) == 2:
            raise _malformed("client-first's authorization id is malformed")
        authzid = _saslname(authzid_part[2:])
    attributes = bare.split(",")
    if attributes[0].startswith("m="):
        raise _malformed("client-first asks for a mandatory extension (m=), none is supported")
    username = _saslname(_attribute(attributes, 0, "n", "client-first"))
    nonce = _attribute(attributes, 1, "r", "client-first")
    _check_extensions(attributes[2:], "client-first")
    _check_nonce(nonce)
    if authzid is not None and authzid != username:
        raise AuthenticationFailed(
            f"SCRAM: user {username!r} asked to act as {authzid!r}",
            "Authentication failed: Client requested an authorization id that is different "
            "from username",
        )
    header = message[: len(flag) + 1 + len(authzid_part) + 1]
    return _ClientFirst(gs2_header=header, username=username, nonce=nonce, bare=bare)


def _split_client_final(message: str, mechanism: ScramMechanism) -> tuple[str, bytes]:
    without_proof, comma, proof_attribute = message.rpartition(",")
    if not comma or not proof_attribute.startswith("p="):
        raise _malformed("client-final does not end with the proof (p=)")
    proof = _unb64_or_fail(proof_attribute[2:], "proof")
    if len(proof) != mechanism.digest_bytes:
        raise _malformed(f"the proof is {len(proof)} bytes, not {mechanism.digest_bytes}")
    return without_proof, proof


def _saslname(value: str) -> str:
    try:
        name = unescape_saslname(value)
    except ValueError as error:
        raise _malformed(str(error)) from None
    problem = username_error(name)
    if problem is not None:
        raise _malformed(problem)
    return name


def _check_nonce(nonce: str) -> None:
    if not nonce or len(nonce) > CLIENT_NONCE_CHARS_MAX:
        raise _malformed(f"the client nonce must be 1 to {CLIENT_NONCE_CHARS_MAX} characters")
    if not all("!" <= char <= "~" for char in nonce):  # printable ASCII; ',' split off already
        raise _malformed("the client nonce has characters outside printable ASCII")


def _malformed(reason: str) -> AuthenticationFailed:
    return AuthenticationFailed(f"SCRAM: malformed message: {reason}")


# ---- the client side of an exchange -------------------------------------------------------------


class _ClientState(enum.Enum):
    START = "start"  # client-first not yet sent
    SERVER_FIRST = "server-first"  # waiting for server-first-message
    SERVER_FINAL = "server-final"  # client-final sent, waiting for server-final-message
    COMPLETE = "complete"
    FAILED = "failed"


class ScramClient:
    """Riverbed's client side of one SCRAM exchange: `initial_response()` is client-first;
    `evaluate_challenge(server-first)` is client-final; `evaluate_challenge(server-final)`
    checks the server's signature and returns None (the exchange is over).

    Failures raise SaslClientError and leave the object FAILED; iteration counts outside
    [ITERATIONS_MIN, ITERATIONS_MAX] are refused so a server cannot make the client do unbounded
    work or accept a weak credential.
    """

    def __init__(
        self,
        mechanism: ScramMechanism,
        username: str,
        password: str,
        *,
        client_nonce: str | None = None,
    ) -> None:
        problem = username_error(username) or password_error(password)
        if problem is not None:
            raise ValueError(problem)
        self.mechanism = mechanism
        self._username = username
        self._password = password
        self._nonce = client_nonce or secrets.token_urlsafe(NONCE_BYTES)
        self._bare = f"n={escape_saslname(username)},r={self._nonce}"
        self._state = _ClientState.START
        self._server_signature = b""

    @property
    def name(self) -> str:
        return self.mechanism.value

    @property
    def complete(self) -> bool:
        return self._state is _ClientState.COMPLETE

    def initial_response(self) -> bytes:
        if self._state is not _ClientState.START:
            raise ExchangeStateError("client-first was already sent")
        self._state = _ClientState.SERVER_FIRST
        return f"n,,{self._bare}".encode()

    def evaluate_challenge(self, challenge: bytes) -> bytes | None:
        state = self._state
        if state not in (_ClientState.SERVER_FIRST, _ClientState.SERVER_FINAL):
            raise ExchangeStateError(f"SCRAM client is {state.value}; no challenge is expected")
        self._state = _ClientState.FAILED  # until this challenge is accepted
        if state is _ClientState.SERVER_FIRST:
            reply = self._on_server_first(challenge)
            self._state = _ClientState.SERVER_FINAL
            return reply
        self._on_server_final(challenge)
        self._state = _ClientState.COMPLETE
        return None

    def _on_server_first(self, challenge: bytes) -> bytes:
        message = _decode_message(challenge, "server-first", SaslClientError)
        attributes = message.split(",")
        if attributes[0].startswith("m="):
            raise SaslClientError("server-first asks for a mandatory extension (m=)")
        nonce = _attribute(attributes, 0, "r", "server-first", SaslClientError)
        salt_text = _attribute(attributes, 1, "s", "server-first", SaslClientError)
        iterations_text = _attribute(attributes, 2, "i", "server-first", SaslClientError)
        if not all(_EXTENSION.fullmatch(extension) for extension in attributes[3:]):
            raise SaslClientError("server-first has a malformed attribute")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslClientError("server-first's nonce does not extend the client's")
        if not all("!" <= char <= "~" for char in nonce):
            raise SaslClientError("server-first's nonce has characters outside printable ASCII")
        try:
            salt = _strict_b64decode(salt_text)
        except ValueError:
            raise SaslClientError("server-first's salt is not base64") from None
        if not salt:
            raise SaslClientError("server-first's salt is empty")
        if not iterations_text.isascii() or not iterations_text.isdigit():
            raise SaslClientError(f"server-first's iteration count {iterations_text!r}")
        iterations = int(iterations_text)
        if problem := iterations_error(iterations):
            raise SaslClientError(f"server-first: {problem}")
        salted = salted_password(self.mechanism, self._password, salt, iterations)
        credential = credential_from_salted_password(self.mechanism, salted, salt, iterations)
        without_proof = f"c={_b64(b'n,,')},r={nonce}"
        auth_message = f"{self._bare},{message},{without_proof}".encode()
        client_key = _hmac(self.mechanism, salted, _CLIENT_KEY)
        client_signature = _hmac(self.mechanism, credential.stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, client_signature, strict=True))
        self._server_signature = _hmac(self.mechanism, credential.server_key, auth_message)
        return f"{without_proof},p={_b64(proof)}".encode("ascii")

    def _on_server_final(self, challenge: bytes) -> None:
        message = _decode_message(challenge, "server-final", SaslClientError)
        if message.startswith("e="):
            raise SaslClientError(f"the server refused the authentication: {message[2:]}")
        if not message.startswith("v="):
            raise SaslClientError("server-final has neither a verifier (v=) nor an error (e=)")
        verifier, _, extensions = message[2:].partition(",")
        try:
            signature = _strict_b64decode(verifier)
        except ValueError:
            raise SaslClientError("server-final's verifier is not base64") from None
        if extensions and not all(_EXTENSION.fullmatch(e) for e in extensions.split(",")):
            raise SaslClientError("server-final has malformed extensions")
        if not hmac.compare_digest(signature, self._server_signature):
            raise SaslClientError(
                "the server's signature is wrong: it does not hold the credential"
            )


# ---- shared helpers -----------------------------------------------------------------------------


# Both sides parse the same grammar; what differs is whom a malformed message is reported to:
# the server refuses the client (AuthenticationFailed), the client gives up (SaslClientError).
_Malformed = Callable[[str], Exception]


def _decode_message(token: bytes, what: str, malformed: _Malformed = _malformed) -> str:
    if len(token) > SCRAM_MESSAGE_BYTES_MAX:
        raise malformed(f"{what} is longer than {SCRAM_MESSAGE_BYTES_MAX} bytes")
    try:
        return token.decode("utf-8")
    except UnicodeDecodeError:
        raise malformed(f"{what} is not UTF-8") from None


def _attribute(
    attributes: list[str], index: int, name: str, what: str, malformed: _Malformed = _malformed
) -> str:
    if index >= len(attributes) or not attributes[index].startswith(f"{name}="):
        raise malformed(f"{what} lacks its {name}= attribute")
    return attributes[index][len(name) + 1 :]


def _check_extensions(extensions: list[str], what: str) -> None:
    """Optional extensions (Kafka's `tokenauth=true` among them) are ignored, but they must at
    least be attribute=value."""
    for extension in extensions:
        if not _EXTENSION.fullmatch(extension):
            raise _malformed(f"{what} has a malformed attribute")


def _unb64_or_fail(text: str, what: str) -> bytes:
    try:
        return _strict_b64decode(text)
    except ValueError:
        raise _malformed(f"the {what} is not base64") from None


def _strict_b64decode(text: str) -> bytes:
    """Standard base64 with padding, and nothing else (no whitespace, no other alphabet)."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as error:
        raise ValueError(str(error)) from None


def _unb64(text: str, what: str) -> bytes:
    try:
        return _strict_b64decode(text)
    except ValueError:
        raise ValueError(f"SCRAM credential {what} is not base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _utf8(text: str) -> bytes | None:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _hmac(mechanism: ScramMechanism, key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, mechanism.hash_name).digest()


def _hash(mechanism: ScramMechanism, data: bytes) -> bytes:
    return hashlib.new(mechanism.hash_name, data).digest()
