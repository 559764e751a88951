"""SCRAM-SHA-256/512 without I/O: RFC 7677's example, round trips, every malformed message, and
interop with scramp (an independent implementation) on both sides."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
import scramp
from hypothesis import given, settings
from hypothesis import strategies as st
from riverbed.security.scram import (
    CLIENT_NONCE_CHARS_MAX,
    ITERATIONS_DEFAULT,
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    SALT_BYTES,
    SCRAM_MESSAGE_BYTES_MAX,
    USERNAME_BYTES_MAX,
    AuthenticationFailed,
    ExchangeStateError,
    InMemoryCredentials,
    SaslClientError,
    ScramClient,
    ScramCredential,
    ScramMechanism,
    ScramServer,
    derive_credential,
    escape_saslname,
    new_credential,
    password_matches,
    unescape_saslname,
)

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
MECHANISMS = [SHA256, SHA512]

# RFC 7677 section 3: user "user", password "pencil".
RFC_CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
GENERIC = None  # AuthenticationFailed.client_message of failures that must not say why


def store(user: str, password: str, *mechanisms: ScramMechanism) -> InMemoryCredentials:
    credentials = InMemoryCredentials()
    for mechanism in mechanisms or tuple(MECHANISMS):
        credentials.set(user, mechanism, new_credential(mechanism, password))
    return credentials


def exchange(server: ScramServer, client: ScramClient) -> None:
    server_first = server.evaluate(client.initial_response())
    client_final = client.evaluate_challenge(server_first)
    assert client_final is not None
    assert client.evaluate_challenge(server.evaluate(client_final)) is None


# ---- RFC 7677 ---------------------------------------------------------------------------------


def rfc_credentials() -> InMemoryCredentials:
    credentials = InMemoryCredentials()
    credentials.set("user", SHA256, derive_credential(SHA256, "pencil", RFC_SALT, 4096))
    return credentials


def test_rfc7677_example_server_side() -> None:
    server = ScramServer(SHA256, rfc_credentials(), server_nonce=RFC_SERVER_NONCE)
    assert server.evaluate(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert not server.complete
    assert server.evaluate(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.complete
    assert server.authorization_id == "user"


def test_rfc7677_example_client_side() -> None:
    client = ScramClient(SHA256, "user", "pencil", client_nonce=RFC_CLIENT_NONCE)
    assert client.initial_response() == RFC_CLIENT_FIRST
    assert client.evaluate_challenge(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    assert not client.complete
    assert client.evaluate_challenge(RFC_SERVER_FINAL) is None
    assert client.complete


# ---- round trips ------------------------------------------------------------------------------

names = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), min_size=1
).filter(lambda n: len(n.encode()) <= USERNAME_BYTES_MAX)
passwords = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), min_size=1
)


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.value)
@settings(max_examples=15, deadline=None)
@given(user=names | st.sampled_from(["a,b", "=", "x=2Cy", "a=3D,,"]), password=passwords)
def test_round_trip(mechanism: ScramMechanism, user: str, password: str) -> None:
    server = ScramServer(mechanism, store(user, password, mechanism))
    client = ScramClient(mechanism, user, password)
    exchange(server, client)
    assert server.complete
    assert client.complete
    assert server.authorization_id == user


def test_each_mechanism_uses_its_own_credential() -> None:
    credentials = InMemoryCredentials()
    credentials.set("alice", SHA256, new_credential(SHA256, "two-five-six"))
    credentials.set("alice", SHA512, new_credential(SHA512, "five-one-two"))
    exchange(ScramServer(SHA512, credentials), ScramClient(SHA512, "alice", "five-one-two"))
    with pytest.raises(AuthenticationFailed):
        exchange(ScramServer(SHA512, credentials), ScramClient(SHA512, "alice", "two-five-six"))


# ---- credentials ------------------------------------------------------------------------------


def test_credential_string_is_kafkas_format() -> None:
    credential = derive_credential(SHA256, "pencil", RFC_SALT, 4096)
    text = credential.to_kafka_string()
    assert text.startswith("salt=W22ZaJ0SNY7soEsUEjb6gQ==,stored_key=")
    assert text.endswith(",iterations=4096")
    assert [part.split("=", 1)[0] for part in text.split(",")] == [
        "salt",
        "stored_key",
        "server_key",
        "iterations",
    ]
    assert ScramCredential.from_kafka_string(text) == credential
    # Kafka reads the pairs in any order.
    reordered = ",".join(reversed(text.split(",")))
    assert ScramCredential.from_kafka_string(reordered) == credential
    assert "stored_key" not in repr(credential)
    assert "pencil" not in text


def test_credential_equals_scramps_derivation() -> None:
    for mechanism in MECHANISMS:
        salt, stored_key, server_key, iterations = scramp.ScramMechanism(
            mechanism.value
        ).make_auth_info("pencil", iteration_count=8192, salt=RFC_SALT)
        ours = derive_credential(mechanism, "pencil", RFC_SALT, 8192)
        assert ours == ScramCredential(salt, stored_key, server_key, iterations)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "key=value"),
        ("salt=AAAA,stored_key=AAAA,server_key=AAAA", "exactly"),
        ("salt=AAAA,stored_key=AAAA,server_key=AAAA,iterations=4096,extra=1", "exactly"),
        ("salt=AAAA,salt=AAAA,server_key=AAAA,iterations=4096", "repeats"),
        ("salt=A?==,stored_key=AAAA,server_key=AAAA,iterations=4096", "salt is not base64"),
        ("salt=AAAA,stored_key=AAAA,server_key=AAAA,iterations=four", "not a number"),
        ("salt=AAAA,stored_key=AAAA,server_key=AAAA,iterations=-1", "not a number"),
        ("salt=AAAA,stored_key=AAAA,server_key=AAAA,iterations=4096", "must both be 32"),
        ("salt=,stored_key=" + "A" * 44 + ",server_key=" + "A" * 44 + ",iterations=1", "salt"),
        ("=x,salt=AAAA", "key=value"),
    ],
)
def test_malformed_credential_strings(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ScramCredential.from_kafka_string(text)


def test_new_credentials_have_fresh_salts_and_bounded_iterations() -> None:
    first, second = new_credential(SHA512, "pw"), new_credential(SHA512, "pw")
    assert len(first.salt) == SALT_BYTES
    assert first.salt != second.salt
    assert first.stored_key != second.stored_key
    assert first.iterations == ITERATIONS_DEFAULT
    assert new_credential(SHA256, "pw", ITERATIONS_MAX).iterations == ITERATIONS_MAX
    for iterations in (ITERATIONS_MIN - 1, ITERATIONS_MAX + 1, 0):
        with pytest.raises(ValueError, match="iterations must be in"):
            new_credential(SHA256, "pw", iterations)
    for password, fragment in [("", "empty"), ("a\x00b", "NUL"), ("x" * 1025, "maximum")]:
        with pytest.raises(ValueError, match=fragment):
            new_credential(SHA256, password)


def test_password_matches_only_the_right_password_and_digest() -> None:
    credential = new_credential(SHA512, "right")
    assert password_matches(SHA512, credential, "right")
    assert not password_matches(SHA512, credential, "wrong")
    assert not password_matches(SHA256, credential, "right")  # a SHA-512 credential
    weak = derive_credential(SHA512, "right", b"salt", ITERATIONS_MIN)
    weak = ScramCredential(weak.salt, weak.stored_key, weak.server_key, 1000)
    assert not password_matches(SHA512, weak, "right")


@given(name=st.text())
def test_saslname_escaping_round_trips(name: str) -> None:
    escaped = escape_saslname(name)
    assert "," not in escaped
    assert unescape_saslname(escaped) == name


@pytest.mark.parametrize("bad", ["a=", "a=2", "a=2c", "=41", "a=3d"])
def test_bad_saslname_escapes(bad: str) -> None:
    with pytest.raises(ValueError, match="=2C or =3D"):
        unescape_saslname(bad)


# ---- failures that must look alike ------------------------------------------------------------


def test_wrong_password_fails_at_the_proof_with_the_generic_message() -> None:
    server = ScramServer(SHA512, store("alice", "right", SHA512))
    client = ScramClient(SHA512, "alice", "wrong")
    client_final = client.evaluate_challenge(server.evaluate(client.initial_response()))
    assert client_final is not None
    with pytest.raises(AuthenticationFailed, match="wrong password") as caught:
        server.evaluate(client_final)
    assert caught.value.client_message is GENERIC
    assert not server.complete
    with pytest.raises(ExchangeStateError):
        server.evaluate(client_final)


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.value)
def test_unknown_user_takes_the_wrong_password_path(mechanism: ScramMechanism) -> None:
    credentials = store("alice", "right", mechanism)

    def server_first_of(user: str) -> tuple[ScramServer, ScramClient, str]:
        server = ScramServer(mechanism, credentials, server_nonce="s" * 32)
        client = ScramClient(mechanism, user, "guess", client_nonce="c" * 32)
        return server, client, server.evaluate(client.initial_response()).decode()

    _, _, known = server_first_of("alice")
    server, client, unknown = server_first_of("mallory")
    # The same shape: nonce, a salt of the same length, the default iteration count...
    assert [a[:2] for a in unknown.split(",")] == [a[:2] for a in known.split(",")]
    salt = base64.b64decode(unknown.split(",")[1][2:])
    assert len(salt) == SALT_BYTES
    assert unknown.endswith(f",i={ITERATIONS_DEFAULT}")
    # ...and the same salt every time, as a real user's would be.
    assert server_first_of("mallory")[2] == unknown
    assert server_first_of("mallory2")[2] != unknown
    client_final = client.evaluate_challenge(unknown.encode())
    assert client_final is not None
    with pytest.raises(AuthenticationFailed, match="unknown user") as caught:
        server.evaluate(client_final)
    assert caught.value.client_message is GENERIC


def test_unusable_stored_credentials_fail_at_the_proof() -> None:
    credentials = InMemoryCredentials()
    good = new_credential(SHA256, "pw")
    credentials.set("weak", SHA256, ScramCredential(good.salt, good.stored_key, good.server_key, 1))
    credentials.set("other-digest", SHA512, good)  # a SHA-256 credential filed under SHA-512
    for user, mechanism, fragment in [
        ("weak", SHA256, "1 iterations, fewer than 4096"),
        ("other-digest", SHA512, "another digest"),
    ]:
        server = ScramServer(mechanism, credentials)
        client = ScramClient(mechanism, user, "pw")
        client_final = client.evaluate_challenge(server.evaluate(client.initial_response()))
        assert client_final is not None
        with pytest.raises(AuthenticationFailed, match=fragment) as caught:
            server.evaluate(client_final)
        assert caught.value.client_message is GENERIC


def test_more_iterations_than_kafkas_admin_api_allows_still_log_in() -> None:
    """kafka-configs --zookeeper checks only the minimum, and Kafka's broker serves any count:
    so does this server (the client does the work). Riverbed's own client stops at
    ITERATIONS_MAX; scramp goes further."""
    credentials = InMemoryCredentials()
    salt, stored_key, server_key, iterations = scramp.ScramMechanism(
        "SCRAM-SHA-256"
    ).make_auth_info("pw", iteration_count=ITERATIONS_MAX * 2)
    credentials.set("heavy", SHA256, ScramCredential(salt, stored_key, server_key, iterations))
    server = ScramServer(SHA256, credentials)
    client = scramp.ScramClient(["SCRAM-SHA-256"], "heavy", "pw")
    client.set_server_first(server.evaluate(client.get_client_first().encode()).decode())
    client.set_server_final(server.evaluate(client.get_client_final().encode()).decode())
    assert server.complete
    ours = ScramClient(SHA256, "heavy", "pw")
    with pytest.raises(SaslClientError, match="iterations must be in"):
        ours.evaluate_challenge(ScramServer(SHA256, credentials).evaluate(ours.initial_response()))


def test_authorization_id_must_be_the_user() -> None:
    credentials = store("alice", "pw", SHA256)
    server = ScramServer(SHA256, credentials, server_nonce="srv")
    assert server.evaluate(b"n,a=alice,n=alice,r=abc").startswith(b"r=abcsrv,")
    with pytest.raises(AuthenticationFailed) as caught:
        ScramServer(SHA256, credentials).evaluate(b"n,a=bob,n=alice,r=abc")
    assert caught.value.client_message == (
        "Authentication failed: Client requested an authorization id that is different from "
        "username"
    )


def test_authorization_id_travels_in_the_channel_binding() -> None:
    """With a=, client-final's c= must repeat the whole gs2 header."""
    credentials = store("alice", "pw", SHA256)
    server = ScramServer(SHA256, credentials, server_nonce="srv")
    server_first = server.evaluate(b"n,a=alice,n=alice,r=abc").decode()
    salt = base64.b64decode(server_first.split(",")[1][2:])
    proof_for = hand_made_client_final(
        "alice", "pw", salt, server_first, gs2=b"n,a=alice,", bare="n=alice,r=abc"
    )
    assert server.evaluate(proof_for).startswith(b"v=")


def hand_made_client_final(
    user: str, password: str, salt: bytes, server_first: str, gs2: bytes, bare: str
) -> bytes:
    """A client-final computed straight from RFC 5802's formulas (SHA-256, 4096 iterations)."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 4096)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    nonce = server_first.split(",")[0][2:]
    without_proof = f"c={base64.b64encode(gs2).decode()},r={nonce}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, "sha256").digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


# ---- malformed client messages ----------------------------------------------------------------

LONG_NAME = "n" * (USERNAME_BYTES_MAX + 1)
MALFORMED_CLIENT_FIRST = {
    "empty": b"",
    "no gs2 header": b"n=user,r=abc",
    "one comma": b"n,n=user",
    "client supports channel binding": b"y,,n=user,r=abc",
    "channel binding requested": b"p=tls-unique,,n=user,r=abc",
    "unknown gs2 flag": b"x,,n=user,r=abc",
    "empty authzid": b"n,a=,n=user,r=abc",
    "authzid without a=": b"n,user,n=user,r=abc",
    "mandatory extension": b"n,,m=ext,n=user,r=abc",
    "no username": b"n,,r=abc",
    "empty username": b"n,,n=,r=abc",
    "no nonce": b"n,,n=user",
    "empty nonce": b"n,,n=user,r=",
    "nonce with a space": b"n,,n=user,r=a c",
    "nonce with non-ASCII": "n,,n=user,r=é".encode(),
    "nonce too long": b"n,,n=user,r=" + b"x" * (CLIENT_NONCE_CHARS_MAX + 1),
    "bad escape": b"n,,n=us=er,r=abc",
    "NUL in name": b"n,,n=us\x00er,r=abc",
    "name too long": b"n,,n=" + LONG_NAME.encode() + b",r=abc",
    "malformed extension": b"n,,n=user,r=abc,ext",
    "not UTF-8": b"n,,n=\xff\xfe,r=abc",
    "too long": b"n,,n=user,r=abc,x=" + b"y" * SCRAM_MESSAGE_BYTES_MAX,
}


@pytest.mark.parametrize("message", MALFORMED_CLIENT_FIRST.values(), ids=MALFORMED_CLIENT_FIRST)
def test_malformed_client_first_is_a_clean_failure(message: bytes) -> None:
    server = ScramServer(SHA256, store("user", "pencil", SHA256))
    with pytest.raises(AuthenticationFailed, match="malformed") as caught:
        server.evaluate(message)
    assert caught.value.client_message is GENERIC
    with pytest.raises(ExchangeStateError):
        server.evaluate(RFC_CLIENT_FIRST)


def test_extensions_are_ignored() -> None:
    """Kafka's delegation-token extension (tokenauth=true) and others: RFC 5802 optional
    extensions are skipped; the exchange goes on as a normal user login."""
    server = ScramServer(SHA256, rfc_credentials(), server_nonce=RFC_SERVER_NONCE)
    assert server.evaluate(RFC_CLIENT_FIRST + b",tokenauth=true") == RFC_SERVER_FIRST


def rfc_server_after_first() -> ScramServer:
    server = ScramServer(SHA256, rfc_credentials(), server_nonce=RFC_SERVER_NONCE)
    server.evaluate(RFC_CLIENT_FIRST)
    return server


NONCE = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
PROOF = b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
MALFORMED_CLIENT_FINAL = {
    "empty": b"",
    "no proof": b"c=biws," + NONCE,
    "proof not last": b"c=biws," + PROOF + b"," + NONCE,
    "proof not base64": b"c=biws," + NONCE + b",p=!!!!",
    "proof of another length": b"c=biws," + NONCE + b",p=" + base64.b64encode(b"x" * 31),
    "no channel binding": NONCE + b"," + PROOF,
    "channel binding not base64": b"c=b!ws," + NONCE + b"," + PROOF,
    "channel binding of another header": b"c=eSws," + NONCE + b"," + PROOF,  # "y,,"
    "no nonce": b"c=biws," + PROOF,
    "only the client's nonce": b"c=biws,r=rOprNGfwEbeRWgbNEkqO," + PROOF,
    "another server nonce": b"c=biws,r=rOprNGfwEbeRWgbNEkqOX," + PROOF,
    "malformed extension": b"c=biws," + NONCE + b",junk," + PROOF,
    "not UTF-8": b"c=biws," + NONCE + b",x=\xff," + PROOF,
    "too long": b"c=biws," + NONCE + b",x=" + b"y" * SCRAM_MESSAGE_BYTES_MAX + b"," + PROOF,
}


@pytest.mark.parametrize("message", MALFORMED_CLIENT_FINAL.values(), ids=MALFORMED_CLIENT_FINAL)
def test_malformed_client_final_is_a_clean_failure(message: bytes) -> None:
    server = rfc_server_after_first()
    with pytest.raises(AuthenticationFailed, match="malformed") as caught:
        server.evaluate(message)
    assert caught.value.client_message is GENERIC
    assert not server.complete


def test_the_valid_final_message_differs_from_the_malformed_ones_only_where_they_say() -> None:
    """The malformed table is built from RFC_CLIENT_FINAL's parts: that message itself passes."""
    assert b"c=biws," + NONCE + b"," + PROOF == RFC_CLIENT_FINAL
    assert rfc_server_after_first().evaluate(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL


@settings(max_examples=300, deadline=None)
@given(first=st.binary(max_size=300), final=st.binary(max_size=300))
def test_garbage_only_ever_fails_authentication(first: bytes, final: bytes) -> None:
    server = ScramServer(SHA256, rfc_credentials())
    try:
        server.evaluate(first)
        server.evaluate(final)
    except AuthenticationFailed:
        assert not server.complete
        return
    raise AssertionError("random bytes authenticated")


# ---- the client's checks of the server --------------------------------------------------------


def rfc_client_after_first() -> ScramClient:
    client = ScramClient(SHA256, "user", "pencil", client_nonce=RFC_CLIENT_NONCE)
    client.initial_response()
    return client


SALT_ATTR = b"s=W22ZaJ0SNY7soEsUEjb6gQ=="
MALFORMED_SERVER_FIRST = {
    "empty": b"",
    "mandatory extension": b"m=x," + NONCE + b"," + SALT_ATTR + b",i=4096",
    "nonce not extending the client's": b"r=other," + SALT_ATTR + b",i=4096",
    "nonce equal to the client's": b"r=rOprNGfwEbeRWgbNEkqO," + SALT_ATTR + b",i=4096",
    "nonce with a space": b"r=rOprNGfwEbeRWgbNEkqO x," + SALT_ATTR + b",i=4096",
    "no salt": NONCE + b",i=4096",
    "salt not base64": NONCE + b",s=@@@@,i=4096",
    "empty salt": NONCE + b",s=,i=4096",
    "no iterations": NONCE + b"," + SALT_ATTR,
    "iterations not a number": NONCE + b"," + SALT_ATTR + b",i=many",
    "too few iterations": NONCE + b"," + SALT_ATTR + b",i=4095",
    "too many iterations": NONCE + b"," + SALT_ATTR + b",i=16385",
    "malformed extension": NONCE + b"," + SALT_ATTR + b",i=4096,junk",
    "not UTF-8": NONCE + b"," + SALT_ATTR + b",i=4096,x=\xff",
    "too long": NONCE + b"," + SALT_ATTR + b",i=4096,x=" + b"y" * SCRAM_MESSAGE_BYTES_MAX,
}


@pytest.mark.parametrize("message", MALFORMED_SERVER_FIRST.values(), ids=MALFORMED_SERVER_FIRST)
def test_client_refuses_a_malformed_server_first(message: bytes) -> None:
    client = rfc_client_after_first()
    with pytest.raises(SaslClientError):
        client.evaluate_challenge(message)
    with pytest.raises(ExchangeStateError):
        client.evaluate_challenge(RFC_SERVER_FIRST)


@pytest.mark.parametrize(
    ("message", "fragment"),
    [
        (b"v=" + base64.b64encode(b"\x00" * 32), "signature is wrong"),
        (b"v=AAAA", "signature is wrong"),
        (b"v=@@@", "not base64"),
        (b"e=invalid-proof", "refused the authentication: invalid-proof"),
        (b"x=1", "neither"),
        (b"", "neither"),
        (RFC_SERVER_FINAL + b",junk", "malformed extensions"),
    ],
)
def test_client_refuses_a_wrong_server_final(message: bytes, fragment: str) -> None:
    client = rfc_client_after_first()
    client.evaluate_challenge(RFC_SERVER_FIRST)
    with pytest.raises(SaslClientError, match=fragment):
        client.evaluate_challenge(message)
    assert not client.complete


def test_client_is_driven_in_order() -> None:
    client = ScramClient(SHA256, "user", "pencil")
    with pytest.raises(ExchangeStateError):
        client.evaluate_challenge(RFC_SERVER_FIRST)
    client.initial_response()
    with pytest.raises(ExchangeStateError):
        client.initial_response()
    for user, password, problem in [
        ("", "pw", "user name is empty"),
        ("u", "", "password is empty"),
        (LONG_NAME, "pw", "user name is 256 bytes long"),
        ("u", "a\x00b", "password contains a NUL"),
    ]:
        with pytest.raises(ValueError, match=problem):
            ScramClient(SHA256, user, password)


def test_mechanism_names() -> None:
    assert ScramMechanism.from_name("SCRAM-SHA-512") is SHA512
    with pytest.raises(ValueError, match="SCRAM-SHA-256, SCRAM-SHA-512"):
        ScramMechanism.from_name("SCRAM-SHA-1")


# ---- interop with scramp ----------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.value)
@pytest.mark.parametrize("user", ["alice", "a,b=c", "ünï"])
def test_scramp_client_against_our_server(mechanism: ScramMechanism, user: str) -> None:
    server = ScramServer(mechanism, store(user, "s3cret", mechanism))
    client = scramp.ScramClient([mechanism.value], user, "s3cret")
    server_first = server.evaluate(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    server_final = server.evaluate(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # raises if our signature were wrong
    assert server.complete
    assert server.authorization_id == user


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.value)
def test_scramp_client_with_a_wrong_password_fails_against_our_server(
    mechanism: ScramMechanism,
) -> None:
    server = ScramServer(mechanism, store("alice", "s3cret", mechanism))
    client = scramp.ScramClient([mechanism.value], "alice", "guess")
    client.set_server_first(server.evaluate(client.get_client_first().encode()).decode())
    with pytest.raises(AuthenticationFailed):
        server.evaluate(client.get_client_final().encode())


def scramp_server(
    mechanism: ScramMechanism, user: str, password: str, iterations: int = 4096
) -> scramp.core.ScramServer:
    auth: tuple[bytes, bytes, bytes, int] = scramp.ScramMechanism(mechanism.value).make_auth_info(
        password, iteration_count=iterations
    )

    def lookup(name: str) -> tuple[bytes, bytes, bytes, int]:
        if name != user:
            raise KeyError(name)
        return auth

    return scramp.ScramMechanism(mechanism.value).make_server(lookup)


@pytest.mark.parametrize("mechanism", MECHANISMS, ids=lambda m: m.value)
@pytest.mark.parametrize("iterations", [ITERATIONS_MIN, ITERATIONS_MAX])
def test_our_client_against_scramps_server(mechanism: ScramMechanism, iterations: int) -> None:
    server = scramp_server(mechanism, "bob", "hunter2", iterations)
    client = ScramClient(mechanism, "bob", "hunter2")
    server.set_client_first(client.initial_response().decode())
    client_final = client.evaluate_challenge(server.get_server_first().encode())
    assert client_final is not None
    server.set_client_final(client_final.decode())
    assert client.evaluate_challenge(server.get_server_final().encode()) is None
    assert client.complete


def test_our_client_reports_scramps_refusal() -> None:
    server = scramp_server(SHA256, "bob", "hunter2")
    client = ScramClient(SHA256, "bob", "wrong")
    server.set_client_first(client.initial_response().decode())
    client_final = client.evaluate_challenge(server.get_server_first().encode())
    assert client_final is not None
    with pytest.raises(scramp.ScramException):
        server.set_client_final(client_final.decode())
    with pytest.raises(SaslClientError, match="invalid-proof"):
        client.evaluate_challenge(server.get_server_final().encode())
