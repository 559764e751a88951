"""riverbed.security.acl: Kafka's enums and codes, validation of patterns, entries and bindings,
and the filter rules of DescribeAcls / DeleteAcls (Kafka's ResourcePatternFilter and
AccessControlEntryFilter), checked case by case and against a brute-force model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from riverbed.protocol.errors import ErrorCode
from riverbed.security.acl import (
    AUTHORIZATION_ERRORS,
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    AclBinding,
    AclBindingFilter,
    AclEntry,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourcePattern,
    ResourceType,
    operations_bitfield,
    parse_super_users,
)
from riverbed.security.acl_snapshot import AclSnapshot

from tests.security.strategies import bindings, names

R, P, Op, A = ResourceType, PatternType, AclOperation, AclPermissionType


def binding(
    name: str = "orders",
    *,
    resource_type: ResourceType = R.TOPIC,
    pattern_type: PatternType = P.LITERAL,
    principal: str = "User:alice",
    host: str = "*",
    operation: AclOperation = Op.READ,
    permission: AclPermissionType = A.ALLOW,
) -> AclBinding:
    return AclBinding(resource_type, name, pattern_type, principal, host, operation, permission)


# -- Kafka's codes and names -------------------------------------------------------------------


def test_wire_codes_are_kafkas() -> None:
    assert {t.name: t.value for t in R} == {
        "ANY": 1,
        "TOPIC": 2,
        "GROUP": 3,
        "CLUSTER": 4,
        "TRANSACTIONAL_ID": 5,
        "DELEGATION_TOKEN": 6,
        "USER": 7,
    }
    assert {t.name: t.value for t in P} == {"ANY": 1, "MATCH": 2, "LITERAL": 3, "PREFIXED": 4}
    assert {o.name: o.value for o in Op} == {
        "ANY": 1,
        "ALL": 2,
        "READ": 3,
        "WRITE": 4,
        "CREATE": 5,
        "DELETE": 6,
        "ALTER": 7,
        "DESCRIBE": 8,
        "CLUSTER_ACTION": 9,
        "DESCRIBE_CONFIGS": 10,
        "ALTER_CONFIGS": 11,
        "IDEMPOTENT_WRITE": 12,
        "CREATE_TOKENS": 13,
        "DESCRIBE_TOKENS": 14,
    }
    assert {p.name: p.value for p in A} == {"ANY": 1, "DENY": 2, "ALLOW": 3}


@pytest.mark.parametrize("code", [0, 8, -1, 127])
def test_unknown_codes_are_invalid(code: int) -> None:
    with pytest.raises(InvalidAclError, match=f"unknown resource type code {code}"):
        R.from_code(code)


def test_names_parse_as_kafkas_tools_write_them() -> None:
    assert Op.IDEMPOTENT_WRITE.kafka_name == "IdempotentWrite"
    assert R.TRANSACTIONAL_ID.kafka_name == "TransactionalId"
    for text in ("IdempotentWrite", "IDEMPOTENT_WRITE", "idempotent-write", " idempotentwrite "):
        assert Op.parse(text) is Op.IDEMPOTENT_WRITE
    assert A.parse("Deny") is A.DENY
    with pytest.raises(InvalidAclError, match=r"unknown operation 'Fly'.*ClusterAction"):
        Op.parse("Fly")


def test_supported_operations_and_errors_per_resource_type() -> None:
    # Kafka's AclEntry.supportedOperations, as bitfields (what Metadata reported before ACLs).
    assert operations_bitfield(SUPPORTED_OPERATIONS[R.TOPIC]) == sum(
        1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11)
    )
    assert operations_bitfield(SUPPORTED_OPERATIONS[R.CLUSTER]) == sum(
        1 << op for op in (5, 7, 8, 9, 10, 11, 12)
    )
    assert operations_bitfield(SUPPORTED_OPERATIONS[R.GROUP]) == sum(1 << op for op in (3, 6, 8))
    assert AUTHORIZATION_ERRORS[R.TOPIC] is ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert AUTHORIZATION_ERRORS[R.GROUP] is ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert AUTHORIZATION_ERRORS[R.CLUSTER] is ErrorCode.CLUSTER_AUTHORIZATION_FAILED


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"resource_type": R.ANY}, "type cannot be ANY"),
        ({"pattern_type": P.MATCH}, "LITERAL or PREFIXED, not MATCH"),
        ({"pattern_type": P.ANY}, "LITERAL or PREFIXED, not ANY"),
        ({"name": ""}, "empty resource name"),
        ({"name": "a/b"}, "invalid resource name 'a/b'"),
        ({"name": ".."}, "invalid resource name '..'"),
        ({"resource_type": R.CLUSTER, "name": "c"}, f"only valid name .* is {CLUSTER_NAME}"),
        ({"principal": "alice"}, "Type:name"),
        ({"principal": "User:"}, "Type:name"),
        ({"host": ""}, "not empty"),
        ({"operation": Op.ANY}, "operation cannot be ANY"),
        ({"permission": A.ANY}, "ALLOW or DENY, not ANY"),
    ],
)
def test_invalid_bindings_say_why(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidAclError, match=fragment):
        binding(**kwargs)  # type: ignore[arg-type]


def test_a_binding_is_its_pattern_and_entry() -> None:
    made = binding("orders-", pattern_type=P.PREFIXED, operation=Op.WRITE, permission=A.DENY)
    assert made.pattern == ResourcePattern(R.TOPIC, "orders-", P.PREFIXED)
    assert made.entry == AclEntry("User:alice", "*", Op.WRITE, A.DENY)
    assert AclBinding.of(made.pattern, made.entry) == made
    assert str(made) == (
        "Topic:PREFIXED:orders-: User:alice has DENY permission for operations: Write from hosts: *"
    )
    assert binding(resource_type=R.CLUSTER, name=CLUSTER_NAME).pattern.name == CLUSTER_NAME


def test_super_users() -> None:
    assert parse_super_users("User:alice; User:bob;;") == {"User:alice", "User:bob"}
    assert parse_super_users("") == frozenset()
    with pytest.raises(InvalidAclError, match="bob"):
        parse_super_users("User:alice;bob")


# -- filters -------------------------------------------------------------------------------------


def test_filter_pattern_types() -> None:
    literal = binding("orders")
    wildcard = binding("*")
    prefix = binding("ord", pattern_type=P.PREFIXED)
    other = binding("payments")
    everything = [literal, wildcard, prefix, other]

    def selected(wanted: AclBindingFilter) -> list[AclBinding]:
        return [b for b in everything if wanted.matches(b)]

    assert selected(AclBindingFilter()) == everything
    # ANY: the exact name, whether the pattern is LITERAL or PREFIXED.
    assert selected(AclBindingFilter(resource_name="ord")) == [prefix]
    # LITERAL / PREFIXED: that type only ("*" is compared as a name).
    assert selected(AclBindingFilter(resource_name="*", pattern_type=P.LITERAL)) == [wildcard]
    assert selected(AclBindingFilter(pattern_type=P.PREFIXED)) == [prefix]
    # MATCH: every pattern covering a resource of that name.
    assert selected(AclBindingFilter(resource_name="orders", pattern_type=P.MATCH)) == [
        literal,
        wildcard,
        prefix,
    ]
    assert selected(AclBindingFilter(resource_name="or", pattern_type=P.MATCH)) == [wildcard]
    assert selected(AclBindingFilter(resource_type=R.GROUP)) == []


def test_filter_entry_fields() -> None:
    alice = binding(host="10.0.0.1")
    bob_denied = binding(principal="User:bob", operation=Op.WRITE, permission=A.DENY)
    assert AclBindingFilter(principal="User:alice").matches(alice)
    assert not AclBindingFilter(principal="User:alice").matches(bob_denied)
    assert AclBindingFilter(host="10.0.0.1").matches(alice)
    assert not AclBindingFilter(host="*").matches(alice)
    assert AclBindingFilter(operation=Op.WRITE, permission=A.DENY).matches(bob_denied)
    assert not AclBindingFilter(operation=Op.READ).matches(bob_denied)
    # ALL in a filter is the operation ALL, not a wildcard (ANY is).
    assert not AclBindingFilter(operation=Op.ALL).matches(alice)


def test_exact_patterns_of_a_filter() -> None:
    assert AclBindingFilter(R.TOPIC, "a", P.ANY).exact_patterns() == (
        ResourcePattern(R.TOPIC, "a", P.LITERAL),
        ResourcePattern(R.TOPIC, "a", P.PREFIXED),
    )
    assert AclBindingFilter(R.TOPIC, "a", P.PREFIXED).exact_patterns() == (
        ResourcePattern(R.TOPIC, "a", P.PREFIXED),
    )
    assert AclBindingFilter(R.TOPIC, "a", P.MATCH).exact_patterns() == ()
    assert AclBindingFilter(R.ANY, "a", P.LITERAL).exact_patterns() == ()
    assert AclBindingFilter(R.TOPIC, None, P.LITERAL).exact_patterns() == ()
    assert AclBindingFilter(R.TOPIC, "a/b", P.LITERAL).exact_patterns() == ()


@given(
    acls=st.lists(bindings(), max_size=12),
    name=names,
    resource_type=st.sampled_from([R.TOPIC, R.GROUP]),
)
def test_match_filter_selects_the_patterns_that_apply(
    acls: list[AclBinding], name: str, resource_type: ResourceType
) -> None:
    """DescribeAcls with MATCH shows exactly the ACLs the authorizer weighs for the resource."""
    snapshot = snapshot_of(acls)
    wanted = AclBindingFilter(resource_type, name, P.MATCH)
    described = {b.entry for b in snapshot.bindings(wanted)}
    weighed = {entry for acls in snapshot.matching(resource_type, name) for entry in acls.entries}
    assert described == weighed


@given(
    acls=st.lists(bindings(), max_size=12),
    wanted=st.builds(
        AclBindingFilter,
        resource_type=st.sampled_from([R.ANY, R.TOPIC, R.GROUP]),
        resource_name=st.none() | names,
        pattern_type=st.sampled_from(list(P)),
    ),
)
def test_exact_patterns_are_all_a_specific_filter_can_match(
    acls: list[AclBinding], wanted: AclBindingFilter
) -> None:
    exact = wanted.exact_patterns()
    if exact:
        assert all(wanted.matches_pattern(p) for p in exact)
        assert {b.pattern for b in acls if wanted.matches(b)} <= set(exact)


def snapshot_of(acls: list[AclBinding]) -> AclSnapshot:
    by_pattern: dict[ResourcePattern, set[AclEntry]] = {}
    for acl in acls:
        by_pattern.setdefault(acl.pattern, set()).add(acl.entry)
    return AclSnapshot({p: frozenset(e) for p, e in by_pattern.items()})


@given(acls=st.lists(bindings(), max_size=12), probes=st.lists(names, min_size=1, max_size=4))
def test_snapshot_round_trip(acls: list[AclBinding], probes: list[str]) -> None:
    snapshot = snapshot_of(acls)
    assert set(snapshot.bindings()) == set(acls)
    assert len(snapshot) == len(set(acls))
    rebuilt = AclSnapshot()
    for pattern, entries in snapshot.acls.items():
        rebuilt = rebuilt.with_entries(pattern, entries)
    assert rebuilt == snapshot
    # A snapshot derived change by change indexes exactly as one built at once.
    for resource_type in (R.TOPIC, R.GROUP):
        for name in [*probes, "*"]:
            assert rebuilt.matching(resource_type, name) == snapshot.matching(resource_type, name)
    for pattern in list(snapshot.acls):
        rebuilt = rebuilt.with_entries(pattern, frozenset())
    assert rebuilt.acls == {}
    assert rebuilt.bindings() == []


def test_a_snapshot_never_holds_an_empty_entry_set() -> None:
    with pytest.raises(ValueError, match="absent"):
        AclSnapshot({ResourcePattern(R.TOPIC, "a"): frozenset()})
