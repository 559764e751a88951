"""riverbed.security.authorizer: Kafka's AclAuthorizer rules, case by case, against a brute-force
model of them, and as properties (a DENY never grants, removing an ACL never grants unless
allow.everyone.if.no.acl.found, super users always pass, KIP-679's any-topic check)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from riverbed.security.access import ALLOW_ALL, AclAccess
from riverbed.security.acl import (
    CLUSTER_NAME,
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    operations_bitfield,
)
from riverbed.security.acl_snapshot import AclSnapshot
from riverbed.security.authorizer import Authorizer, AuthorizerSettings
from riverbed.security.session import KafkaPrincipal, Session

from tests.security.strategies import (
    RESOURCE_TYPES,
    bindings,
    names,
    request_hosts,
    request_operations,
    request_principals,
)
from tests.security.test_acl_model import binding, snapshot_of

R, P, Op, A = ResourceType, PatternType, AclOperation, AclPermissionType
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def authorizer(
    acls: list[AclBinding],
    *,
    super_users: frozenset[str] = frozenset(),
    allow_everyone: bool = False,
) -> Authorizer:
    snapshot = snapshot_of(acls)
    return Authorizer(AuthorizerSettings(super_users, allow_everyone), lambda: snapshot)


def allowed(
    acls: list[AclBinding],
    operation: AclOperation = Op.READ,
    name: str = "orders",
    *,
    principal: str = ALICE,
    host: str = HOST,
    resource_type: ResourceType = R.TOPIC,
    allow_everyone: bool = False,
) -> bool:
    checker = authorizer(acls, allow_everyone=allow_everyone)
    return checker.authorize(principal, host, operation, resource_type, name)


# -- the rules, one by one -----------------------------------------------------------------------


def test_no_acl_denies_unless_allow_everyone() -> None:
    assert not allowed([])
    assert allowed([], allow_everyone=True)
    # Any ACL on the resource, even for someone else, takes it out of "no ACL found".
    assert not allowed([binding(principal=BOB)], allow_everyone=True)
    # An ACL on another resource does not.
    assert allowed([binding("payments", principal=BOB)], allow_everyone=True)


def test_super_users_pass_everything() -> None:
    denied_all = [binding("*", operation=Op.ALL, permission=A.DENY, principal=WILDCARD_PRINCIPAL)]
    checker = authorizer(denied_all, super_users=frozenset({ALICE}))
    assert checker.authorize(ALICE, HOST, Op.ALTER, R.CLUSTER, CLUSTER_NAME)
    assert checker.authorize(ALICE, HOST, Op.WRITE, R.TOPIC, "orders")
    assert not checker.authorize(BOB, HOST, Op.WRITE, R.TOPIC, "orders")
    assert checker.authorized_operations(ALICE, HOST, R.TOPIC, "x") == operations_bitfield(
        (
            Op.READ,
            Op.WRITE,
            Op.CREATE,
            Op.DELETE,
            Op.ALTER,
            Op.DESCRIBE,
            Op.DESCRIBE_CONFIGS,
            Op.ALTER_CONFIGS,
        )
    )
    assert checker.authorize_any(ALICE, HOST, Op.WRITE, R.TOPIC)


def test_literal_wildcard_and_prefixed_patterns() -> None:
    assert allowed([binding("orders")])
    assert not allowed([binding("orders")], name="orders2")
    assert allowed([binding(WILDCARD_RESOURCE)], name="anything")
    assert allowed([binding("ord", pattern_type=P.PREFIXED)], name="orders")
    assert allowed([binding("orders", pattern_type=P.PREFIXED)], name="orders")
    assert not allowed([binding("orders-", pattern_type=P.PREFIXED)], name="orders")
    # A literal `*`-named ACL is the wildcard; a prefixed "*" is only a prefix.
    assert not allowed([binding("*", pattern_type=P.PREFIXED)], name="orders")
    # Resource types are separate.
    assert not allowed([binding("orders", resource_type=R.GROUP)])


def test_principal_and_host_matching() -> None:
    assert allowed([binding(principal=WILDCARD_PRINCIPAL)], principal=BOB)
    assert not allowed([binding(principal=BOB)])
    assert allowed([binding(host=HOST)])
    assert not allowed([binding(host="10.0.0.2")])
    assert allowed([binding(host=WILDCARD_HOST)], host="::1")
    # As in Kafka, an ACL for `User:*` matches every principal, whatever its type.
    assert allowed([binding(principal=WILDCARD_PRINCIPAL)], principal="Group:ops")


def test_deny_beats_allow_wherever_it_comes_from() -> None:
    allow = binding()
    for deny in (
        binding(permission=A.DENY),
        binding("*", permission=A.DENY),
        binding("ord", pattern_type=P.PREFIXED, permission=A.DENY),
        binding(principal=WILDCARD_PRINCIPAL, permission=A.DENY),
        binding(host=HOST, permission=A.DENY),
        binding(operation=Op.ALL, permission=A.DENY),
    ):
        assert not allowed([allow, deny]), deny
    # A DENY of someone else, another host or another operation leaves the ALLOW alone.
    for other in (
        binding(principal=BOB, permission=A.DENY),
        binding(host="10.0.0.2", permission=A.DENY),
        binding(operation=Op.WRITE, permission=A.DENY),
    ):
        assert allowed([allow, other]), other


def test_all_and_implied_operations() -> None:
    assert allowed([binding(operation=Op.ALL)], Op.ALTER_CONFIGS)
    for granting in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert allowed([binding(operation=granting)], Op.DESCRIBE), granting
    assert not allowed([binding(operation=Op.CREATE)], Op.DESCRIBE)
    assert allowed([binding(operation=Op.ALTER_CONFIGS)], Op.DESCRIBE_CONFIGS)
    assert not allowed([binding(operation=Op.DESCRIBE)], Op.READ)
    # Implications only grant: a DENY of READ does not deny DESCRIBE.
    assert allowed([binding(operation=Op.DESCRIBE), binding(permission=A.DENY)], Op.DESCRIBE)
    assert not allowed(
        [binding(operation=Op.READ), binding(operation=Op.DESCRIBE, permission=A.DENY)], Op.DESCRIBE
    )


def test_authorized_operations_bitfield() -> None:
    checker = authorizer(
        [
            binding(operation=Op.WRITE),
            binding(operation=Op.ALTER_CONFIGS),
            binding(operation=Op.ALTER, permission=A.DENY),
        ]
    )
    bits = checker.authorized_operations(ALICE, HOST, R.TOPIC, "orders")
    assert bits == operations_bitfield(
        (Op.WRITE, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS)
    )


@pytest.mark.parametrize(
    ("acls", "expected"),
    [
        ([], False),
        ([binding("a", operation=Op.WRITE)], True),
        ([binding("a", operation=Op.ALL)], True),
        ([binding("a", operation=Op.READ)], False),
        ([binding("a", operation=Op.WRITE, resource_type=R.GROUP)], False),
        (
            [binding("a", operation=Op.WRITE), binding("a", operation=Op.WRITE, permission=A.DENY)],
            False,
        ),
        (
            [binding("a", operation=Op.WRITE), binding("*", operation=Op.WRITE, permission=A.DENY)],
            False,
        ),
        (
            [
                binding("ab", operation=Op.WRITE),
                binding("a", pattern_type=P.PREFIXED, operation=Op.WRITE, permission=A.DENY),
            ],
            False,
        ),
        (
            [
                binding("a", pattern_type=P.PREFIXED, operation=Op.WRITE),
                binding("ab", operation=Op.WRITE, permission=A.DENY),
            ],
            True,
        ),
        (
            [binding("*", operation=Op.WRITE), binding("a", operation=Op.WRITE, permission=A.DENY)],
            True,
        ),
        ([binding("a", operation=Op.WRITE, principal=BOB)], False),
        ([binding("a", operation=Op.WRITE, principal=WILDCARD_PRINCIPAL)], True),
    ],
)
def test_authorize_any_topic(acls: list[AclBinding], expected: bool) -> None:
    """KIP-679: an idempotent producer without IDEMPOTENT_WRITE needs WRITE on some topic."""
    assert authorizer(acls).authorize_any(ALICE, HOST, Op.WRITE, R.TOPIC) is expected


def test_authorize_any_with_allow_everyone() -> None:
    assert authorizer([], allow_everyone=True).authorize_any(ALICE, HOST, Op.WRITE, R.TOPIC)
    wildcard_deny = [binding("*", operation=Op.WRITE, permission=A.DENY)]
    checker = authorizer(wildcard_deny, allow_everyone=True)
    assert not checker.authorize_any(ALICE, HOST, Op.WRITE, R.TOPIC)


def test_denials_are_logged_at_info_and_filters_are_silent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    checker = authorizer([binding()])
    with caplog.at_level(logging.DEBUG, logger="riverbed.security.authorizer"):
        assert not checker.authorize(BOB, HOST, Op.WRITE, R.TOPIC, "orders", api="Produce")
        assert not checker.authorize(BOB, HOST, Op.DESCRIBE, R.TOPIC, "x", log_denied=False)
        assert checker.authorize(ALICE, HOST, Op.READ, R.TOPIC, "orders", api="Fetch")
    denied = [
        r for r in caplog.records if getattr(r, "riverbed_event", None) == "authorizer.denied"
    ]
    assert [(r.levelno, r.riverbed_fields) for r in denied] == [  # type: ignore[attr-defined]
        (
            logging.INFO,
            {
                "principal": BOB,
                "host": HOST,
                "operation": "Write",
                "resource_type": "Topic",
                "resource": "orders",
                "api": "Produce",
            },
        )
    ]
    allowed_lines = [
        r for r in caplog.records if getattr(r, "riverbed_event", None) == "authorizer.allowed"
    ]
    assert [r.levelno for r in allowed_lines] == [logging.DEBUG]


def test_request_access() -> None:
    checker = authorizer([binding("a"), binding("b", operation=Op.WRITE)])
    session = Session(KafkaPrincipal("User", "alice"), HOST)
    access = AclAccess(checker, session, "Produce")
    assert access.enabled
    assert not ALLOW_ALL.enabled
    assert access.denied(Op.WRITE, R.TOPIC, ["a", "b", "a", "c"]) == {"a", "c"}
    assert access.allows(Op.READ, R.TOPIC, "a")
    assert not access.allows_cluster(Op.CREATE)
    assert access.allows_any(Op.WRITE, R.TOPIC)
    assert access.operations(R.TOPIC, "a") == operations_bitfield((Op.READ, Op.DESCRIBE))
    assert ALLOW_ALL.denied(Op.WRITE, R.TOPIC, ["a"]) == frozenset()
    assert ALLOW_ALL.allows_cluster(Op.ALTER)
    assert ALLOW_ALL.operations(R.GROUP, "g") == operations_bitfield(
        (Op.READ, Op.DELETE, Op.DESCRIBE)
    )


# -- against a brute-force model, and as properties ------------------------------------------------


def model_allows(
    acls: list[AclBinding],
    principal: str,
    host: str,
    operation: AclOperation,
    resource_type: ResourceType,
    name: str,
    allow_everyone: bool,
) -> bool:
    """The rules as written in Kafka's docs, over the raw list, with no index."""

    def covers(acl: AclBinding) -> bool:
        if acl.resource_type is not resource_type:
            return False
        if acl.pattern_type is P.PREFIXED:
            return name.startswith(acl.resource_name)
        return acl.resource_name in (name, "*")

    applying = [acl for acl in acls if covers(acl)]
    if not applying:
        return allow_everyone
    mine = [
        acl
        for acl in applying
        if acl.principal in (principal, "User:*") and acl.host in (host, "*")
    ]
    if any(a.permission is A.DENY and a.operation in (operation, Op.ALL) for a in mine):
        return False
    implied = {
        Op.DESCRIBE: {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER},
        Op.DESCRIBE_CONFIGS: {Op.ALTER_CONFIGS},
    }.get(operation, set())
    granting = {operation, Op.ALL} | implied
    return any(a.permission is A.ALLOW and a.operation in granting for a in mine)


request = st.tuples(request_principals, request_hosts, request_operations, RESOURCE_TYPES, names)


@given(acls=st.lists(bindings(), max_size=10), asked=request, allow_everyone=st.booleans())
def test_decisions_match_the_model(
    acls: list[AclBinding],
    asked: tuple[str, str, AclOperation, ResourceType, str],
    allow_everyone: bool,
) -> None:
    principal, host, operation, resource_type, name = asked
    checker = authorizer(acls, allow_everyone=allow_everyone)
    expected = model_allows(acls, *asked, allow_everyone)
    assert checker.authorize(principal, host, operation, resource_type, name) is expected


@given(
    acls=st.lists(bindings(), max_size=10),
    deny=bindings(permission=st.just(A.DENY)),
    asked=request,
    allow_everyone=st.booleans(),
)
def test_adding_a_deny_never_grants(
    acls: list[AclBinding],
    deny: AclBinding,
    asked: tuple[str, str, AclOperation, ResourceType, str],
    allow_everyone: bool,
) -> None:
    principal, host, operation, resource_type, name = asked
    before = authorizer(acls, allow_everyone=allow_everyone)
    after = authorizer([*acls, deny], allow_everyone=allow_everyone)
    if after.authorize(principal, host, operation, resource_type, name):
        assert before.authorize(principal, host, operation, resource_type, name)


@given(
    acls=st.lists(bindings(), min_size=1, max_size=10),
    removed=st.integers(min_value=0),
    asked=request,
    allow_everyone=st.booleans(),
)
def test_removing_an_acl_never_grants_unless_none_is_left(
    acls: list[AclBinding],
    removed: int,
    asked: tuple[str, str, AclOperation, ResourceType, str],
    allow_everyone: bool,
) -> None:
    principal, host, operation, resource_type, name = asked
    kept = acls[: removed % len(acls)] + acls[removed % len(acls) + 1 :]
    before = authorizer(acls, allow_everyone=allow_everyone)
    after = authorizer(kept, allow_everyone=allow_everyone)
    if after.authorize(principal, host, operation, resource_type, name) and not before.authorize(
        principal, host, operation, resource_type, name
    ):
        # Only allow.everyone.if.no.acl.found can grant more, once no ACL covers the resource.
        assert allow_everyone
        assert snapshot_of(kept).matching(resource_type, name) == []


@given(
    acls=st.lists(bindings(), max_size=10),
    allow=bindings(permission=st.just(A.ALLOW)),
    asked=request,
)
def test_adding_an_allow_never_revokes_without_allow_everyone(
    acls: list[AclBinding],
    allow: AclBinding,
    asked: tuple[str, str, AclOperation, ResourceType, str],
) -> None:
    principal, host, operation, resource_type, name = asked
    if authorizer(acls).authorize(principal, host, operation, resource_type, name):
        assert authorizer([*acls, allow]).authorize(principal, host, operation, resource_type, name)


@given(acls=st.lists(bindings(), max_size=10), asked=request, allow_everyone=st.booleans())
def test_super_users_always_pass(
    acls: list[AclBinding],
    asked: tuple[str, str, AclOperation, ResourceType, str],
    allow_everyone: bool,
) -> None:
    principal, host, operation, resource_type, name = asked
    checker = authorizer(acls, super_users=frozenset({principal}), allow_everyone=allow_everyone)
    assert checker.authorize(principal, host, operation, resource_type, name)


@given(acls=st.lists(bindings(), max_size=10), principal=request_principals, host=request_hosts)
def test_authorize_any_is_some_topic_being_writable(
    acls: list[AclBinding], principal: str, host: str
) -> None:
    """Without allow.everyone: WRITE on some topic is allowed exactly when one of these
    witnesses is writable: an ALLOWed literal name, an ALLOWed prefix plus a character no ACL
    uses, or a name no ACL but a wildcard covers."""
    checker = authorizer(acls)
    witnesses = {"zzz"}
    for acl in acls:
        if acl.resource_type is R.TOPIC and acl.permission is A.ALLOW:
            if acl.pattern_type is P.PREFIXED:
                witnesses.add(acl.resource_name + "z")
            elif acl.resource_name != "*":
                witnesses.add(acl.resource_name)
    writable = any(checker.authorize(principal, host, Op.WRITE, R.TOPIC, w) for w in witnesses)
    assert checker.authorize_any(principal, host, Op.WRITE, R.TOPIC) is writable


@given(acls=st.lists(bindings(), max_size=10), name=names)
def test_snapshot_changes_are_seen_by_the_next_decision(acls: list[AclBinding], name: str) -> None:
    current = [AclSnapshot()]
    checker = Authorizer(AuthorizerSettings(), lambda: current[0])
    assume(not checker.authorize(ALICE, HOST, Op.READ, R.TOPIC, name))
    current[0] = snapshot_of([*acls, binding(name)])
    assert checker.authorize(ALICE, HOST, Op.READ, R.TOPIC, name) is model_allows(
        [*acls, binding(name)], ALICE, HOST, Op.READ, R.TOPIC, name, False
    )
